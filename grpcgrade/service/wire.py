"""A batch chunk graded from protobuf bytes to protobuf bytes, in a worker process.

When every grader of a BatchEvaluate call can run in a worker, the server's event loop does not touch the
samples one by one: it cuts the request into chunks of serialized samples, and a worker parses its chunk,
grades it with every grader, adds the rewards and serializes the response message. Cheap graders then use
every core as heavy ones do, for a hop per chunk instead of a pickled dict per sample.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpcgrade.core.grading import Stats, failed_stats, grade_chunk_sync, join_stats
from grpcgrade.core.histograms import EMPTY
from grpcgrade.core.registry import get_registry
from grpcgrade.core.rewards import RewardStats, SpecData, reward_stats, rewards
from grpcgrade.core.samples import Limits
from grpcgrade.core.workers import Work
from grpcgrade.grader import GraderError
from grpcgrade.v1 import grading_pb2 as pb

from .convert import fill_items, sample_kwargs

Labels = list[tuple[str, str]]


def grade_wire(
    specs: list[SpecData],
    data: bytes,
    offset: int,
    full: bool,
    limits: Limits,
    timeout: float | None,
    reward: str = "",
    deadline: float | None = None,
) -> tuple[bytes, list[Stats]]:
    """Runs in the worker: a serialized BatchEvaluateRequest's samples in, a serialized response out; with
    the configured `reward`'s name, its values are counted here too. Past the call's `deadline`
    (`time.monotonic()`) the samples left are answered BUDGET_EXCEEDED."""
    registry = get_registry()
    samples = pb.BatchEvaluateRequest.FromString(data).samples
    graders = [registry.build(spec.name, spec.params) for spec in specs]
    columns, graded = grade_chunk_sync(graders, [sample_kwargs(s, limits) for s in samples], timeout, deadline)
    stats: list[Stats] = list(graded)
    labels = [(spec.label, grader.name) for spec, grader in zip(specs, graders, strict=True)]
    out = pb.BatchEvaluateResponse()
    ids = [s.id for s in samples]
    values = rewards(specs, columns)
    if reward:
        stats.append(reward_stats(reward, values))
    fill_items(out.items, range(offset, offset + len(ids)), ids, labels, columns, values, full)
    return out.SerializeToString(), stats


def wire_work(
    specs: list[SpecData],
    labels: Labels,
    samples: Sequence[pb.Sample],
    offset: int,
    full: bool,
    limits: Limits,
    timeout: float | None,
    reward: str = "",
    deadline: float | None = None,
) -> Work:
    """`samples` (the request's `offset`...) as one unit of pool work; its result is `(bytes, [Stats])`:
    each grader's, and the configured `reward`'s when the call names one. Past the call's `deadline`
    (`time.monotonic()`) the samples left are answered BUDGET_EXCEEDED."""
    data = pb.BatchEvaluateRequest(samples=samples).SerializeToString()

    def split() -> list[Work]:
        return [
            wire_work(specs, labels, [s], offset + k, full, limits, timeout, reward, deadline)
            for k, s in enumerate(samples)
        ]

    def failed(code: str, message: str) -> tuple[bytes, list[Stats]]:
        """Every grader's error for the one sample no worker could grade (which grader hung is unknown)."""
        out = pb.BatchEvaluateResponse()
        errors = [[GraderError(name, message, code=code)] for _, name in labels]
        fill_items(out.items, [offset], [samples[0].id], labels, errors, [None], full)
        stats: list[Stats] = [failed_stats(name, code, first=j == 0) for j, (_, name) in enumerate(labels)]
        if reward:
            stats.append(RewardStats(reward, EMPTY, 1))
        return out.SerializeToString(), stats

    args = (specs, data, offset, full, limits, timeout, reward, deadline)
    return Work(grade_wire, args, len(samples), timeout, split, failed, _join)


def _join(parts: list[tuple[bytes, list[Stats]]]) -> tuple[bytes, list[Stats]]:
    """Serialized messages concatenate into their merge: the items of all parts, in order."""
    return b"".join(data for data, _ in parts), join_stats([stats for _, stats in parts])
