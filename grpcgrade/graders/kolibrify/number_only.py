"""Kolibrify's `number_only`: rewards a final answer that is a bare number, in steps of 10 characters."""

from __future__ import annotations

from typing import Any

from grpcgrade.grader import BaseGrader, GraderScore

from .parsing import NO_ANSWER, NUMBER_RE, final_answer

# (extra characters below, reward), checked in order; 0 extra characters scores 1.0, 50 or more 0.0.
_TIERS = ((10, 0.5), (20, 0.4), (30, 0.3), (40, 0.2), (50, 0.1))


def _tier(extra_chars: int) -> float:
    if extra_chars == 0:
        return 1.0
    for below, reward in _TIERS:
        if extra_chars < below:
            return reward
    return 0.0


class NumberOnlyGrader(BaseGrader):
    """1.0 when the final answer is a bare number, less in tiers as other characters join it (0.0 at 50).

    Counts every character of the final answer except its first number (other numbers count too).
    """

    def __init__(self) -> None:
        super().__init__()

    def evaluate(self, response: str = "", **kwargs: Any) -> GraderScore:
        answer = final_answer(response or "")
        match = NUMBER_RE.search(answer) if answer is not None else None
        if answer is None or match is None:
            return GraderScore(
                name=self.name,
                score=0.0,
                reason=NO_ANSWER if answer is None else "no number in the final answer",
                metadata={"answer_found": answer is not None, "number": None, "extra_chars": None},
            )
        extra_chars = len(answer) - len(match.group(0))
        return GraderScore(
            name=self.name,
            score=_tier(extra_chars),
            reason=f"number {match.group(0)} with {extra_chars} other character(s)",
            metadata={"answer_found": True, "number": match.group(0), "extra_chars": extra_chars},
        )
