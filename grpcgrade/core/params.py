"""Grader params: the schema read from a factory's signature, request values coerced to it, and the ranges
numeric params may take.

ListGraders shows each grader's params (name, type, default, required) as its factory declares them, so a
plugin author writes an ordinary typed `__init__` and never a schema. A request's params arrive as JSON
(a protobuf Struct, with one number type): each value is given the Python type its factory declares, or
refused with InvalidParams naming the param, before any grader is built.

A request chooses every param of the graders it names, so every number is bounded: a grader declares a
param's range with `Annotated[int, Range(1, 10)]`; a number with no declared range still has to lie in
the default one, which keeps n-gram orders, lengths and counts from sizing tables of gigabytes. A value
outside its range is refused with INVALID_ARGUMENT naming the param and the range.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpcgrade.grader import FunctionGrader

from .errors import InvalidParams
from .samples import INPUT_FIELDS

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


@dataclass(frozen=True)
class ParamInfo:
    name: str
    type: str
    default: Any = None
    required: bool = False


def signature_source(factory: Callable[..., Any]) -> tuple[Callable[..., Any], set[str]]:
    """The callable whose parameters are the grader's params, and names that are not params."""
    if isinstance(factory, functools.partial) and isinstance(factory.func, type):
        if issubclass(factory.func, FunctionGrader) and factory.args:
            return factory.args[0], set(INPUT_FIELDS) | set(factory.keywords)
        return factory.func.__init__, set(factory.keywords)  # type: ignore[misc]  # a class's own __init__
    if isinstance(factory, type):
        return factory.__init__, set()  # type: ignore[misc]
    return factory, set()


def _type_name(hint: Any) -> str:
    hint = unannotated(hint)
    if hint is inspect.Parameter.empty:
        return "any"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool, list, dict)) or value is None:
        return value
    return str(getattr(value, "value", value))


def describe_params(factory: Callable[..., Any]) -> tuple[list[ParamInfo], bool, dict[str, Any]]:
    source, skip = signature_source(factory)
    try:
        sig = inspect.signature(source)
        hints = typing.get_type_hints(source, include_extras=True)
    except (TypeError, ValueError, NameError):
        return [], True, {}
    params, open_params = [], False
    for p in sig.parameters.values():
        if p.name in ("self", "name", "mode", "description") or p.name in skip:
            continue
        if p.kind is p.VAR_KEYWORD:
            open_params = True
            continue
        if p.kind is p.VAR_POSITIONAL:
            continue
        hint = hints.get(p.name, p.annotation)
        required = p.default is p.empty
        params.append(ParamInfo(p.name, _type_name(hint), None if required else _jsonable(p.default), required))
    return params, open_params, hints


def _base_types(hint: Any) -> set[type]:
    hint = unannotated(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_base_types(a) for a in typing.get_args(hint)))
    return {origin or hint} if isinstance(origin or hint, type) else set()


def coerce_value(param: str, value: Any, hint: Any) -> Any:
    """JSON (protobuf Struct) has one number type; give each param the Python type its factory declares,
    within its range."""
    value = _typed(param, value, hint)
    check_number(param, value, hint)
    return value


def _typed(param: str, value: Any, hint: Any) -> Any:
    wanted = _base_types(hint) if hint is not None else set()
    if isinstance(value, float) and int in wanted and float not in wanted:
        if not value.is_integer():
            raise InvalidParams(param, f"must be an integer, got {shown(value)}")
        return int(value)
    if isinstance(value, list) and tuple in wanted and list not in wanted:
        return tuple(value)
    if isinstance(value, float) and not wanted and value.is_integer():
        return int(value)
    if wanted and not isinstance(value, tuple(wanted)) and not (float in wanted and isinstance(value, int)):
        names = " or ".join(sorted("null" if t is type(None) else t.__name__ for t in wanted))
        raise InvalidParams(param, f"must be {names}, got {type(value).__name__} {shown(value)}")
    return value
