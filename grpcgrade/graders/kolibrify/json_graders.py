"""Kolibrify's JSON graders: `json_valid` (the raw completion parses) and `json_schema` (object shape).

`json_valid` reads the raw completion, so a completion with a `<think>` block never parses; that is
Kolibrify's documented behaviour and is kept. `json_schema` reads the final answer when there is one,
accepts fenced blocks and Python literals at a 0.9 penalty, and checks only required/extra keys.
"""

from __future__ import annotations

import ast
import decimal
import json
import math
from collections.abc import Mapping
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.grader import BaseGrader, GraderScore

from .parsing import answer_or_completion, fenced_block, is_number, record_schema

RELAXED_PARSE_PENALTY = 0.9


def _required_keys(metadata: Any) -> list[Any] | None:
    """`metadata.expected_json_schema.required` when it is a list; anything else means no requirement."""
    if not isinstance(metadata, Mapping):
        return None
    schema = metadata.get("expected_json_schema")
    if not isinstance(schema, Mapping):
        return None
    required = schema.get("required")
    return required if isinstance(required, list) else None


class JsonValidGrader(BaseGrader):
    """1.0 when the raw completion is JSON holding every `expected_json_schema.required` key, else 0.0."""

    def __init__(self) -> None:
        super().__init__()

    def evaluate(self, response: str = "", metadata: Any = None, **kwargs: Any) -> GraderScore:
        try:
            parsed = json.loads(response or "")
        except (ValueError, RecursionError) as exc:
            return GraderScore(
                name=self.name,
                score=0.0,
                reason=f"not valid JSON: {exc}",
                metadata={"valid_json": False, "missing_keys": None},
            )
        required = _required_keys(metadata)
        missing: list[Any] = []
        if required is not None:
            # Kolibrify uses `key in parsed`: substring tests for strings, and any TypeError (a number,
            # null, an unhashable key) fails the whole check.
            try:
                missing = [key for key in required if key not in parsed]
            except TypeError:
                return GraderScore(
                    name=self.name,
                    score=0.0,
                    reason=f"valid JSON, but a {type(parsed).__name__} cannot hold the required keys",
                    metadata={"valid_json": True, "missing_keys": None},
                )
        return GraderScore(
            name=self.name,
            score=0.0 if missing else 1.0,
            reason=f"valid JSON missing required keys {missing}" if missing else "valid JSON",
            metadata={"valid_json": True, "missing_keys": missing},
        )


def _json_int(digits: str) -> int | decimal.Decimal:
    """A JSON integer; one past CPython's 4,300-digit limit on `int` is still valid JSON (a Decimal)."""
    try:
        return int(digits)
    except ValueError:
        return decimal.Decimal(digits)


def _loads(text: str) -> Any:
    return json.loads(text, parse_int=_json_int)


def _parse_relaxed(text: str) -> tuple[Any, float, str | None]:
    """(value, penalty, how): strict JSON at penalty 1.0; a fenced block or Python literal at 0.9.

    Only a JSON syntax error falls through to the relaxed parsers, as in Kolibrify; (None, 0.0, None)
    when nothing parses.
    """
    try:
        return _loads(text), 1.0, "json"
    except json.JSONDecodeError:
        pass
    candidate = fenced_block(text) or text
    try:
        return _loads(candidate), RELAXED_PARSE_PENALTY, "fenced json"
    except Exception:  # any failure moves on to the next parser, as in Kolibrify
        pass
    try:
        return ast.literal_eval(candidate), RELAXED_PARSE_PENALTY, "python literal"
    except Exception:
        return None, 0.0, None


def _shape_score(value: Any, schema: Mapping[str, Any]) -> tuple[float, list[Any], list[Any]]:
    """(score, missing keys, disallowed extra keys): any parsed value earns 0.5, the keys refine it."""
    if not isinstance(value, dict):
        return 0.5, [], []
    required = schema.get("required") or []
    if not isinstance(required, list):
        return 0.5, [], []
    required_set = set(required)
    keys = set(value)
    missing = [key for key in required if key not in keys]
    allow_additional = bool(schema.get("allow_additional_properties", True))
    extra = [] if allow_additional else [key for key in value if key not in required_set]
    if missing and extra:
        return 0.7, missing, extra
    if missing:
        return 0.8, missing, extra
    if extra:
        return 0.9, missing, extra
    return 1.0, missing, extra


class SchemaGrader(BaseGrader):
    """What `json_schema` and `xml_schema` share: the record schema (`metadata.schema`), the no-schema reward,
    and so their params and inputs; a subclass grades the answer against the schema (`against`)."""

    def __init__(self, reward_if_no_schema: float = 0.0) -> None:
        if not is_number(reward_if_no_schema) or not math.isfinite(reward_if_no_schema):
            raise InvalidParams("reward_if_no_schema", "must be a finite number")
        super().__init__()
        self.reward_if_no_schema = float(reward_if_no_schema)

    def no_schema_result(self) -> GraderScore:
        return GraderScore(
            name=self.name,
            score=self.reward_if_no_schema,
            reason="no metadata.schema JSON string; reward_if_no_schema applies",
            metadata={"schema_found": False},
        )

    def evaluate(self, response: str = "", metadata: Any = None, **kwargs: Any) -> GraderScore:
        schema = record_schema(metadata)
        if schema is None:
            return self.no_schema_result()
        return self.against(response or "", schema)

    def against(self, response: str, schema: Mapping[str, Any]) -> GraderScore:
        """The answer in `response` graded against the record's `schema`."""
        raise NotImplementedError


class JsonSchemaGrader(SchemaGrader):
    """Shape check against `metadata.schema` (a JSON string): required keys, optional no-extra-keys rule."""

    def against(self, response: str, schema: Mapping[str, Any]) -> GraderScore:
        value, penalty, how = _parse_relaxed(answer_or_completion(response))
        if value is None:
            # Kolibrify cannot tell a parsed `null` / `None` from a failed parse: both score 0.
            return GraderScore(
                name=self.name,
                score=0.0,
                reason="the answer is neither JSON nor a Python literal" if how is None else "the answer is null",
                metadata={"schema_found": True, "parsed_as": how},
            )
        shape, missing, extra = _shape_score(value, schema)
        if not isinstance(value, dict):
            detail = f"parsed a {type(value).__name__}, not an object"
        elif shape == 1.0:
            detail = "all required keys, no disallowed keys"
        else:
            detail = f"missing keys {missing}, disallowed keys {extra}"
        if penalty != 1.0:
            detail += f"; parsed as {how} (x{RELAXED_PARSE_PENALTY})"
        return GraderScore(
            name=self.name,
            score=shape * penalty,
            reason=detail,
            metadata={
                "schema_found": True,
                "parsed_as": how,
                "missing_keys": missing,
                # A Python-literal dict may have keys JSON cannot carry (bytes, tuples): report their repr.
                "extra_keys": [key if isinstance(key, str) else repr(key) for key in extra],
            },
        )
