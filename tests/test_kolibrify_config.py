"""A Kolibrify RL dataserver configuration served by grpcgrade (`serve --kolibrify-config`).

The end-to-end part starts a real server on the configuration and grades over gRPC. Expected rewards come
from Kolibrify's definitions: the worked example of its DatasetReward (weights [2, 1], the auto-attached
reasoning format at 1, gate completion_length_cap(200, min_reward=0.2)), and for the custom and remote
graders, the rules this file gives them, worked out by hand.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from http_services import Reply, Service, http_service

from grpcgrade.core.config import ServerConfig
from grpcgrade.core.engine import Engine
from grpcgrade.core.errors import ConfigError
from grpcgrade.core.plugins import load_plugins, make_manager
from grpcgrade.core.registry import Registry
from grpcgrade.core.rewards import Reward, SpecData
from grpcgrade.core.samples import Limits
from grpcgrade.grader import GraderError
from grpcgrade.graders.kolibrify.config import PLUGIN_NAME, load_kolibrify_config
from grpcgrade.service.convert import sample_kwargs, sample_to_pb
from grpcgrade.testing import ServerProcess, start_server

# Kolibrify's example grader (examples/rl/gspo_custom_grader), written against Kolibrify's own API. It
# answers in reverse order on purpose: grpcgrade pairs results by sample_id + completion_index.
RUSSIAN_GRADER = '''
from kolibrify.rl_dataserver.graders import Grader, GradeResult, GraderInput


class RussianReasoningGrader(Grader):
    """Share of Cyrillic letters in the reasoning, +0.05 from `min_letters` Cyrillic letters, at most 1."""

    def __init__(self, min_letters: int = 30) -> None:
        self.min_letters = min_letters

    async def grade_batch(self, inputs):
        results = []
        for item in inputs:
            assert isinstance(item, GraderInput)
            letters = [c for c in (item.reasoning or "") if c.isalpha()]
            cyrillic = sum(1 for c in letters if "\\u0400" <= c <= "\\u04ff")
            share = cyrillic / len(letters) if letters else 0.0
            bonus = 0.05 if cyrillic >= self.min_letters else 0.0
            results.append(GradeResult(item.sample_id, min(1.0, share + bonus), item.completion_index))
        return results[::-1]
'''

CONFIG = """
paths:
  data_root: data
datasets:
  gsm8k:
    path: gsm8k_train.jsonl
    graders: [math_exact, number_only]
    grader_weights: [2.0, 1.0]
    multiplicative_graders: [length_cap_guard]
  gsm8k_ru:
    path: gsm8k_ru.jsonl
    graders: [math_exact, russian_reasoning, judge]
    grader_weights: [1.0, 1.0, 2.0]
  latex:
    path: latex.jsonl
    graders: [latex_check, latex_only]
    grader_weights: [1.0, 1.0]
python_graders:
  length_cap_guard:
    builtin: completion_length_cap
    init_kwargs: {max_completion_tokens: 200, min_reward: 0.2}
  russian_reasoning:
    path: "./graders/custom_graders.py:RussianReasoningGrader"
    init_kwargs: {min_letters: 5}
  latex_check:
    builtin: math-verify
    init_kwargs: {parsing_timeout: 3, verification_timeout: 3}
external_graders:
  judge:
    type: remote_http
    url: "{url}"
    timeout_s: 10
stages:
  - name: main
    until_step: 100
    datasets: [{id: gsm8k, weight: 1.0}, {id: gsm8k_ru, weight: 1.0}]
