"""A call admission control refused (`core.admission`), answered in each protocol's words. For load
(`Overloaded`): gRPC's RESOURCE_EXHAUSTED with the `grpc-retry-pushback-ms` trailer (what gRPC's own retry
policy reads, gRFC A6); while no worker can grade (`CannotGrade`): UNAVAILABLE, which gRPC's retry policy
(the Python client's service config) sends again after its backoff, to another replica when there is one.
HTTP's 503 with Retry-After (RFC 9110: whole seconds) for both. Either way at once, before the request is
graded."""

from __future__ import annotations

import math

import grpc
from aiohttp import web

from grpcgrade.core.admission import PUSHBACK_KEY as PUSHBACK_KEY
from grpcgrade.core.errors import CannotGrade, Refused


async def refuse(context: grpc.aio.ServicerContext, exc: Refused) -> None:
    """End the call UNAVAILABLE (no worker can grade) or RESOURCE_EXHAUSTED with the retry hint (raises, as
    `context.abort` does)."""
    if isinstance(exc, CannotGrade):
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    pushback = ((PUSHBACK_KEY, str(max(1, round(exc.retry_after * 1000)))),)
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), trailing_metadata=pushback)


def service_unavailable(exc: Refused) -> web.HTTPServiceUnavailable:
    """The HTTP refusal: 503, Retry-After in whole seconds (at least 1), the reason as text."""
    return web.HTTPServiceUnavailable(text=str(exc), headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))})
