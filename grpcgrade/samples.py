"""A sample's fields as grader keyword arguments, and the per-sample checks that come first.

A sample that breaks a limit or whose `extra` collides with a standard field gets an error result for
every grader; the other samples of the batch are graded as usual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .grader import Inputs

STANDARD_FIELDS = ("query", "response", "reference", "context")
REFERENCE_ALIASES = ("reference_response", "ground_truth")
RESERVED = frozenset((*STANDARD_FIELDS, "responses", *REFERENCE_ALIASES))


@dataclass(frozen=True)
class Limits:
    """Request limits; the defaults suit thousands of completions per call."""

    max_message_bytes: int = 64 * 1024 * 1024
    max_samples_per_batch: int = 100_000
    max_field_chars: int = 1_000_000
    max_graders_per_request: int = 64


class SampleProblem(ValueError):
    """This sample cannot be graded at all; every grader reports it as INVALID_SAMPLE."""


def check_field(name: str, value: str, limits: Limits) -> None:
    if len(value) > limits.max_field_chars:
        raise SampleProblem(
            f"field {name!r} has {len(value)} characters, over the limit max_field_chars={limits.max_field_chars}"
        )


def build_kwargs(fields: dict[str, str], responses: list[str], extra: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """All the keyword arguments a grader could ask for; `select` then keeps what each grader declares.

    `fields` becomes the result (no copy: this runs once per sample on the hot path).
    """
    cap = limits.max_field_chars
    for name, value in fields.items():
        if len(value) > cap:
            check_field(name, value, limits)
    for i, value in enumerate(responses):
        check_field(f"responses[{i}]", value, limits)
    if extra:
        clash = RESERVED.intersection(extra)
        if clash:
            raise SampleProblem(f"extra key {sorted(clash)[0]!r} collides with a standard sample field")
        fields.update(extra)
    fields["responses"] = responses
    return fields


def select(kwargs: dict[str, Any], inputs: Inputs) -> dict[str, Any]:
    """What one grader receives: all fields for `**kwargs` graders, else only the names it declares.

    `reference` is also offered as `reference_response` and `ground_truth` (the seeds' names) to graders
    that name those.
    """
    aliases = [a for a in REFERENCE_ALIASES if a in inputs.names]
    if inputs.open and not aliases:
        return kwargs  # shared between graders: safe, since `evaluate(**kwargs)` gets a fresh dict
    out = dict(kwargs) if inputs.open else {k: v for k, v in kwargs.items() if k in inputs.names}
    for alias in aliases:
        out[alias] = kwargs["reference"]
    return out