"""


def judge(number: int, body: dict[str, Any]) -> Reply:
    """The remote grader: 0.5 for Russian-language records, plus 0.1 per completion index."""
    results = []
    for s in body["samples"]:
        reward = (0.5 if (s["metadata"] or {}).get("lang") == "ru" else 0.0) + 0.1 * (s["completion_index"] or 0)
        results.append({"sample_id": s["sample_id"], "reward": reward, "completion_index": s["completion_index"]})
    return 200, {"results": results}, {}


@pytest.fixture(scope="module")
def judge_service() -> Iterator[Service]:
    with http_service(judge) as service:
        yield service


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory, judge_service: Service) -> Path:
    root = tmp_path_factory.mktemp("kolibrify") / "kolibrify"
    (root / "graders").mkdir(parents=True)
    (root / "graders" / "custom_graders.py").write_text(RUSSIAN_GRADER)
    path = root / "rl_data_config.yaml"
    path.write_text(CONFIG.replace("{url}", judge_service.url))
    return path


@pytest.fixture(scope="module")
def kolibrify_server(config_path: Path) -> Iterator[ServerProcess]:
    # Started from another directory: the grader file's path is relative to the configuration file.
    srv = start_server(config_path.parent.parent, "--workers", "1", "--kolibrify-config", str(config_path))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(kolibrify_server: ServerProcess):
    with kolibrify_server.client(timeout=60) as c:
        yield c


def think(reasoning: str, answer: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n{answer}"


# -- over gRPC ---------------------------------------------------------------------------------------


def test_kolibrifys_worked_example(client):
    perfect = think("r", "72")
    samples = [
        {"id": "gsm8k:1", "response": perfect, "completion_tokens": 50},
        {"id": "gsm8k:1", "response": "<think>r</think> The answer is 72", "completion_tokens": 50},
        {"id": "gsm8k:1", "response": perfect, "completion_tokens": 500},
        {"id": "gsm8k:1", "response": think("r", "71"), "completion_tokens": 50},
        {"id": "gsm8k:1", "response": "72", "completion_tokens": 10},
    ]
    replies = client.batch_evaluate([{**s, "reference": "#### 72"} for s in samples], reward="gsm8k")
    assert [r.reward for r in replies] == pytest.approx([1.0, 0.825, 0.2, 0.5, 0.0])
    assert [r.key for r in replies[0].results] == ["math_exact", "number_only", "think_format", "length_cap_guard"]
    assert [r.grader for r in replies[0].results][-1] == "completion_length_cap"


def test_custom_and_remote_graders_join_the_weighted_mean(client, judge_service):
    ru = {"metadata": {"lang": "ru"}, "system_prompt": "Отвечай по-русски."}
    samples = [
        {"id": "ru:1", "response": think("Семьдесят плюс два", "72"), "completion_index": 0, **ru},
        {"id": "ru:1", "response": think("sum это", "71"), "completion_index": 1, **ru},
        {"id": "ru:2", "response": think("thinking", "72"), "completion_index": 0, "metadata": {"lang": "en"}},
        {"id": "ru:3", "response": think("думаю hard", "72"), "completion_index": 0, **ru},
    ]
    judge_service.requests.clear()
    replies = client.batch_evaluate([{**s, "reference": "#### 72"} for s in samples], reward="gsm8k_ru")
    # (math_exact, russian_reasoning, judge, think_format) by hand from their definitions:
    expected = [
        (1.0, 1.0, 0.5, 1.0),  # 16 of 16 letters Cyrillic, +0.05 capped at 1
        (0.0, 0.5, 0.6, 1.0),  # 3 of 6 letters Cyrillic, fewer than 5: no bonus; judge 0.5 + 0.1 * 1
        (1.0, 0.0, 0.0, 1.0),  # no Cyrillic; lang en
        (1.0, 5 / 9 + 0.05, 0.5, 1.0),  # 5 of 9 letters Cyrillic, 5 >= min_letters
    ]
    for reply, scores in zip(replies, expected, strict=True):
        assert [r.key for r in reply.results] == ["math_exact", "russian_reasoning", "judge", "think_format"]
        assert [r.score for r in reply.results] == pytest.approx(scores)
        weights = (1.0, 1.0, 2.0, 1.0)
        assert reply.reward == pytest.approx(sum(w * s for w, s in zip(weights, scores, strict=True)) / 5)
    sent = [s for body in judge_service.requests for s in body["samples"]]
    expected_ids = [("ru:1", 0), ("ru:1", 1), ("ru:2", 0), ("ru:3", 0)]
    assert [(s["sample_id"], s["completion_index"]) for s in sent] == expected_ids
    assert sent[0]["system_prompt"] == "Отвечай по-русски." and sent[0]["answer"] == "#### 72"
    assert sent[1]["final_response"] == "71" and sent[1]["reasoning"] == "sum это"


def test_a_builtin_with_init_kwargs_runs_with_its_params(client):
    # math-verify (in a worker process) + latex_only + the format grader, equal weights.
    gold = {"reference": "$5$"}
    replies = client.batch_evaluate(
        [
            {"response": think("r", "$5$"), **gold},
            {"response": think("r", "$6$"), **gold},
            {"response": think("r", "Answer is $5$"), **gold},
        ],
        reward="latex",
    )
    assert [r.reward for r in replies] == pytest.approx([1.0, (0.5 + 1 + 1) / 3, (1 + 0 + 1) / 3])
    assert [(r.key, r.grader) for r in replies[0].results][0] == ("latex_check", "math_verify")


def test_a_failing_remote_grader_masks_only_its_samples(tmp_path):
    def refuse_ru3(number: int, body: dict[str, Any]) -> Reply:
        reply = judge(number, body)[1]["results"]
        return 200, {"results": [r for r in reply if r["sample_id"] != "ru:3"]}, {}

    with http_service(refuse_ru3) as service:
        config = tmp_path / "k.yaml"
        config.write_text(
            textwrap.dedent(f"""
            datasets:
              d: {{graders: [judge], grader_weights: [1]}}
            external_graders:
              judge: {{type: remote_http, url: "{service.url}"}}
        """)
        )
        engine, _ = engine_for(config)
        graded = grade(engine, "d", [{"id": "ru:1", "response": think("r", "1")}, {"id": "ru:3", "response": "x"}])
    assert graded[0].reward == pytest.approx((0.0 + 1.0) / 2)
    assert graded[1].reward is None and isinstance(graded[1].results[0], GraderError)


def test_list_graders_shows_the_datasets_as_rewards(client, config_path):
    listing = client.list_graders()
    rewards = {r.name: r for r in listing.rewards}
    assert sorted(rewards) == ["gsm8k", "gsm8k_ru", "latex"]
    specs = [(g.name, g.key, g.weight if g.HasField("weight") else None, g.gate) for g in rewards["gsm8k"].graders]
    assert specs == [
        ("math_exact", "", 2.0, False),
        ("number_only", "", 1.0, False),
        ("think_format", "", 1.0, False),
        ("completion_length_cap", "length_cap_guard", None, True),
    ]
    params = dict(rewards["gsm8k"].graders[3].params)
    assert params == {"max_completion_tokens": 200, "min_reward": 0.2}
    graders = {g.name: g for g in listing.graders}
    for name in ("judge", "russian_reasoning"):
        assert (graders[name].plugin, graders[name].distribution) == ("kolibrify-config", str(config_path))
    plugin = next(p for p in listing.plugins if p.name == "kolibrify-config")
    assert list(plugin.graders) == ["russian_reasoning", "judge"]


def test_a_wrong_configuration_stops_the_server_at_start(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("datasets:\n  gsm8k: {graders: [math_exact, number_only], grader_weights: [1.0]}\n")
    with pytest.raises(RuntimeError) as err:
        start_server(tmp_path, "--workers", "0", "--kolibrify-config", str(config))
    assert "datasets.gsm8k: 2 graders but 1 grader_weights" in str(err.value)


# -- in process: the configuration's rules -----------------------------------------------------------


def fresh_registry() -> Registry:
    pm = make_manager()
    return Registry(load_plugins(pm), pm)


def engine_for(path: Path, base: ServerConfig | None = None) -> tuple[Engine, ServerConfig]:
    registry = fresh_registry()
    config = load_kolibrify_config(path, registry, base or ServerConfig())
    return Engine(registry, None, rewards=config.rewards, server_only_graders=config.server_only_graders), config


def grade(engine: Engine, reward: str, samples: list[dict[str, Any]]) -> list[Any]:
    jobs = engine.resolve([], reward)
    chunk = [(i, sample_kwargs(sample_to_pb(s), Limits())) for i, s in enumerate(samples)]
    graded = asyncio.run(engine.grade_chunk(jobs, chunk))
    return [
        SimpleNamespace(results=[column[k] for column in graded.columns], reward=graded.rewards[k])
        for k in range(len(samples))
    ]


def test_plain_graders_instances_kolibrify_names_and_repeated_graders(tmp_path, monkeypatch):
    (tmp_path / "short_answer.py").write_text(
        textwrap.dedent("""
        from grpcgrade import BaseGrader, GraderScore
        from grpcgrade.graders.kolibrify.parsing import final_answer

        class ShortAnswer(BaseGrader):
            def __init__(self, max_chars):
                super().__init__(name="short")
                self.max_chars = max_chars

            def evaluate(self, response="", **kwargs):
                answer = final_answer(response) or ""
                return GraderScore(self.name, 1.0 if len(answer) <= self.max_chars else 0.0)
    """)
    )
    (tmp_path / "kolibrify_half_module.py").write_text(
        textwrap.dedent("""
        from kolibrify.rl_dataserver.graders import Grader, GradeResult

        class Half(Grader):
            async def grade_batch(self, inputs):
                return [GradeResult(i.sample_id, 0.5, i.completion_index) for i in inputs]

        always_half = Half()
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "k.yaml"
    config.write_text(
        textwrap.dedent("""
        python_graders:
          short: {path: short_answer.py:ShortAnswer, init_kwargs: {max_chars: 3}}
          half: {import: "kolibrify_half_module:always_half"}
        datasets:
          d:
            graders: [short, half, reasoning_format, short]
            grader_weights: [1, 1, 1, 1]
            multiplicative_graders: [short]
    """)
    )
    engine, built = engine_for(config, ServerConfig(rewards={"other": Reward("other", [SpecData("think_format")])}))
    assert sorted(built.rewards) == ["d", "other"]
    assert sorted(built.server_only_graders) == ["half", "short"]
    ok, long = grade(engine, "d", [{"response": think("r", "72")}, {"response": think("r", "7200")}])
    specs = engine.rewards["d"].specs
    assert [s.label for s in specs] == ["short", "half", "reasoning_format", "short#2", "think_format", "short#3"]
    assert [r.name for r in ok.results][2] == "think_format"  # Kolibrify's reasoning_format is our think_format
    assert [r.score for r in ok.results] == [1.0, 0.5, 1.0, 1.0, 1.0, 1.0]
    assert ok.reward == pytest.approx((1 + 0.5 + 1 + 1 + 1) / 5)
    assert long.reward == 0.0  # gated by the repeated grader
    assert "kolibrify" not in sys.modules and importlib.util.find_spec("kolibrify") is None


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "graders.py").write_text(
        textwrap.dedent("""
        from kolibrify.rl_dataserver.graders import Grader

        class NeedsNothing(Grader):
            async def grade_batch(self, inputs):
                return []

        NOT_A_GRADER = 42
    """)
    )
    path = tmp_path / "k.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "datasets: {d: {graders: [math_exact, number_only], grader_weights: [1.0]}}",
            "datasets.d: 2 graders but 1 grader_weights",
        ),
        (
            "datasets: {d: {graders: [math_exakt], grader_weights: [1]}}",
            "datasets.d.graders[0]: unknown grader 'math_exakt'; did you mean 'math_exact'",
        ),
        ("datasets: {d: {graders: [math_exact], grader_weights: [-1]}}", "weights sum to 0; the sum must be a finite"),
        (
            "datasets: {d: {graders: [math_exact, number_only], grader_weights: [1.0e+308, 1.0e+308]}}",
            "weights sum to inf; the sum must be a finite number > 0",
        ),
        ("datasets: {d: {graders: [math_exact], grader_weights: [x]}}", "datasets.d.grader_weights[0]"),
        (
            "datasets: {d: {graders: [math_exact], grader_weights: [1], multiplicative_graders: [nope]}}",
            "datasets.d.multiplicative_graders[0]: unknown grader 'nope'",
        ),
        ("datasets: {d: {graders: [math_exact], grader_weight: [1]}}", "datasets.d: unknown key 'grader_weight'"),
        ("datasets: {}", "no datasets"),
        (
            "datasets: {d: {graders: [j], grader_weights: [1]}}\nexternal_graders: {j: {type: grpc, url: 'http://x'}}",
            "external_graders.j.type: unsupported external grader type 'grpc'",
        ),
        (
            "datasets: {d: {graders: [j], grader_weights: [1]}}\nexternal_graders: {j: {type: remote_http}}",
            "external_graders.j: url is required",
        ),
        (
            "datasets: {d: {graders: [j], grader_weights: [1]}}\n"
            "external_graders: {j: {type: remote_http, url: 'http://127.0.0.1/', timeout_s: -1}}",
            "external_graders.j.timeout_s",
        ),
        (
            "datasets: {d: {graders: [g], grader_weights: [1]}}\npython_graders: {g: {path: missing.py:G}}",
            "python_graders.g.path: no file",
        ),
        (
            "datasets: {d: {graders: [g], grader_weights: [1]}}\npython_graders: {g: {path: graders.py}}",
            "python_graders.g.path: must be 'file.py:Attr'",
        ),
        (
            "datasets: {d: {graders: [g], grader_weights: [1]}}\npython_graders: {g: {path: graders.py:Nope}}",
            "python_graders.g: 'graders.py' has no attribute 'Nope'",
        ),
        (
            "datasets: {d: {graders: [g], grader_weights: [1]}}\n"
            "python_graders: {g: {path: graders.py:NeedsNothing, init_kwargs: {x: 1}}}",
            "python_graders.g: graders.py:NeedsNothing(**init_kwargs) failed: TypeError",
        ),
        (
            "datasets: {d: {graders: [g], grader_weights: [1]}}\npython_graders: {g: {path: graders.py:NOT_A_GRADER}}",
            "python_graders.g: 'graders.py:NOT_A_GRADER' is a int, not a grader",
        ),
        (
            "datasets: {d: {graders: [g], grader_weights: [1]}}\n"
            "python_graders: {g: {path: graders.py:NeedsNothing, import: 'x:Y'}}",
            "python_graders.g: give exactly one of import, path or builtin",
        ),
        (
            "datasets: {d: {graders: [math_exact], grader_weights: [1]}}\n"
            "python_graders: {math_exact: {path: graders.py:NeedsNothing}}",
            "python_graders.math_exact: 'math_exact' is already the name of a grader",
        ),
        (
            "datasets: {d: {graders: [cap], grader_weights: [1]}}\n"
            "python_graders: {cap: {builtin: completion_length_cap, init_kwargs: {max_completion_tokens: 0}}}",
            "python_graders.cap.init_kwargs: parameter 'max_completion_tokens'",
        ),
        (
            "datasets: {d: {graders: [c], grader_weights: [1]}}\npython_graders: {c: {builtin: no_such_thing}}",
            "python_graders.c.builtin: unknown grader 'no_such_thing'",
        ),
        (
            "datasets: {other: {graders: [math_exact], grader_weights: [1]}}",
            "datasets.other: a reward of that name is already configured",
        ),
    ],
)
def test_configuration_errors_name_the_place(tmp_path, text, message):
    base = ServerConfig(rewards={"other": Reward("other", [SpecData("think_format")])})
    with pytest.raises(ConfigError) as err:
        load_kolibrify_config(write(tmp_path, text), fresh_registry(), base)
    assert message in str(err.value)
    assert "kolibrify" not in sys.modules


def test_graders_command_shows_configuration_defined_graders_without_a_version(kolibrify_server, config_path):
    """`grpcgrade graders --target`: graders the configuration defines come from its file, not "None"."""
    out = subprocess.run(
        [sys.executable, "-m", "grpcgrade", "graders", "--target", kolibrify_server.target],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    origin = f"defined by {config_path.resolve()}"
    assert f"  {PLUGIN_NAME}  {origin}  loaded" in out.stdout.splitlines()
    defined = [line for line in out.stdout.splitlines() if f"plugin {PLUGIN_NAME}," in line]
    assert defined and all(line.endswith(origin) for line in defined)
    assert "None" not in out.stdout.split("\nplugins:\n", 1)[1]
