"""OpenJudge's `MathExpressionVerifyGrader` (py-openjudge 0.2.4), served as `math_expression_verify` (the name
`math_verify` is Kolibrify's grader, plugins/grpcgrade-math-verify).

HF math-verify does the work, as in the reference, with the reference's configuration: LaTeX then plain
expressions, the first match of each side, and only the first parsed value of each compared (reference as
gold). It is an optional dependency (`pip install 'grpcgrade[math]'`): without it the grader answers every
sample with an error naming the package. math-verify bounds its parsing with SIGALRM timers of its own,
which would fight the service's per-sample timer in the same process, so here they are off and the
service's time limit bounds each sample instead (a TIMEOUT result where the reference would score 0.0).
"""

from __future__ import annotations

import logging
from typing import Any

from grpcgrade.core.errors import ErrorCode
from grpcgrade.grader import BaseGrader, GraderError, GraderScore

MISSING = "math_expression_verify needs the math-verify package: pip install 'grpcgrade[math]'"


class _TimedByTheService(logging.Filter):
    """math-verify warns once per process that its timeouts are off and that "you must provide the logic for
    timeout interruption yourself": the service does (each sample's time limit), so in an operator's log
    (every worker said it as it warmed up) the warning only misleads. Its other records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_TimedByTheService())


class MathExpressionVerifyGrader(BaseGrader):
    """1.0 when math-verify finds the response's first answer equal to the reference's, else 0.0 (also when
    either side has no parsable answer). `timeout_score` is what the reference gives when math-verify
    raises, which it practically never does (it catches its own errors)."""

    cache_by_default = True  # a symbolic check: the same inputs give the same score

    def __init__(self, timeout_score: float = 1.0) -> None:
        super().__init__()
        self.timeout_score = timeout_score

    def warm_up(self) -> None:
        self.evaluate("1", "1")  # imports math-verify and sympy (or answers that they are missing)

    def evaluate(self, response: str, reference_response: str) -> GraderScore | GraderError:  # type: ignore[override]
        try:
            from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify  # type: ignore[import-untyped]
        except ImportError:
            return GraderError(self.name, MISSING, code=ErrorCode.GRADER_FAILED)
        config: list[Any] = [LatexExtractionConfig(), ExprExtractionConfig()]
        options: dict[str, Any] = {
            "extraction_config": config,
            "extraction_mode": "first_match",
            "parsing_timeout": None,
        }
        try:
            gold = parse(reference_response, **options)
            pred = parse(response, **options)
            if gold and pred:
                score = 1.0 if verify(gold[0], pred[0], timeout_seconds=None) else 0.0
                reason = f"({gold}, {pred})"
            else:
                score = 0.0
                reason = f"Parsing failed - gold: {gold}, pred: {pred}"
        except Exception as exc:  # noqa: BLE001 - the reference's rule: any failure scores timeout_score
            score = self.timeout_score
            reason = f"Exception occurred: {exc}"
        return GraderScore(
            name=self.name,
            score=score,
            reason=reason,
            metadata={"response": response, "reference_response": reference_response, "score": score},
        )
