"""The server's one interceptor: bearer-token auth, the caller's name, a clean answer to unparsable requests,
and per-RPC metrics and logs, in one wrapper per method.

They were four interceptors, each with its own `intercept_service` coroutine per call and its own layer of
wrapping around the handler: 30-50 µs of a unary call (measured with `grpcgrade bench --per-sample`). Now a
call costs one `intercept_service`, one authorization check on its metadata, and one wrapper, built once per
method (and once more for its refusal) and reused.

A method's behaviour is wrapped with a function of the same kind, the shape of grpc's own
latency-interceptor example. A response stream is either an async generator or a coroutine that calls
`context.write` (grpc's own health `Watch`), so the wrapper is whichever the behaviour is. What the wrapper
does, in order:

1. counts the call as started and its request message(s) received, and starts its clock (`observe`);
2. refuses a call without a valid token (UNAUTHENTICATED), before its request is parsed: a refused call's
   body is dropped unread, so a stranger cannot make the server parse or hold anything;
3. answers a request protobuf cannot parse (invalid UTF-8, nesting past its depth limit) INVALID_ARGUMENT
   saying why, where grpc's aio server would answer UNKNOWN and log a traceback for the client's mistake
   (streamed requests are parsed as the handler reads them, and left as they are);
4. sets `core.context.CALLER` from `x-grpcgrade-caller` (the judges' fair share), in the call's own task;
5. runs the behaviour, then counts the status, the messages sent and the latency, and logs a failure.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import re
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from grpcgrade.core.context import CALLER, CALLER_HEADER, caller_name
from grpcgrade.core.errors import CANNOT_GRADE, NOT_A_RESULT, OVERLOADED

from .metrics import Metrics

log = logging.getLogger("grpcgrade.requests")

#: What `context.abort` raises (grpc's, from its Cython core).
AbortError = grpc.aio.AbortError

OPEN_SERVICES = ("grpc.health.v1.Health",)  # probes must work without credentials
UNAUTHENTICATED_MESSAGE = "missing or invalid bearer token"

_KINDS = {
    "unary_unary": ("unary", grpc.unary_unary_rpc_method_handler),
    "unary_stream": ("server_stream", grpc.unary_stream_rpc_method_handler),
    "stream_unary": ("client_stream", grpc.stream_unary_rpc_method_handler),
    "stream_stream": ("bidi_stream", grpc.stream_stream_rpc_method_handler),
}


def metadata_value(context: grpc.aio.ServicerContext[Any, Any], key: str) -> str:
    """The call's metadata value for `key` as text ("" without one)."""
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode(errors="replace")
    return ""


def _refused(request: bytes) -> None:
    """The request deserializer of a refused call: the bytes are dropped unread."""
    return None


class _Unparsable:
    """Stands in for a request whose bytes protobuf refused, so the call can be answered instead of crashing."""

    def __init__(self, error: DecodeError) -> None:
        self.error = error


def _guarded(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def guarded_parse(raw: bytes) -> Any:
        try:
            return parse(raw)
        except DecodeError as exc:
            return _Unparsable(exc)

    return guarded_parse


DEADLINE_SKEW_SECONDS = 0.02
MAX_REQUEST_ID_CHARS = 64
_UNSAFE_IN_ID = re.compile(r"[^A-Za-z0-9._:/@+=-]")


def _request_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The caller's `x-request-id`, fit for a log line (safe characters only, capped), or a fresh one."""
    given = _UNSAFE_IN_ID.sub("_", metadata_value(context, "x-request-id")[:MAX_REQUEST_ID_CHARS])
    return given or uuid.uuid4().hex[:16]


def _code_of(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException | None) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int) and code:
        return grpc.StatusCode(code).name if code in [c.value[0] for c in grpc.StatusCode] else "UNKNOWN"
    remaining = context.time_remaining()
    if exc is None:
        # A handler that returned after the deadline answered nobody: the caller saw DEADLINE_EXCEEDED.
        return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "OK"
    if not isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "UNKNOWN"
    # grpc cancels the handler (a stream: closes its generator) both when the client cancels and when the
    # deadline passes; operators need the two apart (a slow server shows as DEADLINE_EXCEEDED, as
    # go-grpc-prometheus reports it). gRPC core's timer can fire a few ms before Python's clock reaches the
    # deadline (seen: 1 run in ~13).
    return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= DEADLINE_SKEW_SECONDS else "CANCELLED"


