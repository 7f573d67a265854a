"""A sample's fields as grader keyword arguments, and the per-sample checks that come first.

A sample that breaks a limit or whose `extra` collides with a standard field gets an error result for
every grader; the other samples of the batch are graded as usual.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from grpcgrade.grader import Inputs

from .errors import SampleProblem

#: The text fields of a `Sample`; a grader receives each one it names.
TEXT_FIELDS = ("query", "response", "reference", "context")
#: Every field of a `Sample` message but `extra`: what a client's sample dict maps onto the message.
SAMPLE_FIELDS = ("id", *TEXT_FIELDS, "responses")
#: Other names for `reference` (OpenJudge's and Kolibrify's), offered to graders that declare them.
REFERENCE_ALIASES = ("reference_response", "ground_truth")
REFERENCE_ALIASES_SET = frozenset(REFERENCE_ALIASES)
#: The names a grader may declare for the sample's own fields; an `extra` key may not take one.
INPUT_FIELDS = frozenset((*TEXT_FIELDS, "responses", *REFERENCE_ALIASES))
#: The agent inputs (docs/agents.md): JSON lists in the OpenAI chat format, a grader input only when the sample
#: sets them. Before they had Sample fields of their own they travelled in `extra`, which still works: an
#: `extra` key of one of these names is refused only when the sample also sets the field.
AGENT_FIELDS = ("messages", "tool_calls", "tool_definitions")
AGENT_FIELDS_SET = frozenset(AGENT_FIELDS)


#: What a sample carries under each name a grader may require: the aliases are its `reference`.
_CARRIED_AS = {alias: "reference" for alias in REFERENCE_ALIASES}


def requirements(inputs: Iterable[tuple[str, Inputs]]) -> dict[str, str]:
    """Each input the graders (name, declared inputs) require, as the sample carries it, with the first
    grader that requires it: what a sample must carry to be graded by all of them."""
    out: dict[str, str] = {}
    for name, declared in inputs:
        for needed in sorted(declared.required):
            out.setdefault(_CARRIED_AS.get(needed, needed), name)
    return out


def missing_input(carried: Iterable[str], required: dict[str, str]) -> SampleProblem | None:
    """The problem of a sample that lacks a required input (None when it has them all): it names the input,
    the grader that reads it and the keys the sample did carry, which is usually the fix (a dataset's
    `answer` column meant as `reference`)."""
    have = set(carried)
    missing = [k for k in required if k not in have]
    if not missing:
        return None
    name = missing[0]
    shown = sorted(have - {"sample_id", "responses"}) or ["nothing"]
    also = f" (and {', '.join(repr(m) for m in missing[1:])})" if len(missing) > 1 else ""
    return SampleProblem(
        f"missing input {name!r}{also}, which grader {required[name]!r} requires; the sample carried: "
        f"{', '.join(shown)}. An empty string that is sent is graded; a field left out is not"
    )


@dataclass(frozen=True)
class Limits:
    """Request limits; the defaults suit thousands of completions per call."""

    max_message_bytes: int = 64 * 1024 * 1024
    max_samples_per_batch: int = 100_000
    max_field_chars: int = 1_000_000
    max_graders_per_request: int = 64
    #: A stream whose client takes no message for this long is ended (RESOURCE_EXHAUSTED).
    send_timeout_seconds: float = 30.0
    #: Graded answers held server-wide for clients that have not taken them; calls wait past it.
    max_buffered_output_bytes: int = 256 * 1024 * 1024
    #: Admission control (`core.admission`): calls past these are refused at once with RESOURCE_EXHAUSTED
    #: (HTTP 503) and a retry hint, never left to be cancelled. Calls (gRPC and HTTP) being handled at once:
    max_concurrent_calls: int = 10_000
    #: Samples accepted and not yet answered, over every call (a call that finds none waiting is admitted
    #: whatever its size, up to max_samples_per_batch).
    max_queued_samples: int = 1_000_000
    #: The server process's resident memory past which calls are refused; 0: no such limit.
    max_memory_bytes: int = 0
    #: Calls gRPC's core may hold before the server takes them up (past it, gRPC itself cancels them).
    max_pending_calls: int = 65_536
    #: Requests (gRPC messages, HTTP bodies) one serving process holds at once, from their arrival to their
    #: answers (an HTTP body as it arrives, so a trickled one holds only what was sent); 0: no such limit.
    #: Without it, 100 posts of 8 MB at once took one HTTP face process to 1.7 GB; 20 BatchEvaluate calls of
    #: 47 MB at once took the server's process to 1.1 GB (0.69 GB with it: a gRPC message counts once it has
    #: arrived, so the bound keeps calls from piling up, not a burst from arriving).
    max_pending_request_bytes: int = 128 * 1024 * 1024
    #: The retry hint sent with a refusal (gRPC's `grpc-retry-pushback-ms`, HTTP's Retry-After).
    retry_after_seconds: float = 0.5


def plain(value: Any) -> Any:
    """`value` with numpy's scalars and arrays as the Python values they hold (`.item()`, `.tolist()`),
    through lists, tuples and dicts; anything else as it is. veRL hands a dataset's values as numpy: an
    `np.int64(72)` label, an array of accepted answers. numpy is recognised by its module, never imported:
    the client installs without it."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind.__module__ == "numpy":
        if hasattr(value, "tolist"):  # an ndarray, or a scalar (whose `tolist` is its `item`)
            return plain(value.tolist())
        return value
    if kind is list or kind is tuple:
        return [plain(v) for v in value]
    if kind is dict:
        return {k: plain(v) for k, v in value.items()}
    return value


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _whole(value: Any) -> Any:
    """Whole floats as ints, through lists and dicts: a parquet float column's `72.0` is the answer 72."""
    if type(value) is float:
        return int(value) if value.is_integer() else value
    if type(value) is list:
        return [_whole(v) for v in value]
    if type(value) is dict:
        return {k: _whole(v) for k, v in value.items()}
    return value


