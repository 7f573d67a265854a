"""protobuf messages <-> the Python grader API, for the servicer and the client."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from itertools import repeat
from typing import Any, cast

from grpcgrade.core.errors import (
    MAX_DETAIL_CHARS,
    ErrorCode,
    InvalidParams,
    SampleProblem,
    UnsendableSample,
    UnsendableType,
    UnsendableValue,
    as_value,
    describe,
    encodable,
)
from grpcgrade.core.result_cache import CacheMode
from grpcgrade.core.rewards import Result, SpecData
from grpcgrade.core.samples import (
    AGENT_FIELDS,
    SAMPLE_FIELDS,
    TEXT_FIELDS,
    Limits,
    add_extra,
    check_agent_input,
    check_fields,
    missing_input,
)
from grpcgrade.grader import GraderError, GraderRank, GraderScore
from grpcgrade.v1 import grading_pb2 as pb

from .structs import fill_struct, list_to_py, struct_to_dict

# -- requests -> Python ------------------------------------------------------------------------------


def spec_from_pb(spec: pb.GraderSpec) -> SpecData:
    return SpecData(
        name=spec.name,
        params=struct_to_dict(spec.params) if spec.params.fields else {},
        key=spec.key,
        weight=spec.weight if spec.HasField("weight") else None,
        gate=spec.gate,
    )


#: The request's `cache` field as the engine takes it.
CACHE_MODES: dict[int, CacheMode] = {
    pb.CACHE_MODE_UNSPECIFIED: CacheMode.DEFAULT,
    pb.CACHE_MODE_OFF: CacheMode.OFF,
    pb.CACHE_MODE_ON: CacheMode.ON,
}


def cache_mode(value: int) -> CacheMode:
    """A request's CacheMode; a number this server does not know is refused (INVALID_ARGUMENT)."""
    mode = CACHE_MODES.get(value)
    if mode is None:
        allowed = ", ".join(f"{pb.CacheMode.Name(k)} ({k})" for k in CACHE_MODES)
        raise InvalidParams("cache", f"unknown CacheMode {value}; allowed: {allowed}")
    return mode


def sample_kwargs(
    sample: pb.Sample, limits: Limits, small: bool = False, required: Mapping[str, str] | None = None
) -> dict[str, Any] | SampleProblem:
    """All the keyword arguments a grader could ask for (`select` keeps what each grader declares), or
    the problem that makes the sample ungradable (reported per sample). `small`: the caller knows the
    sample's encoding is within `max_field_chars` (its whole request or chunk is), so no field is over it.
    `required`: the inputs the call's graders require (`samples.requirements`); a sample that did not send
    one is a problem. A text field left unset is "" to a grader that does not require it, as before."""
    # `sample_id` (an `extra.sample_id` wins) lets Kolibrify-style batch graders match results by id.
    fields = {
        "sample_id": sample.id,
        "query": sample.query,
        "response": sample.response,
        "reference": sample.reference,
        "context": sample.context,
        "responses": list(sample.responses) if sample.responses else [],
    }
    try:
        # No text holds more characters than the sample's encoding has bytes: one C call clears most samples.
        if not small and sample.ByteSize() > limits.max_field_chars:
            check_fields(fields, limits)
        for name in AGENT_FIELDS:
            if sample.HasField(name):
                given = getattr(sample, name)
                check_agent_input(name, 0 if small else given.ByteSize(), limits)
                fields[name] = list_to_py(given)
        if sample.HasField("extra"):
            _join_extra(fields, sample.extra, limits, small)
        if required:
            _check_present(fields, [f for f in TEXT_FIELDS if sample.HasField(f)], required)
    except SampleProblem as exc:
        return as_value(exc)
    return fields


def _check_present(fields: dict[str, Any], texts: Iterable[str], required: Mapping[str, str]) -> None:
    """Raise the sample's problem when it lacks a required input: `texts` are the text fields it sent,
    the other keys of `fields` beyond the standard ones came in `extra`."""
    carried = {*texts, *(k for k in fields if k not in _STANDARD)}
    if fields["responses"]:
        carried.add("responses")
    problem = missing_input(carried, dict(required))
    if problem is not None:
        raise problem


#: The keys every sample's keyword arguments hold, sent or not.
_STANDARD = frozenset(("sample_id", "responses", *TEXT_FIELDS))


