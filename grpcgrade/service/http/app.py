"""The HTTP face's one aiohttp application (`--http-port`): every protocol's routes on one port.

aiohttp.web serves it (well kept, asyncio-native, and the client OpenRLHF itself uses). `grpcgrade serve`
runs it in HTTP face processes of its own (`http.process`), grading through the engine's process over the
gRPC contract (`forward.EngineLink`): the same engine, limits, grader metrics and tokens as the gRPC
service, and nothing a client sends on the gRPC server's event loop.
Each protocol module adds its routes with `add_routes(app, ctx)` (or is a sub-application mounted at its
prefix); the one middleware here names each request's caller, admits it (or refuses it: 503) and counts
it under its face, method and status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiohttp import web

from grpcgrade.core.admission import Admission
from grpcgrade.core.coalesce import ServerCoalescer
from grpcgrade.core.config import HttpConfig
from grpcgrade.core.context import CALLER, CALLER_HEADER, caller_name
from grpcgrade.core.engine import Engine
from grpcgrade.core.errors import Overloaded, Refused
from grpcgrade.core.samples import Limits

from ..counters import FaceCounters
from ..overload import service_unavailable
from . import nemo_gym, openai_graders, openrlhf, slime
from .common import FACE_KEY, NO_FACE, FaceContext, Handler
from .forward import EngineLink
from .limits import HELD_KEY, HeldBody, declared_bytes, mark_head_arrived

#: The status a request whose client went away is counted with (nginx's "client closed request").
CLIENT_CLOSED_REQUEST = 499


def build_http_app(
    engine: Engine,
    limits: Limits,
    http: HttpConfig,
    default_reward: str = "",
    *,
    tokens: Sequence[str] = (),
    metrics: FaceCounters | None = None,
    admission: Admission | None = None,
    coalescer: ServerCoalescer | None = None,
    link: EngineLink | None = None,
) -> web.Application:
    """The HTTP face's application: each trainer's reward routes (OpenRLHF's, slime's, NeMo Gym's) and
    OpenAI's grader endpoints (at `openai_graders.MOUNT_PATH`), all checking the same `tokens` (each
    answering in its own protocol's error format). With `link`, samples are graded by the engine's process
    through it (`forward`); `engine` then only resolves plans."""

    admission = admission or Admission(limits)
    if metrics is not None:
        metrics.watch_refusals(admission)

    @web.middleware
    async def served(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request: its connection's head timer stopped, its caller named (`callers`), admitted while
        under the calls and memory limits and with room for its declared body (else 503 at once: `overload`;
        its body counts against `limits.max_pending_request_bytes` as it is read, `limits.read_body`, and a
        face counts its samples with `Admission.reserve` once it has read them), and counted under its face,
        method and status. One middleware, not one for each: each is a coroutine and a call more per request."""
        mark_head_arrived(request)
        status = 500
        try:
            CALLER.set(caller_name(request.headers.get(CALLER_HEADER)))
            held = HeldBody(admission)
            try:
                admission.check_bytes(declared_bytes(request, http))  # a body sure to pass the bound: unread
                admission.enter()
            except Refused as exc:
                raise service_unavailable(exc) from None
            request[HELD_KEY] = held  # the body's bytes count as `read_body` reads them
            try:
                response = await handler(request)
            except Overloaded as exc:  # the body passed the bound as it arrived
                raise service_unavailable(exc) from None
            finally:
                admission.leave(request_bytes=held.bytes)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_CLOSED_REQUEST  # nobody is there to answer: not a server error
            raise
        finally:
            if metrics is not None:
                face = request.get(FACE_KEY, NO_FACE)
                metrics.http_requests.labels(face, request.method, str(status)).inc()

    app = web.Application(middlewares=[served], client_max_size=http.max_body_bytes)
    ctx = FaceContext(engine, limits, http, default_reward, tokens, metrics, admission, coalescer, link)
    for face in (openrlhf, slime, nemo_gym):
        face.add_routes(app, ctx)
    app.add_subapp(
        openai_graders.MOUNT_PATH,
        openai_graders.openai_graders_app(engine, tokens=tokens, limits=limits, http=http, link=link),
    )
    return app
