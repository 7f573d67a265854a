"""The GradingService: translates protobuf to the engine's Python calls and back, nothing more."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any

import grpc

from grpcgrade.core.admission import Admission
from grpcgrade.core.budget import OutputBudget
from grpcgrade.core.coalesce import ServerCoalescer
from grpcgrade.core.engine import INLINE_MAX_BYTES, INLINE_RESULTS_MAX_BYTES, Batch, Chunk, Engine, Plan
from grpcgrade.core.errors import (
    MAX_DETAIL_CHARS,
    InvalidParams,
    Refused,
    TooManyFailures,
    UnknownGrader,
    UnknownReward,
)
from grpcgrade.core.guard import FailureTally, call_guards
from grpcgrade.core.plan import Job, required_inputs
from grpcgrade.core.samples import Limits
from grpcgrade.grader import GraderMode
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

from .catalog import list_graders
from .convert import (
    cache_mode,
    fill_columns,
    fill_items,
    fill_response,
    is_full,
    leave_out_details,
    sample_kwargs,
    slice_columns,
    spec_from_pb,
)
from .metrics import Metrics
from .overload import refuse
from .wire import WIRE, ReceivedBatch, encoded, unwrapped_batch, wrapped_answer

Request = pb.EvaluateRequest | ReceivedBatch


def _spec_key(spec: pb.GraderSpec) -> bytes:
    """One spec's part of a call's resolution key: its encoding, length-prefixed so that no two lists of
    specs join into the same bytes."""
    data = spec.SerializeToString()
    return len(data).to_bytes(4, "little") + data


def _full(request: Request) -> bool:
    """Evaluate answers RESULT_VIEW_COLUMNS as the scores view: one sample has no columns to pack."""
    return is_full(request.view)


Message = pb.BatchEvaluateResponse | bytes

#: A stream's first message up to this size carries its headers; a larger one goes after them, sent on their
#: own. grpc aio never sends the status of a stream whose first write, carrying the headers, was cancelled by
#: the send timeout (grpcio 1.85, measured): so a message a stalled reader's flow-control window can hold up
#: goes after its headers. One this small fits any HTTP/2 stream's first window (64 KiB), and a gRPC client
#: that does not read still takes the connection's bytes (12 unread 10 MB streams on one channel held up no
#: small first message, measured), so only a peer that stops reading its socket altogether can stall it, and
#: that peer takes no status either. Headers on their own cost a batch of gRPC operations and a `sendmsg`:
#: 0.1-0.15 ms of an 8-sample step (measured on a bare grpc.aio server).
HEADERS_WITH_MESSAGE_BYTES = 16 * 1024
#: BatchEvaluateUnaryResponse's own bytes around the answer it holds: a tag and a length (at most 5 bytes).
UNARY_FRAMING_BYTES = 6


def _serialize(message: Message) -> bytes:
    """A worker's chunk arrives serialized already (see `wire`) and goes out as it is."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def _fitted(message: pb.BatchEvaluateResponse, limit: int) -> list[pb.BatchEvaluateResponse]:
    """The message, or its items (or rows) over several messages, each within the message size limit: long
    reasons or error messages make a chunk's answer large, and a stream must not fail for it. A single item
    over the limit goes without its details (`convert.leave_out_details`)."""
    rows = len(message.columns.indices) if message.HasField("columns") else len(message.items)
    if message.ByteSize() <= limit:
        return [message]
    if rows < 2:
        if message.HasField("columns"):  # one row: only its error messages can be long
            for column in message.columns.scores:
                for error in column.errors:
                    error.message = error.message[:MAX_DETAIL_CHARS]
        else:
            for item in message.items:
                leave_out_details(item.result, limit)
        return [message]
    half = rows // 2
    parts = []
    if message.HasField("columns"):
        for a, b in ((0, half), (half, rows)):
            parts.extend(_fitted(pb.BatchEvaluateResponse(columns=slice_columns(message.columns, a, b)), limit))
        return parts
    for items in (message.items[:half], message.items[half:]):
        part = pb.BatchEvaluateResponse()
        part.items.extend(items)
        parts.extend(_fitted(part, limit))
    return parts


def _answered(message: pb.BatchEvaluateResponse) -> int:
    return len(message.columns.indices) if message.HasField("columns") else len(message.items)