def _join_extra(fields: dict[str, Any], extra: Any, limits: Limits, small: bool) -> None:
    """A sample's `extra` Struct joins its fields; it is grader input too, so the same size limit holds."""
    size = 0 if small else extra.ByteSize()
    if size > limits.max_field_chars:
        raise SampleProblem(
            f"field 'extra' takes {size} bytes, over the limit max_field_chars={limits.max_field_chars}"
        )
    if extra.fields:
        add_extra(fields, struct_to_dict(extra))


#: SampleColumns' text columns: one per Sample text field, under the same name.
TEXT_COLUMNS = ("id", "query", "response", "reference", "context")


def column_count(columns: pb.SampleColumns) -> int:
    """The number of samples in a request's SampleColumns; InvalidParams when two non-empty columns differ
    in length (a column is empty or holds one entry per sample)."""
    lengths = {name: len(getattr(columns, name)) for name in (*TEXT_COLUMNS, "extra")}
    given = {name: n for name, n in lengths.items() if n}
    if len(set(given.values())) > 1:
        detail = ", ".join(f"{name} has {n}" for name, n in given.items())
        raise InvalidParams("columns", f"every non-empty column needs one entry per sample; {detail}")
    return max(given.values(), default=0)


def column_rows(
    columns: pb.SampleColumns,
    texts: Mapping[str, Sequence[str]],
    start: int,
    stop: int,
    limits: Limits,
    small: bool = False,
    required: Mapping[str, str] | None = None,
) -> list[dict[str, Any] | SampleProblem]:
    """`sample_kwargs` for rows start..stop-1 of a request's SampleColumns; `texts` holds its non-empty text
    columns (a column left empty is a field no sample sent). Each column is sliced once (one call into
    protobuf's C code), not read row by row."""
    blank = [""] * (stop - start)
    ids, queries, responses, references, contexts = (
        texts[name][start:stop] if name in texts else blank for name in TEXT_COLUMNS
    )
    made = [
        {"sample_id": i, "query": q, "response": r, "reference": ref, "context": c, "responses": []}
        for i, q, r, ref, c in zip(ids, queries, responses, references, contexts, strict=True)
    ]
    rows: list[dict[str, Any] | SampleProblem] = list(made)
    extra = columns.extra
    check = required is not None and not set(required) <= texts.keys()  # else every row has them all
    if small and not extra and not check:
        return rows
    sent = [name for name in TEXT_FIELDS if name in texts]
    for k, fields in enumerate(made):
        try:
            if not small:
                check_fields(fields, limits)
            if extra:
                _join_extra(fields, extra[start + k], limits, small)
            if check:
                assert required is not None
                _check_present(fields, sent, required)
        except SampleProblem as exc:
            rows[k] = as_value(exc)
    return rows


# -- Python -> responses -----------------------------------------------------------------------------

#: The views that carry no reasons and no metadata.
SCORE_VIEWS = frozenset((pb.RESULT_VIEW_SCORES, pb.RESULT_VIEW_COLUMNS))


def is_full(view: int) -> bool:
    """Whether a request's ResultView asks for reasons and metadata (any view this server does not know
    is answered in full)."""
    return view not in SCORE_VIEWS


def add_result(results: Any, key: str, grader: str, result: Result, full: bool) -> None:
    """Append one grader's result to an EvaluateResponse's `results`; `full` adds reason and metadata.
    A bare number is a score from the scores view's column path (no reason, no metadata).

    Fields go in through `add(...)` keywords: one call into protobuf's C code instead of one per field,
    which is most of the cost of a cheap grader's response. A reason or error message UTF-8 cannot encode
    (a lone surrogate) is written again made encodable (`errors.encodable`): protobuf refuses it, and it
    would otherwise fail the response of every sample of the chunk.
    """
    size = len(results)
    try:
        _add_result(results, key, grader, result, full)
    except UnicodeEncodeError:
        del results[size:]  # the entry protobuf began before it refused the text
        _add_result(results, key, grader, _encodable(result), full)


def _encodable(result: Result) -> Result:
    if isinstance(result, GraderError):
        return replace(result, error=encodable(result.error), reason=encodable(result.reason))
    if isinstance(result, (GraderScore, GraderRank)):
        return replace(result, reason=encodable(result.reason))
    return result


