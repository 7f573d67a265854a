"""Kolibrify's `category_match`: graded credit for a categorical label."""

from __future__ import annotations

from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.grader import BaseGrader, GraderScore

from .parsing import answer_or_completion


class CategoryMatchGrader(BaseGrader):
    """1.0 exact, 0.8 case-insensitive, 0.5 contained, 0.3 another allowed category, else 0.0.

    The expected category is the reference, or the sample's `expected_category` when the reference
    is empty (Kolibrify: `record["answer"] or record["expected_category"]`).
    """

    def __init__(self, allowed_categories: list[str] | None = None) -> None:
        if allowed_categories is None:
            raise InvalidParams("allowed_categories", "required: the list of valid category labels")
        if not isinstance(allowed_categories, (list, tuple)) or not all(
            isinstance(category, str) for category in allowed_categories
        ):
            raise InvalidParams("allowed_categories", "must be a list of strings")
        super().__init__()
        self.allowed_categories = list(allowed_categories)
        self._allowed_lower = {category.lower() for category in self.allowed_categories}

    def evaluate(
        self, response: str = "", reference: str = "", expected_category: Any = None, **kwargs: Any
    ) -> GraderScore:
        answer = answer_or_completion(response or "").strip()
        expected = reference or expected_category
        if not expected or not answer:
            return GraderScore(
                name=self.name,
                score=0.0,
                reason="no expected category" if not expected else "empty response",
                metadata={"expected": str(expected) if expected else None},
            )
        expected = str(expected)
        score, reason = self._tier(answer, expected)
        return GraderScore(
            name=self.name,
            score=score,
            reason=reason,
            metadata={"expected": expected},
        )

    def _tier(self, answer: str, expected: str) -> tuple[float, str]:
        if answer == expected:
            return 1.0, "exact match"
        answer_lower, expected_lower = answer.lower(), expected.lower()
        if answer_lower == expected_lower:
            return 0.8, "match ignoring case"
        if expected_lower in answer_lower:
            return 0.5, "expected category contained in a longer answer"
        if answer_lower in self._allowed_lower:
            return 0.3, "a different allowed category"
        return 0.0, "not the expected category nor an allowed one"
