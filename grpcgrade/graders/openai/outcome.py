"""What running an OpenAI grader on one sample gives: a score or OpenAI's error flags, plus what to report.

The flags are the field names of OpenAI's `GraderRunResponse.metadata.errors`, so the HTTP endpoint answers
in OpenAI's shape and a gRPC result's metadata uses the same words. A failed grader never has a score: the
flags say what went wrong, `message` says it in words, and the service reports an error result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpcgrade.core.errors import ErrorCode

from .templating import MissingVariable, RenderedTooLong, SampleNotJson

# The boolean fields of OpenAI's `metadata.errors`, in the schema's order.
ERROR_FLAGS = (
    "formula_parse_error",
    "invalid_variable_error",
    "model_grader_parse_error",
    "model_grader_refusal_error",
    "model_grader_server_error",
    "other_error",
    "python_grader_runtime_error",
    "python_grader_server_error",
    "sample_parse_error",
    "truncated_observation_error",
    "unresponsive_reward_error",
)
# The error code of grpcgrade's result for each flag: the sample's fault, the grader's output, or a failure.
FLAG_CODES = {
    "invalid_variable_error": ErrorCode.INVALID_SAMPLE,
    "sample_parse_error": ErrorCode.INVALID_SAMPLE,
    "truncated_observation_error": ErrorCode.INVALID_SAMPLE,
    "formula_parse_error": ErrorCode.INVALID_RESULT,
    "model_grader_parse_error": ErrorCode.INVALID_RESULT,
    "model_grader_refusal_error": ErrorCode.INVALID_RESULT,
    "unresponsive_reward_error": ErrorCode.TIMEOUT,
    "python_grader_server_error": ErrorCode.SANDBOX_UNAVAILABLE,
}


@dataclass
class Outcome:
    """One grader's outcome on one sample; `sub` holds a multi grader's per-key outcomes."""

    score: float | None
    errors: tuple[str, ...] = ()
    message: str = ""
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> token counts
    sampled_model: str = ""
    sub: dict[str, Outcome] = field(default_factory=dict)

    @classmethod
    def fail(cls, flag: str, message: str) -> Outcome:
        assert flag in ERROR_FLAGS, flag
        return cls(None, (flag,), message)

    @property
    def ok(self) -> bool:
        return self.score is not None and not self.errors

    @property
    def code(self) -> ErrorCode:
        return next((FLAG_CODES[f] for f in self.errors if f in FLAG_CODES), ErrorCode.GRADER_FAILED)

    @property
    def sub_rewards(self) -> dict[str, float]:
        return {key: o.score for key, o in self.sub.items() if o.score is not None}

    @property
    def total_tokens(self) -> int | None:
        if not self.usage:
            return None
        return sum(int(u.get("total_tokens", 0)) for u in self.usage.values())


def add_usage(into: dict[str, dict[str, int]], model: str, usage: dict[str, Any]) -> None:
    """Sum a reply's token counts (the integer fields of the endpoint's `usage`) into `into[model]`."""
    counts = into.setdefault(model, {})
    for name, value in usage.items():
        if isinstance(value, int) and not isinstance(value, bool):
            counts[name] = counts.get(name, 0) + value


def render_failure(exc: Exception) -> Outcome:
    """The outcome of a template that could not be filled for this sample."""
    if isinstance(exc, SampleNotJson):
        return Outcome.fail("sample_parse_error", str(exc))
    if isinstance(exc, MissingVariable):
        return Outcome.fail("invalid_variable_error", str(exc))
    return Outcome.fail("other_error", str(exc))


#: What filling a template may raise for one sample (see `render_failure`).
RENDER_ERRORS = (SampleNotJson, MissingVariable, RenderedTooLong)