def _add_result(results: Any, key: str, grader: str, result: Result, full: bool) -> None:
    if isinstance(result, (float, int)):
        results.add(key=key, grader=grader, score=result)
        return
    if isinstance(result, GraderScore):
        out = results.add(key=key, grader=grader, score=result.score, reason=result.reason if full else "")
        if result.cached:
            out.cached = True
    elif isinstance(result, GraderError):
        out = results.add(key=key, grader=grader, reason=(result.reason or result.error) if full else "")
        out.error.code = result.code
        out.error.message = result.error
    else:
        out = results.add(key=key, grader=grader, rank=result.rank, reason=result.reason if full else "")
        if result.cached:
            out.cached = True
    if full and result.metadata:
        fill_struct(out.metadata, result.metadata)


def fill_response(
    out: pb.EvaluateResponse,
    sample_id: str,
    labels: list[tuple[str, str]],
    results: Sequence[Result],
    reward: float | None,
    full: bool = True,
) -> None:
    """`labels` holds (key, grader name) per spec, in the request's order."""
    if sample_id:
        out.id = sample_id
    container = out.results
    for (key, name), result in zip(labels, results, strict=True):
        add_result(container, key, name, result, full)
    if reward is not None:
        out.reward = reward


#: How the first reason of an answer `leave_out_details` made to fit begins, followed by the answer's size
#: in bytes. The native gRPC face reads it too (native/grpc-face/wire.go's leftOutNote, the same words).
LEFT_OUT_NOTE = "reason and metadata left out: this sample's answer is "


def leave_out_details(response: pb.EvaluateResponse, limit: int) -> None:
    """A sample's answer over the message size `limit` (a long reason, large metadata or error messages),
    made to fit: its scores, ranks, error codes and reward stay, reasons and metadata are left out (the first
    reason says why), and error messages are cut to `MAX_DETAIL_CHARS`. gRPC would otherwise refuse the
    message, and with it the stream of every sample not yet sent."""
    size = response.ByteSize()
    note = f"{LEFT_OUT_NOTE}{size} bytes, over the {limit}-byte message limit (max_message_bytes)"
    for result in response.results:
        result.reason, note = note, ""
        result.ClearField("metadata")
        if result.HasField("error") and len(result.error.message) > MAX_DETAIL_CHARS:
            result.error.message = result.error.message[:MAX_DETAIL_CHARS] + "\N{HORIZONTAL ELLIPSIS}"


def details_left_out(response: pb.EvaluateResponse) -> bool:
    """Whether `leave_out_details` left out an answer's details (its first reason says so)."""
    return bool(response.results) and response.results[0].reason.startswith(LEFT_OUT_NOTE)


def fill_items(
    items: Any,
    indices: Sequence[int],
    ids: Sequence[str],
    labels: list[tuple[str, str]],
    columns: Sequence[Sequence[Result]],
    rewards: Sequence[float | None],
    full: bool,
) -> None:
    """Append a graded chunk to a BatchEvaluateResponse's `items`; `columns[j][k]` is grader j's result
    for the k-th sample. One grader, the common case, skips building a row per sample."""
    if len(columns) == 1:
        ((key, name),) = labels
        for index, sample_id, result, reward in zip(indices, ids, columns[0], rewards, strict=True):
            out = items.add(index=index).result
            if sample_id:
                out.id = sample_id
            add_result(out.results, key, name, result, full)
            if reward is not None:
                out.reward = reward
        return
    for k, (index, sample_id, reward) in enumerate(zip(indices, ids, rewards, strict=True)):
        fill_response(items.add(index=index).result, sample_id, labels, [c[k] for c in columns], reward, full)


def fill_columns(
    out: pb.ResultColumns,
    indices: Sequence[int],
    labels: list[tuple[str, str]],
    columns: Sequence[Sequence[Result]],
    rewards: Sequence[float | None],
) -> None:
    """A graded chunk as RESULT_VIEW_COLUMNS: packed indices, a packed score column per grader with its failed
    and cached rows, and the rewards. A column of bare numbers (the column path) goes in with one C call."""
    out.indices.extend(indices)
    for (key, name), column in zip(labels, columns, strict=True):
        col = out.scores.add(key=key, grader=name)
        if {*map(type, column)} <= _NUMBERS:
            col.scores.extend(column)  # type: ignore[arg-type]
            continue
        scores: list[float] = []
        add = scores.append
        for row, result in enumerate(column):
            if isinstance(result, (float, int)):
                add(result)
            elif isinstance(result, GraderScore):
                add(result.score)
                if result.cached:
                    col.cached_rows.append(row)
            else:
                add(0.0)
                col.error_rows.append(row)
                if isinstance(result, GraderError):
                    col.errors.add(code=result.code, message=encodable(result.error))
                else:  # a rank: refused before grading for this view, so only a grader's wrong answer
                    col.errors.add(code=ErrorCode.INVALID_RESULT, message=f"{name} ranked instead of scoring")
        col.scores.extend(scores)
    if None in rewards:
        out.rewards.extend([0.0 if v is None else v for v in rewards])
        out.reward_absent_rows.extend([row for row, v in enumerate(rewards) if v is None])
    else:
        out.rewards.extend(rewards)  # type: ignore[arg-type]


