"""A face process: the HTTP face, the gRPC face, or both, served in a process of its own, started and
watched by the server's process (`faces.FaceProcesses`).

One kind of face process serves either protocol: what differs between the two faces is only the server
each listens with (aiohttp's, `http.app`; grpc.aio's, `grpc_face`), and everything else is the same:
the configuration and tokens read as the server reads them, an engine of its own that only resolves plans
(no worker pool: it knows each reward's graders, their inputs and configs, to answer a bad request at
once), every sample graded through `link.EngineLink` (the gRPC contract on the engine process's private
socket), the counters sent to the server's process (`counters`), the supervisor, the drain and the
death signal. Face `i` serves HTTP when `i < http.processes` and gRPC when `i < grpc.processes`, so a
server with both faces runs max(http.processes, grpc.processes) processes, not their sum.

Its life: it listens on its face's port(s) with SO_REUSEPORT (so several share each), says `ready` on its
pipe, and on SIGTERM stops accepting and lets its in-flight requests and calls finish for up to the grace
period (within `lifecycle.SHUTDOWN_MARGIN_SECONDS` more, like the server). It ends too when the server's
process ends (PR_SET_PDEATHSIG, and the pipe's end): a face without its engine can only refuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection

from aiohttp import web

from grpcgrade import logs
from grpcgrade.core.cached_grading import CachedGrading
from grpcgrade.core.coalesce import ServerCoalescer
from grpcgrade.core.config import ServerConfig
from grpcgrade.core.engine import Engine
from grpcgrade.core.prctl import end_with_parent, name_process
from grpcgrade.core.registry import get_registry
from grpcgrade.llm.models import close_clients as close_judge_clients
from grpcgrade.llm.models import configure as configure_models

from .counters import FLUSH, FLUSHED, FaceCounters
from .grpc_face import build_grpc_face
from .http.app import build_http_app
from .http.forward import EngineLink as HttpLink
from .http.limits import ConnectionGuard
from .lifecycle import SHUTDOWN_MARGIN_SECONDS, exit_deadline, settle_heap, tune_process
from .link import EngineLink
from .options import ServeOptions, public_server_options, read_config, read_tokens, server_credentials

log = logging.getLogger("grpcgrade.service.faces")

#: The process name a face process takes (`/proc/PID/comm`), so tests and operators tell it apart.
PROCESS_NAME = "grpcgrade-face"

#: A face process's garbage collector thresholds (the engine's process: `lifecycle.GC_THRESHOLDS`). A crowd
#: keeps thousands of requests in flight in a face, each some tens of objects the collector tracks, alive
#: across the young collections until answered: at 10,000 a young collection every ~80 requests walked them
#: all, and promoted them to be walked again in the next generation's (18% of a face's CPU under 4,000
#: callers). Young collections are set off by allocations net of frees, so at 100,000 a steady crowd (as
#: many requests answered as arrive) seldom sets one off: 194-209 -> 152-168 us of server CPU a call
#: (`bench --per-sample`, two face processes). What it costs is reference cycles waiting longer to be
#: freed: at most ~100,000 objects, a few tens of MB.
FACE_GC_THRESHOLDS = (100_000, 10, 10)


@dataclass(frozen=True)
class FaceSpec:
    """What a face process is started with (pickled to the spawned process)."""

    options: ServeOptions
    #: The engine process's private gRPC address (`unix:PATH`).
    engine: str
    #: Which face process this is (0..processes-1), for its log lines.
    index: int
    #: The HTTP face's port, the public gRPC port (None: this process does not serve that face).
    http_port: int | None
    grpc_port: int | None
    log_levels: Mapping[str, int]
    log_formatter: logging.Formatter | None


def main(spec: FaceSpec, conn: Connection, parent: int) -> None:
    """The spawned process's entry point."""
    name_process(PROCESS_NAME)
    if not end_with_parent(signal.SIGTERM, parent):  # the server ended before the death signal was set
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the server, which drains us
    logs.apply(spec.log_levels, spec.log_formatter)
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(_serve(spec, conn))
    except Exception as exc:  # a start that failed: the server says why and stops
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (a server dependency where it builds), else asyncio's
    (None). uvloop's loop (libuv's, in C) takes a third off a bare aiohttp server's CPU a call, and 10-13 us
    off a face's (152-168 -> 140-160 us of server CPU a call, two face processes); grpc.aio's channel to
    the engine runs on either. Before the faces stopped sending a message per request and walking their
    crowd in every young collection (`FACE_GC_THRESHOLDS`), those hid the loop's share: uvloop alone moved
    a face by nothing measurable."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _answer(conn: Connection, metrics: FaceCounters, stop: asyncio.Event) -> None:
    """The face's end of its pipe, readable: the server's process asking for the counts so far (`FLUSH`,
    before a scrape: they are sent, then `FLUSHED`), or gone (the pipe's end: this face stops)."""
    loop = asyncio.get_running_loop()
    try:
        while conn.poll():
            kind, value = conn.recv()
            if kind == FLUSH:
                metrics.flush()
                conn.send((FLUSHED, value))
    except (EOFError, OSError):
        loop.remove_reader(conn.fileno())
        stop.set()