#: The types pandas uses for a missing value (`pd.NA`, `pd.NaT`), by name: pandas is never imported.
_PANDAS_MISSING = frozenset(("NAType", "NaTType"))


def is_missing(value: Any) -> bool:
    """Whether a trainer's dataset value stands for no value: None, a float NaN (what pandas, and a parquet
    column read through it, holds where a row of a numeric column has none; numpy's too), pandas' NA and
    NaT. Such a label is a field the sample does not carry, as None is (docs/calling.md, missing inputs):
    as text it was "NaN", which a grader compared with the response and scored 0, a wrong reward, not a
    mask. A string "NaN" is a text like any other."""
    if value is None:
        return True
    kind = type(value)
    if kind is str:
        return False
    if isinstance(value, float) or (kind.__module__ == "numpy" and kind.__name__.startswith("float")):
        return bool(value != value)
    return kind.__name__ in _PANDAS_MISSING and kind.__module__.startswith("pandas")


def text_or_none(value: Any) -> str | None:
    """A trainer's value as a field's text (`as_text`), or None for one that stands for no value
    (`is_missing`): the field the sample does not carry."""
    return None if is_missing(value) else as_text(value)


def as_text(value: Any) -> str:
    """A field's text from a trainer's dataset value, one rule for every way in (the trainers'
    integrations, the HTTP faces): a string as it is; None as no text (callers that can tell leave the
    field out instead: see docs/calling.md, missing inputs); numpy scalars and arrays as their Python
    values (`plain`); a whole float as its integer text (`72.0` -> "72", which `math_exact` matches
    against "72"); anything else (a number, a list of accepted answers, a dict) as JSON, with whole floats
    inside as integers too, so a grader parsing it reads what the dataset held."""
    if type(value) is str:
        return value
    if value is None:
        return ""
    value = _whole(plain(value))
    if isinstance(value, str):  # numpy's str_, or a str subclass
        return str(value)
    return json.dumps(value, default=str, ensure_ascii=False)


def check_field(name: str, value: str, limits: Limits) -> None:
    if len(value) > limits.max_field_chars:
        raise SampleProblem(
            f"field {name!r} has {len(value)} characters, over the limit max_field_chars={limits.max_field_chars}"
        )


def check_fields(fields: dict[str, Any], limits: Limits) -> None:
    """Raise for the first standard field or `responses` item over `max_field_chars` (an agent input: its JSON
    text)."""
    for name, value in fields.items():
        if name in AGENT_FIELDS_SET:
            check_agent_input(name, len(json.dumps(value, default=str).encode()), limits)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                check_field(f"{name}[{i}]", item, limits)
        else:
            check_field(name, value, limits)


def check_agent_input(name: str, size: int, limits: Limits) -> None:
    """An agent input (`size`: its encoding's bytes) is held to the limit of every other field."""
    if size > limits.max_field_chars:
        limit = limits.max_field_chars
        raise SampleProblem(f"field {name!r} takes {size} bytes, over the limit max_field_chars={limit}")


def add_extra(fields: dict[str, Any], extra: dict[str, Any]) -> None:
    """Every other grader input joins the standard fields, which it may not replace."""
    clash = INPUT_FIELDS.intersection(extra) or AGENT_FIELDS_SET.intersection(extra, fields)
    if clash:
        raise SampleProblem(f"extra key {sorted(clash)[0]!r} collides with a standard sample field")
    fields.update(extra)


def _passes_through(inputs: Inputs) -> bool:
    return inputs.open and REFERENCE_ALIASES_SET.isdisjoint(inputs.names)


def select(kwargs: dict[str, Any], inputs: Inputs) -> dict[str, Any]:
    """What one grader receives: all fields for `**kwargs` graders, else only the names it declares.

    `reference` is also offered as `reference_response` and `ground_truth` (the seeds' names) to graders
    that name those.
    """
    if _passes_through(inputs):
        return kwargs  # shared between graders: safe, since `evaluate(**kwargs)` gets a fresh dict
    aliases = [a for a in REFERENCE_ALIASES if a in inputs.names]
    out = dict(kwargs) if inputs.open else {k: v for k, v in kwargs.items() if k in inputs.names}
    for alias in aliases:
        out[alias] = kwargs["reference"]
    return out


def select_all(batch: list[dict[str, Any]], inputs: Inputs, own: bool = False) -> list[dict[str, Any]]:
    """`select` over a chunk; the chunk itself when every sample would pass through unchanged. With `own`
    (more than one grader reads the chunk in this process), each grader gets its own copy of every list and
    dict in the fields (`responses`, `extra`'s values): one that sorts or empties its input in place changes
    nothing the next grader reads."""
    if own:
        return [_own(select(kw, inputs)) for kw in batch]
    if _passes_through(inputs):
        return batch
    return [select(kw, inputs) for kw in batch]


def _own(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: _copied(v) if type(v) in _MUTABLE else v for k, v in kwargs.items()}


_MUTABLE = frozenset((list, dict))


def _copied(value: Any) -> Any:
    """A list or dict of JSON-like values (what `extra` and `responses` hold) copied all the way down.
    `copy.deepcopy` does the same for any object, ~4x slower on a sample with a tool call (4.7 against
    1.2 µs, measured), and the values here come from protobuf: lists, dicts and scalars only."""
    if type(value) is list:
        return [_copied(v) if type(v) in _MUTABLE else v for v in value]
    if type(value) is dict:
        return {k: _copied(v) if type(v) in _MUTABLE else v for k, v in value.items()}
    return value
