"""Length penalty (OpenJudge `LengthPenaltyGrader`, py-openjudge 0.2.4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpcgrade.grader import BaseGrader, GraderScore


class LengthPenaltyGrader(BaseGrader):
    """Penalises each character outside [min_length, max_length] by `penalty_rate`; 0.0 inside.

    Lengths are Python code points (a CJK character counts 1), the bounds are inclusive and the
    penalty is not clamped, as in the reference; the arithmetic is written in the reference's order
    so float artefacts (e.g. -0.30000000000000004) come out bit for bit. Parameters are taken as
    given, like the reference: a min above the max simply makes every length a violation.
    """

    bounded_cost = True  # a length and a product

    def __init__(self, min_length: int = 10, max_length: int = 1000, penalty_rate: float = 0.01) -> None:
        super().__init__()
        self.min_length = min_length
        self.max_length = max_length
        self.penalty_rate = penalty_rate

    def score_column(self, response: Sequence[str]) -> list[float]:
        """`evaluate`'s scores for a chunk's responses, without a result object per sample."""
        low, high, rate = self.min_length, self.max_length, self.penalty_rate
        out: list[float] = []
        for text in response:
            length = len(text)
            if length < low:
                out.append(-(low - length) * rate)
            elif length > high:
                out.append(-(length - high) * rate)
            else:
                out.append(0.0)
        return out

    def evaluate(self, response: str = "", **kwargs: Any) -> GraderScore:
        length = len(response)
        penalty = 0.0
        if length < self.min_length:
            penalty = -(self.min_length - length) * self.penalty_rate
            reason = f"Too short: {length} < {self.min_length}"
        elif length > self.max_length:
            penalty = -(length - self.max_length) * self.penalty_rate
            reason = f"Too long: {length} > {self.max_length}"
        else:
            reason = f"Length acceptable: {self.min_length} <= {length} <= {self.max_length}"
        return GraderScore(
            name=self.name,
            score=penalty,
            reason=reason,
            metadata={
                "length": length,
                "min_length": self.min_length,
                "max_length": self.max_length,
                "penalty": penalty,
            },
        )
