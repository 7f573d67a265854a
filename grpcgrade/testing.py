"""Start a real grpcgrade server in a subprocess: for test suites (ours and plugin authors') and the benchmark.

Tests of a grader plugin should call it the way trainers do, over gRPC on a loopback port, not through a
mocked channel.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .client import GradingClient

#: How many times `start_server` picks fresh ports when the server could not bind the ones it was given.
BIND_ATTEMPTS = 5
#: What the server says when it cannot bind a port it was given (`cli.describe` of a PortUnavailable).
_PORT_TAKEN = "cannot listen on"


def free_port() -> int:
    """A loopback port free now. Something else may bind it before the caller does: a server started on it
    must be started again on another when it cannot bind it (`start_server` does)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_ports(pids: list[int]) -> set[int]:
    """The TCP ports on which `pids` listen (how a test learns the port a server was given for
    `--http-port 0`)."""
    return {local for state, local, _ in _tcp_sockets(pids) if state == "0A"}  # 0A: LISTEN


def connections_to(port: int, pids: list[int]) -> int:
    """How many TCP connections `pids` hold open to `port` (ESTABLISHED): whether a client closed its
    channel, seen from the sockets instead of the client's insides."""
    return sum(1 for state, _, remote in _tcp_sockets(pids) if state == "01" and remote == port)


def _tcp_sockets(pids: list[int]) -> list[tuple[str, int, int]]:
    """(state, local port, remote port) of every TCP socket one of `pids` holds: the entries of
    /proc/net/tcp and tcp6 whose inode is among their open files."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        inodes.add(link[len("socket:[") : -1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    local, remote = (int(f.rsplit(":", 1)[1], 16) for f in fields[1:3])
                    out.append((fields[3], local, remote))
    return out


def eventually(condition: Callable[[], object], what: str, bound: float = 60.0, every: float = 0.05) -> None:
    """Poll until `condition()` holds: for what the server does after a call has its answer (a worker
    replaced and warmed, a metric scraped). The bound only keeps a broken server from hanging the suite:
    it is not a time limit the test asserts."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"not within {bound:g} s: {what}"
        time.sleep(every)


class CpuSince:
    """The CPU each of `pids` has used since this was made: which of them took up work (a worker spinning
    on a sample), seen without timing it."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self.since = {p: cpu_seconds(p) for p in self.pids}

    def busy(self, more_than: float = 0.0) -> list[int]:
        """The processes that have used more than `more_than` CPU seconds since (one gone is not busy)."""
        out = []
        for pid in self.pids:
            try:
                if cpu_seconds(pid) > self.since[pid] + more_than:
                    out.append(pid)
            except OSError:
                continue
        return out


def cpu_when_idle(pids: list[int], bound: float = 60.0, every: float = 0.3) -> float:
    """The CPU seconds `pids` have used in all, read once none of them runs any more (none gained more than
    two clock ticks between two reads `every` apart; a process gone counts what it had): how much work a
    server still did after a call ended, counted in CPU instead of timed. The bound only keeps a broken
    server from hanging the suite."""
    tick = 2 / os.sysconf("SC_CLK_TCK")
    last: dict[int, float] = {}

    def read() -> dict[int, float]:
        now = dict(last)
        for pid in pids:
            try:
                now[pid] = cpu_seconds(pid)
            except OSError:  # ended: what it used is what it had
                continue
        return now

    last = read()
    deadline = time.monotonic() + bound
    while True:
        time.sleep(every)
        now = read()
        if all(now[p] - last.get(p, 0.0) <= tick for p in now):
            return sum(now.values())
        assert time.monotonic() < deadline, f"not idle within {bound:g} s: {sorted(now)}"
        last = now


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a server's workers and its resource tracker)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def worker_pids(server_pid: int) -> list[int]:
    """A server's worker processes: its spawned children, not multiprocessing's resource tracker nor the
    HTTP face processes (`face_pids`)."""
    faces = set(face_pids(server_pid))
    out = []
    for pid in children(server_pid):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes() and pid not in faces:
                out.append(pid)
        except OSError:  # ended meanwhile
            continue
    return out


def _named(pids: list[int], name: str) -> list[int]:
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                out.append(pid)
        except OSError:  # ended meanwhile
            continue
    return out


def face_pids(server_pid: int) -> list[int]:
    """The server's face processes (named `face_process.PROCESS_NAME`)."""
    from grpcgrade.service.face_process import PROCESS_NAME

    return _named(children(server_pid), PROCESS_NAME)


def parser_pids(server_pid: int) -> list[int]:
    """The HTTP face's JSON parsing processes (named `json_body.PROCESS_NAME`): the face processes'
    children."""
    from grpcgrade.core.json_body import PROCESS_NAME

    return _named([pid for face in face_pids(server_pid) for pid in children(face)], PROCESS_NAME)


#: The system calls a process blocked writing to a pipe or socket is in (write, writev), by machine.
WRITE_CALLS = {"x86_64": {1, 20}, "aarch64": {64, 66}}


def writing(pid: int) -> bool:
    """Whether `pid` is in a write system call (`/proc/PID/syscall` names the call it is blocked in first)."""
    try:
        call = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return bool(call) and call[0].isdigit() and int(call[0]) in WRITE_CALLS.get(platform.machine(), {1})


def memory_kib(pid: int, field: str = "VmRSS") -> int:
    """A process's memory from /proc status: `VmRSS` (resident now) or `VmHWM` (its peak), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def install_into(target: Path, *packages: Path | str) -> Path:
    """pip-install plugin packages (entry points and all) into `target`: put it on PYTHONPATH to use them."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target",
         str(target), *map(str, packages)],
        check=True,
    )  # fmt: skip
    return target


