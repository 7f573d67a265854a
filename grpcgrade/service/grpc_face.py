"""The gRPC face: the public gRPC port served by face processes (`face_process`, `grpc.processes`), in
front of the engine's process.

Why: one Python process answers a crowd of one-sample gRPC calls at what grpc.aio's own per-call cost
allows on one core (`grpcgrade bench --per-sample`: the bare grpc.aio floor is ~1.5x the FastAPI peer);
the public port served by several processes, SO_REUSEPORT spreading the connections over them, uses every
core for gRPC's own work, and the engine's process sees one BatchEvaluate per coalesced crowd.

What a face process does with each call:

- **Evaluate** (unary, one sample) is translated here, as the server's own servicer does it (the same
  `servicer.GradingServicer`, with a plan-only engine): the plan resolved, the sample checked, and the
  sample graded with the concurrent calls of its plan by a `core.coalesce.ServerCoalescer` whose engine is
  the face's `link.EngineLink`: one BatchEvaluate to the engine's process per chunk. Two coalescers, one
  per view (the scores view, and the full one with reasons and metadata).
- **Every other method** (BatchEvaluate, ListGraders, the admin service, health, reflection) is relayed to
  the engine's process as bytes (`Relay`, a generic handler: nothing parsed or built again), with the
  call's deadline, its metadata (the token, `x-request-id`, `x-grpcgrade-caller`) and its cancellation,
  and the engine's status, details and trailers back. Health is the engine's: a face says SERVING only
  while the engine's process does, and answers UNAVAILABLE when it is away.
- An engine call that fails is the face's call's failure with the engine's status (UNAVAILABLE when the
  engine's process is away, with the engine's retry hint when it refused for load): never a made-up score.
- The face's own interceptor (`interceptors.ServiceInterceptor`) authenticates each call (a bad token is
  refused here, its body unread) and counts it into the face's counters, which go to the server's
  process's /metrics (`counters`): the same `grpc_server_*` series as without face processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from grpcgrade.core.coalesce import FACE_LINGER_SECONDS, ServerCoalescer
from grpcgrade.core.engine import Chunk, ChunkResult, Engine, Job
from grpcgrade.core.errors import CANNOT_GRADE
from grpcgrade.core.samples import Limits
from grpcgrade.v1 import admin_pb2
from grpcgrade.v1 import grading_pb2 as pb

from .convert import details_left_out, is_full
from .counters import FaceCounters
from .interceptors import ServiceInterceptor
from .link import EngineFailed, EngineLink, Metadata
from .servicer import GradingServicer

if TYPE_CHECKING:  # generic only to the type checker
    Context = grpc.aio.ServicerContext[Any, Any]
    Handler = grpc.RpcMethodHandler[Any, Any]

EVALUATE = f"/{pb.DESCRIPTOR.services_by_name['GradingService'].full_name}/Evaluate"

#: Request metadata a relayed call does not carry: HTTP/2's and gRPC's own, which the face's channel sets.
_NOT_CARRIED = frozenset(("user-agent", "te", "content-type", "host"))


def relayed_methods() -> dict[str, tuple[bool, bool]]:
    """Every method the engine's process serves, as gRPC names it (`/service/Method`), with whether its
    requests and its responses stream."""
    out = {}
    for file in (pb.DESCRIPTOR, admin_pb2.DESCRIPTOR, health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        for service in file.services_by_name.values():
            for method in service.methods:
                out[f"/{service.full_name}/{method.name}"] = (method.client_streaming, method.server_streaming)
    return out


def carried(context: Context) -> tuple[tuple[str, str | bytes], ...]:
    """The call's metadata a relayed call carries to the engine (all but gRPC's and HTTP/2's own)."""
    return tuple(
        (k, v)
        for k, v in context.invocation_metadata() or ()
        if k not in _NOT_CARRIED and not k.startswith(("grpc-", ":"))
    )


async def fail_as_the_engine(context: Context, code: grpc.StatusCode, details: str, trailing: Metadata) -> None:
    """Ends the call with the engine call's status, details and trailers (an engine that was away: saying so)."""
    if code is grpc.StatusCode.UNAVAILABLE and not details.startswith(CANNOT_GRADE):  # else the engine's refusal
        details = f"the grading engine is not reachable now ({details}); retry"
    await context.abort(code, details, trailing_metadata=tuple(trailing))


