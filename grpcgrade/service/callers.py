"""Who is calling: the caller's name from its gRPC metadata or HTTP header, for the judges' fair share.

A trainer (or experiment) names itself with `x-grpcgrade-caller` (`core.context.CALLER_HEADER`); each
call's grading then runs with that name in `core.context.CALLER`, where an LLM judge reads it to queue the
call's judgments in the caller's share of its model (see `grpcgrade.llm.limits`) and to count them under
the caller's name. A call that names no caller is `default`. The name is a label, not a credential: with
tokens configured, only authorized clients call at all.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from aiohttp import web

from grpcgrade.core.context import CALLER, CALLER_HEADER, caller_name

from .interceptors import _metadata, _rewrap, _Wrapping


class CallerInterceptor(_Wrapping):
    """Sets `CALLER` from the call's metadata before its handler runs (in the call's own task)."""

    def _intercept(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        return _rewrap(handler, method, _named)


def _named(behavior: Callable[..., Any], kind: str, service: str, method: str) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            CALLER.set(caller_name(_metadata(context, CALLER_HEADER)))
            async for item in behavior(request, context):
                yield item

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        CALLER.set(caller_name(_metadata(context, CALLER_HEADER)))
        return await behavior(request, context)

    return unary


@web.middleware
async def caller_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The HTTP faces' `CALLER`, from the `X-Grpcgrade-Caller` header (aiohttp runs each request in its task)."""
    CALLER.set(caller_name(request.headers.get(CALLER_HEADER)))
    return await handler(request)
