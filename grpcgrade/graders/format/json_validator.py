"""JSON validity: does `json.loads` accept the response? (OpenJudge `JsonValidatorGrader`, 0.2.4)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grpcgrade.grader import BaseGrader, GraderScore

# Every way `json.loads` rejects a text without the process being in trouble: JSONDecodeError is a
# ValueError, so is CPython's 4300-digit limit on integers, nesting deeper than the interpreter's
# recursion limit is a RecursionError, and a non-str argument is a TypeError. The format family treats
# all of them as "not valid JSON", so hostile input scores 0 instead of failing the sample.
JSON_PARSE_ERRORS = (ValueError, TypeError, RecursionError)


class JsonValidatorGrader(BaseGrader):
    """Scores 1.0 when the response parses as JSON, 0.0 otherwise.

    Python's parser is the yardstick on purpose (as in the reference): NaN/Infinity, duplicate keys,
    surrounding whitespace and top-level scalars are accepted; an empty string, single quotes and
    trailing commas are not. Failures other than a JSONDecodeError (too deep, too many digits) are
    reported as the reference does, with an "Unexpected error: ..." message.
    """

    bounded_cost = True  # one parse, linear in the response (CPython caps integer digits and nesting)

    def __init__(self) -> None:
        super().__init__()

    def score_column(self, response: Sequence[str]) -> list[float]:
        """`evaluate`'s scores for a chunk's responses, without a result object per sample."""
        out: list[float] = []
        append, loads = out.append, json.loads
        for text in response:
            try:
                loads(text)
            except JSON_PARSE_ERRORS:
                append(0.0)
            else:
                append(1.0)
        return out

    def evaluate(self, response: str = "", **kwargs: Any) -> GraderScore:
        if not isinstance(response, str):
            return self._invalid(f"Invalid input type: expected str, got {type(response).__name__}", 0)
        try:
            json.loads(response)
        except json.JSONDecodeError as e:
            return self._invalid(f"JSON decode error: {e}", len(response))
        except JSON_PARSE_ERRORS as e:
            return self._invalid(f"Unexpected error: {e}", len(response))
        return GraderScore(
            name=self.name,
            score=1.0,
            reason="Valid JSON",
            metadata={"is_valid": True, "response_length": len(response)},
        )

    def _invalid(self, message: str, length: int) -> GraderScore:
        return GraderScore(
            name=self.name,
            score=0.0,
            reason=message,
            metadata={"is_valid": False, "error_message": message, "response_length": length},
        )
