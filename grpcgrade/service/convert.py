"""protobuf messages <-> the Python grader API, for the servicer and the client."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from grpcgrade.core.errors import SampleProblem
from grpcgrade.core.rewards import Result, SpecData
from grpcgrade.core.samples import SAMPLE_FIELDS, Limits, add_extra, check_fields
from grpcgrade.grader import GraderError, GraderScore
from grpcgrade.v1 import grading_pb2 as pb

from .structs import fill_struct, struct_to_dict

# -- requests -> Python ------------------------------------------------------------------------------


def spec_from_pb(spec: pb.GraderSpec) -> SpecData:
    return SpecData(
        name=spec.name,
        params=struct_to_dict(spec.params) if spec.params.fields else {},
        key=spec.key,
        weight=spec.weight if spec.HasField("weight") else None,
        gate=spec.gate,
    )


def sample_kwargs(sample: pb.Sample, limits: Limits, small: bool = False) -> dict[str, Any] | SampleProblem:
    """All the keyword arguments a grader could ask for (`select` keeps what each grader declares), or
    the problem that makes the sample ungradable (reported per sample). `small`: the caller knows the
    sample's encoding is within `max_field_chars` (its whole request or chunk is), so no field is over it."""
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
        if sample.HasField("extra"):
            size = 0 if small else sample.extra.ByteSize()  # `extra` is grader input too: the same limit
            if size > limits.max_field_chars:
                raise SampleProblem(
                    f"field 'extra' takes {size} bytes, over the limit max_field_chars={limits.max_field_chars}"
                )
            add_extra(fields, struct_to_dict(sample.extra))
    except SampleProblem as exc:
        return exc
    return fields


# -- Python -> responses -----------------------------------------------------------------------------


def add_result(results: Any, key: str, grader: str, result: Result, full: bool) -> None:
    """Append one grader's result to an EvaluateResponse's `results`; `full` adds reason and metadata.
    A bare number is a score from the scores view's column path (no reason, no metadata).

    Fields go in through `add(...)` keywords: one call into protobuf's C code instead of one per field,
    which is most of the cost of a cheap grader's response.
    """
    if isinstance(result, (float, int)):
        results.add(key=key, grader=grader, score=result)
        return
    if isinstance(result, GraderScore):
        out = results.add(key=key, grader=grader, score=result.score, reason=result.reason if full else "")
    elif isinstance(result, GraderError):
        out = results.add(key=key, grader=grader, reason=(result.reason or result.error) if full else "")
        out.error.code = result.code
        out.error.message = result.error
    else:
        out = results.add(key=key, grader=grader, rank=result.rank, reason=result.reason if full else "")
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


# -- the client's side -------------------------------------------------------------------------------


def spec_to_pb(spec: str | Mapping[str, Any] | pb.GraderSpec) -> pb.GraderSpec:
    """Accept a grader name, a dict like {"name": "similarity", "params": {...}, "weight": 2}, or a spec."""
    if isinstance(spec, pb.GraderSpec):
        return spec
    if isinstance(spec, str):
        return pb.GraderSpec(name=spec)
    out = pb.GraderSpec(name=spec["name"], key=spec.get("key", ""), gate=bool(spec.get("gate", False)))
    if spec.get("params"):
        out.params.update(spec["params"])
    if spec.get("weight") is not None:
        out.weight = float(spec["weight"])
    return out


def sample_to_pb(sample: Mapping[str, Any] | pb.Sample) -> pb.Sample:
    """A dict with the Sample's field names; any other key goes into `extra`."""
    if isinstance(sample, pb.Sample):
        return sample
    fields: dict[str, Any] = {
        k: str(sample[k]) for k in SAMPLE_FIELDS if k != "responses" and sample.get(k) is not None
    }
    out = pb.Sample(**fields)
    if sample.get("responses"):
        out.responses.extend(sample["responses"])
    extra = dict(sample.get("extra") or {})
    extra.update({k: v for k, v in sample.items() if k not in SAMPLE_FIELDS and k != "extra"})
    if extra:
        out.extra.update(extra)
    return out


def specs_to_pb(graders: Iterable[str | Mapping[str, Any] | pb.GraderSpec] | None) -> list[pb.GraderSpec]:
    return [spec_to_pb(g) for g in graders or ()]