def _relay(channel: grpc.aio.Channel, method: str, streaming_in: bool, streaming_out: bool) -> Handler:
    """A handler of `method`'s kind that makes the same call to the engine's process with the call's bytes,
    deadline and metadata, and answers with the engine's bytes and status; the engine's call is cancelled
    with the face's (a client gone, a deadline past)."""

    multicallable: Any = (
        channel.stream_stream(method) if streaming_in and streaming_out
        else channel.stream_unary(method) if streaming_in
        else channel.unary_stream(method) if streaming_out
        else channel.unary_unary(method)
    )  # fmt: skip

    def start(request: Any, context: Context) -> Any:
        return multicallable(request, timeout=context.time_remaining(), metadata=carried(context))

    async def answer(request: Any, context: Context) -> bytes:
        ongoing = start(request, context)
        try:
            response: bytes = await ongoing
            trailing = await ongoing.trailing_metadata()
        except grpc.aio.AioRpcError as exc:
            await fail_as_the_engine(context, exc.code(), exc.details() or "", tuple(exc.trailing_metadata() or ()))
            raise AssertionError("unreachable: abort raises") from exc
        finally:
            ongoing.cancel()  # a no-op once it ended; else (the face's call cancelled) the engine's ends too
        if trailing:
            context.set_trailing_metadata(tuple(trailing))
        return response

    async def stream(request: Any, context: Context) -> AsyncIterator[bytes]:
        ongoing = start(request, context)
        try:
            async for message in ongoing:
                yield message
            trailing = await ongoing.trailing_metadata()
        except grpc.aio.AioRpcError as exc:
            await fail_as_the_engine(context, exc.code(), exc.details() or "", tuple(exc.trailing_metadata() or ()))
            raise AssertionError("unreachable: abort raises") from exc
        finally:
            ongoing.cancel()
        if trailing:
            context.set_trailing_metadata(tuple(trailing))

    if streaming_out:
        factory = grpc.stream_stream_rpc_method_handler if streaming_in else grpc.unary_stream_rpc_method_handler
        return factory(stream)
    factory = grpc.stream_unary_rpc_method_handler if streaming_in else grpc.unary_unary_rpc_method_handler
    return factory(answer)


class Relay(grpc.GenericRpcHandler):
    """The face's handlers: `local` ones by method name, and every other method the engine serves relayed."""

    def __init__(self, channel: grpc.aio.Channel, local: Mapping[str, Handler]) -> None:
        self._handlers = dict(local)
        for method, (streaming_in, streaming_out) in relayed_methods().items():
            if method not in self._handlers:
                self._handlers[method] = _relay(channel, method, streaming_in, streaming_out)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        return self._handlers.get(handler_call_details.method)


class _FullView:
    """The link as a coalescer's engine that answers with each result's reason and metadata (the full view)."""

    def __init__(self, link: EngineLink) -> None:
        self.link = link

    def inline_small(self, jobs: Sequence[Job], nbytes: int) -> bool:
        return False

    async def grade_chunk(
        self, jobs: Sequence[Job], chunk: Chunk, timeout: float | None = None, reward: str = "",
        deadline: float | None = None, nbytes: int = 0,
    ) -> ChunkResult:  # fmt: skip
        return await self.link.grade_chunk(jobs, chunk, timeout, reward, deadline, nbytes, full=True)


class FaceServicer(GradingServicer):
    """The servicer's Evaluate with a coalescer per view, each grading through the link."""

    def __init__(self, engine: Engine, limits: Limits, link: EngineLink, linger: float) -> None:
        super().__init__(engine, limits, coalescer=ServerCoalescer(link, linger))
        self.full = ServerCoalescer(_FullView(link), linger)
        self.link = link

    def coalescer_for(self, request: pb.EvaluateRequest) -> ServerCoalescer | None:
        return self.full if is_full(request.view) else self.coalescer

    async def Evaluate(self, request: pb.EvaluateRequest, context: Context) -> pb.EvaluateResponse:
        """The coalesced answer; or, for an answer whose details were left out to fit a message, the engine's
        own Evaluate's answer to the call, graded again alone. The engine left the details out of a batch
        item a few bytes larger than the call's answer (which may fit the call's message: the engine's port
        sends it whole), and measured the item without the sample's id, which the link does not send (the
        engine's port names the answer's own size): so the face answers exactly as the engine's port does.
        Only answers about as large as the message limit (`limits.max_message_bytes`) take this way."""
        response = await super().Evaluate(request, context)
        if not details_left_out(response):
            return response
        return await self.link.evaluate(request, carried(context), context.time_remaining())


def _evaluate(servicer: FaceServicer) -> Handler:
    async def evaluate(request: pb.EvaluateRequest, context: Context) -> pb.EvaluateResponse:
        try:
            return await servicer.Evaluate(request, context)
        except EngineFailed as exc:
            await fail_as_the_engine(context, exc.code, exc.details, exc.trailing)
            raise AssertionError("unreachable: abort raises") from exc

    return grpc.unary_unary_rpc_method_handler(
        evaluate,
        request_deserializer=pb.EvaluateRequest.FromString,
        response_serializer=pb.EvaluateResponse.SerializeToString,
    )


def build_grpc_face(
    engine: Engine,
    limits: Limits,
    link: EngineLink,
    linger: float,
    tokens: list[str],
    metrics: FaceCounters,
    options: list[tuple[str, int]],
) -> grpc.aio.Server:
    """A face process's gRPC server (not yet bound): Evaluate coalesced through `link`, everything else
    relayed on the link's channel; `linger`: the configuration's (`coalesce.FACE_LINGER_SECONDS` at least,
    which says why)."""
    servicer = FaceServicer(engine, limits, link, max(linger, FACE_LINGER_SECONDS))
    metrics.watch([servicer.coalescer, servicer.full])
    metrics.watch_refusals(servicer.admission)
    server = grpc.aio.server(interceptors=[ServiceInterceptor(metrics, tokens)], options=options)
    server.add_generic_rpc_handlers((Relay(link.channel, {EVALUATE: _evaluate(servicer)}),))
    return server
