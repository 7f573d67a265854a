"""A face process's one way to the engine: the service's own gRPC contract, `BatchEvaluate`, on the engine
process's private socket (`EngineLink`). The HTTP faces and the gRPC face processes both grade through it.

A face process only translates: it reads, bounds and checks what a client sends, and the grading is a
BatchEvaluate call to the engine's process, exactly as any gRPC client's, with the server's token when it
has one. So one engine, one cache and quarantine, one worker pool serve every face, and nothing a face's
client sends runs on the engine's event loop.

- A large request goes in pieces of `FORWARD_PIECE` samples, `FORWARD_WINDOW` of them in flight: one
  message of 100k samples is one long parse on the engine's loop (gRPC callers would queue behind it),
  a piece a short one.
- The reward guard keeps its meaning across pieces: each piece carries the time left of the request's
  `budget_seconds`, and the failures are tallied here over the whole request (`core.guard.FailureTally`),
  so a request past its `max_failure_ratio` ends (its pieces still in flight cancelled) as it did in one
  call.
- Concurrent one-sample requests are gathered by the server's coalescer (`core.coalesce`), with this
  link in the engine's place: a crowd costs the engine's process a call per chunk, not per sample.
- An engine call that failed (the engine's process refusing, restarting, draining or away) is the face's
  failure in its own protocol's words (`EngineLink.failed`: `EngineFailed` here, an HTTP answer in
  `http.forward`), never a made-up reward.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from grpcgrade.client import unary_refused
from grpcgrade.core.context import CALLER, CALLER_HEADER, DEFAULT_CALLER
from grpcgrade.core.engine import Chunk, ChunkResult, Job
from grpcgrade.core.errors import ErrorCode, SampleProblem
from grpcgrade.core.grading import Stats, problem_stats
from grpcgrade.core.guard import FailureTally
from grpcgrade.core.rewards import reward_stats
from grpcgrade.grader import GraderError, GraderMode, GraderRank, GraderResult, GraderScore
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc

from .convert import spec_from_data, unwritable_sample, write_sample
from .structs import struct_to_dict

#: Samples per forwarded BatchEvaluate: the engine's loop parses one piece per step (a few ms).
FORWARD_PIECE = 4096
#: Pieces of one request in flight at once.
FORWARD_WINDOW = 2


Kwargs = dict[str, Any] | SampleProblem
#: gRPC metadata as (key, value) pairs.
Metadata = Sequence[tuple[str, str | bytes]]


class EngineFailed(Exception):
    """An engine call that failed, as the engine's process (or gRPC, when it was away) said it: the face
    answers with the same status, details and trailers (a retry hint among them)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details, self.trailing = code, details, tuple(trailing)


def cache_of(jobs: Sequence[Job]) -> pb.CacheMode:
    """The cache mode that makes the engine decide each grader's cache use as the face's plan did: the
    face resolves with the same configuration, so all, none or the per-grader default."""
    uses = {job.use_cache for job in jobs}
    if uses == {True}:
        return pb.CACHE_MODE_ON
    if uses == {False}:
        return pb.CACHE_MODE_OFF
    return pb.CACHE_MODE_UNSPECIFIED


def pointwise(jobs: Sequence[Job]) -> bool:
    """Whether every grader is pointwise (the columns view holds no ranks)."""
    return all(job.grader.mode is GraderMode.POINTWISE for job in jobs)


def _result(message: pb.GraderResult) -> GraderResult:
    metadata = struct_to_dict(message.metadata) if message.HasField("metadata") else {}
    if message.HasField("error"):
        error = message.error
        return GraderError(message.grader, error.message, message.reason, code=error.code, metadata=metadata)
    if message.rank:
        return GraderRank(message.grader, list(message.rank), message.reason, metadata, cached=message.cached)
    return GraderScore(message.grader, message.score, message.reason, metadata, cached=message.cached)


def _from_items(items: Sequence[pb.BatchItem], offset: int, width: int) -> ChunkResult:
    indices = [offset + item.index for item in items]
    columns: list[list[GraderResult]] = [[] for _ in range(width)]
    rewards: list[float | None] = []
    for item in items:
        for j, result in enumerate(item.result.results):
            columns[j].append(_result(result))
        rewards.append(item.result.reward if item.result.HasField("reward") else None)
    return ChunkResult(indices, columns, rewards)


def _from_columns(message: pb.ResultColumns, offset: int) -> ChunkResult:
    absent = set(message.reward_absent_rows)
    rewards = [None if r in absent else value for r, value in enumerate(message.rewards)]
    columns: list[list[GraderResult]] = []
    for column in message.scores:
        errors = dict(zip(column.error_rows, column.errors, strict=True))
        cached = set(column.cached_rows)
        name = column.grader
        columns.append([
            GraderError(name, errors[r].message, code=errors[r].code) if r in errors
            else GraderScore(name, score, cached=r in cached)
            for r, score in enumerate(column.scores)
        ])  # fmt: skip
    return ChunkResult([offset + i for i in message.indices], columns, rewards)