class _CountingWrites:
    """A servicer context whose `write` also counts the message sent (a stream written with `context.write`);
    everything else is the context's own."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any], sent: Any) -> None:
        self._context = context
        self._sent = sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def write(self, message: Any) -> None:
        await self._context.write(message)
        self._sent.inc()


def _with_status(exc: BaseException) -> BaseException:
    """What may leave a handler. grpc answers an Exception with a status (UNKNOWN), but leaves the call
    open, without one, for any other BaseException (grpcio 1.85, measured: the client waits until its
    deadline). So a library's own BaseException that reached here (grading loops record a grader's as its
    sample's error; one raised building a grader, say) leaves as an Exception naming it."""
    if isinstance(exc, (Exception, *NOT_A_RESULT)):
        return exc
    return RuntimeError(f"{type(exc).__name__}: {exc}")


class _Observer:
    """One method's go-grpc-prometheus counters and latency, its debug log line per call and warning per
    failure; its label children bound once (`.labels()` costs more than the increment)."""

    def __init__(self, metrics: Any, kind: str, service: str, method: str) -> None:
        self.m = metrics
        self.service, self.method = service, method
        self.labels = (kind, service, method)
        self.streaming_in = kind in ("client_stream", "bidi_stream")
        self.streaming_out = kind in ("server_stream", "bidi_stream")
        if metrics is not None:
            self.started, self.received = metrics.started.labels(*self.labels), metrics.received.labels(*self.labels)
            self.sent, self.handling = metrics.sent.labels(*self.labels), metrics.handling.labels(*self.labels)
            self.handled: dict[str, Any] = {}

    async def _counted(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for r in requests:
            self.received.inc()
            yield r

    def arrive(self, request: Any) -> tuple[Any, float]:
        """Count the call and its request message(s); the start time for `finish`."""
        if self.m is not None:
            self.started.inc()
            if self.streaming_in:
                request = self._counted(request)
            else:
                self.received.inc()
        return request, time.perf_counter()

    def finish(self, context: grpc.aio.ServicerContext[Any, Any], t0: float, exc: BaseException | None) -> None:
        """Counts the call, and logs it; its request id is read only for a line that is written (reading
        the metadata, and a fresh id for a call without one, cost ~3 us of every call)."""
        code = _code_of(context, exc)
        elapsed = time.perf_counter() - t0
        if self.m is not None:
            handled = self.handled.get(code)
            if handled is None:
                handled = self.handled[code] = self.m.handled.labels(*self.labels, code)
            handled.inc()
            self.handling.observe(elapsed)
        if code == "OK":
            if log.isEnabledFor(logging.DEBUG):
                rid = _request_id(context)
                log.debug("rpc %s/%s request_id=%s code=OK seconds=%.4f", self.service, self.method, rid, elapsed)
            return
        details = context.details() if hasattr(context, "details") else ""
        # A refusal for load is counted (grpcgrade_calls_refused_total), not logged one by one: a crowd
        # refused by the thousand would spend the event loop on log lines when it has least to spare. So is
        # one while no worker can grade (by its code): the server logged that state once, as it began.
        refused = (code == "RESOURCE_EXHAUSTED" and str(details).startswith(OVERLOADED)) or (
            code == "UNAVAILABLE" and str(details).startswith(CANNOT_GRADE)
        )
        level = logging.DEBUG if refused else logging.WARNING
        if log.isEnabledFor(level):
            log.log(
                level,
                "rpc %s/%s request_id=%s code=%s seconds=%.4f details=%s",
                self.service,
                self.method,
                _request_id(context),
                code,
                elapsed,
                details or (repr(exc) if exc else ""),
            )


async def _refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)


async def _refuse_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
    yield  # pragma: no cover - abort raises; the yield makes this an async generator


