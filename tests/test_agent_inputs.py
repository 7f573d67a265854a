"""The agent inputs (`messages`, `tool_calls`, `tool_definitions`: Sample fields 8-10) through every way in:
the Python client, a Node client built from proto/ alone, and the CLI's JSONL; each reaches the graders
as the list it was, an empty list included, under the same size limit as every other field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
MESSAGES = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees Celsius in Paris today"},
    {"role": "assistant", "content": [{"type": "text", "text": "It is sunny."}]},
]
SAMPLE = {
    "id": "agent-1",
    "messages": MESSAGES,
    "tool_calls": [CALL],
    "tool_definitions": [WEATHER],
    "extra": {"reference_tool_calls": [[{"name": "weather", "arguments": {"city": "Paris"}}]]},
}
GRADERS = [
    {"name": "tool_call_valid"},
    {"name": "tool_call_sequence", "params": {"strict_mode": False}},
    {"name": "action_loop_detection"},
]
#: One valid call of a defined tool; the one reference step's tool called; one action cannot loop.
EXPECTED = {"tool_call_valid": 1.0, "tool_call_sequence": 1.0, "action_loop_detection": 1.0}


def scores(reply) -> dict[str, float]:
    return {r.key: (r.error.code if r.HasField("error") else r.score) for r in reply.results}


def test_python_client_sends_the_fields(client):
    assert scores(client.evaluate(SAMPLE, GRADERS)) == EXPECTED


def test_an_invalid_argument_gets_the_documented_partial_credit(client):
    bad = {**CALL, "function": {"name": "weather", "arguments": '{"town": "Paris"}'}}
    reply = client.evaluate({**SAMPLE, "tool_calls": [CALL, bad]}, ["tool_call_valid"])
    assert reply.results[0].score == pytest.approx((1 + 0.5) / 2)
    assert "'city' is a required property" in reply.results[0].reason


def test_an_empty_list_is_an_input_and_an_absent_one_is_missing(client):
    both_empty = client.evaluate(
        {"messages": [], "extra": {"reference_tool_calls": []}}, ["tool_call_sequence"]
    ).results[0]
    assert not both_empty.HasField("error") and both_empty.score == 1.0  # the reference: nothing vs nothing
    absent = client.evaluate({"extra": {"reference_tool_calls": []}}, ["tool_call_sequence"]).results[0]
    assert absent.error.code == "INVALID_SAMPLE" and "messages" in absent.error.message


def test_extra_still_carries_them_but_not_twice(client):
    old_style = {"extra": {"messages": MESSAGES, "reference_tool_calls": SAMPLE["extra"]["reference_tool_calls"]}}
    assert client.evaluate(old_style, ["tool_call_sequence"]).results[0].score == 1.0
    both = {**old_style, "messages": MESSAGES}
    result = client.evaluate(both, ["tool_call_sequence"]).results[0]
    assert result.error.code == "INVALID_SAMPLE" and "'messages'" in result.error.message


def test_size_limit_holds_for_the_agent_fields(client):
    huge = [{"role": "tool", "content": "x" * 1_100_000}]  # the session server's max_field_chars is 1,000,000
    reply = client.evaluate(
        {"messages": huge, "tool_calls": [CALL], "tool_definitions": [WEATHER]}, ["tool_call_valid"]
    )
    assert reply.results[0].error.code == "INVALID_SAMPLE"
    assert "'messages'" in reply.results[0].error.message and "max_field_chars" in reply.results[0].error.message


def test_python_client_refuses_a_field_that_is_not_a_list(client):
    with pytest.raises(TypeError, match="tool_calls"):
        client.evaluate({"tool_calls": "weather()"}, ["tool_call_valid"])


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """grpc-js and proto-loader, pinned in the Makefile, installed once from npm into .tools/."""
    subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), ".tools/.node-grpc"], check=True)
    return ROOT / ".tools" / "node_modules"


def test_node_client_built_from_the_proto_alone(server, node_modules):
    out = subprocess.run(
        [
            "node",
            str(ROOT / "tests" / "node" / "client.js"),
            str(ROOT / "proto"),
            server.target,
            json.dumps(SAMPLE),
            json.dumps(GRADERS),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NODE_PATH": str(node_modules)},
    )
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["id"] == "agent-1"
    assert {r["key"]: r["score"] for r in reply["results"]} == EXPECTED
    assert all(r["error"] is None for r in reply["results"])


def cli_eval(server, tmp_path, *lines: object) -> subprocess.CompletedProcess[str]:
    """`grpcgrade eval` of these JSONL lines with tool_call_valid, written to tmp_path/out.jsonl (the
    environment's GRPCGRADE_ settings left out)."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return subprocess.run(
        [sys.executable, "-m", "grpcgrade", "eval", str(source), "--grader", "tool_call_valid"]
        + ["--target", server.target, "-o", str(tmp_path / "out.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("GRPCGRADE_")},
    )


def test_cli_eval_reads_them_from_jsonl(server, tmp_path):
    out = cli_eval(server, tmp_path, SAMPLE, {**SAMPLE, "id": "b", "tool_calls": []})
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(x["id"], x["results"][0]["score"]) for x in lines] == [("agent-1", 1.0), ("b", 0.0)]


def test_cli_eval_names_the_line_of_a_bad_field(server, tmp_path):
    out = cli_eval(server, tmp_path, SAMPLE, {"messages": {"role": "user"}})
    assert out.returncode != 0
    assert "line 2" in out.stderr and "messages" in out.stderr and "Traceback" not in out.stderr
