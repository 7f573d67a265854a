"""Every reference case, through a real server: the numbers users got in-process, over gRPC.

The expected values were computed by running the reference implementations (py-openjudge 0.2.4,
Kolibrify at 1695107); see tests/fixtures/*.jsonl. The agent/code/math cases (openjudge_agent_public.jsonl)
name their inputs as the reference's `aevaluate` does, all in `extra`; they travel as a client sends them:
`messages` and `tool_calls` in the sample's own fields, `reference_response` as the sample's reference; the
three whose score hangs on an `arguments` object's key order or int-vs-float send it as JSON text (below).
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def load(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


AGENT_CASES = load("openjudge_agent_public.jsonl")
CASES = load("openjudge_public.jsonl") + load("kolibrify_public.jsonl") + AGENT_CASES
#: Agent inputs a client sends in the sample's own fields (docs/agents.md).
AGENT_FIELDS = ("messages", "tool_calls", "tool_definitions")


#: Cases whose score hangs on what a protobuf Struct cannot carry in an `arguments` object: its key order (a
#: protobuf map; Python's upb hands the keys out in hash order), and an int apart from the float of the same
#: value (a Struct number is a double: `1.0` and `1` both arrive as 1). tool_call_sequence's strict Jaccard
#: mode compares Python's str() of the arguments and tool_call_sequence_simple's `match_arguments` their
#: JSON. These cases send each `arguments` object as its JSON text, as OpenAI does and docs/agents.md tells
#: users to: the graders read that text with its order and its numbers as written, what the reference got.
#: (ojx-tool_call_sequence-30, once kept off the wire with 01 and 05, scores 0 whatever the order: as dicts.)
ARGUMENTS_AS_TEXT = {
    "ojx-tool_call_sequence-01": "key order: {'city': 'Hangzhou', 'stars': 4} must meet the reference's as written",
    "ojx-tool_call_sequence-05": "key order: {'b': 2, 'a': 1} is not the reference's {'a': 1, 'b': 2}",
    "ojx-tool_call_sequence_simple-12": "int and float: {'x': 1.0} is not the reference's {'x': 1}",
}


def arguments_as_text(value: object) -> object:
    """`value` with every tool call's `arguments` object replaced by its JSON text (order and numbers kept)."""
    if isinstance(value, list):
        return [arguments_as_text(v) for v in value]
    if isinstance(value, dict):
        return {
            k: json.dumps(v) if k == "arguments" and isinstance(v, dict) else arguments_as_text(v)
            for k, v in value.items()
        }
    return value


def sample_of(case: dict) -> dict:
    sample = dict(case["sample"])
    sample.setdefault("id", case["id"])
    if case["id"].startswith("ojx-"):  # their "" query, reference, context stand for inputs not passed
        sample = {k: v for k, v in sample.items() if v != "" or k == "response"}
    extra = dict(sample.get("extra") or {})
    for name in AGENT_FIELDS:
        if extra.get(name) is not None:  # a null stays in `extra`: the grader receives None, as the reference did
            sample[name] = extra.pop(name)
    if "reference_response" in extra:
        sample["reference"] = extra.pop("reference_response")
    sample["extra"] = extra
    return arguments_as_text(sample) if case["id"] in ARGUMENTS_AS_TEXT else sample


@pytest.fixture(scope="module")
def replies(client) -> dict[str, object]:
    """All cases in one BatchEvaluate per distinct grader set, so the module costs a few calls."""
    out: dict[str, object] = {}
    for case in CASES:
        graders = case.get("graders") or [{"name": case["grader"], "params": case.get("params") or {}}]
        try:
            out[case["id"]] = client.evaluate(sample_of(case), graders)
        except grpc.RpcError as exc:
            out[case["id"]] = exc
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_reference_case(case, replies):
    reply = replies[case["id"]]
    expect = case["expect"]
    if expect.get("error"):
        if isinstance(reply, grpc.RpcError):
            assert reply.code() == grpc.StatusCode.INVALID_ARGUMENT
        else:
            assert reply.results[0].HasField("error"), reply
        return
    assert not isinstance(reply, grpc.RpcError), reply.details()
    tol = expect.get("abs_tol", 1e-9)
    if "reward" in expect:
        assert reply.HasField("reward"), reply
        assert reply.reward == pytest.approx(expect["reward"], abs=tol)
    else:
        (result,) = reply.results
        assert not result.HasField("error"), result.error
        assert result.score == pytest.approx(expect["score"], abs=tol)


def test_what_a_struct_cannot_carry_is_said_by_the_json_text(client):
    """The value the contract cannot carry in a Struct, shown: tool_call_sequence_simple-12 sent with its
    `arguments` as objects scores 0.5, not the reference's 0.0, because `{"x": 1.0}` and `{"x": 1}` arrive as
    one number (the `g` calls then match); sent as JSON text, as the conformance run sends it, 0.0."""
    (case,) = [c for c in CASES if c["id"] == "ojx-tool_call_sequence_simple-12"]
    graders = [{"name": case["grader"], "params": case["params"]}]
    as_text = sample_of(case)
    as_objects = {**as_text, "tool_calls": case["sample"]["extra"]["tool_calls"]}
    as_objects["extra"] = {"reference_tool_calls": case["sample"]["extra"]["reference_tool_calls"]}
    assert [client.evaluate(s, graders).results[0].score for s in (as_objects, as_text)] == [
        0.5,
        case["expect"]["score"],
    ]
