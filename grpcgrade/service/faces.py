"""The face processes, as the server's process runs them: started before the server says SERVING,
restarted when one dies, drained with the server, their counters served on the server's /metrics.

Why processes of their own: on the engine's event loop, a flood of HTTP bodies (or a crowd of one-sample
posts or unary calls) gave that loop more short steps than a core can do, and every caller queued behind
them (`grpcgrade bench --http-stall`: seconds); and one process answers gRPC calls only as fast as
grpc.aio's own per-call work on one core allows (`bench --per-sample`). A face process translates its
protocol into the gRPC contract (`link`), so the engine's process sees one BatchEvaluate per piece or per
coalesced crowd, and the faces' work uses the machine's other cores. One kind of face process serves
the HTTP face, the gRPC face or both (`face_process`).

- The ports: the server binds each face's port first, with SO_REUSEPORT and without listening (so a port
  in use fails the start at once, and port 0 has a port to give the faces); every face process listens on
  it with SO_REUSEPORT, and the kernel spreads new connections over them. The placeholder never accepts.
- The engine: the face processes call the server's process on a Unix-domain socket in a directory only
  this user can enter, with the server's token when it has one (`server.Service`); a gRPC face relays a
  client's other calls there with the client's own token.
- Counters: each face process sends its increments (`counters`); they are added to the server's counters
  of the same names and labels, as they arrive, and a scrape first asks every face for what it has counted
  so far (`drain`), so /metrics is one view.
- The native gRPC face (`grpc.face: native`): the public gRPC port served by a Go program instead of gRPC
  face processes (`native_face.NativeFace`, held here beside the HTTP face processes).
- A face process that dies is started again after `restarts.RESTART_PAUSE_SECONDS` (doubling, up to
  `MAX_RESTART_PAUSE_SECONDS`, while they keep dying fast); its in-flight requests are lost with it
  (their clients see the connection end) and nothing else is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from grpcgrade import logs
from grpcgrade.core.config import ServerConfig
from grpcgrade.core.errors import ConfigError, PortUnavailable
from grpcgrade.core.grading import Stats

from .counters import COALESCED, COUNTERS, FLUSH, FLUSHED, HISTOGRAMS, Increment
from .face_process import FaceSpec, main
from .metrics import Metrics
from .native_face import NativeFace
from .options import ServeOptions
from .ports import reserve_port
from .restarts import Restarts, started

log = logging.getLogger("grpcgrade.service.faces")

#: How long a scrape waits for a face process's counts (`drain`): one stuck answers the scrape without them.
FLUSH_WAIT_SECONDS = 1.0


class _Face:
    """One face process slot: the process in it now, its pipe, its last counters."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: BaseProcess | None = None
        self.conn: Connection | None = None
        self.ready: asyncio.Future[int] | None = None
        self.restarts = Restarts()
        #: The last scrape's ask sent to this face (`FLUSH`), and the last it answered (`FLUSHED`).
        self.asked = self.flushed = 0


