"""Every reference case, through a real server: the numbers users got in-process, over gRPC.

The expected values were computed by running the reference implementations (py-openjudge 0.2.4,
Kolibrify at 1695107); see tests/fixtures/*.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def load(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


CASES = load("openjudge_public.jsonl") + load("kolibrify_public.jsonl")


def sample_of(case: dict) -> dict:
    sample = dict(case["sample"])
    sample.setdefault("id", case["id"])
    return sample


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
