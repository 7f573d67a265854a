"""SkyRL, AReaL and verifiers, each running its own code (the scripts in tests/trainers/, in .venv-trainers)
against a real server: rewards equal to direct grading of the same samples, and a failed grader shown the
way each framework can show it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from grpcgrade.testing import start_server

pytestmark = pytest.mark.trainers

CONFIG = """
rewards:
  gsm8k:
    graders:
      - {name: math_exact, weight: 2}
      - {name: number_only}
  capped:
    graders:
      - {name: math_exact}
      - {name: completion_length_cap, params: {max_completion_tokens: 5}, gate: true}
  flaky:
    graders: [{name: misbehave, params: {heavy: false}}]
"""
TOKEN = "trainer-token"
SCRIPTS = Path(__file__).parent / "trainers"
QUESTION = "What is 8*9?"


@pytest.fixture(scope="module")
def server(tmp_path_factory, plugin_env):
    tmp = tmp_path_factory.mktemp("trainers")
    (tmp / "config.yaml").write_text(CONFIG)
    (tmp / "tokens").write_text(TOKEN + "\n")
    srv = start_server(tmp, "--workers", "0", "--config", "config.yaml", "--auth-token-file", "tokens", env=plugin_env)
    yield srv
    srv.stop()


def run(python: Path, script: str, server, reward: str, rows: list[dict]) -> dict:
    args = {"target": server.target, "token": TOKEN, "reward": reward, "rows": rows}
    done = subprocess.run([str(python), str(SCRIPTS / script)], input=json.dumps(args), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def refused(python: Path, script: str, server, reward: str, rows: list[dict]) -> str:
    """The error a framework's script stops with (its stderr): it must not run at all."""
    args = {"target": server.target, "token": TOKEN, "reward": reward, "rows": rows}
    done = subprocess.run([str(python), str(SCRIPTS / script)], input=json.dumps(args), capture_output=True, text=True)
    assert done.returncode != 0, done.stdout
    return done.stderr


def direct(server, reward: str, samples: list[dict]) -> list[float | None]:
    with server.client(token=TOKEN) as client:
        return client.batch_scores(samples, reward=reward).rewards


def test_skyrl_env_steps_are_graded_and_failures_flagged(server, trainers_python):
    rows = [
        {"prompt": QUESTION, "action": "<think>r</think>72", "ground_truth": "72"},
        {"prompt": QUESTION, "action": "<think>r</think>71", "ground_truth": "72"},
    ]
    out = run(trainers_python, "skyrl_env.py", server, "gsm8k", rows)
    samples = [{"query": QUESTION, "response": r["action"], "reference": r["ground_truth"]} for r in rows]
    assert [s["reward"] for s in out["steps"]] == pytest.approx(direct(server, "gsm8k", samples))
    assert all(s["done"] and s["metadata"] == {"grpcgrade_failed": False} for s in out["steps"])
    failed = run(
        trainers_python, "skyrl_env.py", server, "flaky", [{"prompt": "q", "action": "nan", "ground_truth": ""}]
    )
    (step,) = failed["steps"]
    assert step["reward"] == -1.0 and step["metadata"]["grpcgrade_failed"] is True  # the configured failure value
    assert step["metadata"]["grpcgrade_error"].startswith("misbehave ")
    assert failed["aggregated"] == {"grpcgrade_failed": 1.0}  # SkyRL's own aggregation of the env metrics
    # an action the client cannot send (a lone surrogate) is a failed step, not an exception out of step()
    unsent = run(trainers_python, "skyrl_env.py", server, "gsm8k", [{**rows[0], "action": "72\ud800"}])
    (step,) = unsent["steps"]
    assert step["reward"] == -1.0 and step["metadata"]["grpcgrade_failed"] is True
    assert step["metadata"]["grpcgrade_error"].startswith("grpcgrade.client INVALID_SAMPLE: not sent: the sample, ")
    # no ground truth: math_exact's reference is missing (INVALID_SAMPLE), not "" graded (a made-up 0)
    unlabelled = run(trainers_python, "skyrl_env.py", server, "gsm8k", [{**rows[0], "ground_truth": None}])
    (step,) = unlabelled["steps"]
    assert step["reward"] == -1.0 and step["metadata"]["grpcgrade_error"].startswith("math_exact INVALID_SAMPLE")


