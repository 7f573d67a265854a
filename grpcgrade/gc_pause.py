"""Python's cyclic garbage collector held off while a large batch's answers arrive, for a bounded time.

Why: each result of a `batch_evaluate` call is a protobuf message, an object the collector tracks. While
100,000 of them arrive, CPython runs a full collection (a walk of every tracked object in the process)
each time the objects that survived younger collections grow by a quarter of those already old, so a
call from a process with a small heap walks its own results about five times over before it returns.
Each collection holds the GIL, and with it the threads placing the call's other answers, so the server
and its workers wait for the client too. Measured on 2 cores (100,000-sample `json_validator` full-view
batches, docs/performance.md): the client's CPU 3.09 → 2.53 µs a sample, the batch's median rate
121k → 135k samples/s.

Held off, the results are walked at most once or twice after the call if the caller keeps them, and never
if it drops them. Reference counting frees everything as usual meanwhile; only garbage in reference
cycles waits. The pause is bounded in time (`DEFAULT_SECONDS` a call): a judge's batch may run for
minutes, and a trainer's other threads may make cycles that hold GPU memory. Concurrent calls share one
pause: the collector comes back when the last of them ends, or when the first runs out of time. A
collector the program turned off itself stays off.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: At most this many seconds of a call with the collector held off (0: never held off).
DEFAULT_SECONDS = 2.0

_lock = threading.Lock()
_holders = 0  # calls inside `paused` now
_since: float | None = None  # when this module turned the collector off (None: it is not off because of us)


def _hold(seconds: float) -> float | None:
    """Counts a call in; the seconds left of the pause it is part of, or None when there is none."""
    global _holders, _since
    with _lock:
        _holders += 1
        if _holders == 1 and gc.isenabled():
            gc.disable()
            _since = time.monotonic()
        return None if _since is None else max(0.0, _since + seconds - time.monotonic())


def resume() -> None:
    """The collector back on now, for every call holding it off (the pause ran out of time)."""
    global _since
    with _lock:
        if _since is not None:
            _since = None
            gc.enable()


def _release() -> None:
    global _holders
    with _lock:
        _holders -= 1
        last = _holders == 0
    if last:
        resume()


@contextmanager
def paused(seconds: float) -> Iterator[float | None]:
    """The collector held off inside the block, shared with concurrent blocks (see the module). Yields the
    seconds left before the caller must call `resume()` if the block has not ended by then (counted from
    the start of the shared pause, so overlapping calls never stretch it), or None when the collector is
    not held off (`seconds` is 0, the program turned it off itself, or the shared pause has run out)."""
    if seconds <= 0:
        yield None
        return
    left = _hold(seconds)
    try:
        yield left
    finally:
        _release()
