"""The ranges numeric grader params may take, declared once per param and checked where params are coerced.

A request chooses every param of the graders it names, so every number is bounded: a grader declares a
param's range with `Annotated[int, Range(1, 10)]`; a number with no declared range still has to lie in
the default one, which keeps n-gram orders, lengths and counts from sizing tables of gigabytes. A value
outside its range is refused with INVALID_ARGUMENT naming the param and the range.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Any

from .errors import InvalidParams

#: How much of a value a message (an INVALID_ARGUMENT detail, a log line) repeats back.
SHOWN_VALUE_CHARS = 80
#: The largest JSON form of one grader's params a request may send: rubrics and patterns fit, megabytes do not.
MAX_PARAMS_BYTES = 64 * 1024


@dataclass(frozen=True)
class Range:
    """Inclusive bounds of a numeric param: `Annotated[int, Range(1, 10)]`."""

    low: float
    high: float

    def check(self, param: str, value: float) -> None:
        if not (math.isfinite(value) and self.low <= value <= self.high):
            raise InvalidParams(param, f"must be from {self.low:g} to {self.high:g}, got {shown(value)}")


#: The range of an integer param that declares none: counts, lengths and orders, with room to spare.
DEFAULT_INT_RANGE = Range(-1_000_000, 1_000_000)
#: The range of a float param that declares none: finite, and far from overflowing in a product.
DEFAULT_FLOAT_RANGE = Range(-1e9, 1e9)


def shown(value: Any) -> str:
    """`repr(value)`, cut to `SHOWN_VALUE_CHARS`: a message never echoes megabytes."""
    text = repr(value)
    if len(text) <= SHOWN_VALUE_CHARS:
        return text
    return f"{text[:SHOWN_VALUE_CHARS]}... ({len(text)} characters)"


def declared_range(hint: Any) -> Range | None:
    """The `Range` in an `Annotated[...]` hint, if any."""
    if typing.get_origin(hint) is typing.Annotated:
        return next((m for m in hint.__metadata__ if isinstance(m, Range)), None)
    return None


def unannotated(hint: Any) -> Any:
    """The type under an `Annotated[...]` hint."""
    return typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint


def check_number(param: str, value: Any, hint: Any) -> None:
    """Refuse a number outside the param's declared range, or the default one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    bounds = declared_range(hint)
    if bounds is None:
        bounds = DEFAULT_INT_RANGE if isinstance(value, int) else DEFAULT_FLOAT_RANGE
    bounds.check(param, value)