_NUMBERS = frozenset((float, int))


def _rows_in(rows: Iterable[int], a: int, b: int) -> list[int]:
    return [r - a for r in rows if a <= r < b]


def slice_columns(columns: pb.ResultColumns, a: int, b: int) -> pb.ResultColumns:
    """Rows a..b-1 of a ResultColumns, renumbered from 0 (to fit a chunk's answer in the message limit)."""
    out = pb.ResultColumns(
        indices=columns.indices[a:b],
        rewards=columns.rewards[a:b],
        reward_absent_rows=_rows_in(columns.reward_absent_rows, a, b),
    )
    for col in columns.scores:
        part = out.scores.add(
            key=col.key, grader=col.grader, scores=col.scores[a:b], cached_rows=_rows_in(col.cached_rows, a, b)
        )
        for row, error in zip(col.error_rows, col.errors, strict=True):
            if a <= row < b:
                part.error_rows.append(row - a)
                part.errors.append(error)
    return out


def join_columns(parts: Sequence[pb.ResultColumns]) -> pb.ResultColumns:
    """The rows of `parts`, one after the other, as one ResultColumns (the inverse of `slice_columns`)."""
    out = pb.ResultColumns()
    offset = 0
    for part in parts:
        if not out.scores:
            for col in part.scores:
                out.scores.add(key=col.key, grader=col.grader)
        out.indices.extend(part.indices)
        out.rewards.extend(part.rewards)
        out.reward_absent_rows.extend(r + offset for r in part.reward_absent_rows)
        for into, col in zip(out.scores, part.scores, strict=True):
            into.scores.extend(col.scores)
            into.error_rows.extend(r + offset for r in col.error_rows)
            into.errors.extend(col.errors)
            into.cached_rows.extend(r + offset for r in col.cached_rows)
        offset += len(part.indices)
    return out


# -- the client's side -------------------------------------------------------------------------------


def spec_to_pb(spec: str | Mapping[str, Any] | pb.GraderSpec) -> pb.GraderSpec:
    """Accept a grader name, a dict like {"name": "similarity", "params": {...}, "weight": 2}, or a spec;
    TypeError or ValueError naming the grader and what is wrong with anything else."""
    if isinstance(spec, pb.GraderSpec):
        return spec
    if isinstance(spec, str):
        return pb.GraderSpec(name=spec)
    if not isinstance(spec, Mapping):
        raise TypeError(f"a grader is a name, a mapping with 'name', or a GraderSpec, not {type(spec).__name__}")
    name = spec.get("name")
    if not isinstance(name, str):
        raise TypeError(f"a grader mapping needs a 'name' (a str), got {_shown(name)}: {dict(spec)!r:.80}")
    params = spec.get("params")
    if params is not None and not isinstance(params, Mapping):
        hint = " (parse the JSON text first: json.loads)" if isinstance(params, (str, bytes)) else ""
        raise TypeError(f"grader {name!r}: params must be a mapping, not {type(params).__name__}{hint}")
    try:
        return _grader_spec(name, spec.get("key", ""), bool(spec.get("gate", False)), params, spec.get("weight"))
    except (TypeError, ValueError) as exc:  # protobuf's words for a weight, key or param it cannot hold
        kind = ValueError if isinstance(exc, ValueError) else TypeError
        raise kind(f"grader {name!r}: {_what_failed(spec, exc)}") from None