def add_to_server(servicer: GradingServicer, server: grpc.aio.Server) -> None:
    """The generated `add_GradingServiceServicer_to_server`, but BatchEvaluate may yield bytes, and the two
    batch methods take their requests as they arrived (`wire.ReceivedBatch`)."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Evaluate": grpc.unary_unary_rpc_method_handler(
            servicer.Evaluate,
            request_deserializer=pb.EvaluateRequest.FromString,
            response_serializer=pb.EvaluateResponse.SerializeToString,
        ),
        "BatchEvaluate": grpc.unary_stream_rpc_method_handler(
            servicer.BatchEvaluate,
            request_deserializer=ReceivedBatch,
            response_serializer=_serialize,
        ),
        "BatchEvaluateUnary": grpc.unary_unary_rpc_method_handler(
            servicer.BatchEvaluateUnary,
            request_deserializer=unwrapped_batch,
            response_serializer=_serialize,
        ),
        "ListGraders": grpc.unary_unary_rpc_method_handler(
            servicer.ListGraders,
            request_deserializer=pb.ListGradersRequest.FromString,
            response_serializer=pb.ListGradersResponse.SerializeToString,
        ),
    }
    name = pb.DESCRIPTOR.services_by_name["GradingService"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


class GradingServicer(pb_grpc.GradingServiceServicer):
    def __init__(
        self,
        engine: Engine,
        limits: Limits,
        metrics: Metrics | None = None,
        admission: Admission | None = None,
        coalescer: ServerCoalescer | None = None,
    ) -> None:
        self.coalescer = coalescer  # None: each unary call graded alone
        self.engine = engine
        self.limits = limits
        self.metrics = metrics
        self.admission = admission or Admission(limits)
        self.budget = OutputBudget(limits.max_buffered_output_bytes)

    def _in_flight(self, delta: int) -> None:
        """Moves the in-flight gauge once per call or streamed chunk: per sample would cost more than cheap grading."""
        if self.metrics is not None:
            self.metrics.in_flight.inc(delta)

    async def _resolve(self, request: Request, context: grpc.aio.ServicerContext) -> tuple[Plan, float | None]:
        """The call's plan and per-sample time limit; aborts the call for a bad request."""
        specs = list(request.graders)
        if len(specs) > self.limits.max_graders_per_request:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(specs)} graders in one request, over the limit "
                f"max_graders_per_request={self.limits.max_graders_per_request}",
            )
        try:
            key = b"".join(_spec_key(s) for s in specs)  # the specs as they arrived: the same bytes, the same specs
            jobs = self.engine.resolve_keyed(
                key, lambda: [spec_from_pb(s) for s in specs], request.reward, cache_mode(request.cache)
            )
            return jobs, self.engine.timeout(request.grader_timeout_seconds)
        except (UnknownGrader, UnknownReward) as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except InvalidParams as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise AssertionError("unreachable: abort raises")

    @staticmethod
    def _labels(jobs: Sequence[Job]) -> list[tuple[str, str]]:
        return [(job.spec.label, job.grader.name) for job in jobs]

    def coalescer_for(self, request: pb.EvaluateRequest) -> ServerCoalescer | None:
        """The coalescer a unary call's sample joins (a gRPC face process keeps one per view, `grpc_face`)."""
        return self.coalescer

    async def Evaluate(self, request: pb.EvaluateRequest, context: grpc.aio.ServicerContext) -> pb.EvaluateResponse:
        size = request.ByteSize()
        try:
            self.admission.enter(1, size)
        except Refused as exc:
            await refuse(context, exc)
        self._in_flight(1)
        try:
            jobs, timeout = await self._resolve(request, context)
            kwargs = sample_kwargs(request.sample, self.limits, required=required_inputs(jobs))
            coalescer = self.coalescer_for(request)
            if coalescer is not None:  # graded with the concurrent calls of the same plan
                results, reward = await coalescer.grade(jobs, kwargs, timeout, request.reward, size)
            else:
                graded = await self.engine.grade_chunk(jobs, [(0, kwargs)], timeout, request.reward, nbytes=size)
                results, reward = [column[0] for column in graded.columns], graded.rewards[0]
        finally:
            self._in_flight(-1)
            self.admission.leave(1, size)
        response = pb.EvaluateResponse()
        fill_response(response, request.sample.id, self._labels(jobs), results, reward, _full(request))
        if response.ByteSize() > self.limits.max_message_bytes:
            leave_out_details(response, self.limits.max_message_bytes)
        return response

    async def _admitted(self, request: ReceivedBatch, context: grpc.aio.ServicerContext) -> int:
        """The batch's sample count, once the call is within the batch limit and admitted (`admission.enter`
        with its samples and its message's bytes: the caller leaves with both); aborts the call
        otherwise."""
        try:
            n = request.rows.n
        except InvalidParams as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.reason)
        if n > self.limits.max_samples_per_batch:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{n} samples in one batch, over the limit max_samples_per_batch="
                f"{self.limits.max_samples_per_batch}; split the batch (the Python client does)",
            )
        try:
            self.admission.enter(n, len(request.data))
        except Refused as exc:
            await refuse(context, exc)
        return n

    async def _batch_plan(
        self, request: ReceivedBatch, context: grpc.aio.ServicerContext, n: int, started: float
    ) -> tuple[Plan, float | None, Iterator[tuple[int, int]], float | None, FailureTally | None]:
        """An admitted batch's plan, time limit, chunks and guards (deadline, failure tally); aborts the call
        for a bad request."""
        jobs, timeout = await self._resolve(request, context)
        request.rows.required = required_inputs(jobs)
        if request.view == pb.RESULT_VIEW_COLUMNS:
            listwise = next((job for job in jobs if job.grader.mode is GraderMode.LISTWISE), None)
            if listwise is not None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"RESULT_VIEW_COLUMNS carries scores, and grader {listwise.grader.name!r} (key "
                    f"{listwise.spec.label!r}) is listwise: it ranks; ask for RESULT_VIEW_SCORES instead",
                )
        ratio = request.max_failure_ratio if request.HasField("max_failure_ratio") else None
        try:
            deadline, failures = call_guards(request.budget_seconds, ratio, n, started)
        except InvalidParams as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if self.metrics is not None:
            self.metrics.batch_samples.observe(n)
        return jobs, timeout, self.engine.chunks(jobs, n, request.chunk_size), deadline, failures

    async def BatchEvaluate(self, request: ReceivedBatch, context: grpc.aio.ServicerContext) -> None:
        """Streams the answers with `context.write`, each write timed: a client that takes no message for
        `send_timeout_seconds` has its call ended (RESOURCE_EXHAUSTED), its running chunks cancelled and its
        graded answers dropped, so a reader that never reads cannot hold the server's memory.

        The call's guards (`budget_seconds` from now, `max_failure_ratio`) are the engine's: past the budget
        the rest comes back as BUDGET_EXCEEDED results and the stream ends OK; past the failure budget the
        call ends FAILED_PRECONDITION."""
        started = time.monotonic()
        n = await self._admitted(request, context)
        try:
            await self._answer_batch(request, context, n, started)
        finally:
            self.admission.leave(n, len(request.data))

    async def BatchEvaluateUnary(self, request: ReceivedBatch, context: grpc.aio.ServicerContext) -> bytes:
        """BatchEvaluate answered in one message (a serialized BatchEvaluateUnaryResponse): the chunks' answers
        joined as they finish. One over `max_message_bytes` ends the call RESOURCE_EXHAUSTED, naming
        BatchEvaluate; past the failure budget the call ends FAILED_PRECONDITION, as BatchEvaluate's does."""
        started = time.monotonic()
        n = await self._admitted(request, context)
        try:
            jobs, timeout, chunks, deadline, failures = await self._batch_plan(request, context, n, started)
            limit = self.limits.max_message_bytes - UNARY_FRAMING_BYTES
            parts: list[bytes] = []
            size = 0
            self._in_flight(n)
            messages = None
            try:
                # A trainer's step: one small chunk graded here and now, with no generator or task.
                now = self._graded_now(request, jobs, n, timeout, deadline, failures)
                if now is not None:
                    parts.append(now)
                    size = len(now)
                else:
                    messages = self._graded(request, jobs, chunks, timeout, deadline, failures)
                    async for message, _count in messages:
                        parts.append(message)
                        size += len(message)
                        if size > limit:
                            break
            except TooManyFailures as exc:
                if self.metrics is not None:
                    self.metrics.failure_budget_calls.inc()
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            finally:  # done, over the size or failed: running chunks stop, graded ones are dropped
                if messages is not None:
                    await messages.aclose()
                self._in_flight(-n)
        finally:
            self.admission.leave(n, len(request.data))
        if size > limit:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the answer of {n} samples is over one message (max_message_bytes="
                f"{self.limits.max_message_bytes}); call BatchEvaluate, which streams it in parts",
            )
        return wrapped_answer(parts[0] if len(parts) == 1 else WIRE.concat(parts))

    async def _answer_batch(
        self, request: ReceivedBatch, context: grpc.aio.ServicerContext, n: int, started: float
    ) -> None:
        """BatchEvaluate's work once the call is admitted."""
        jobs, timeout, chunks, deadline, failures = await self._batch_plan(request, context, n, started)
        wait = self.limits.send_timeout_seconds
        unanswered, stalled, failed = n, False, ""
        self._in_flight(n)
        headers = False  # sent: with the first message when it is small, else on their own before it
        messages = self._graded(request, jobs, chunks, timeout, deadline, failures)
        try:
            async for message, count in messages:
                if not headers:
                    headers = True
                    if len(message) > HEADERS_WITH_MESSAGE_BYTES:
                        await context.send_initial_metadata(())
                try:
                    async with asyncio.timeout(wait):  # no task per message, unlike wait_for
                        await context.write(message)
                except TimeoutError:
                    stalled = True
                    break
                except Exception as exc:  # grpc's own error: the client cancelled or its deadline passed
                    raise asyncio.CancelledError("the call ended before its answer was sent") from exc
                unanswered -= count
                self._in_flight(-count)
        except TooManyFailures as exc:
            failed = str(exc)
        finally:  # done, stalled, failed or cancelled: running chunks stop, graded ones are dropped
            await messages.aclose()
            self._in_flight(-unanswered)
        if stalled:
            # The status goes out behind the message the client did not take: it sees the status once it
            # reads again (or its deadline passes); nothing of the call is left here but that message.
            context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.set_details(
                f"the client stopped reading: no message taken for {wait:g} s (send_timeout_seconds); "
                f"{unanswered} of {n} samples unanswered"
            )
        elif failed:
            if self.metrics is not None:
                self.metrics.failure_budget_calls.inc()
            context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
            context.set_details(failed)

    def _batch(self, request: ReceivedBatch) -> Batch:
        """The request as the engine takes a batch: chunks of keyword arguments, or of its own encoding."""
        rows, limits, view = request.rows, self.limits, request.view
        small = len(request.data) <= limits.max_field_chars  # then no sample has a field over the limit

        def chunk(a: int, b: int) -> Chunk:
            return list(zip(range(a, b), rows.kwargs(a, b, limits, small), strict=True))

        # a result message per sample makes objects per sample: only smaller calls of it are graded inline
        most = INLINE_MAX_BYTES if view == pb.RESULT_VIEW_COLUMNS else INLINE_RESULTS_MAX_BYTES
        return Batch(rows.n, chunk, lambda a, b: encoded(request, a, b, view, limits), len(request.data), most)

    def _graded_now(
        self,
        request: ReceivedBatch,
        jobs: Plan,
        n: int,
        timeout: float | None,
        deadline: float | None,
        failures: FailureTally | None,
    ) -> bytes | None:
        """The serialized answer of a call the engine grades here and now (one small chunk, `graded_now`),
        else None."""
        if not self.engine.one_chunk(jobs, n, request.chunk_size):
            return None
        graded = self.engine.graded_now(
            jobs, self._batch(request), timeout, self.budget, request.reward, deadline, failures
        )
        if graded is None:
            return None
        assert graded.encoded is not None  # graded whole in the service's codec
        return graded.encoded

    async def _graded(
        self,
        request: ReceivedBatch,
        jobs: Plan,
        chunks: Iterator[tuple[int, int]],
        timeout: float | None,
        deadline: float | None = None,
        failures: FailureTally | None = None,
    ) -> AsyncGenerator[tuple[bytes, int], None]:
        """Serialized response messages and how many samples each answers, in the order chunks finish."""
        rows, limits = request.rows, self.limits
        labels = self._labels(jobs)
        full, columnar = _full(request), request.view == pb.RESULT_VIEW_COLUMNS
        batch = self._batch(request)
        limit = limits.max_message_bytes
        graded_chunks = self.engine.grade_batch(
            jobs, batch, chunks, timeout, self.budget, request.reward, deadline=deadline, failures=failures
        )
        async for graded in graded_chunks:
            if graded.encoded is not None:  # answered in the wire codec (`wire.WIRE`): sent as it is
                if len(graded.encoded) <= limit:
                    yield graded.encoded, graded.size
                    continue
                message = pb.BatchEvaluateResponse.FromString(graded.encoded)
            else:
                message = pb.BatchEvaluateResponse()
                if columnar:
                    fill_columns(message.columns, graded.indices, labels, graded.columns, graded.rewards)
                else:
                    ids = [rows.id(i) for i in graded.indices]
                    fill_items(message.items, graded.indices, ids, labels, graded.columns, graded.rewards, full)
            for part in _fitted(message, limit):
                yield part.SerializeToString(), _answered(part)

    async def ListGraders(
        self, request: pb.ListGradersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListGradersResponse:
        return list_graders(self.engine.registry, self.engine.rewards)
