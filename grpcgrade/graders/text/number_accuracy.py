"""Numerical accuracy: the numbers of the response against the reference's, position by position.

Reference: OpenJudge `NumberAccuracyGrader` (py-openjudge 0.2.4), with one deliberate difference (D4):
the reference's number pattern `-?\\d+\\.?\\d*` reads `1,000` as the two numbers 1 and 0 and `1e5` as 1
and 5. Here a number is either comma-grouped (`-?\\d{1,3}(,\\d{3})+(\\.\\d+)?`, the commas being
thousands separators) or plain with an optional exponent (`-?\\d+(\\.\\d+)?([eE][-+]?\\d+)?`), found
left to right as `re.findall` finds D4's two alternatives: `12,3456` reads as 12345 then 6, exactly as D4's
pattern reads it. Everything else (positional comparison, the
score denominator, reasons and metadata) is the reference's.
"""

from __future__ import annotations

import math
import re
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.grader import BaseGrader, GraderScore

# The leading lookahead only skips positions where no number can start; it makes the scan faster than the
# reference's simpler pattern (Python's engine otherwise tries both branches at every character).
_NUMBER = re.compile(r"(?=[-\d])-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def extract_numbers(text: str) -> list[float]:
    """The numbers of `text` in order of appearance."""
    return [float(number.replace(",", "")) for number in _NUMBER.findall(text)]


class NumberAccuracyGrader(BaseGrader):
    """Fraction of the reference's numbers that the response reproduces at the same position."""

    #: Compares the response with the reference: a sample without either is INVALID_SAMPLE, not a match of
    #: two empty texts.
    required_inputs = frozenset(("response", "reference_response"))

    def __init__(self, tolerance: float = 1e-6) -> None:
        super().__init__()
        if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
            raise InvalidParams("tolerance", f"must be a finite number >= 0, got {tolerance!r}")
        self.tolerance = tolerance

    def evaluate(self, response: str = "", reference_response: str = "", **kwargs: Any) -> GraderScore:
        response_numbers = extract_numbers(response)
        reference_numbers = extract_numbers(reference_response)
        numbers = {"response_numbers": response_numbers, "reference_response_numbers": reference_numbers}
        if not reference_numbers:
            return GraderScore(
                name=self.name, score=0.0, reason="No reference_response numbers to compare", metadata=numbers
            )
        if not response_numbers:
            return GraderScore(
                name=self.name, score=0.0, reason="No numbers found in response content", metadata=numbers
            )

        # zip stops at the shorter list: extra response numbers are ignored, missing ones count as wrong.
        correct = sum(abs(a - b) <= self.tolerance for a, b in zip(response_numbers, reference_numbers, strict=False))
        total = len(reference_numbers)
        accuracy = correct / total
        return GraderScore(
            name=self.name,
            score=accuracy,
            reason=f"Number accuracy: {correct}/{total} numbers correct",
            metadata={
                "accuracy": accuracy,
                "correct_numbers": correct,
                "total_reference_response_numbers": total,
                **numbers,
                "tolerance": self.tolerance,
            },
        )