def _what_failed(spec: Mapping[str, Any], exc: Exception) -> str:
    """Which of a grader mapping's fields the spec could not take, and why."""
    weight = spec.get("weight")
    if weight is not None:
        try:
            float(weight)
        except (TypeError, ValueError):
            return f"weight must be a number, got {_shown(weight)}"
    if not isinstance(spec.get("key", ""), str):
        return f"key must be a str, got {_shown(spec.get('key'))}"
    return f"params must hold only JSON values (str, numbers, booleans, None, lists, str-keyed mappings): {exc}"


def _shown(value: Any) -> str:
    """A wrong value in an error message: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:39] + chr(0x2026)}"


def spec_from_data(spec: SpecData) -> pb.GraderSpec:
    """A resolved spec as the contract states it (the inverse of `spec_from_pb`): a face's plan sent to the
    engine's process, a reward's graders in the catalog."""
    return _grader_spec(spec.name, spec.key, spec.gate, spec.params, spec.weight)


def _grader_spec(name: str, key: str, gate: bool, params: Mapping[str, Any] | None, weight: Any) -> pb.GraderSpec:
    """The one GraderSpec builder: a client's spec and a resolved one differ only in what they check first."""
    out = pb.GraderSpec(name=name, key=key, gate=gate)
    if params:
        out.params.update(params)
    if weight is not None:
        out.weight = float(weight)
    return out


def sample_to_pb(sample: Mapping[str, Any] | pb.Sample) -> pb.Sample:
    """A dict with the Sample's field names; any other key goes into `extra`. TypeError or ValueError
    naming the field for a sample that cannot be sent (`sample_error`)."""
    if isinstance(sample, pb.Sample):
        return sample
    out = pb.Sample()
    try:
        _fill_sample(out, sample)
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise sample_error(sample, exc) from None
    return out


def sample_error(sample: Any, exc: Exception, index: int | None = None) -> UnsendableSample:
    """A sample the client could not write, said plainly: which one (`index`, in its batch), which field, and
    what is wrong, rather than protobuf's or Python's words from deep in the writing ("'str' object has no
    attribute 'get'", "Unexpected type"). Made only once writing failed: the writers stay as fast."""
    where = "the sample" if index is None else f"sample {index}"
    if not isinstance(sample, Mapping):
        why = f"{where} must be a mapping of its fields or a Sample message, not {type(sample).__name__}"
        out: UnsendableSample = UnsendableType(why)
    else:
        found = unwritable(sample, _fill_sample, _DICT_TEXTS)
        said, kind = found if found is not None else (str(exc), type(exc))
        wrong = UnsendableValue if issubclass(kind, (ValueError, OverflowError)) else UnsendableType
        out = wrong(f"{where}{', ' if found else ': '}{said}")
    out.index = index
    return out


def unwritable(
    sample: Mapping[str, Any], write: Callable[[pb.Sample, Mapping[str, Any]], None], texts: Sequence[str]
) -> tuple[str, type[Exception]] | None:
    """Which of `sample`'s fields `write` cannot put in a Sample, and why ("field 'response': text that UTF-8
    cannot encode ..."), with the error's class; None when each field alone can be written. `texts`: the
    writer's text fields (the rest travel in `extra`, as JSON)."""
    for key, value in sample.items():
        try:
            write(pb.Sample(), {key: value})
        except (TypeError, ValueError, AttributeError, OverflowError) as own:
            if isinstance(own, UnicodeEncodeError):
                why = f"text that UTF-8 cannot encode ({own.reason} at position {own.start})"
            elif key in texts or key == "responses":
                why = str(own)
            else:  # `extra` itself, or a key that travels in it
                why = f"{own} (`extra` travels as JSON: str, numbers, booleans, None, lists, str-keyed mappings)"
            return f"field {key!r}: {why}", type(own)
    return None


#: The keys a sample dict may hold that map one to one onto a Sample's string fields.
_TEXT_KEYS = frozenset(SAMPLE_FIELDS) - {"responses"}
#: A sample dict's keys written as the Sample's string fields, and the keys that are its own fields (every
#: other key of a sample dict goes into `extra`, and so does the dict its own `extra` key holds).
_DICT_TEXTS = tuple(k for k in SAMPLE_FIELDS if k != "responses")
_MESSAGE_KEYS = frozenset((*SAMPLE_FIELDS, *AGENT_FIELDS, "extra"))
#: The same for a face's sample, the graders' keyword arguments (`sample_kwargs`, the HTTP faces'
#: `sample_fields`): the text fields by their own names, `sample_id` kept in the face (the engine answers
#: by position), and every other key, one named `extra` too, is an `extra` key the engine joins back.
_KWARGS_KEYS = frozenset(("sample_id", "responses", *TEXT_FIELDS, *AGENT_FIELDS))