def unusable_result(jobs: Sequence[Job], indices: Sequence[int], problems: Sequence[SampleProblem]) -> ChunkResult:
    """Samples the face could not make (each its problem): INVALID_SAMPLE from every grader, no reward,
    as the engine answers them; they never travel."""
    columns: list[list[GraderResult]] = [
        [GraderError(job.grader.name, str(p), code=ErrorCode.INVALID_SAMPLE) for p in problems] for job in jobs
    ]
    return ChunkResult(list(indices), columns, [None] * len(problems))


class EngineLink:
    """A face process's gRPC channel to the engine's process, and the two ways a face grades through it:
    `grade_chunk` (one call, the coalescer's) and `grade_pieces` (a request's samples in pieces)."""

    def failed(self, code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> BaseException:
        """What an engine call that ended with `code` raises: `EngineFailed` (the HTTP faces' link
        answers in HTTP's words instead)."""
        return EngineFailed(code, details, trailing)

    def __init__(self, target: str, token: str | None, max_message_bytes: int) -> None:
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        self.channel = grpc.aio.insecure_channel(target, options=options)
        self.stub = grading_pb2_grpc.GradingServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        #: Told what the engine's metrics would have counted for samples answered here (the unusable ones:
        #: INVALID_SAMPLE for each grader, and no reward), so /metrics counts them as before.
        self.observer: Callable[[list[Stats]], None] | None = None

    async def close(self) -> None:
        await self.channel.close()

    # The coalescer's engine: every call is gathered (the engine's process decides what runs inline).
    def inline_small(self, jobs: Sequence[Job], nbytes: int) -> bool:
        return False

    async def grade_chunk(
        self, jobs: Sequence[Job], chunk: Chunk, timeout: float | None = None, reward: str = "",
        deadline: float | None = None, nbytes: int = 0, *, full: bool = False,
    ) -> ChunkResult:  # fmt: skip
        """One chunk graded by one BatchEvaluate (its unusable samples answered here); `full`: with each
        result's reason and metadata (the scores view otherwise)."""
        calls = self._call(jobs, chunk, reward, timeout, deadline, full=full, one_message=True)
        parts = [part async for part in calls]
        return _joined(parts, [index for index, _ in chunk], len(jobs))

    async def evaluate(
        self, request: pb.EvaluateRequest, metadata: Metadata, timeout: float | None
    ) -> pb.EvaluateResponse:
        """One call's Evaluate made to the engine's process as it came (with the call's `metadata`): the
        engine answers it as its own port does."""
        try:
            response: pb.EvaluateResponse = await self.stub.Evaluate(request, metadata=metadata, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise self.failed(exc.code(), exc.details() or "", tuple(exc.trailing_metadata() or ())) from None
        return response

    async def grade_pieces(
        self,
        jobs: Sequence[Job],
        n: int,
        sample: Callable[[int], Kwargs],
        reward: str,
        deadline: float | None,
        failures: FailureTally | None,
        *,
        full: bool = False,
    ) -> AsyncIterator[ChunkResult]:
        """Samples 0..n-1 (`sample(i)` makes each, a piece at a time) graded piece by piece
        (`FORWARD_WINDOW` pieces in flight), each piece's results as they come; TooManyFailures once the
        request's failures are past its ratio."""
        starts = list(range(0, n, FORWARD_PIECE))
        names = [job.grader.name for job in jobs]
        queue: asyncio.Queue[ChunkResult | BaseException | None] = asyncio.Queue()
        window = asyncio.Semaphore(FORWARD_WINDOW)

        async def piece(a: int) -> None:
            async with window:
                chunk = [(i, sample(i)) for i in range(a, min(a + FORWARD_PIECE, n))]
                try:
                    async for part in self._call(jobs, chunk, reward, None, deadline, full=full):
                        await queue.put(part)
                except BaseException as exc:
                    await queue.put(exc)
                    raise
                await queue.put(None)  # this piece is done

        tasks = [asyncio.ensure_future(piece(a)) for a in starts]
        done = ended = 0
        try:
            while ended < len(tasks):
                part = await queue.get()
                if isinstance(part, BaseException):
                    raise part
                if part is None:
                    ended += 1
                    continue
                done += len(part.indices)
                if failures is not None:
                    failures.add_columns(names, part.columns, part.rewards)
                    failures.check()
                yield part
            if done != n:  # never expected: the engine answers every sample it takes
                raise self.failed(grpc.StatusCode.INTERNAL, f"the grading engine answered {done} of {n} samples")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _call(
        self,
        jobs: Sequence[Job],
        chunk: Sequence[tuple[int, Kwargs]],
        reward: str,
        timeout: float | None,
        deadline: float | None,
        *,
        full: bool = False,
        one_message: bool = False,
    ) -> AsyncIterator[ChunkResult]:
        """One BatchEvaluate of `chunk`'s usable samples; yields its answer's messages (and the unusable
        samples' answer) with the face's indices. `one_message`: a chunk answered whole (a coalesced crowd's)
        is asked as BatchEvaluateUnary when its answer is columns (one message each way costs the engine's
        process less than a stream), and as BatchEvaluate when that answer was over one message (the
        client's rule, `client.unary_refused`; the engine is never older than its face)."""
        good: list[tuple[int, dict[str, Any]]] = [(i, kw) for i, kw in chunk if not isinstance(kw, SampleProblem)]
        bad: list[tuple[int, SampleProblem]] = [(i, kw) for i, kw in chunk if isinstance(kw, SampleProblem)]
        wrapped = pb.BatchEvaluateUnaryRequest()  # the request is written in place, for either method
        request = wrapped.batch
        request.view = pb.RESULT_VIEW_FULL if full or not pointwise(jobs) else pb.RESULT_VIEW_COLUMNS
        request.cache = cache_of(jobs)
        add = request.samples.add
        try:
            for _, kw in good:
                write_sample(add(), kw)
        except (TypeError, ValueError, AttributeError, OverflowError):
            good = _written(request, good, bad)
        if bad:
            if self.observer is not None:
                stats: list[Stats] = [problem_stats(job.grader.name, len(bad)) for job in jobs]
                self.observer([*stats, reward_stats(reward, [None] * len(bad))] if reward else stats)
            yield unusable_result(jobs, [i for i, _ in bad], [p for _, p in bad])
        if not good:
            return
        if reward:
            request.reward = reward
        else:
            request.graders.extend(spec_from_data(job.spec) for job in jobs)
        if timeout:
            request.grader_timeout_seconds = timeout
        if deadline is not None:
            request.budget_seconds = max(deadline - time.monotonic(), 0.001)
        caller = CALLER.get()  # the HTTP request's (`http.app`'s middleware): the judges' fair share
        metadata = self.metadata + (((CALLER_HEADER, caller),) if caller != DEFAULT_CALLER else ())
        positions = [i for i, _ in good]
        if one_message and request.view == pb.RESULT_VIEW_COLUMNS:
            try:
                answer = await self.stub.BatchEvaluateUnary(wrapped, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED or not unary_refused(exc):  # the face's failure
                    raise self.failed(exc.code(), exc.details() or "", tuple(exc.trailing_metadata() or ())) from None
            else:
                part = _from_columns(answer.answer.columns, 0)
                yield ChunkResult([positions[k] for k in part.indices], part.columns, part.rewards)
                return
        try:
            async for message in self.stub.BatchEvaluate(request, metadata=metadata):
                part = (
                    _from_columns(message.columns, 0)
                    if message.HasField("columns")
                    else _from_items(message.items, 0, len(jobs))
                )
                yield ChunkResult([positions[k] for k in part.indices], part.columns, part.rewards)
        except grpc.aio.AioRpcError as exc:
            raise self.failed(exc.code(), exc.details() or "", tuple(exc.trailing_metadata() or ())) from None


def _written(
    request: pb.BatchEvaluateRequest,
    good: list[tuple[int, dict[str, Any]]],
    bad: list[tuple[int, SampleProblem]],
) -> list[tuple[int, dict[str, Any]]]:
    """`good`'s samples written into `request` again, each one protobuf cannot hold (a JSON body's lone
    surrogate, which UTF-8 cannot encode; an integer past a double's range in `extra`) moved to `bad` as the
    INVALID_SAMPLE it is, naming its field: one such sample never costs the others of its chunk (a coalesced
    crowd's) their results. Only after a write failed: the usual chunk is written once."""
    del request.samples[:]
    add, kept = request.samples.add, []
    for i, kw in good:
        try:
            write_sample(add(), kw)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            del request.samples[-1]
            bad.append((i, unwritable_sample(kw, exc)))
        else:
            kept.append((i, kw))
    return kept


def _joined(parts: Sequence[ChunkResult], order: list[int], width: int) -> ChunkResult:
    """Parts of one chunk's answer as one, in `order` (the chunk's indices)."""
    if len(parts) == 1 and parts[0].indices == order:  # the usual answer: one message, in order
        return parts[0]
    where: dict[int, tuple[ChunkResult, int]] = {}
    for part in parts:
        for k, index in enumerate(part.indices):
            where[index] = (part, k)
    columns: list[list[GraderResult]] = [[] for _ in range(width)]
    rewards: list[float | None] = []
    for index in order:
        part, k = where[index]
        for j in range(width):
            columns[j].append(part.columns[j][k])
        rewards.append(part.rewards[k])
    return ChunkResult(list(order), columns, rewards)
