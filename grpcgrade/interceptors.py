"""Server interceptors: bearer-token auth, and per-RPC metrics and logs.

Both wrap the method's behaviour with a function of the same kind (unary or streaming), the shape of
grpc's own latency-interceptor example.
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from .metrics import Metrics

log = logging.getLogger("grpcgrade.requests")

OPEN_SERVICES = ("grpc.health.v1.Health",)  # probes must work without credentials

_KINDS = {
    "unary_unary": ("unary", grpc.unary_unary_rpc_method_handler),
    "unary_stream": ("server_stream", grpc.unary_stream_rpc_method_handler),
    "stream_unary": ("client_stream", grpc.stream_unary_rpc_method_handler),
    "stream_stream": ("bidi_stream", grpc.stream_stream_rpc_method_handler),
}

Wrap = Callable[[Callable[..., Any], str, str, str], Callable[..., Any]]


def _rewrap(handler: grpc.RpcMethodHandler, method: str, wrap: Wrap) -> grpc.RpcMethodHandler:
    service, _, name = method.lstrip("/").rpartition("/")
    for attr, (kind, factory) in _KINDS.items():
        behavior = getattr(handler, attr)
        if behavior is not None:
            return factory(
                wrap(behavior, kind, service, name),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def _metadata(context: grpc.aio.ServicerContext, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return ""


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Calls must carry `authorization: Bearer <token>`; compared in constant time, never logged."""

    def __init__(self, tokens: list[str]) -> None:
        self._tokens = [t.encode() for t in tokens if t]

    def _allowed(self, context: grpc.aio.ServicerContext) -> bool:
        header = _metadata(context, "authorization")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        presented = token.strip().encode()
        return any(hmac.compare_digest(presented, t) for t in self._tokens)

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.lstrip("/").startswith(OPEN_SERVICES):
            return handler

        def wrap(behavior: Callable[..., Any], kind: str, service: str, method: str) -> Callable[..., Any]:
            async def deny(context: grpc.aio.ServicerContext) -> None:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

            if kind.endswith("stream") and kind != "client_stream":
                async def checked_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                    if not self._allowed(context):
                        await deny(context)
                    async for item in behavior(request, context):
                        yield item
                return checked_stream

            async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if not self._allowed(context):
                    await deny(context)
                return await behavior(request, context)
            return checked

        return _rewrap(handler, details.method, wrap)


def _code_of(context: grpc.aio.ServicerContext, exc: BaseException | None) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int) and code:
        return grpc.StatusCode(code).name if code in [c.value[0] for c in grpc.StatusCode] else "UNKNOWN"
    if exc is None:
        return "OK"
    if isinstance(exc, (grpc.aio.AbortError,)):
        return "UNKNOWN"
    return "CANCELLED" if type(exc).__name__ == "CancelledError" else "UNKNOWN"


class ObservingInterceptor(grpc.aio.ServerInterceptor):
    """go-grpc-prometheus counters and latency, one debug log line per call, a warning per failure."""

    def __init__(self, metrics: Metrics | None) -> None:
        self.metrics = metrics

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        return _rewrap(handler, details.method, self._wrap)

    def _wrap(self, behavior: Callable[..., Any], kind: str, service: str, method: str) -> Callable[..., Any]:
        m = self.metrics
        labels = (kind, service, method)
        streaming_in = kind in ("client_stream", "bidi_stream")
        streaming_out = kind in ("server_stream", "bidi_stream")

        def begin(context: grpc.aio.ServicerContext) -> tuple[str, float]:
            if m is not None:
                m.started.labels(*labels).inc()
            return _metadata(context, "x-request-id") or uuid.uuid4().hex[:16], time.perf_counter()

        def finish(context: grpc.aio.ServicerContext, rid: str, t0: float, exc: BaseException | None) -> None:
            code = _code_of(context, exc)
            elapsed = time.perf_counter() - t0
            if m is not None:
                m.handled.labels(*labels, code).inc()
                m.handling.labels(*labels).observe(elapsed)
            if code == "OK":
                log.debug("rpc %s/%s request_id=%s code=OK seconds=%.4f", service, method, rid, elapsed)
            else:
                details = context.details() if hasattr(context, "details") else ""
                log.warning(
                    "rpc %s/%s request_id=%s code=%s seconds=%.4f details=%s",
                    service, method, rid, code, elapsed, details or (repr(exc) if exc else ""),
                )

        async def counted(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
            async for r in requests:
                if m is not None:
                    m.received.labels(*labels).inc()
                yield r

        if streaming_out:
            async def stream_behavior(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                rid, t0 = begin(context)
                if streaming_in:
                    request = counted(request)
                elif m is not None:
                    m.received.labels(*labels).inc()
                exc: BaseException | None = None
                try:
                    async for item in behavior(request, context):
                        if m is not None:
                            m.sent.labels(*labels).inc()
                        yield item
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    finish(context, rid, t0, exc)
            return stream_behavior

        async def unary_behavior(request: Any, context: grpc.aio.ServicerContext) -> Any:
            rid, t0 = begin(context)
            if streaming_in:
                request = counted(request)
            elif m is not None:
                m.received.labels(*labels).inc()
            exc: BaseException | None = None
            try:
                response = await behavior(request, context)
                if m is not None:
                    m.sent.labels(*labels).inc()
                return response
            except BaseException as e:
                exc = e
                raise
            finally:
                finish(context, rid, t0, exc)
        return unary_behavior
