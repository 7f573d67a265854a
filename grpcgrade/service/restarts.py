"""How a face is supervised: the Python face processes (`faces`) and the native gRPC face (`native_face`)
keep the same rule. A face has `START_SECONDS` to say it is ready; a first start that fails fails the
server's; a face that dies while serving, or whose new start fails, is logged and started again after a
pause, short after a face that ran a while, doubling while they keep dying fast."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from grpcgrade.core.errors import ConfigError

log = logging.getLogger("grpcgrade.service.faces")

#: How long a face may take to start (a Python face process imports the graders and reads the configuration).
START_SECONDS = 120.0
#: The pause before a dead face is started again, doubled while they keep dying within `STABLE_SECONDS`
#: of their start, up to the maximum.
RESTART_PAUSE_SECONDS = 0.2
MAX_RESTART_PAUSE_SECONDS = 10.0
STABLE_SECONDS = 30.0


async def started(ready: asyncio.Future[int], what: str) -> int:
    """What the face `what` said when ready (its port); ConfigError when it has not said it in time, or
    the error its start ended with."""
    try:
        return await asyncio.wait_for(asyncio.shield(ready), START_SECONDS)
    except TimeoutError:
        raise ConfigError(f"{what} did not start within {START_SECONDS:g} s") from None


class Restarts:
    """One face slot's restarts: the pause before the next, and the start waiting for it."""

    def __init__(self) -> None:
        self.pause_now = RESTART_PAUSE_SECONDS
        self.at = 0.0
        #: Faces started again in this slot.
        self.count = 0
        self._again: asyncio.Task[None] | None = None

    def started(self) -> None:
        self.at = time.monotonic()

    def pause(self) -> float:
        """The pause before the next start, the face in this slot having just ended."""
        quick = time.monotonic() - self.at < STABLE_SECONDS
        pause = self.pause_now if quick else RESTART_PAUSE_SECONDS
        self.pause_now = min(pause * 2, MAX_RESTART_PAUSE_SECONDS)
        return pause

    def ended(
        self, what: str, pid: int | None, code: int | None, ready: asyncio.Future[int] | None,
        start: Callable[[], asyncio.Future[int]] | None,
    ) -> None:  # fmt: skip
        """The face `what` (process `pid`) in this slot ended with `code`: a start not yet ready fails
        with it (`ready`), which fails the server's start when it was the first; a face that was serving,
        or that was started again and failed, is logged and started again (`start`: spawns it and gives its
        ready future; None: the server is stopping) after the pause, unless `cancel` comes first."""
        if ready is not None and not ready.done():
            ready.set_exception(ConfigError(f"{what} exited ({code})"))
            if self.count == 0:
                return
        if start is None:
            return
        pause = self.pause()
        log.error("%s (pid %s) exited with %s; starting another in %.1f s", what, pid, code, pause)
        self._again = asyncio.get_running_loop().create_task(self._start_again(pause, start))

    async def _start_again(self, pause: float, start: Callable[[], asyncio.Future[int]]) -> None:
        await asyncio.sleep(pause)
        self.count += 1
        with contextlib.suppress(Exception):  # a failed start ends the process, and its end tries again
            await start()

    def cancel(self) -> None:
        """No face is started again in this slot: the server is stopping."""
        if self._again is not None:
            self._again.cancel()
