"""What belongs to one event loop, closed on that loop when it ends.

A client bound to an event loop (an aiohttp session, a grpc.aio channel) can only be closed on its own
loop, and not at all once that loop is closed; one dropped open keeps its connections until the garbage
collector comes. `closed_with_its_loop` closes it as its loop ends, through the one hook asyncio runs then:
`asyncio.run` shuts down the loop's async generators before it closes the loop. A loop stopped without that
shutdown (`loop.stop()` alone) runs no hook; its clients end with the process.

Nothing else can close them (looked at for TRL, which stops its daemon loop so, at exit): asyncio has no
hook on `stop()` or `close()`, and a finalizer for when the loop is collected would never run, because
grpc.aio's completion queue keeps every loop it served in a dict of its own for the process's life
(`PollerCompletionQueue.bind_loop`, grpcio 1.85), so such a loop is never collected. Closing a client from
another thread while its loop is stopped would race its owner, who may run that loop again (a loop run
with `run_until_complete` per batch is stopped between batches). At TRL's exit nothing is left to close:
the process ends with no warning (`python -X dev`) and its connections with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


def closed_with_its_loop(close: Callable[[], Awaitable[object]]) -> AsyncGenerator[None, None]:
    """An async generator, started here on the running loop, that awaits `close()` when it is closed
    itself: by the loop as it ends, or by the loop it belongs to once its owner drops it (the loop's
    finalizer hook). Keep it while the client is in use: dropping it closes the client."""

    async def closing() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await close()

    closer = closing()
    with contextlib.suppress(StopIteration):  # runs to its `yield` at once: nothing there to wait for
        closer.asend(None).send(None)
    return closer


class PerLoop(Generic[T]):
    """One `T` per running event loop and key, made on first use on that loop (`make(*key)`) and closed on
    it when it ends (`close(value)`, by `closed_with_its_loop`): what a trainer integration holds its client
    in: a caller that runs each step with `asyncio.run` makes a loop per step, and a client kept per loop
    without this stayed open for the process's life (its loop and channel held, and a connection)."""

    def __init__(self, make: Callable[..., T], close: Callable[[T], Awaitable[object]]) -> None:
        self._make, self._close = make, close
        self._held: dict[tuple[Hashable, ...], tuple[T, AsyncGenerator[None, None]]] = {}

    def get(self, *key: Hashable) -> T:
        """The running loop's `T` for `key`."""
        where = (asyncio.get_running_loop(), *key)
        held = self._held.get(where)
        if held is None:
            value = self._make(*key)

            async def close() -> None:
                self._held.pop(where, None)
                await self._close(value)

            held = self._held[where] = (value, closed_with_its_loop(close))
        return held[0]
