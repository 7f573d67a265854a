"""One bwrap process from start to finish: its input, its bounded output, its time limit, its end.

Stopping a sandbox kills its PID 1 (bwrap's init inside the namespace), whose host PID bwrap reports on
`--info-fd`, through a pidfd so a recycled PID can never be hit. The kernel then kills every process of the
namespace, and the outer bwrap, seeing its child gone, exits by itself. Killing the outer bwrap instead
would orphan the init: it would die as well (bwrap's `--die-with-parent`) but stay a zombie until PID 1
of the host or container reaps it, and in a container the server itself is PID 1 and never does. The
outer bwrap is killed only when its sandbox does not go away.

The run is finished when the outer bwrap has exited and both output pipes are closed, which happens only
once every process of the sandbox is gone: they all hold those pipes. Whatever way the caller leaves (a
result, an error, a cancellation), the sandbox is stopped and the transport closed before the event loop
moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

#: How long a stopped sandbox may take to go away before it counts as the sandbox's failure.
KILL_GRACE_SECONDS = 5.0
_CHILD_PID = re.compile(rb'"child-pid":\s*(\d+)')


class StuckSandbox(Exception):
    """The sandbox did not go away after it was killed."""


@dataclass(frozen=True)
class Exit:
    """What came out of bwrap, before any reading of it."""

    status: int | None  #: bwrap's exit status (128 + n for a program killed by signal n)
    stdout: bytes
    stderr: bytes
    timed_out: bool
    overflowed: bool
    seconds: float  #: from the start to bwrap's exit


class _Run(asyncio.SubprocessProtocol):
    """bwrap's stdout and stderr, each kept up to its limit; past it, the sandbox is stopped at once."""

    def __init__(self, limits: tuple[int, int], info_fd: int) -> None:
        self.limits = {1: limits[0], 2: limits[1]}
        self.data: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self.overflowed = False
        self.exited_at = 0.0
        self.transport: asyncio.SubprocessTransport | None = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.info_fd: int | None = info_fd
        self.info = bytearray()
        self.pidfd: int | None = None
        self.stopping = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.transport = transport

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if self.overflowed:
            return
        kept = self.data[fd]
        room = self.limits[fd] - len(kept)
        kept += data[:room]
        if len(data) > room:
            self.overflowed = True
            self.stop()

    def process_exited(self) -> None:
        self.exited_at = time.perf_counter()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    # -- the sandbox's PID 1 ------------------------------------------------------------------------

    def read_info(self) -> None:
        """Take what bwrap wrote on --info-fd so far; once the init's PID is there, hold it by a pidfd.

        The pipe is read to its end, never closed early: bwrap writes more after the PID, and a write to a
        closed pipe would kill it (SIGPIPE) between creating the sandbox and letting it run.
        """
        if self.info_fd is None:
            return
        try:
            while chunk := os.read(self.info_fd, 4096):
                self.info += chunk
            self.close_info()  # end of file: bwrap is done with it
        except BlockingIOError:
            pass
        match = _CHILD_PID.search(self.info)
        if match and self.pidfd is None:
            with contextlib.suppress(ProcessLookupError):  # already gone: nothing to stop
                self.pidfd = os.pidfd_open(int(match.group(1)))
                if self.stopping:
                    self._kill_init()

    def close_info(self) -> None:
        if self.info_fd is not None:
            asyncio.get_running_loop().remove_reader(self.info_fd)
            os.close(self.info_fd)
            self.info_fd = None

    def stop(self) -> None:
        """Kill the sandbox's init (the kernel takes the rest), now or as soon as bwrap names it. A bwrap
        that never gets as far as creating it exits by itself; one that hangs, `_end` kills."""
        self.stopping = True
        self.read_info()
        if self.pidfd is not None:
            self._kill_init()

    def _kill_init(self) -> None:
        assert self.pidfd is not None
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def release(self) -> None:
        self.close_info()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


async def run_process(
    argv: Sequence[str],
    pass_fds: Sequence[int],
    info_fd: int,
    stdin: bytes,
    output_limits: tuple[int, int],
    time_limit: float,
) -> Exit:
    """Run bwrap (`argv`, which writes its info to the pipe whose read end is `info_fd`) to its end.

    It owns every fd it is given: `pass_fds` (bwrap's copies are all it needs) are closed here once bwrap
    is started, `info_fd` once the run is over. Raises OSError when bwrap cannot be started and
    StuckSandbox when it does not stop.
    """
    loop = asyncio.get_running_loop()
    run = _Run(output_limits, info_fd)
    os.set_blocking(info_fd, False)
    loop.add_reader(info_fd, run.read_info)
    # Never cancelled: asyncio (3.11) can hang for good when subprocess_exec itself is cancelled. A caller
    # that gives up meanwhile still waits the few milliseconds the spawn takes, then stops what it made.
    spawn = asyncio.ensure_future(
        loop.subprocess_exec(
            lambda: run,
            *argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=tuple(pass_fds),
            env={},
            start_new_session=True,
        )
    )
    spawn.add_done_callback(lambda _: _close_all(pass_fds))
    try:
        try:
            transport, _ = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            while not spawn.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(spawn)
            if not spawn.cancelled() and spawn.exception() is None:
                await _end(spawn.result()[0], run)
            raise
        try:
            return await _supervise(transport, run, stdin, time_limit)
        finally:
            await _end(transport, run)
    finally:
        run.release()


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


async def _supervise(transport: asyncio.SubprocessTransport, run: _Run, stdin: bytes, time_limit: float) -> Exit:
    started = time.perf_counter()
    feed = transport.get_pipe_transport(0)
    assert isinstance(feed, asyncio.WriteTransport)
    feed.write(stdin)  # a program that exits without reading it all closes the pipe: no error here
    feed.write_eof()
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(run.finished), time_limit)
    except TimeoutError:
        timed_out = True
        run.stop()
    seconds = (run.exited_at or time.perf_counter()) - started
    try:
        await asyncio.wait_for(asyncio.shield(run.finished), KILL_GRACE_SECONDS)
    except TimeoutError as exc:
        raise StuckSandbox(f"the sandbox did not stop within {KILL_GRACE_SECONDS:g} s of being killed") from exc
    return Exit(transport.get_returncode(), bytes(run.data[1]), bytes(run.data[2]), timed_out, run.overflowed, seconds)


async def _end(transport: asyncio.SubprocessTransport, run: _Run) -> None:
    """Stop the sandbox if it still runs, let it go away, then close the transport (the outer bwrap is
    killed only if it is still there by then)."""
    try:
        if not run.finished.done():
            run.stop()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(run.finished), KILL_GRACE_SECONDS)
    finally:
        transport.close()
