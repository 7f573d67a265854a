"""An HTTP face process: the HTTP face served in a process of its own, started and watched by the
server's process (`http.faces.FaceProcesses`).

It reads the same configuration and tokens as the server, resolves plans with an engine of its own that
never grades (no worker pool: it knows each reward's graders, their inputs and configs, to answer a bad
request at once), and grades every sample through `forward.EngineLink`, the gRPC contract on the engine
process's private socket. Its counters (requests, failed and unusable samples, failure-ratio refusals)
go to the server's process with each request (`counters`), where /metrics serves them.

Its life: it listens on the face's port with SO_REUSEPORT (so several share it), says `ready` with the
port on its pipe, and on SIGTERM stops accepting and lets its in-flight requests finish for up to the
grace period (within `lifecycle.SHUTDOWN_MARGIN_SECONDS` more, like the server). It ends too when the
server's process ends (PR_SET_PDEATHSIG, and the pipe's end): a face without its engine can only answer 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection

from aiohttp import web

from grpcgrade import logs
from grpcgrade.core.cached_grading import CachedGrading
from grpcgrade.core.coalesce import ServerCoalescer
from grpcgrade.core.engine import Engine
from grpcgrade.core.registry import get_registry
from grpcgrade.llm.models import close_clients as close_judge_clients
from grpcgrade.llm.models import configure as configure_models

from ..lifecycle import SHUTDOWN_MARGIN_SECONDS, exit_deadline, settle_heap, tune_process
from ..options import ServeOptions, read_config, read_tokens
from .app import build_http_app
from .counters import FaceCounters
from .forward import EngineLink
from .limits import ConnectionGuard

log = logging.getLogger("grpcgrade.service.http")

#: Linux's prctl option: the signal this process gets when its parent ends.
PR_SET_PDEATHSIG = 1
#: The process name a face process takes (`/proc/PID/comm`), so tests and operators tell it apart.
PROCESS_NAME = "grpcgrade-http"


@dataclass(frozen=True)
class FaceSpec:
    """What a face process is started with (pickled to the spawned process)."""

    options: ServeOptions
    #: The engine process's private gRPC address (`unix:PATH`).
    engine: str
    #: Which face process this is (0..processes-1), for its log lines.
    index: int
    port: int
    log_levels: Mapping[str, int]
    log_formatter: logging.Formatter | None


def _name_this_process() -> None:
    """Named PROCESS_NAME, and told to end with its parent (Linux; elsewhere the pipe's end tells it)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, PROCESS_NAME.encode(), 0, 0, 0)  # PR_SET_NAME
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def main(spec: FaceSpec, conn: Connection, parent: int) -> None:
    """The spawned process's entry point."""
    _name_this_process()
    if os.getppid() != parent:  # the server ended before the death signal was set
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the server, which drains us
    logs.apply(spec.log_levels, spec.log_formatter)
    try:
        asyncio.run(_serve(spec, conn))
    except Exception as exc:  # a start that failed: the server says why and stops
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


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
    link = EngineLink(spec.engine, tokens[0] if tokens else None, config.limits.max_message_bytes)
    linger = config.coalesce_linger_seconds
    coalescer = ServerCoalescer(link, linger) if linger > 0 else None
    metrics = FaceCounters(lambda increments, stats: conn.send(("count", (increments, stats))))
    link.observer = metrics.observe
    metrics.coalescer = coalescer
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
    await guard.start(runner, opts.http_host, spec.port, reuse_port=True)
    settle_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(conn.fileno(), stop.set)  # the server's end of the pipe closed: it is gone
    conn.send(("ready", spec.port))
    log.debug("HTTP face process %d serving on %s:%d", spec.index, opts.http_host, spec.port)
    await stop.wait()
    loop.remove_reader(conn.fileno())
    exit_deadline(opts.grace_seconds + SHUTDOWN_MARGIN_SECONDS)
    guard.close()  # no new connection; the in-flight requests finish for up to the grace period
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(runner.cleanup(), opts.grace_seconds + 0.5)
    await link.close()
    await close_judge_clients()