def _fill_sample(out: pb.Sample, sample: Mapping[str, Any]) -> None:
    """`sample_to_pb`'s rules, into an empty message: texts as str (None: unset), `responses`, and every
    other key joined with `extra`."""
    extra = sample.get("extra")
    if extra:
        out.extra.update(extra)  # first: a key of the sample's own beside it wins (`_write` writes those)
    _write(out, sample, _DICT_TEXTS, _MESSAGE_KEYS)


def unwritable_sample(kwargs: Mapping[str, Any], exc: Exception) -> SampleProblem:
    """A face's sample `write_sample` could not write (`exc`), as the INVALID_SAMPLE it is, naming its field."""
    found = unwritable(kwargs, write_sample, TEXT_FIELDS)
    return SampleProblem(found[0] if found is not None else describe(exc))


def write_sample(out: pb.Sample, kwargs: Mapping[str, Any]) -> None:
    """A face's sample (the graders' keyword arguments) written into the contract's Sample `out`, which a
    face process sends the engine's process: texts, agent inputs, and every other key in `extra` (the
    engine joins it back, `sample_kwargs`). Written in place (`samples.add()`): a Sample made apart is
    copied again into its request, which took three quarters of a one-sample post's encoding."""
    _write(out, kwargs, TEXT_FIELDS, _KWARGS_KEYS)


def _write(out: pb.Sample, sample: Mapping[str, Any], texts: Sequence[str], own: frozenset[str]) -> None:
    """The one Sample writer: `texts` as the Sample's string fields (str; None: unset), `responses`, the
    agent inputs (an empty list is an input too: set, not absent), and every key not in `own` in `extra`."""
    for name in texts:
        value = sample.get(name)
        if value is not None:
            setattr(out, name, value if type(value) is str else str(value))
    if sample.get("responses"):
        out.responses.extend(sample["responses"])
    for name in AGENT_FIELDS:
        value = sample.get(name)
        if value is not None:
            if not isinstance(value, (list, tuple)):
                raise TypeError(f"sample field {name!r} must be a list of JSON objects, not {type(value).__name__}")
            given = getattr(out, name)
            given.SetInParent()
            given.extend(value)
    if not own.issuperset(sample):  # the usual sample has no other key
        out.extra.update({k: v for k, v in sample.items() if k not in own})


def all_text(values: Iterable[Any]) -> bool:
    """Whether every value is exactly a str (one C-level pass: ~10 ns a value)."""
    return set(map(type, values)) <= {str}


