"""`tool_call_valid`: are the response's tool calls calls of the offered tools, with arguments their JSON Schemas
accept?

The `jsonschema` library validates (draft 2020-12, the dialect OpenAI's and MCP's tool parameters use), not
hand-written checks: it covers the whole vocabulary (`$ref`, `oneOf`, `additionalProperties`...) and names
the failing path. A schema that is itself invalid is the sample's INVALID_SAMPLE, never a score. Schemas and
calls come from clients, so the grader runs in a worker under the per-sample time limit (a catastrophic
`pattern` is cut by the watchdog), never inline. Nothing is fetched: `$ref` resolves only inside the schema,
through a registry whose retrieval refuses every URI (jsonschema's default would still download an `http`
reference), and an unresolvable reference is the sample's INVALID_SAMPLE.

Partial credit, per call: 1 when its name is a defined tool and its arguments validate; 0.5 when the tool
exists but the arguments are not a JSON object or break the schema; 0 when no tool has its name. The score is
the mean over the calls (`partial_credit=False`: 1.0 only when every call scores 1, else 0.0), and
`score_without_calls` when there are none.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.exceptions import best_match
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

from grpcgrade.core.errors import ErrorCode
from grpcgrade.grader import BaseGrader, GraderError, GraderScore

NAME_ONLY = 0.5


def _refuse(uri: str) -> Any:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class: mypy sees no field


#: Resolves `$ref` only within the schema at hand: nothing is read from the network or the disk.
OFFLINE: Registry[Any] = Registry(retrieve=_refuse)  # type: ignore[call-arg]  # attrs again


class BadDefinitions(ValueError):
    """The sample's tool definitions cannot be read (reported as INVALID_SAMPLE)."""


def _function(item: Any) -> dict[str, Any]:
    """The function object of an OpenAI tool (`{"type": "function", "function": {...}}`) or a bare function."""
    if not isinstance(item, dict):
        raise BadDefinitions(f"a tool definition must be an object, got {type(item).__name__}")
    function = item.get("function", item)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadDefinitions("a tool definition needs a function with a string `name`")
    return function


def validators(tool_definitions: Any) -> dict[str, Draft202012Validator]:
    """One validator per defined tool, its `parameters` schema checked first; BadDefinitions otherwise."""
    if not isinstance(tool_definitions, list):
        raise BadDefinitions(f"tool_definitions must be a list, got {type(tool_definitions).__name__}")
    out = {}
    for item in tool_definitions:
        function = _function(item)
        schema = function.get("parameters", {})
        if not isinstance(schema, dict | bool):
            raise BadDefinitions(f"tool {function['name']!r}: `parameters` must be a JSON Schema object")
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise BadDefinitions(f"tool {function['name']!r}: invalid JSON Schema: {exc.message}") from None
        out[function["name"]] = Draft202012Validator(schema, registry=OFFLINE)
    return out


def _call_parts(call: Any) -> tuple[Any, Any]:
    """(name, arguments) of an OpenAI tool call (`function.arguments` as JSON text) or a flat call."""
    if not isinstance(call, dict):
        return None, None
    function = call.get("function", call)
    if not isinstance(function, dict):
        return None, None
    return function.get("name"), function.get("arguments", {})


def check_call(call: Any, tools: dict[str, Draft202012Validator]) -> tuple[float, str]:
    """One call's credit and why."""
    name, arguments = _call_parts(call)
    if not isinstance(name, str) or name not in tools:
        return 0.0, f"no tool named {name!r}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            return NAME_ONLY, f"{name}: arguments are not JSON ({exc})"
    if not isinstance(arguments, dict):
        return NAME_ONLY, f"{name}: arguments are not a JSON object"
    error = best_match(tools[name].iter_errors(arguments))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "(root)"
        return NAME_ONLY, f"{name}: {where}: {error.message}"
    return 1.0, f"{name}: valid"


class ToolCallValidGrader(BaseGrader):
    """The share of the sample's tool calls that name a defined tool with arguments its JSON Schema accepts
    (half credit for a defined tool with bad arguments; see docs/agents.md)."""

    def __init__(self, partial_credit: bool = True, score_without_calls: float = 0.0) -> None:
        super().__init__()
        self.partial_credit = partial_credit
        self.score_without_calls = score_without_calls

    def evaluate(self, tool_calls: Any, tool_definitions: Any) -> GraderScore | GraderError:  # type: ignore[override]
        try:
            tools = validators(tool_definitions)
        except BadDefinitions as exc:
            return GraderError(self.name, str(exc), code=ErrorCode.INVALID_SAMPLE)
        if not isinstance(tool_calls, list):
            return GraderError(self.name, "tool_calls must be a list", code=ErrorCode.INVALID_SAMPLE)
        if not tool_calls:
            return GraderScore(self.name, self.score_without_calls, "no tool calls", {"calls": []})
        try:
            checked = [check_call(call, tools) for call in tool_calls]
        except Unresolvable as exc:
            return GraderError(self.name, f"unresolvable $ref in a tool's schema: {exc}", code=ErrorCode.INVALID_SAMPLE)
        credits = [credit for credit, _ in checked]
        valid = sum(1 for c in credits if c == 1.0)
        score = sum(credits) / len(credits) if self.partial_credit else float(valid == len(credits))
        return GraderScore(
            self.name,
            score,
            f"{valid}/{len(credits)} tool calls valid; " + "; ".join(why for _, why in checked),
            {"calls": [{"credit": c, "reason": why} for c, why in checked]},
        )
