"""Who is calling: the caller's name from its gRPC metadata or HTTP header, for the judges' fair share.

A trainer (or experiment) names itself with `x-grpcgrade-caller` (`core.context.CALLER_HEADER`); each
call's grading then runs with that name in `core.context.CALLER`, where an LLM judge reads it to queue the
call's judgments in the caller's share of its model (see `grpcgrade.llm.limits`) and to count them under
the caller's name. A call that names no caller is `default`. The name is a label, not a credential: with
tokens configured, only authorized clients call at all. The gRPC side is `interceptors.ServiceInterceptor`;
the HTTP face's one middleware (`http.app`) names it too; this module's is for an application of OpenAI's
grader endpoints alone (`http.openai_graders.openai_graders_root`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from grpcgrade.core.context import CALLER, CALLER_HEADER, caller_name


@web.middleware
async def caller_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The HTTP faces' `CALLER`, from the `X-Grpcgrade-Caller` header (aiohttp runs each request in its task)."""
    CALLER.set(caller_name(request.headers.get(CALLER_HEADER)))
    return await handler(request)