class SampleColumns(Sequence[dict[str, Any]]):
    """Samples as columns: one list of texts per Sample field, as a trainer holds them, and optionally
    each sample's `extra` (a dict, or None), `responses` and agent inputs (`agent`: a dict of `messages`,
    `tool_calls`, `tool_definitions` lists, or None; samples with them travel as messages, not columns).

    A request is filled from columns with one keyword call into protobuf's C code per sample, without a
    dict or a message of its own per sample (`add_samples`), which is most of a cheap batch's client cost.
    Slices are columns too (the client's chunks); an item is the sample as a dict.
    """

    def __init__(
        self,
        n: int | None = None,
        *,
        extra: Sequence[Mapping[str, Any] | None] | None = None,
        responses: Sequence[Sequence[str] | None] | None = None,
        **fields: Sequence[str | None],
    ) -> None:
        unknown = set(fields) - _TEXT_KEYS
        if unknown:
            raise ValueError(f"SampleColumns: no Sample field {sorted(unknown)[0]!r}; columns are {sorted(_TEXT_KEYS)}")
        lengths = {len(c) for c in (*fields.values(), *(c for c in (extra, responses) if c is not None))}
        if n is not None:
            lengths.add(n)
        if len(lengths) > 1:
            raise ValueError(f"SampleColumns: columns of different lengths {sorted(lengths)}")
        self.n = lengths.pop() if lengths else 0
        # texts as str, None kept (the field is absent from that sample), so the C call below takes every
        # value as it is: protobuf leaves a field given None unset
        self.fields = {
            name: col if all_text(col) else [v if v is None else str(v) for v in col] for name, col in fields.items()
        }
        self.gaps = any(None in col for col in self.fields.values())
        self.extra = extra if extra is not None and any(extra) else None
        self.responses = responses if responses is not None and any(responses) else None
        self.agent: Sequence[Mapping[str, Any] | None] | None = None

    @classmethod
    def of_text(
        cls,
        fields: Mapping[str, Sequence[str | None]],
        extra: Sequence[Mapping[str, Any] | None] | None = None,
        gaps: bool = False,
    ) -> SampleColumns:
        """Columns a caller has already checked: every field a Sample text field, every value a str (or
        None, a field absent from that sample: then `gaps`), and every column (and `extra`) as long as the
        others. Skips the checks of the constructor."""
        out = cls.__new__(cls)
        out.fields = dict(fields)
        out.gaps = gaps
        out.n = len(next(iter(fields.values()))) if fields else len(extra or ())
        out.extra = extra if extra is not None and any(extra) else None
        out.responses = None
        out.agent = None
        return out

    def with_agent(self, agent: Sequence[Mapping[str, Any] | None]) -> SampleColumns:
        """These columns with each sample's agent inputs (a dict of AGENT_FIELDS lists, or None)."""
        if len(agent) != self.n:
            raise ValueError(f"SampleColumns: {len(agent)} agent inputs for {self.n} samples")
        self.agent = agent if any(agent) else None
        return self

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            out = SampleColumns.__new__(SampleColumns)
            out.fields = {k: v[index] for k, v in self.fields.items()}
            out.gaps = self.gaps
            out.extra = self.extra[index] if self.extra is not None else None
            out.responses = self.responses[index] if self.responses is not None else None
            out.agent = self.agent[index] if self.agent is not None else None
            out.n = len(range(*index.indices(self.n)))
            return out
        sample: dict[str, Any] = {k: v[index] for k, v in self.fields.items() if v[index] is not None}
        if self.extra is not None and self.extra[index]:
            sample["extra"] = dict(self.extra[index])
        if self.responses is not None and self.responses[index]:
            sample["responses"] = list(self.responses[index])
        if self.agent is not None and self.agent[index]:
            sample.update(self.agent[index])
        return sample

    @property
    def columnar(self) -> bool:
        """Whether the samples fit a request's SampleColumns: no listwise `responses` or agent inputs, no field
        absent from some samples only (a column is sent for all or none), and some column to count them by (n samples of
        no field at all have no column)."""
        return self.responses is None and self.agent is None and not self.gaps and bool(self.fields or self.extra)

    def fill_columns(self, out: pb.SampleColumns) -> None:
        """Every sample into a request's SampleColumns: a C call per column, and a Struct per row only
        when some sample has an `extra`."""
        for name, column in self.fields.items():
            getattr(out, name).extend(column)
        if self.extra is not None:
            for extra in self.extra:
                row = out.extra.add()
                if extra:
                    row.update(extra)

    def fill(self, container: Any) -> None:
        """Append every sample to a repeated Sample field (`request.samples`)."""
        add = container.add
        names = tuple(self.fields)
        columns = [self.fields[k] for k in names]
        if self.agent is not None:  # rare (agent rollouts): a sample dict each, by `sample_to_pb`'s rules
            for i in range(self.n):
                _fill_sample(add(), self[i])
            return
        if self.extra is None and self.responses is None:
            if names == ("query", "response", "reference"):  # TRL's prompt, completion and answer
                for q, r, ref in zip(*columns, strict=True):
                    add(query=q, response=r, reference=ref)
                return
            for values in zip(*columns, strict=True):
                add(**dict(zip(names, values, strict=True)))
            return
        none = [None] * self.n
        rows: Iterable[tuple[Any, ...]] = zip(*columns, strict=True) if columns else repeat((), self.n)
        extras = self.extra if self.extra is not None else none
        listed = self.responses if self.responses is not None else none
        for values, extra, responses in zip(rows, extras, listed, strict=True):
            out = add(**dict(zip(names, values, strict=True)))
            if responses:
                out.responses.extend(responses)
            if extra:
                out.extra.update(extra)


