"""The agent/code/math family in-process: every reference case (tests/fixtures/openjudge_agent_public.jsonl,
computed with py-openjudge 0.2.4) with the inputs exactly as the reference received them, including the
ones a wire cannot carry (None for a text, `1.0` beside `1` in an arguments object: protobuf's Struct has
one number type, so the gRPC run in test_conformance.py sees those as the same number)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpcgrade.core.errors import InvalidParams
from grpcgrade.core.registry import get_registry
from grpcgrade.grader import GraderError

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "openjudge_agent_public.jsonl"
CASES = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
#: Inputs the reference reads from `response` (the others read only what `extra` names).
READS_RESPONSE = {"syntax_check", "code_style", "patch_similarity", "math_expression_verify"}


def outcome(case: dict) -> object:
    """The grader's result, or the exception that refused its params or its inputs."""
    try:
        grader = get_registry().build(case["grader"], case["params"])
    except (InvalidParams, TypeError, ValueError) as exc:
        return exc
    kwargs = dict(case["sample"]["extra"])
    if case["grader"] in READS_RESPONSE:
        kwargs["response"] = case["sample"]["response"]
    try:
        return grader.evaluate(**kwargs)
    except (TypeError, ValueError, AttributeError) as exc:
        return exc


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_reference_case_in_process(case):
    result = outcome(case)
    if case["expect"].get("error"):
        assert isinstance(result, (Exception, GraderError)), result
        return
    assert not isinstance(result, (Exception, GraderError)), result
    assert result.score == pytest.approx(case["expect"]["score"], abs=1e-9)
