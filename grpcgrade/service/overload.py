"""A call admission control refused (`core.admission`), answered in each protocol's words: gRPC's
RESOURCE_EXHAUSTED with the `grpc-retry-pushback-ms` trailer (what gRPC's own retry policy reads, gRFC A6),
HTTP's 503 with Retry-After (RFC 9110: whole seconds). Either way at once, before the request is graded."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import grpc
from aiohttp import web
from aiohttp.typedefs import Middleware

from grpcgrade.core.admission import Admission
from grpcgrade.core.errors import Overloaded

#: The trailer gRPC's retry policy reads as the server's retry hint, in milliseconds.
PUSHBACK_KEY = "grpc-retry-pushback-ms"


async def refuse_overloaded(context: grpc.aio.ServicerContext, exc: Overloaded) -> None:
    """End the call RESOURCE_EXHAUSTED with the retry hint (raises, as `context.abort` does)."""
    pushback = ((PUSHBACK_KEY, str(max(1, round(exc.retry_after * 1000)))),)
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), trailing_metadata=pushback)


def service_unavailable(exc: Overloaded) -> web.HTTPServiceUnavailable:
    """The HTTP refusal: 503, Retry-After in whole seconds (at least 1), the reason as text."""
    return web.HTTPServiceUnavailable(text=str(exc), headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def admission_middleware(admission: Admission) -> Middleware:
    """Every HTTP request is a call for admission control: admitted while under the calls and memory limits
    (a face counts its samples with `Admission.reserve` once it has read them), else 503 at once."""

    @web.middleware
    async def admitted(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            admission.enter()
        except Overloaded as exc:
            raise service_unavailable(exc) from None
        try:
            return await handler(request)
        finally:
            admission.leave()

    return admitted
