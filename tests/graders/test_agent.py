"""The agent/code/math family in-process: every reference case (tests/fixtures/openjudge_agent_public.jsonl,
computed with py-openjudge 0.2.4) with the inputs exactly as the reference received them, including the
ones a wire cannot carry (None for a text, `1.0` beside `1` in an arguments object: protobuf's Struct has
one number type, so the gRPC run in test_conformance.py sees those as the same number)."""

from __future__ import annotations

import json
import subprocess
import sys
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


def test_math_expression_says_nothing_of_math_verify_timeouts_it_leaves_to_the_service() -> None:
    """math-verify's once-a-process warning that its timeouts are off (every worker logged it as it warmed
    up) is not an operator's business: each sample's time limit bounds it. In a fresh process, as a worker."""
    pytest.importorskip("math_verify")
    code = (
        "from grpcgrade import logs; logs.setup_logging('warning', 'text')\n"
        "from grpcgrade.core.registry import get_registry\n"
        "grader = get_registry().build('math_expression_verify', {})\n"
        "grader.warm_up()\n"
        "print(grader.evaluate(response='$x = 3/6$', reference_response='$1/2$').score)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1.0"]
    assert "Timeout is disabled" not in run.stderr, run.stderr
