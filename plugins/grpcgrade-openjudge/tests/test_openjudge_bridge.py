"""The bridge over gRPC with the real py-openjudge: its graders listed under `openjudge.`, its LLM graders
asking the project's fake OpenAI-compatible judge through grpcgrade's configured model, its deterministic
ones scoring as OpenJudge itself does in-process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import yaml
from openai_judge import Judge, models_section, running_judge

from grpcgrade.testing import ServerProcess, start_server


@pytest.fixture(scope="module")
def judge() -> Iterator[Judge]:
    with running_judge() as fake:
        yield fake


@pytest.fixture(scope="module")
def server(judge: Judge, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("openjudge")
    models = models_section(judge)
    config = {"models": {"default": models["gpt-4o-2024-08-06"], "other": models["o3-mini"]}}
    path = tmp / "grpcgrade.yaml"
    path.write_text(yaml.safe_dump(config))
    srv = start_server(tmp, "--workers", "0", "--config", str(path), wait=180)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def listed(server: ServerProcess) -> dict:
    with server.client(timeout=60) as client:
        return {g.name: g for g in client.list_graders().graders}


def test_every_openjudge_grader_is_listed(listed):
    import openjudge.graders.agent.tool.tool_call_accuracy  # noqa: F401 - the reference's own modules

    names = {n for n in listed if n.startswith("openjudge.")}
    # LLM graders of each family, and the deterministic ones, under OpenJudge's own names
    for name in (
        "tool_call_accuracy",
        "tool_selection",
        "trajectory_comprehensive",
        "correctness",
        "hallucination",
        "syntax_check",
        "tool_call_sequence_simple",
        "math_verify",
        "json_validator",
    ):
        assert f"openjudge.{name}" in names, sorted(names)
    assert len(names) >= 50
    params = {p.name for p in listed["openjudge.tool_call_sequence_simple"].params}
    assert {"metric_type", "match_arguments"} <= params
    assert "model" in {p.name for p in listed["openjudge.tool_call_accuracy"].params}


def test_an_llm_grader_asks_the_configured_model(server, judge):
    marker = judge.reply(json.dumps({"score": 4, "reason": "the right tool with the right city"}))
    sample = {
        "query": f"What is the weather in Paris? {marker}",
        "tool_definitions": [{"name": "weather", "description": "Weather of a city", "parameters": {"city": "str"}}],
        "tool_calls": [{"name": "weather", "arguments": {"city": "Paris"}}],
    }
    with server.client(timeout=60) as client:
        reply = client.evaluate(sample, ["openjudge.tool_call_accuracy"])
    result = reply.results[0]
    assert not result.HasField("error"), result.error
    assert result.score == 4.0  # OpenJudge takes the judge's structured score as it is
    assert "right tool" in result.reason
    (path, body), *_ = judge.requests(marker)
    assert path.endswith("/chat/completions") and body["model"] == "judge-x"  # the configured "default"
    assert "weather" in json.dumps(body["messages"])


def test_the_model_param_names_a_configured_model(server, judge):
    marker = judge.reply(json.dumps({"score": 1, "reason": "wrong"}))
    with server.client(timeout=60) as client:
        reply = client.evaluate(
            {"query": f"q {marker}", "response": "r", "reference": "ref"},
            [{"name": "openjudge.correctness", "params": {"model": "other"}}],
        )
    assert not reply.results[0].HasField("error"), reply.results[0].error
    assert judge.requests(marker)[0][1]["model"] == "judge-y"


def test_a_failing_judge_is_an_error_not_a_score(server, judge):
    marker = judge.reply(status=500)
    with server.client(timeout=60) as client:
        reply = client.evaluate({"query": f"q {marker}", "response": "r"}, ["openjudge.relevance"])
    assert reply.results[0].HasField("error")
    assert not reply.HasField("reward")


def test_deterministic_graders_score_as_openjudge_in_process(server):
    from openjudge.graders.agent.tool.tool_call_precision_recall_match import ToolCallPrecisionRecallMatchGrader

    calls = [{"name": "search", "arguments": {"q": "a"}}, {"name": "calc", "arguments": {}}]
    reference = [{"name": "search", "arguments": {"q": "a"}}]
    own = asyncio.run(
        ToolCallPrecisionRecallMatchGrader(metric_type="precision").aevaluate(
            tool_calls=calls, reference_tool_calls=reference
        )
    )
    spec = {"name": "openjudge.tool_call_sequence_simple", "params": {"metric_type": "precision"}}
    with server.client(timeout=60) as client:
        bridged = client.evaluate({"tool_calls": calls, "extra": {"reference_tool_calls": reference}}, [spec])
        built_in = client.evaluate(
            {"tool_calls": calls, "extra": {"reference_tool_calls": reference}},
            [{"name": "tool_call_sequence_simple", "params": {"metric_type": "precision"}}],
        )
    assert bridged.results[0].score == own.score == built_in.results[0].score == 0.5


def test_bad_params_are_refused_by_name(server, listed):
    import grpc

    # this install builds every grader with its defaults: none is listed as unavailable
    unavailable = {g.name: g.description for g in listed.values() if g.description.startswith("unavailable")}
    assert not unavailable
    spec = {"name": "openjudge.tool_call_sequence_simple", "params": {"metric_type": "f1"}}
    with server.client(timeout=60) as client, pytest.raises(grpc.RpcError) as bad:
        client.evaluate({"tool_calls": []}, [spec])
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "metric_type" in bad.value.details() or "f1" in bad.value.details()


def test_a_grader_that_cannot_be_built_is_listed_with_why():
    """What `discover` makes of a grader class whose constructor needs more than its defaults (OpenJudge's
    own all build today): listed as unavailable, and a request for it refused naming the reason."""
    import grpcgrade_openjudge as bridge
    from openjudge.graders.base_grader import BaseGrader as OpenJudgeBase

    from grpcgrade import InvalidParams

    class NeedsAKey(OpenJudgeBase):
        def __init__(self, api_key: str) -> None:
            super().__init__(name="needs_a_key")

        async def _aevaluate(self, response: str):  # pragma: no cover - never built
            raise AssertionError

    found = bridge.describe(NeedsAKey, bridge._model_class())
    assert found.cls is None and "api_key" in found.problem
    registered = {}
    bridge.register_found([found], lambda factory, **options: registered.update({options["name"]: (factory, options)}))
    factory, options = registered["openjudge.NeedsAKey"]
    assert options["description"].startswith("unavailable: cannot be built with its defaults")
    with pytest.raises(InvalidParams, match="unavailable"):
        factory()


def test_results_are_cached_as_for_every_judge(server, judge):
    marker = judge.reply(json.dumps({"score": 3, "reason": "fine"}))
    sample = {"query": f"q {marker}", "response": "r"}
    with server.client(timeout=60) as client:
        first = client.evaluate(sample, ["openjudge.relevance"]).results[0]
        second = client.evaluate(sample, ["openjudge.relevance"]).results[0]
    assert (first.score, first.cached) == (3.0, False)
    assert (second.score, second.cached) == (3.0, True)
    assert len(judge.requests(marker)) == 1


def test_the_agents_page_configuration_loads():
    """docs/agents.md's configuration example (a `yml` block: the main suite, without this plugin, cannot
    resolve it) is read and its rewards resolved, as `grpcgrade serve --config` does."""
    import re
    from pathlib import Path

    from grpcgrade.core.config import parse_config
    from grpcgrade.core.engine import Engine
    from grpcgrade.core.registry import get_registry
    from grpcgrade.llm.models import configure

    page = (Path(__file__).resolve().parents[3] / "docs" / "agents.md").read_text()
    (body,) = re.findall(r"^```yml\n(.*?)^```", page, re.MULTILINE | re.DOTALL)
    config = parse_config(yaml.safe_load(body), "docs/agents.md")
    configure(config.models)
    engine = Engine(get_registry(), None, rewards=config.rewards)
    for reward in config.rewards.values():
        engine.resolve(reward.specs)
    assert "agent_judge" in config.rewards


def test_graders_without_a_model_are_sync_and_judges_async():
    """OpenJudge's local graders run like grpcgrade's sync graders (in workers, under the time limit), its
    judges as async graders bounding their own time."""
    from grpcgrade.core.registry import get_registry

    local = get_registry().build("openjudge.patch_similarity", {})
    judge = get_registry().build("openjudge.correctness", {})
    assert local.is_sync and not local.bounds_own_time
    assert local.evaluate(response="abcd", reference_response="abce").score == 0.75  # difflib's 2*3/8
    assert not judge.is_sync and judge.bounds_own_time
