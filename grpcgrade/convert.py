"""protobuf messages <-> the Python grader API, for the servicer and the client."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .grader import GraderError, GraderRank, GraderResult
from .rewards import SpecData
from .samples import Limits, SampleProblem, build_kwargs
from .structs import fill_struct, struct_to_dict
from .v1 import grading_pb2 as pb

# -- requests -> Python ------------------------------------------------------------------------------


def spec_from_pb(spec: pb.GraderSpec) -> SpecData:
    return SpecData(
        name=spec.name,
        params=struct_to_dict(spec.params) if spec.params.fields else {},
        key=spec.key,
        weight=spec.weight if spec.HasField("weight") else None,
        gate=spec.gate,
    )


def sample_kwargs(sample: pb.Sample, limits: Limits) -> dict[str, Any] | SampleProblem:
    """A sample's grader inputs, or the problem that makes it ungradable (reported per sample)."""
    try:
        extra = struct_to_dict(sample.extra) if sample.HasField("extra") else {}
        # `sample_id` (an `extra.sample_id` wins) lets Kolibrify-style batch graders match results by id.
        fields = {
            "sample_id": sample.id,
            "query": sample.query,
            "response": sample.response,
            "reference": sample.reference,
            "context": sample.context,
        }
        return build_kwargs(fields, list(sample.responses), extra, limits)
    except SampleProblem as exc:
        return exc


# -- Python -> responses -----------------------------------------------------------------------------


def fill_result(out: pb.GraderResult, key: str, grader: str, result: GraderResult) -> None:
    out.key = key
    out.grader = grader
    if isinstance(result, GraderError):
        out.error.code = result.code
        out.error.message = result.error
        out.reason = result.reason or result.error
    elif isinstance(result, GraderRank):
        out.rank.extend(result.rank)
        out.reason = result.reason
    else:
        out.score = result.score
        out.reason = result.reason
    if result.metadata:
        fill_struct(out.metadata, result.metadata)


def fill_response(
    out: pb.EvaluateResponse,
    sample_id: str,
    labels: list[tuple[str, str]],
    results: list[GraderResult],
    reward: float | None,
) -> None:
    """`labels` holds (key, grader name) per spec, in the request's order."""
    out.id = sample_id
    for (key, name), result in zip(labels, results, strict=True):
        fill_result(out.results.add(), key, name, result)
    if reward is not None:
        out.reward = reward


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


SAMPLE_FIELDS = ("id", "query", "response", "reference", "context")


def sample_to_pb(sample: Mapping[str, Any] | pb.Sample) -> pb.Sample:
    """A dict with the Sample's field names; any other key goes into `extra`."""
    if isinstance(sample, pb.Sample):
        return sample
    out = pb.Sample(**{k: str(sample[k]) for k in SAMPLE_FIELDS if sample.get(k) is not None})
    if sample.get("responses"):
        out.responses.extend(sample["responses"])
    extra = dict(sample.get("extra") or {})
    extra.update({k: v for k, v in sample.items() if k not in (*SAMPLE_FIELDS, "responses", "extra")})
    if extra:
        out.extra.update(extra)
    return out


def specs_to_pb(graders: Iterable[str | Mapping[str, Any] | pb.GraderSpec] | None) -> list[pb.GraderSpec]:
    return [spec_to_pb(g) for g in graders or ()]
