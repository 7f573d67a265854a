"""Kolibrify's `math_exact`: the final answer contains the gold number, compared as a string.

The comparison is deliberately textual, as in Kolibrify: `72.0` does not match `72`, `-72` does not
match `72`, and `1,072` is read as `1` and `072`. Any number in the answer may match.
"""

from __future__ import annotations

from typing import Any

from grpcgrade.grader import BaseGrader, GraderScore

from .parsing import NUMBER_RE, final_answer, no_answer


class MathExactGrader(BaseGrader):
    """1.0 when a number after `<think>...</think>` (both tags needed) is the reference's first number, else 0.

    The final answer is the text after `</think>`; without both tags there is none, and the score is 0."""

    #: Compares the response with the reference: a sample without either is INVALID_SAMPLE, not a match of
    #: two empty texts.
    required_inputs = frozenset(("response", "reference"))

    def __init__(self) -> None:
        super().__init__()

    def evaluate(self, response: str = "", reference: str = "", **kwargs: Any) -> GraderScore:
        answer = final_answer(response or "")
        if answer is None:
            return no_answer(self.name, gold=None, numbers_in_answer=0)
        numbers = NUMBER_RE.findall(answer)
        gold_match = NUMBER_RE.search(reference or "")
        gold = gold_match.group(0) if gold_match else None
        matched = gold is not None and gold in numbers
        if gold is None:
            reason = "the reference contains no number"
        elif matched:
            reason = f"the final answer contains {gold}"
        else:
            reason = f"none of the {len(numbers)} number(s) in the final answer is {gold}"
        return GraderScore(
            name=self.name,
            score=1.0 if matched else 0.0,
            reason=reason,
            metadata={"answer_found": True, "gold": gold, "numbers_in_answer": len(numbers)},
        )
