"""Response type checks after Audacia's format evaluators (`llm_eval/evaluators/format.py`).

Audacia checks Python objects with `isinstance`; over the wire a response is always text, so the text is
first read as JSON, else as a Python literal, else taken as the string it is. The detected type is
reported in metadata `format` using these names:

    ===========  =============================================  =========================================
    `format`     detected value                                 accepted by `expected_type`
    ===========  =============================================  =========================================
    ``dict``     JSON object / Python dict                      ``dict``, ``object``
    ``list``     JSON array / Python list                       ``list``, ``array``
    ``str``      JSON string, Python str literal, or any text   ``str``, ``string``
                 that is neither JSON nor a Python literal
    ``int``      integer (never a boolean)                      ``int``, ``float``, ``number``
    ``float``    non-integer number, NaN, Infinity              ``float``, ``number``
    ``bool``     ``true``/``false``/``True``/``False``          ``bool``, ``boolean``
    ``null``     ``null``/``None``                              ``null``
    other        Python type name of other literals: ``tuple``,  nothing
                 ``set``, ``complex``, ``bytes``
    ===========  =============================================  =========================================

Two choices differ from Python's `isinstance` on purpose: a boolean is not an `int` (JSON keeps the two
apart; that bool subclasses int is a Python implementation detail), and `float`/`number` accept integers
(JSON has one number type; `3` is as much a number as `3.0`).
"""

from __future__ import annotations

import ast
import json
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.grader import BaseGrader, GraderScore

from .json_validator import JSON_PARSE_ERRORS

_ACCEPTED_FORMATS = {
    "dict": frozenset({"dict"}),
    "object": frozenset({"dict"}),
    "list": frozenset({"list"}),
    "array": frozenset({"list"}),
    "str": frozenset({"str"}),
    "string": frozenset({"str"}),
    "int": frozenset({"int"}),
    "float": frozenset({"float", "int"}),
    "number": frozenset({"float", "int"}),
    "bool": frozenset({"bool"}),
    "boolean": frozenset({"bool"}),
    "null": frozenset({"null"}),
}

# Longer text is never handed to the Python parser: its syntax tree for a few megabytes of literal would
# take gigabytes. Such text, when it is not JSON either, counts as a plain string.
MAX_LITERAL_CHARS = 100_000

# How `ast.literal_eval` rejects text: not a literal (ValueError, TypeError), not Python (SyntaxError),
# or too deep or too large for the parser and compiler (RecursionError, MemoryError).
_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, RecursionError, MemoryError)

# isinstance order matters: bool before int.
_FORMAT_NAMES = ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (dict, "dict"), (list, "list"))


def format_name(value: Any) -> str:
    """The `format` name of a value (see the module docstring)."""
    if value is None:
        return "null"
    for kind, name in _FORMAT_NAMES:
        if isinstance(value, kind):
            return name
    return type(value).__name__


def read_value(text: str) -> Any:
    """The response as a value: JSON first (so `true`/`null` are JSON's), then a Python literal, then text."""
    try:
        return json.loads(text)
    except JSON_PARSE_ERRORS:
        pass
    if len(text) <= MAX_LITERAL_CHARS:
        try:
            return ast.literal_eval(text)
        except _LITERAL_ERRORS:
            pass
    return text


def _result(name: str, passed: bool, reason: str, metadata: dict[str, Any]) -> GraderScore:
    return GraderScore(
        name=name,
        score=1.0 if passed else 0.0,
        reason=reason,
        metadata={**metadata, "result": "pass" if passed else "fail"},
    )


class CustomResponseGrader(BaseGrader):
    """1.0 when the response reads as a value of `expected_type`, 0.0 otherwise (Audacia's
    `RunCustomResponseEvaluator`).

    Metadata: `format` (detected type name), `expected_type` (as given, lower-cased) and `result`
    ("pass"/"fail").
    """

    def __init__(self, expected_type: str = "dict") -> None:
        super().__init__()
        self.expected_type = str(expected_type).strip().lower()
        if self.expected_type not in _ACCEPTED_FORMATS:
            raise InvalidParams(
                "expected_type", f"unknown type {expected_type!r}; allowed: {', '.join(_ACCEPTED_FORMATS)}"
            )
        self._accepted = _ACCEPTED_FORMATS[self.expected_type]

    def evaluate(self, response: Any = "", **kwargs: Any) -> GraderScore:
        # A non-text response (a direct in-process call) is checked as the object it is, as Audacia does.
        found = format_name(read_value(response) if isinstance(response, str) else response)
        passed = found in self._accepted
        if passed:
            reason = f"Response format {found} matches expected type {self.expected_type}"
        else:
            reason = (
                "Evaluation failed: output type of response not the expected format "
                f"(expected {self.expected_type}, got {found})"
            )
        return _result(self.name, passed, reason, {"format": found, "expected_type": self.expected_type})


class JsonResponseGrader(BaseGrader):
    """1.0 when `json.loads` gives an object (dict), 0.0 otherwise (Audacia's `RunJsonResponseEvaluator`).

    Metadata `format` is the parsed value's type name, or, when the response does not parse, the type
    name of the response itself (`str` for text), which is what Audacia reports; `result` is
    "pass"/"fail".
    """

    def __init__(self) -> None:
        super().__init__()

    def evaluate(self, response: Any = "", **kwargs: Any) -> GraderScore:
        try:
            value = json.loads(response)
        except JSON_PARSE_ERRORS as e:
            reason = f"Evaluation failed: output is not a valid JSON format ({type(e).__name__}: {e})"
            return _result(self.name, False, reason, {"format": format_name(response)})
        found = format_name(value)
        if found == "dict":
            return _result(self.name, True, "Response is a valid JSON object", {"format": found})
        reason = f"Evaluation failed: output is not a valid JSON format (a JSON {found}, not an object)"
        return _result(self.name, False, reason, {"format": found})
