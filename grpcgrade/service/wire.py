"""A batch chunk graded from protobuf bytes to protobuf bytes, in a worker process.

When every grader of a BatchEvaluate call can run in a worker, the server's event loop does not touch the
samples one by one: it cuts the request's own bytes into chunks of serialized samples, and a worker parses
its chunk, grades it with every grader, adds the rewards and serializes the response message. Cheap graders
then use every core as heavy ones do, for a hop per chunk instead of a pickled dict per sample.

Cutting: a serialized BatchEvaluateRequest holds each sample as one record (tag 0x12, a varint length, the
sample's bytes), and records concatenate into a valid message, so samples a..b-1 are one slice of the bytes
that arrived (`ReceivedBatch`). A request that is one chunk goes to the worker as it arrived. The bytes are
kept for the call beside the parsed message (the request is held twice, within `max_message_bytes` each),
the price of never parsing and writing a sample again to send it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpcgrade.core.grading import Stats, column_inputs, failed_stats, grade_chunk_sync, grade_columns, join_stats
from grpcgrade.core.histograms import EMPTY
from grpcgrade.core.registry import get_registry
from grpcgrade.core.result_cache import QUARANTINE_CODES
from grpcgrade.core.rewards import Result, RewardStats, SpecData, reward_stats, rewards
from grpcgrade.core.samples import Limits
from grpcgrade.core.workers import Work
from grpcgrade.grader import BaseGrader, GraderError
from grpcgrade.v1 import grading_pb2 as pb

from .convert import fill_items, sample_kwargs

Labels = list[tuple[str, str]]

SAMPLE_TAG = 0x12  # field 2 (`samples`), wire type 2 (length-delimited)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; IndexError past the end."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def sample_offsets(data: bytes) -> list[int] | None:
    """Where each sample record of a serialized BatchEvaluateRequest starts, and where the last one ends
    (n + 1 offsets), when the records are one run (as every protobuf library writes them); None when they are
    not (interleaved with other fields, or a group): the caller then re-serializes."""
    starts: list[int] = []
    append = starts.append
    end = -1  # where the run of sample records ends so far
    pos, size = 0, len(data)
    try:
        while pos < size:
            tag = data[pos]
            if tag == SAMPLE_TAG:
                if starts and pos != end:
                    return None  # a second run of samples
                byte = data[pos + 1]  # a sample's length: one varint byte up to 127, else more
                length, after = (byte, pos + 2) if byte < 0x80 else _varint(data, pos + 1)
                append(pos)
                pos = end = after + length
                continue
            key, pos = _varint(data, pos)
            kind = key & 7
            if kind == 0:
                _, pos = _varint(data, pos)
            elif kind == 1:
                pos += 8
            elif kind == 2:
                length, pos = _varint(data, pos)
                pos += length
            elif kind == 5:
                pos += 4
            else:
                return None  # groups: never written for this message
    except IndexError:
        return None
    if pos != size:
        return None
    if starts:
        starts.append(end)
    return starts


class ReceivedBatch:
    """A BatchEvaluateRequest as it arrived: the parsed message, whose fields read through (`request.samples`,
    `request.view`...), and its bytes, from which whole chunks are cut without re-serializing a sample.

    It is the request deserializer of BatchEvaluate: bytes protobuf refuses raise its DecodeError as before.
    """

    __slots__ = ("message", "data", "_offsets", "_scanned")

    def __init__(self, data: bytes) -> None:
        self.message = pb.BatchEvaluateRequest.FromString(data)
        self.data = data
        self._offsets: list[int] | None = None
        self._scanned = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.message, name)

    def samples_bytes(self, start: int, stop: int) -> bytes:
        """A serialized BatchEvaluateRequest whose samples are the request's `start`..`stop-1`."""
        n = len(self.message.samples)
        if start == 0 and stop == n:
            return self.data  # the graders and the other fields travel too: the worker reads only `samples`
        if not self._scanned:  # once per request, when it is cut into several chunks
            offsets = sample_offsets(self.data)
            self._offsets = offsets if offsets is not None and len(offsets) == n + 1 else None
            self._scanned = True
        offsets = self._offsets
        if offsets is None:
            return pb.BatchEvaluateRequest(samples=self.message.samples[start:stop]).SerializeToString()
        return self.data[offsets[start] : offsets[stop]]