def as_columns(samples: Sequence[Mapping[str, Any] | pb.Sample] | SampleColumns) -> SampleColumns | None:
    """`samples` as columns when they can travel as a request's SampleColumns: columns already, or dicts
    with the same text fields each (a dataset's rows); None for anything else (messages, `extra`,
    `responses`, dicts of different keys), which travel as `samples`. C-level passes, none per sample."""
    if isinstance(samples, SampleColumns):
        return samples if samples.columnar else None
    if not samples or {*map(type, samples)} != {dict}:
        return None
    rows = cast("Sequence[dict[str, Any]]", samples)
    keys = tuple(rows[0])
    if not keys or not _TEXT_KEYS.issuperset(keys):
        return None
    try:
        fields = {k: [row[k] for row in rows] for k in keys}
    except KeyError:
        return None
    if sum(map(len, rows)) != len(keys) * len(rows) or not all(all_text(c) for c in fields.values()):
        return None  # a row with another key, or a value that is not text
    return SampleColumns.of_text(fields)


def add_samples(
    container: Any, samples: Sequence[Mapping[str, Any] | pb.Sample] | SampleColumns, first: int = 0
) -> None:
    """Append `samples` to a repeated Sample field (`request.samples`): columns, messages (copied) or dicts
    by `sample_to_pb`'s rules. A dict of only text fields is one keyword call into protobuf's C code. A
    sample that cannot be written is `sample_error`'s, numbered from `first` (the chunk's place in its batch)."""
    if isinstance(samples, SampleColumns):
        samples.fill(container)
        return
    add = container.add
    k, sample = 0, None
    try:
        for k, sample in enumerate(samples):  # noqa: B007 - `k` numbers the sample at fault below
            if isinstance(sample, pb.Sample):
                container.append(sample)
            elif _TEXT_KEYS.issuperset(sample.keys()) and all(type(v) is str for v in sample.values()):
                add(**sample)
            else:
                _fill_sample(add(), sample)
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise sample_error(sample, exc, first + k) from None


def _unwritable(samples: Sequence[Any], first: int = 0) -> Iterator[tuple[int, UnsendableSample]]:
    """Each sample of a batch the client cannot send, with its index (from `first`) and `sample_error`'s
    words for it; tried sample by sample, so only after writing the batch failed."""
    for k in range(len(samples)):
        sample = samples[k]
        if isinstance(sample, pb.Sample):
            continue
        try:
            _fill_sample(pb.Sample(), sample)
        except (TypeError, ValueError, AttributeError, OverflowError) as own:
            yield first + k, sample_error(sample, own, first + k)


def unsendable(samples: Sequence[Any], exc: Exception, first: int = 0) -> UnsendableSample | TypeError | ValueError:
    """Why a batch written as columns could not be (`exc`): the first sample the client cannot send,
    numbered from `first` (`exc` itself when no sample alone is at fault)."""
    for _, error in _unwritable(samples, first):
        return error
    return exc if isinstance(exc, (TypeError, ValueError)) else ValueError(describe(exc))


def unsent_rows(samples: Sequence[Any]) -> dict[int, str]:
    """Every sample of a batch the client cannot send, by index, with why: what a trainer's call masks
    (`batch_scores`)."""
    return {k: str(error) for k, error in _unwritable(samples)}


def check_samples(samples: Any) -> None:
    """A batch's `samples` must be a sequence of samples: TypeError for one sample given on its own (a
    mapping, a Sample) or a text, which would be read key by key or letter by letter."""
    if isinstance(samples, (Mapping, pb.Sample, str, bytes)):
        raise TypeError(
            f"samples must be a list of samples (mappings or Sample messages) or SampleColumns, not "
            f"{type(samples).__name__}: for one sample, pass [sample] or call evaluate(sample)"
        )


GraderArg = str | Mapping[str, Any] | pb.GraderSpec


def graders_list(graders: Iterable[GraderArg] | GraderArg | None) -> list[GraderArg]:
    """A call's `graders` as a list: one grader given on its own (a name, a dict, a spec) is a list of one,
    not a name read letter by letter."""
    if graders is None:
        return []
    if isinstance(graders, (str, Mapping, pb.GraderSpec)):
        return [graders]
    try:
        return list(graders)
    except TypeError:
        raise TypeError(
            f"graders must be a grader (a name, a mapping with 'name', a GraderSpec) or a list of them, "
            f"not {type(graders).__name__}"
        ) from None


def specs_to_pb(graders: Iterable[GraderArg] | GraderArg | None) -> list[pb.GraderSpec]:
    return [spec_to_pb(g) for g in graders_list(graders)]