def test_areal_wrapper_gets_rewards_with_token_counts_and_rejects_failed_samples(server, trainers_python):
    rows = [
        {"prompt": QUESTION, "completion": "<think>r</think>72", "completion_ids": [5, 6, 7], "answer": "72"},
        {"prompt": QUESTION, "completion": "<think>r</think>72", "completion_ids": list(range(8)), "answer": "72"},
        {"prompt": QUESTION, "completion": "<think>r</think>70", "completion_ids": [5], "answer": "72"},
    ]
    out = run(trainers_python, "areal_reward.py", server, "capped", rows)
    samples = [
        {"query": QUESTION, "response": r["completion"], "reference": r["answer"],
         "completion_tokens": len(r["completion_ids"]), "level": 1}
        for r in rows
    ]  # fmt: skip
    expected = direct(server, "capped", samples)
    assert expected == [1.0, 0.0, 0.0]  # the second is over the 5-token cap: its count came from completion_ids
    assert [r["reward"] for r in out["results"]] == pytest.approx(expected)
    failed = run(trainers_python, "areal_reward.py", server, "flaky",
                 [{"prompt": "q", "completion": "nan", "completion_ids": [1], "answer": ""}])  # fmt: skip
    (result,) = failed["results"]
    assert result["error"].startswith("SampleFailed: grpcgrade: the sample's graders failed (misbehave ")
    unsent = run(trainers_python, "areal_reward.py", server, "capped", [{**rows[0], "completion": "72\ud800"}])
    (result,) = unsent["results"]  # rejected as a failed sample, not a ValueError of the client's
    assert result["error"].startswith("SampleFailed: grpcgrade: the sample's graders failed (grpcgrade.client ")
    unlabelled = run(trainers_python, "areal_reward.py", server, "capped", [{**rows[0], "answer": None}])
    (result,) = unlabelled["results"]  # no answer: a missing reference, not "" graded 0
    assert result["error"].startswith("SampleFailed: grpcgrade: the sample's graders failed (math_exact INVALID_SAMPLE")


def test_verifiers_rubric_scores_groups_and_rollouts_as_direct_grading(server, trainers_python):
    rows = [
        {"question": QUESTION, "completion": "<think>r</think>72", "answer": "72"},
        {"question": QUESTION, "completion": "<think>r</think>71", "answer": "72"},
        {"question": QUESTION, "completion": "seventy-two", "answer": "72"},
    ]
    out = run(trainers_python, "verifiers_rubric.py", server, "gsm8k", rows)
    samples = [{"query": r["question"], "response": r["completion"], "reference": r["answer"]} for r in rows]
    expected = direct(server, "gsm8k", samples)
    for scored in (out["group"], out["alone"]):
        assert [s["reward"] for s in scored] == pytest.approx(expected)
        assert [s["metrics"]["grpcgrade_failed"] for s in scored] == [0.0, 0.0, 0.0]
    # a loop per run: each run's client closed as its loop ends (before: left open, its connection with it)
    assert [left for _, left in out["loops"]] == [0, 0, 0] and all(during >= 1 for during, _ in out["loops"])
    flaky = [{"question": "q", "completion": "nan", "answer": ""}, {"question": "q", "completion": "ok", "answer": ""}]
    flaky.append({"question": "q", "completion": "ok\ud800", "answer": ""})  # one the client cannot send
    failed = run(trainers_python, "verifiers_rubric.py", server, "flaky", flaky)
    assert [s["reward"] for s in failed["group"]] == [0.0, 1.0, 0.0]  # failure_reward, a grade, failure_reward
    assert [s["metrics"]["grpcgrade_failed"] for s in failed["group"]] == [1.0, 0.0, 1.0]
    unlabelled = run(trainers_python, "verifiers_rubric.py", server, "gsm8k", [{**rows[0], "answer": None}])
    assert [s["metrics"]["grpcgrade_failed"] for s in unlabelled["group"]] == [1.0]  # no answer: no reference


def test_pandas_missing_values_are_missing(trainers_python):
    """pandas (in the trainers' installation, as in theirs) marks a missing value NA or NaT, and a missing
    number NaN: each is a field the sample does not carry; a value pandas holds is not."""
    values = "pd.NA, pd.NaT, pd.Series([1.0, None])[1], pd.Timestamp(0), pd.Series(['x'])[0]"
    code = f"import pandas as pd\nfrom grpcgrade.core.samples import is_missing as m\nprint([m(v) for v in ({values})])"
    done = subprocess.run([str(trainers_python), "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[True,", "True,", "True,", "False,", "False]"]


@pytest.mark.parametrize(
    ("script", "row", "path"),
    [
        ("skyrl_env.py", {"prompt": QUESTION, "action": "<think>r</think>72", "ground_truth": "72"}, "SkyRL"),
        (
            "verifiers_rubric.py",
            {"question": QUESTION, "completion": "<think>r</think>72", "answer": "72"},
            "verifiers",
        ),
    ],
)
def test_skyrl_and_verifiers_refuse_a_length_gate_the_server_cannot_count(server, trainers_python, script, row, path):
    """Neither sends token counts and the server has no tokenizer: `capped` would cut every reward to its
    gate's min_reward (0), so building the environment / rubric fails naming the option (issue 37's rule)."""
    error = refused(trainers_python, script, server, "capped", [row])
    assert "ValueError: grpcgrade: reward 'capped' gates on completion_tokens (completion_length_cap)" in error
    assert "--tokenizer" in error and f"which {path}" in error