async def _serve(spec: FaceSpec, conn: Connection) -> None:
    opts = spec.options
    tune_process()
    registry = get_registry()
    config = read_config(opts, registry)
    configure_models(config.models, config.callers)  # the rewards' LLM graders look their models up
    engine = Engine(  # plans only: this engine has no workers and grades nothing
        registry,
        None,
        rewards=config.rewards,
        grader_timeout=config.grader_timeout_seconds,
        server_only_graders=config.server_only_graders,
        cached=CachedGrading.from_config(config.cache, config.quarantine),  # each grader's cache use, decided as there
        tokenizer=config.tokenizer,
    )
    tokens = read_tokens(opts.auth_token_file)
    token = tokens[0] if tokens else None
    max_bytes, linger = config.limits.max_message_bytes, config.coalesce_linger_seconds
    metrics = FaceCounters(lambda increments, stats: conn.send(("count", (increments, stats))), batched=True)
    links: list[EngineLink] = []
    stops: list[Callable[[], Awaitable[None]]] = []
    if spec.http_port is not None:
        stops.append(await _serve_http(spec, engine, config, tokens, metrics, links))
    if spec.grpc_port is not None:
        link = EngineLink(spec.engine, token, max_bytes)
        link.observer = metrics.observe
        links.append(link)
        options = public_server_options(opts, config, shared=True)
        server = build_grpc_face(engine, config.limits, link, linger, tokens, metrics, options)
        address, creds = f"{opts.host}:{spec.grpc_port}", server_credentials(opts)
        try:
            server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc's "Failed to bind"
            raise OSError(f"[Errno 98] cannot bind the gRPC port {address}: {exc}") from None
        await server.start()
        stops.append(lambda: server.stop(opts.grace_seconds))
    settle_heap(FACE_GC_THRESHOLDS)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(conn.fileno(), _answer, conn, metrics, stop)  # scrapes' asks, or the server gone
    conn.send(("ready", spec.grpc_port if spec.http_port is None else spec.http_port))
    log.debug("face process %d serving (HTTP port %s, gRPC port %s)", spec.index, spec.http_port, spec.grpc_port)
    await stop.wait()
    exit_deadline(opts.grace_seconds + SHUTDOWN_MARGIN_SECONDS)
    # No new connection or call; the in-flight ones finish for up to the grace period, both faces at once
    # (and scrapes meanwhile still get their counts).
    await asyncio.gather(*(stopping() for stopping in stops))
    with contextlib.suppress(OSError, ValueError):
        loop.remove_reader(conn.fileno())
    metrics.flush()
    for each in links:
        await each.close()
    await close_judge_clients()


async def _serve_http(
    spec: FaceSpec,
    engine: Engine,
    config: ServerConfig,
    tokens: list[str],
    metrics: FaceCounters,
    links: list[EngineLink],
) -> Callable[[], Awaitable[None]]:
    """The HTTP face listening on its port; returns what drains it."""
    opts = spec.options
    link = HttpLink(spec.engine, tokens[0] if tokens else None, config.limits.max_message_bytes)
    link.observer = metrics.observe
    links.append(link)
    linger = config.coalesce_linger_seconds
    coalescer = ServerCoalescer(link, linger) if linger > 0 else None
    metrics.watch([coalescer])
    app = build_http_app(
        engine, config.limits, config.http, config.default_reward, tokens=tokens, metrics=metrics,
        coalescer=coalescer, link=link,
    )  # fmt: skip
    guard = ConnectionGuard(config.http)
    # handler_cancellation: a request whose client went away stops its engine call, as a cancelled gRPC
    # call does, instead of running to an answer nobody reads.
    runner = web.AppRunner(
        app, shutdown_timeout=opts.grace_seconds, handler_cancellation=True, **guard.connection_options()
    )
    await runner.setup()
    assert spec.http_port is not None
    await guard.start(runner, opts.http_host, spec.http_port, reuse_port=True)

    async def drain() -> None:
        guard.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(runner.cleanup(), opts.grace_seconds + 0.5)

    return drain