def grade_serialized(
    graders: Sequence[BaseGrader],
    specs: list[SpecData],
    data: bytes,
    offset: int,
    full: bool,
    limits: Limits,
    timeout: float | None,
    reward: str = "",
    deadline: float | None = None,
) -> tuple[bytes, list[Stats]]:
    """A serialized BatchEvaluateRequest's samples in (the request's `offset`...), a serialized response out;
    with the configured `reward`'s name, its values are counted here too. Past the call's `deadline`
    (`time.monotonic()`) the samples left are answered BUDGET_EXCEEDED."""
    samples = pb.BatchEvaluateRequest.FromString(data).samples
    # No field of a sample holds more characters than the chunk has bytes: one comparison clears them all.
    small = len(data) <= limits.max_field_chars

    def kwargs() -> list[Any]:
        return [sample_kwargs(s, limits, small) for s in samples]

    columns: list[list[Result]]
    fields = _column_fields(graders) if not full and small and deadline is None else None
    if fields is not None and not any(s.HasField("extra") for s in samples):
        # The scores view of graders with a `score_column`: text columns in, scores out, no dict per sample.
        # (A call with a step budget is graded sample by sample: the budget cuts between samples.)
        text = {name: [getattr(s, name) for s in samples] for name in fields}
        columns, graded = grade_columns(graders, text, len(samples), kwargs, timeout)
    else:
        columns, graded = grade_chunk_sync(graders, kwargs(), timeout, deadline)  # type: ignore[assignment]
    stats: list[Stats] = list(graded)
    labels = [(spec.label, grader.name) for spec, grader in zip(specs, graders, strict=True)]
    out = pb.BatchEvaluateResponse()
    ids = [s.id for s in samples]
    values = rewards(specs, columns)
    if reward:
        stats.append(reward_stats(reward, values))
    fill_items(out.items, range(offset, offset + len(ids)), ids, labels, columns, values, full)
    return out.SerializeToString(), stats


def _column_fields(graders: Sequence[BaseGrader]) -> set[str] | None:
    """The text fields every grader's `score_column` takes, or None when one of them has none."""
    fields: set[str] = set()
    for grader in graders:
        inputs = column_inputs(grader)
        if not inputs:
            return None
        fields.update(inputs)
    return fields


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
    """Runs in the worker: its own registry's graders over `grade_serialized`."""
    registry = get_registry()
    graders = [registry.build(spec.name, spec.params) for spec in specs]
    return grade_serialized(graders, specs, data, offset, full, limits, timeout, reward, deadline)


def wire_work(
    specs: list[SpecData],
    labels: Labels,
    request: ReceivedBatch,
    start: int,
    stop: int,
    full: bool,
    limits: Limits,
    timeout: float | None,
    reward: str = "",
    deadline: float | None = None,
) -> Work:
    """The request's samples `start`..`stop-1` as one unit of pool work; its result is `(bytes, [Stats])`:
    each grader's, and the configured `reward`'s when the call names one. Past the call's `deadline`
    (`time.monotonic()`) the samples left are answered BUDGET_EXCEEDED."""
    data = request.samples_bytes(start, stop)

    def split() -> list[Work]:
        return [
            wire_work(specs, labels, request, k, k + 1, full, limits, timeout, reward, deadline)
            for k in range(start, stop)
        ]

    def failed(code: str, message: str) -> tuple[bytes, list[Stats]]:
        """Every grader's error for the one sample no worker could grade (which grader hung is unknown)."""
        out = pb.BatchEvaluateResponse()
        errors = [[GraderError(name, message, code=code)] for _, name in labels]
        fill_items(out.items, [start], [request.message.samples[start].id], labels, errors, [None], full)
        stats: list[Stats] = [failed_stats(name, code, first=j == 0) for j, (_, name) in enumerate(labels)]
        if reward:
            stats.append(RewardStats(reward, EMPTY, 1))
        return out.SerializeToString(), stats

    args = (specs, data, start, full, limits, timeout, reward, deadline)
    return Work(grade_wire, args, stop - start, timeout, split, failed, _join)


def quarantine_failures(payload: bytes) -> list[tuple[int, int, GraderError]]:
    """(sample index, grader position, error) of each TIMEOUT or WORKER_LOST result in a whole chunk's
    answer: asked only of an answer whose stats count one, so the parse is rare."""
    items = pb.BatchEvaluateResponse.FromString(payload).items
    return [
        (item.index, j, GraderError(r.grader, r.error.message, code=r.error.code))
        for item in items
        for j, r in enumerate(item.result.results)
        if r.error.code in QUARANTINE_CODES
    ]


def _join(parts: list[tuple[bytes, list[Stats]]]) -> tuple[bytes, list[Stats]]:
    """Serialized messages concatenate into their merge: the items of all parts, in order."""
    return b"".join(data for data, _ in parts), join_stats([stats for _, stats in parts])