class _Call:
    """One call as every wrapper runs it, around its behaviour (the module's docstring, steps 1, 4 and 5):
    counted on arrival (`request`: the request as the behaviour reads it, a counted stream for a streamed
    one), `CALLER` set in the call's own task, and on leaving its status counted and logged; a
    BaseException that would leave the call without a status leaves as an Exception naming it
    (`_with_status`). A `with` block, so a response stream (an async generator) and a unary behaviour
    share it: a plain class, not `contextlib.contextmanager`, whose generator would cost each call more
    than the block itself."""

    __slots__ = ("context", "observer", "request", "t0")

    def __init__(self, observer: _Observer | None, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.observer, self.context, self.t0 = observer, context, 0.0
        if observer is not None:
            request, self.t0 = observer.arrive(request)
        self.request = request
        CALLER.set(caller_name(metadata_value(context, CALLER_HEADER)))

    def __enter__(self) -> Any:
        return self.request

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        exc = None if e is None else _with_status(e)
        if self.observer is not None:
            self.observer.finish(self.context, self.t0, exc)
        if exc is not e:
            raise exc from e  # type: ignore[misc]  # exc is an Exception here: e is not None


async def _refuse_unparsable(request: _Unparsable, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    """INVALID_ARGUMENT saying why protobuf refused the request's bytes (step 3 of the module's docstring)."""
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unparsable request: {request.error}")


#: How far down an abort's chain of exceptions (`__context__`) its frames are cleared (`_forget`).
_CHAIN_DEPTH = 8


def _forget(exc: BaseException) -> None:
    """Clear the finished frames in the tracebacks of an abort and the exceptions it was raised in. grpc keeps
    the AbortError in the call's state, which the servicer context holds, which the frames in its traceback
    hold: a cycle, so every frame of an aborted call (its request among their locals) lived until the garbage
    collector's next full pass. A server refusing large calls for load grew by their size each time (20 calls
    of 47 MB at a time, 13 of them refused: 1.1 GB more a round, 5.5 GB after four) until a collection,
    which the start-up's frozen heap and raised thresholds make rare (`lifecycle.GC_THRESHOLDS`)."""
    for _ in range(_CHAIN_DEPTH):
        traceback.clear_frames(exc.__traceback__)  # a frame still running (the wrapper's) is left as it is
        if exc.__context__ is None:
            return
        exc = exc.__context__


def _wrap(behavior: Callable[..., Any], observer: _Observer | None, guarded: bool) -> Callable[..., Any]:
    """`behavior` run as the module's docstring says (`_Call`): counted and logged (with an `observer`),
    its request checked for parsing (`guarded`), with `CALLER` set. An abort leaves no frame of the call
    holding its request (`_forget`)."""
    sent = observer.sent if observer is not None and observer.m is not None else None

    if inspect.isasyncgenfunction(behavior):

        async def stream_behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            try:
                with _Call(observer, request, context) as request:
                    if guarded and isinstance(request, _Unparsable):
                        await _refuse_unparsable(request, context)
                    async for item in behavior(request, context):
                        if sent is not None:
                            sent.inc()
                        yield item
            except AbortError as exc:
                request = None  # this frame stays in the abort's traceback, which grpc keeps
                _forget(exc)
                raise

        return stream_behavior

    writes = sent is not None and observer is not None and observer.streaming_out

    async def unary_behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """Also runs a stream written with `context.write`, counting the messages written."""
        try:
            with _Call(observer, request, context) as request:
                if guarded and isinstance(request, _Unparsable):
                    await _refuse_unparsable(request, context)
                if writes:
                    return await behavior(request, _CountingWrites(context, sent))
                response = await behavior(request, context)
                if sent is not None:
                    sent.inc()
                return response
        except AbortError as exc:
            request = None  # this frame stays in the abort's traceback, which grpc keeps
            _forget(exc)
            raise

    return unary_behavior


if TYPE_CHECKING:  # generic only to the type checker
    Handler = grpc.RpcMethodHandler[Any, Any]


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    """Every call's auth, caller, decode guard and observation (the module's docstring), one wrapper per
    method reused from call to call (wrapping per call cost ~25 µs of a unary call).

    `tokens`: the bearer tokens a call must carry (none: no auth). `observe`: count and log each call (into
    `metrics` when there are metrics); the engine's private socket, whose calls are the faces' and counted
    there, does not."""

    def __init__(self, metrics: Metrics | Any | None, tokens: list[str] | None = None, *, observe: bool = True) -> None:
        self.metrics = metrics
        self.observe = observe
        self._tokens = [t.encode() for t in tokens or () if t]
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]] = {}
        self._refusals: dict[str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]] = {}

    def allowed(self, method: str, metadata: Any) -> bool:
        """Whether a call of `method` with `metadata` may run: open services and servers without tokens
        always; otherwise `authorization: Bearer <token>`, compared in constant time, never logged."""
        if not self._tokens or method.lstrip("/").startswith(OPEN_SERVICES):
            return True
        header = ""
        for k, v in metadata or ():
            if k == "authorization":
                header = v if isinstance(v, str) else v.decode(errors="replace")
                break
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        presented = token.strip().encode()
        return any(hmac.compare_digest(presented, t) for t in self._tokens)

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        cache = self._wrapped if self.allowed(method, details.invocation_metadata) else self._refusals
        cached = cache.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self.wrap(handler, method, refused=cache is self._refusals)
        cache[method] = (handler, wrapped)
        return wrapped

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str, *, refused: bool = False
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """`handler` wrapped (`refused`: a handler of the same kind that answers UNAUTHENTICATED)."""
        service, _, name = method.lstrip("/").rpartition("/")
        for attr, (kind, factory) in _KINDS.items():
            behavior = getattr(handler, attr)
            if behavior is None:
                continue
            observer = _Observer(self.metrics, kind, service, name) if self.observe else None
            deserializer = handler.request_deserializer
            guarded = not handler.request_streaming and deserializer is not None
            if refused:
                behavior = _refuse_stream if inspect.isasyncgenfunction(behavior) else _refuse
                deserializer, guarded = _refused, False
            elif guarded and deserializer is not None:
                deserializer = _guarded(deserializer)
            return factory(
                _wrap(behavior, observer, guarded),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
