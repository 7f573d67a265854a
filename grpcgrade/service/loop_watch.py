"""The event loop's slow callbacks, for diagnosis: `GRPCGRADE_SLOW_CALLBACK_MS=N` in the server's environment
logs every callback the loop ran for N ms or more, with the CPU the loop's thread spent in it.

The server's gRPC service and HTTP face share one event loop, so one long callback stalls every caller
(issue 33: none may take 100 ms). asyncio's debug mode reports slow callbacks too, but it also records a
stack with every handle it makes, which slows the loop it is meant to observe. This wraps only the call of
each handle (two clock readings). Each line gives wall time and the loop thread's CPU time: a callback whose
CPU time is long did that much work on the loop (ours to move off it); one long in wall time only waited,
for the GIL another thread held or for a core the machine gave to someone else.

One line per slow callback, on the `grpcgrade.service.loop` logger at WARNING, in a fixed form that
`grpcgrade bench --http-stall` counts (`SLOW_CALLBACK`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from asyncio import events
from typing import Any

log = logging.getLogger("grpcgrade.service.loop")

#: The environment variable holding the threshold in ms (absent or 0: no watch).
ENV = "GRPCGRADE_SLOW_CALLBACK_MS"
#: The start of every line, then `WALL ms wall, CPU ms cpu: CALLBACK`.
SLOW_CALLBACK = "slow event-loop callback:"
#: The start of a line for a garbage collection as long (it holds the GIL, so the loop, throughout).
SLOW_COLLECTION = "slow garbage collection:"
#: How much of a callback's description a line keeps.
DESCRIPTION_CHARS = 300


def awaiting(task: asyncio.Task[Any]) -> str:
    """Where a task waits now, innermost last: the chain of coroutines it awaits (`name:line` each). After a
    long step, the await that ended it: the code before it is what took long."""
    where: list[str] = []
    link: Any = task.get_coro()
    while link is not None and len(where) < 32:
        frame = getattr(link, "cr_frame", None) or getattr(link, "gi_frame", None) or getattr(link, "ag_frame", None)
        if frame is not None:
            where.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        link = getattr(link, "cr_await", None) or getattr(link, "gi_yieldfrom", None) or getattr(link, "ag_await", None)
    return " > ".join(where[-4:]) if where else "done"


def describe(handle: events.Handle) -> str:
    """The callback: a task's step names the task's coroutine and where it waits now (`awaiting`), anything
    else is named as asyncio's debug mode names it."""
    callback: Any = getattr(handle, "_callback", None)
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return f"task {owner.get_name()} waiting at {awaiting(owner)}"[:DESCRIPTION_CHARS]
    return repr(handle)[:DESCRIPTION_CHARS]


def install(threshold_ms: float) -> None:
    """Time every handle's run from now on in this process; log those of `threshold_ms` or more."""
    threshold = threshold_ms / 1000
    run = events.Handle._run

    def timed(handle: events.Handle) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        run(handle)
        took = time.perf_counter() - wall
        if took >= threshold:
            spent = time.thread_time() - cpu
            log.warning("%s %.1f ms wall, %.1f ms cpu: %s", SLOW_CALLBACK, took * 1000, spent * 1000, describe(handle))

    events.Handle._run = timed  # type: ignore[method-assign,assignment]  # asyncio has no per-callback hook but debug mode
    started = [0.0, 0.0]

    def collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = time.perf_counter(), time.thread_time()
            return
        took = time.perf_counter() - started[0]
        if took >= threshold:
            spent = time.thread_time() - started[1]
            generation = info["generation"]
            after = len(gc.get_objects(generation))
            line = "%s %.1f ms wall, %.1f ms cpu, generation %d, %d objects after it"
            log.warning(line, SLOW_COLLECTION, took * 1000, spent * 1000, generation, after)

    gc.callbacks.append(collection)


def install_from_env() -> float:
    """`install` with the threshold of GRPCGRADE_SLOW_CALLBACK_MS when it is set; returns it (0: none)."""
    raw = os.environ.get(ENV, "").strip()
    try:
        threshold = float(raw) if raw else 0.0
    except ValueError:
        log.warning("%s=%r is not a number of ms: the event loop is not watched", ENV, raw)
        return 0.0
    if threshold > 0:
        install(threshold)
        log.info("watching the event loop: callbacks of %g ms or more are logged", threshold)
    return threshold
