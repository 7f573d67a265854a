"""The native gRPC face (`grpc.face: native`, `serve --grpc-face native`): the public gRPC port served by
`grpcgrade-grpc-face`, a Go program (native/grpc-face/), started and watched by the server's process.

Why Go: on 2 cores a Python gRPC server spends 250-290 us of CPU on a unary call whatever its loop
(grpc.aio on asyncio or uvloop, the sync server), so a crowd of one-sample callers meets the same bound with
any number of Python face processes: 1.04x the FastAPI peer with a face process per core, 1.11x for two
bare grpc.aio processes doing nothing. grpc-go's server answered the same crowd (h2load, 4,000 callers) at
~20 us of CPU a call: docs/performance.md.

The Go face does what the Python gRPC face processes do (`grpc_face`), on the same contract: unary
Evaluate calls of the same plan gathered into BatchEvaluate calls to the engine's process on its private
socket (the same linger rule, `core.coalesce.FACE_LINGER_SECONDS`), every other method relayed as bytes with its
deadline, metadata and cancellation, the same token check, and its counts sent here. What differs: it does
not resolve plans (it has no registry): it splits each EvaluateRequest by field number, groups calls by the
plan's bytes, and a call it cannot split or whose chunk the engine refused for what a request holds goes to
the engine as the plain Evaluate it was, so the engine names what is wrong.

Here: the public port's socket is bound and listening in this process (`faces.FaceProcesses` reserves it)
and inherited by the Go process, so connections that arrive while a face is replaced wait in the backlog;
the face says `ready` (and later its counts) as JSON lines on its stdout; it ends when its stdin closes
(this process has gone) or on SIGTERM (draining for the grace period). A face that dies is started again
after a pause (`restarts`), as a Python face process is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from grpcgrade.core.admission import PENDING_CALLS
from grpcgrade.core.coalesce import FACE_LINGER_SECONDS
from grpcgrade.core.config import ServerConfig
from grpcgrade.core.engine import CHEAP_CHUNK
from grpcgrade.core.errors import ConfigError

from .grpc_face import relayed_methods
from .metrics import Metrics
from .options import ServeOptions, connection_cap
from .restarts import Restarts, started

log = logging.getLogger("grpcgrade.service.faces")

#: The face as log lines and errors name it.
WHAT = "the native gRPC face"
#: The program's name, and the environment variable that may give its path.
BINARY = "grpcgrade-grpc-face"
BINARY_ENV = "GRPCGRADE_GRPC_FACE"
#: Where `make native-face` builds it, from the repository's root.
BUILT = Path("build") / "native" / BINARY
#: The public port's listen backlog: connections wait there while a face starts or is replaced.
BACKLOG = 4096
#: The most bytes of the face's stdout kept while a line is incomplete (a line is a few KB).
MAX_LINE_BYTES = 1 << 20

_KINDS = {
    (False, False): "unary",
    (False, True): "server_stream",
    (True, False): "client_stream",
    (True, True): "bidi_stream",
}


def binary() -> str:
    """The Go face's path: $GRPCGRADE_GRPC_FACE, `make native-face`'s build, or on PATH (the image's);
    ConfigError saying how to build it otherwise."""
    given = os.environ.get(BINARY_ENV)
    if given:
        if not os.access(given, os.X_OK):
            raise ConfigError(f"{BINARY_ENV}={given}: not an executable file (`make native-face` builds {BUILT})")
        return given
    built = Path(__file__).resolve().parents[2] / BUILT
    if os.access(built, os.X_OK):
        return str(built)
    found = shutil.which(BINARY)
    if found is None:
        raise ConfigError(
            f"grpc.face: native needs the Go face's program, {BINARY}, which is not built: run `make native-face` "
            f"(Go 1.19+ and Debian's golang-google-grpc-dev: `make system-deps`), or set {BINARY_ENV} to its "
            "path; or serve the gRPC port with Python (grpc.face: python)"
        )
    return found


def arguments(options: ServeOptions, engine: str, config: ServerConfig, metrics: Metrics | None) -> list[str]:
    """The Go face's command-line options: the engine's address, the limits and linger of `config`, the
    connection bounds of its `grpc:` (as the Python server's: `options.public_server_options`), the methods
    the engine serves (by kind), the latency histogram's buckets, the tokens and TLS files."""
    limits, grpc_config = config.limits, config.grpc
    methods = {name: _KINDS[kinds] for name, kinds in relayed_methods().items()}
    bounds: list[float] = []
    if metrics is not None:  # the histogram's own upper bounds (+Inf last): the face counts per bucket
        bounds = list(metrics.handling._upper_bounds)
    args = [
        f"--engine={engine}",
        f"--max-message-bytes={limits.max_message_bytes}",
        f"--max-calls={limits.max_pending_calls}",
        f"--retry-after={limits.retry_after_seconds}",
        f"--linger={max(config.coalesce_linger_seconds, FACE_LINGER_SECONDS)}",
        f"--max-chunk={CHEAP_CHUNK}",
        f"--grace={options.grace_seconds}",
        f"--max-connections={connection_cap(grpc_config.max_connections)}",
        f"--handshake-timeout={grpc_config.handshake_timeout_seconds}",
        f"--idle-timeout={grpc_config.idle_timeout_seconds}",
        f"--methods={json.dumps(methods)}",
        f"--buckets={','.join(_bound(b) for b in bounds)}",
    ]
    if options.auth_token_file:
        args.append(f"--token-file={options.auth_token_file}")
    if options.tls_cert and options.tls_key:
        args += [f"--tls-cert={options.tls_cert}", f"--tls-key={options.tls_key}"]
        if options.tls_client_ca:
            args.append(f"--tls-client-ca={options.tls_client_ca}")
    return args


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


class NativeFace:
    """The Go face serving the public gRPC port on `sock` (bound here), with `cores` cores (GOMAXPROCS),
    grading through the engine at `engine`; its counts go into `metrics`."""

    def __init__(
        self, options: ServeOptions, engine: str, sock: socket.socket, cores: int, config: ServerConfig,
        metrics: Metrics | None,
    ) -> None:  # fmt: skip
        self.program = binary()
        self.args = arguments(options, engine, config, metrics)
        self.sock = sock
        self.cores = cores
        self.grace = options.grace_seconds
        self.metrics = metrics
        self.process: subprocess.Popen[bytes] | None = None
        self.ready: asyncio.Future[int] | None = None
        self.restarts = Restarts()
        self.stopping = False
        #: What its coalescer gathered (`metrics.watch_coalescer` counts it with the server's).
        self.chunks = 0
        self.samples = 0
        self._pending = b""
        self._pidfd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Held while its stdout is read: by the event loop, and by a scrape's thread (`drain`).
        self._reading = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.returncode is None else None

    async def start(self) -> None:
        """The face started and serving; ConfigError saying why it could not start."""
        self._loop = asyncio.get_running_loop()
        self.sock.listen(BACKLOG)
        await started(self._spawn(), WHAT)

    def _spawn(self) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        fd = self.sock.fileno()
        env = {**os.environ, "GOMAXPROCS": str(self.cores)}
        self.process = subprocess.Popen(
            [self.program, f"--listen-fd={fd}", *self.args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(fd,), env=env,
        )  # fmt: skip
        assert self.process.stdout is not None
        os.set_blocking(self.process.stdout.fileno(), False)
        self._pending = b""
        self.restarts.started()
        self.ready = loop.create_future()
        loop.add_reader(self.process.stdout.fileno(), self._read)
        self._pidfd = os.pidfd_open(self.process.pid)
        loop.add_reader(self._pidfd, self._ended, self.process)
        return self.ready

    def _lines(self) -> list[dict[str, Any]]:
        """Every whole line the face has written so far, parsed (under the lock)."""
        process = self.process
        with self._reading:
            if process is None or process.stdout is None or process.stdout.closed:
                return []
            chunks = [self._pending]
            with contextlib.suppress(BlockingIOError, OSError, ValueError):
                while True:
                    data = os.read(process.stdout.fileno(), 1 << 16)
                    if not data:
                        break
                    chunks.append(data)
            *whole, rest = b"".join(chunks).split(b"\n")
            self._pending = rest[-MAX_LINE_BYTES:]
        out = []
        for raw in whole:
            with contextlib.suppress(ValueError):
                out.append(json.loads(raw))
        return out

    def _read(self) -> None:
        for message in self._lines():
            self._count(message)
            self._handle(message)

    def drain(self) -> None:
        """What the face has sent, counted now (a scrape's thread calls it before answering)."""
        for message in self._lines():
            self._count(message)
            if ("ready" in message or "error" in message) and self._loop is not None:
                self._loop.call_soon_threadsafe(self._handle, message)

    def _handle(self, message: dict[str, Any]) -> None:
        """Ready, or why it could not start (on the loop)."""
        if self.ready is None or self.ready.done():
            return
        if "ready" in message:
            self.ready.set_result(int(message["ready"]))
        elif "error" in message:
            self.ready.set_exception(ConfigError(f"{WHAT}: {message['error']}"))

    def _count(self, message: dict[str, Any]) -> None:
        """A line's counts into the server's counters of the same names and labels."""
        self.chunks += int(message.get("chunks", 0))
        self.samples += int(message.get("samples", 0))
        if self.metrics is None:
            return
        refused = int(message.get("refused", 0))  # past its in-flight bound, as the server's own are counted
        if refused:
            self.metrics.calls_refused.labels(PENDING_CALLS).inc(refused)
        for name, labels, amount in message.get("count", ()):
            if name in ("started", "received", "sent", "handled"):
                getattr(self.metrics, name).labels(*labels).inc(amount)
        for name, labels, increments, total in message.get("hist", ()):
            if name == "handling":
                observe_buckets(self.metrics.handling.labels(*labels), increments, total)

    def _ended(self, process: subprocess.Popen[bytes]) -> None:
        loop = asyncio.get_running_loop()
        self._read()  # its last counts
        self._close_pipes(loop, process)
        process.wait()
        if self.process is process:
            again = None if self.stopping else self._spawn
            self.restarts.ended(WHAT, process.pid, process.returncode, self.ready, again)

    def _close_pipes(self, loop: asyncio.AbstractEventLoop, process: subprocess.Popen[bytes]) -> None:
        if self._pidfd >= 0 and process is self.process:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1
        with self._reading:
            for pipe in (process.stdout, process.stdin):
                if pipe is not None and not pipe.closed:
                    with contextlib.suppress(ValueError, OSError):
                        loop.remove_reader(pipe.fileno())
                    pipe.close()

    async def stop(self, grace: float) -> None:
        """The face drains (SIGTERM: no new connection, in-flight calls finish for up to `grace`), within
        `grace` and a second more; killed if still there then."""
        self.stopping = True
        self.restarts.cancel()
        process = self.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            end = time.monotonic() + grace + 1.0
            while process.poll() is None and time.monotonic() < end:
                await asyncio.sleep(0.05)
            if process.poll() is None:
                log.warning("%s (pid %s) did not drain in time: killed", WHAT, process.pid)
                process.kill()
        await asyncio.sleep(0)  # its pidfd's callback: the last counts read
        self.close()

    def close(self) -> None:
        """Everything released at once (a failed start, or after `stop`)."""
        self.stopping = True
        self.restarts.cancel()
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(1.0)
        with contextlib.suppress(RuntimeError):
            self._read()
        with contextlib.suppress(RuntimeError):
            self._close_pipes(asyncio.get_running_loop(), process)


def observe_buckets(child: Any, increments: list[int], total: float) -> None:
    """A prometheus_client histogram's child moved by many observations at once: `increments[i]`
    observations in bucket i (not cumulative, +Inf last, the histogram's own bounds) summing to `total`.
    Observing each call here would cost the engine's process a Python call per gRPC call: the face's
    whole point is to keep that CPU for grading. (prometheus_client keeps these per-bucket values itself;
    its API has no bulk observe.)"""
    buckets = child._buckets
    for i, n in enumerate(increments[: len(buckets)]):
        if n:
            buckets[i].inc(n)
    child._sum.inc(total)