def health_status(
    target: str, service: str = "", timeout: float = 1.0, credentials: grpc.ChannelCredentials | None = None
) -> int | None:
    """The health service's answer, or None when the server does not answer (over TLS with `credentials`)."""
    channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]  # the stub package omits it
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError:
            return None
    return reply.status


def scrape(metrics_port: int, host: str = "127.0.0.1") -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A server's /metrics as {(sample name, sorted labels): value}."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    body = urlopen(f"http://{host}:{metrics_port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    metrics_port: int
    log_path: Path
    #: The HTTP face's port, when started with one (`start_server(http=True)`).
    http_port: int | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        """The HTTP face's base URL."""
        if self.http_port is None:
            raise RuntimeError("this server was started without the HTTP face (start_server(http=True))")
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return scrape(self.metrics_port)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels` (0 when there is none)."""
        return sum(v for (n, tags), v in self.metrics().items() if n == name and labels.items() <= dict(tags).items())

    def batch_calls(self) -> float:
        """The batch calls the server has started: BatchEvaluate's and BatchEvaluateUnary's."""
        methods = ("BatchEvaluate", "BatchEvaluateUnary")
        return sum(self.metric("grpc_server_started_total", grpc_method=method) for method in methods)

    def client(self, **kwargs: object) -> GradingClient:
        return GradingClient(self.target, **kwargs)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def start_server(
    workdir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    wait: float = 180,
    metrics: bool = True,
    credentials: grpc.ChannelCredentials | None = None,
    status: int = health_pb2.HealthCheckResponse.SERVING,
    http: bool = False,
) -> ServerProcess:
    """`grpcgrade serve` on free loopback ports; returns once health says `status` (SERVING by default;
    NOT_SERVING returns as soon as the server answers, e.g. for one whose failing canaries keep it there).
    With `http`, the HTTP face too, on a port of its own (`ServerProcess.http`).

    Two suites running at once never share a server's port: a port taken between `free_port` and the
    server's bind (the gRPC and metrics ports, which the server binds alone) makes the server exit saying
    so, and it is started again on fresh ports; the HTTP face, whose port its processes share
    (SO_REUSEPORT: another server's face could share it too, silently), is given port 0 and the port it got
    is read from its listening sockets.

    A server started with `--tls-cert` only answers TLS: pass the `credentials` to check its health with.

    `wait` only keeps a start that hangs from holding the suite (one that fails exits, and says why at
    once): a server with workers and face processes, each importing every grader, took over 60 s to say
    SERVING on a machine loaded to 10 with the test at nice 10.
    """
    if http:
        args = (*args, "--http-port", "0")
    for _attempt in range(BIND_ATTEMPTS - 1):
        try:
            return _start(workdir, args, env, wait, metrics, credentials, status, http)
        except _PortTaken:
            continue
    return _start(workdir, args, env, wait, metrics, credentials, status, http)


class _PortTaken(RuntimeError):
    """The server could not bind a port it was given: another process took it after `free_port`."""


def _start(
    workdir: Path,
    args: tuple[str, ...],
    env: dict[str, str] | None,
    wait: float,
    metrics: bool,
    credentials: grpc.ChannelCredentials | None,
    status: int,
    http: bool,
) -> ServerProcess:
    port, metrics_port = free_port(), (free_port() if metrics else 0)
    log_path = Path(workdir) / f"server-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "grpcgrade.cli",
        "serve",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        *args,
    ]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=workdir
        )
    server = ServerProcess(proc, port, metrics_port, log_path)
    try:
        return _wait_until_up(server, wait, credentials, status, http)
    except BaseException:  # a step after the spawn failed (or was interrupted): no server is left behind
        if proc.poll() is None:  # not reaped yet, so its PID is still its own
            kill_tree(proc.pid)
        proc.wait()
        raise


def _wait_until_up(
    server: ServerProcess, wait: float, credentials: grpc.ChannelCredentials | None, status: int, http: bool
) -> ServerProcess:
    proc = server.proc
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            kind = _PortTaken if _PORT_TAKEN in server.log() else RuntimeError
            raise kind(f"server exited with {proc.returncode}:\n{server.log()}")
        if health_status(server.target, credentials=credentials) == status:
            if http:
                # its face processes' one HTTP port (they hold the gRPC port too with --grpc-processes)
                (server.http_port,) = listening_ports(children(proc.pid)) - {server.port}
            return server
        time.sleep(0.05)
    raise RuntimeError(
        f"server not {health_pb2.HealthCheckResponse.ServingStatus.Name(status)} after {wait} s:\n{server.log()}"
    )


def kill_tree(pid: int, bound: float = 10.0) -> None:
    """SIGKILL `pid` and every process under it (a server's workers, face processes, their parsing
    processes). Each is stopped (SIGSTOP) before its children are read, top down, so none starts another
    (a supervisor replacing what died) or leaves its children to init unseen, and none's PID can be reused
    before it is killed. The bound only keeps a process that never stops from hanging the caller."""
    stopped: list[int] = []
    todo = [pid]
    while todo:
        one = todo.pop()
        try:
            os.kill(one, signal.SIGSTOP)
        except ProcessLookupError:
            continue
        stopped.append(one)
        give_up = time.monotonic() + bound
        while process_state(one) not in ("T", "Z", "X", None) and time.monotonic() < give_up:
            time.sleep(0.001)  # SIGSTOP is delivered on its way back to user space: a fork may finish first
        todo.extend(children(one))
    for one in reversed(stopped):  # children first: a parent killed first would hand them to init
        with contextlib.suppress(ProcessLookupError):
            os.kill(one, signal.SIGKILL)


def process_state(pid: int) -> str | None:
    """A process's state letter from /proc (R, S, T, Z, ...); None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