class FaceProcesses:
    """The server's face processes, calling the engine at `engine`: `http` of them serve the HTTP face (on
    `options.http_host:http_port`), `grpc` the public gRPC port (`options.host:port`); max(http, grpc)
    processes, face i serving HTTP when i < http and gRPC when i < grpc. With `native` (the server's
    configuration, `grpc.face: native`), the public gRPC port is the native face's (`native_face`), using
    `grpc` cores, and the face processes serve HTTP only."""

    def __init__(
        self, options: ServeOptions, engine: str, http: int, grpc: int, metrics: Metrics | None,
        native: ServerConfig | None = None,
    ) -> None:  # fmt: skip
        self.options = options
        self.engine = engine
        self.metrics = metrics
        self.http, self.grpc = http, grpc
        self.placeholders: list[socket.socket] = []
        #: The HTTP face's port and the public gRPC port, bound (None: no such face).
        self.port: int | None = None
        self.grpc_port: int | None = None
        if http:
            self.placeholders.append(reserve_port(options.http_host, options.http_port or 0))
            self.port = self.placeholders[-1].getsockname()[1]
        if grpc:
            try:
                self.placeholders.append(reserve_port(options.host, options.port, "port"))
            except BaseException:
                self.close_placeholders()
                raise
            self.grpc_port = self.placeholders[-1].getsockname()[1]
        #: The native gRPC face (None: face processes serve the gRPC port, if anyone does).
        self.native: NativeFace | None = None
        if grpc and native is not None:
            try:
                self.native = NativeFace(options, engine, self.placeholders[-1], grpc, native, metrics)
            except BaseException:
                self.close_placeholders()
                raise
        #: The face processes serving gRPC.
        self.grpc_processes = 0 if self.native is not None else grpc
        self.faces = [_Face(i) for i in range(max(http, self.grpc_processes))]
        self.stopping = False
        #: What the faces' coalescers gathered (`metrics.watch_coalescer` counts it with the server's).
        self.chunks = 0
        self.samples = 0
        self._context = multiprocessing.get_context("spawn")
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Held while a face's pipe is read: by the event loop, and by a scrape's thread (`drain`).
        self._reading = threading.Lock()
        #: Held by a scrape asking the faces (scrapes may come at once; only they write to the pipes).
        self._asking = threading.Lock()
        if metrics is not None:
            metrics.before_scrape.append(self.drain)

    def kind(self, face: _Face) -> str:
        """What `face` serves, for log lines: HTTP, gRPC, or both."""
        served = [name for name, count in (("HTTP", self.http), ("gRPC", self.grpc_processes)) if face.index < count]
        return " and ".join(served)

    @property
    def restarts(self) -> int:
        """Face processes started again after one died."""
        return sum(face.restarts.count for face in self.faces)

    def what(self, face: _Face) -> str:
        """A face process as log lines and errors name it."""
        return f"{self.kind(face)} face process {face.index}"

    @property
    def pids(self) -> list[int]:
        """The face processes' PIDs now."""
        return [f.process.pid for f in self.faces if f.process is not None and f.process.pid is not None]

    async def start(self) -> None:
        """Every face process started and listening; PortUnavailable or ConfigError naming the first
        that could not start."""
        self._loop = asyncio.get_running_loop()
        for face in self.faces:
            self._spawn(face)
        for face in self.faces:
            assert face.ready is not None
            await started(face.ready, self.what(face))
        if self.native is not None:
            await self.native.start()

    def _spawn(self, face: _Face) -> asyncio.Future[int]:
        levels, formatter = logs.current()
        http = self.port if face.index < self.http else None
        grpc = self.grpc_port if face.index < self.grpc_processes else None
        spec = FaceSpec(self.options, self.engine, face.index, http, grpc, levels, formatter)
        ours, theirs = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=main, args=(spec, theirs, os.getpid()), name=f"grpcgrade-face-{face.index}", daemon=False
        )
        process.start()
        theirs.close()
        face.process, face.conn = process, ours
        face.restarts.started()
        face.ready = asyncio.get_running_loop().create_future()
        loop = asyncio.get_running_loop()
        loop.add_reader(ours.fileno(), self._read, face, ours)
        loop.add_reader(process.sentinel, self._ended, face, process)
        return face.ready

    def _read(self, face: _Face, conn: Connection) -> None:
        """The event loop's reader of a face's pipe: what it sent so far."""
        for kind, value in self._received(conn):
            self._handle(face, kind, value)

    def _received(self, conn: Connection) -> list[tuple[str, object]]:
        """Every message waiting on `conn`, read under the lock; [] once it has ended."""
        out = []
        with self._reading:
            try:
                while not conn.closed and conn.poll():
                    out.append(conn.recv())
            except (EOFError, OSError):
                pass
        return out

    def _handle(self, face: _Face, kind: str, value: object) -> None:
        """A message from a face process: its counts, ready, or why it could not start (on the loop)."""
        if kind == "count":
            self._count(*value)  # type: ignore[misc]
        elif kind == FLUSHED:
            face.flushed = max(face.flushed, int(value))  # type: ignore[call-overload]
        elif face.ready is not None and not face.ready.done():
            if kind == "ready":
                face.ready.set_result(int(value))  # type: ignore[call-overload]
            else:
                face.ready.set_exception(_start_error(self.options, str(value)))

    def drain(self) -> None:
        """What the face processes have counted until now, counted here (a scrape's thread calls it before
        answering): each serving face is asked for its counts (`counters.FLUSH`) and its answer awaited, up
        to `FLUSH_WAIT_SECONDS` in all, so a scrape sees every request answered before it began although the
        faces send their counts every `counters.BATCH_SECONDS`; the native gRPC face's, as it has sent them."""
        if self.native is not None:
            self.native.drain()
        with self._asking:
            asked = []
            for face in self.faces:
                if face.ready is None or not face.ready.done():
                    continue  # starting: it has counted nothing, and reads its pipe only once it serves
                with contextlib.suppress(OSError, ValueError, AttributeError):  # gone meanwhile
                    face.conn.send((FLUSH, face.asked + 1))  # type: ignore[union-attr]
                    face.asked += 1
                    asked.append(face)
            end = time.monotonic() + FLUSH_WAIT_SECONDS
            for face in asked:
                while (conn := face.conn) is not None and self._take(face, conn) and face.flushed < face.asked:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    with contextlib.suppress(OSError, ValueError):
                        conn.poll(min(left, 0.01))

    def _take(self, face: _Face, conn: Connection) -> bool:
        """What a face has sent, read by a scrape's thread: counts counted here, the rest for the loop;
        False once its pipe has ended (the loop hangs it up)."""
        received, open_ = [], True
        with self._reading:
            try:
                while not conn.closed and conn.poll():
                    received.append(conn.recv())
            except (EOFError, OSError):
                open_ = False
        for kind, value in received:
            if kind in ("count", FLUSHED):
                self._handle(face, kind, value)
            elif self._loop is not None:
                self._loop.call_soon_threadsafe(self._handle, face, kind, value)
        return open_ and not conn.closed

    def _count(self, increments: list[Increment], stats: list[Stats]) -> None:
        """A face's increments into the server's counters of the same names and labels, and its grading
        stats into the metrics as the engine's own."""
        if self.metrics is not None:
            for one in stats:
                self.metrics.observe_grading(one)
        for name, values, amount in increments:
            if name in COALESCED:
                setattr(self, name, getattr(self, name) + int(amount))
            elif self.metrics is not None and (name in COUNTERS or name in HISTOGRAMS):
                metric = getattr(self.metrics, name)
                child = metric.labels(*values) if values else metric
                (child.observe if name in HISTOGRAMS else child.inc)(amount)

    def _hang_up(self, face: _Face, loop: asyncio.AbstractEventLoop) -> None:
        """Close a face process's pipe, after reading what it said last (its final counts)."""
        if face.conn is None:
            return
        self._read(face, face.conn)
        with contextlib.suppress(OSError, ValueError):
            loop.remove_reader(face.conn.fileno())
        with self._reading:
            face.conn.close()
            face.conn = None

    def _ended(self, face: _Face, process: BaseProcess) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(process.sentinel)
        process.join(0)
        if face.process is not process:
            return
        self._hang_up(face, loop)
        again = None if self.stopping else lambda: self._spawn(face)
        face.restarts.ended(self.what(face), process.pid, process.exitcode, face.ready, again)

    async def stop(self, grace: float) -> None:
        """Each face process drains (SIGTERM: no new connection, in-flight requests finish for up to
        `grace`), within `grace` and a second more; one still there then is killed."""
        self.stopping = True
        for face in self.faces:
            face.restarts.cancel()
        alive = [f.process for f in self.faces if f.process is not None and f.process.exitcode is None]
        for process in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)  # type: ignore[arg-type]
        native = asyncio.ensure_future(self.native.stop(grace)) if self.native is not None else None
        end = time.monotonic() + grace + 1.0
        while any(p.exitcode is None for p in alive) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        if native is not None:
            await native
        for process in alive:
            if process.exitcode is None:
                log.warning("face process pid %s did not drain in time: killed", process.pid)
                process.kill()
                process.join(1.0)
        await asyncio.sleep(0)  # their sentinels' callbacks: the last counters read
        self.close()

    def close_placeholders(self) -> None:
        for placeholder in self.placeholders:
            placeholder.close()

    def close(self) -> None:
        """Everything released at once (a failed start, or after `stop`)."""
        self.stopping = True
        loop = asyncio.get_running_loop()
        for face in self.faces:
            face.restarts.cancel()
            process = face.process
            if process is not None:
                if process.exitcode is None:
                    process.kill()
                    process.join(1.0)
                with contextlib.suppress(ValueError, OSError):
                    loop.remove_reader(process.sentinel)
            self._hang_up(face, loop)
        if self.native is not None:
            self.native.close()
        self.close_placeholders()
        if self.metrics is not None and self.drain in self.metrics.before_scrape:
            self.metrics.before_scrape.remove(self.drain)


def _start_error(options: ServeOptions, message: str) -> Exception:
    """A face process's failed start as the server's error: a port's, or the configuration's."""
    if "Errno" in message and ("address" in message.lower() or "bind" in message.lower()):
        if "gRPC port" in message:
            return PortUnavailable("port", options.host, options.port, message)
        return PortUnavailable("http_port", options.http_host, options.http_port or 0, message)
    return ConfigError(f"face process: {message}")
