"""`grpcgrade bench --per-sample`: a crowd of one-sample callers, against the FastAPI peer users write.

Trainers that grade as rollouts finish send one sample per call, thousands at once. This measures, in one
run on the same sample and the same grader, the calls per second answered by

- the plain FastAPI per-sample server (`bench_peer`: uvicorn, one process, the grader inline), over HTTP;
- grpcgrade's unary `Evaluate` (the scores view), with its server coalescing concurrent calls, and again
  with coalescing off; and with a gRPC face process per core (`grpc_cores`, `--grpc-processes`): the faces
  own the port and coalesce the crowd into BatchEvaluate calls to the engine's process; and with the native
  gRPC face (`grpc_native`, `--grpc-face native`: grpc-go, one process on every core) doing the same, when
  it is built (`make native-face`; otherwise the report says `grpc_native: not built`);
- grpcgrade's HTTP face (`POST /get_reward`, OpenRLHF's body with one query), in its one face process by
  default (`http`) and with a face process per core (`http_cores`, `--http-processes`): the faces
  coalesce the crowd into BatchEvaluate calls to the engine's process;
- the floor of each protocol (`bench_peer`'s bare `grpc.aio` and aiohttp servers in one process): what
  gRPC and aiohttp themselves allow a Python process here, which bounds what grpcgrade's faces can reach;
  and the floor of the gRPC face processes (`floor_grpc_cores`): a bare grpc.aio process per core sharing
  one port (SO_REUSEPORT), doing no more than the one-process floor; and the native face's
  (`floor_grpc_native`: the Go face's `--floor`, grpc-go answering every call at once, on every core);

each with `callers` concurrent callers calling back to back, and reports each as a ratio to the peer (the
goals: gRPC >= 3x, HTTP >= 2x, each met by the best of its default, its process-per-core and (gRPC) its
native server: `goals[...]["by"]`) with its p50 and p99 latency.

**The load generator is `h2load`** (nghttp2's, in C; Debian's `nghttp2-client`, which `make system-deps`
installs), the same for every server: HTTP/1.1 with one connection per caller for the HTTP servers, and
HTTP/2 with gRPC's headers and a framed `EvaluateRequest` for gRPC (`GRPC_STREAMS_PER_CONNECTION` calls in
flight on each connection, as a trainer's worker processes each with a channel). A Python client driving
4,000 callers spends about as much CPU per call as the server it drives, so on 2 cores it capped every
server alike and the ratios read ~1; h2load spends 30-55 us a call (reported as `*_h2load_cpu_us`),
the same for every server, beside the peer's ~200. h2load checks HTTP
statuses, not gRPC's trailers: the gRPC calls are counted as answered from the server's own
`grpc_server_handled_total{grpc_code="OK"}`.

**Server CPU per call** is reported beside calls/s (`*_server_cpu_us`: user + system CPU of the server
process and its child processes (workers, HTTP face processes), from /proc, over the run, per call): the
server's capacity whatever the machine's load, and the figure that says where the time goes. Each side
runs twice, taking turns, and keeps its better run: on a shared machine load changes within seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bench import PRESETS, make_samples
from .core.errors import ConfigError
from .testing import ServerProcess, children, cpu_seconds, free_port, start_server

#: The issue's goals: per-sample calls/s as a multiple of the FastAPI peer's.
GOALS = {"grpc_x_fastapi": 3.0, "http_x_fastapi": 2.0}
ROUNDS = 2
#: gRPC calls in flight on one HTTP/2 connection (the crowd is spread over callers / this connections).
GRPC_STREAMS_PER_CONNECTION = 100
#: The longest one h2load run may take (a crowd on a loaded machine is slow, not stuck).
RUN_TIMEOUT_SECONDS = 600
EVALUATE_PATH = "/grpcgrade.v1.GradingService/Evaluate"


@dataclass
class Crowd:
    """One server to drive: where, with what body, whose CPU counts, and (gRPC) how many calls it answered OK."""

    name: str
    url: str
    body: Path
    pid: int
    grpc: bool = False
    answered: Callable[[], float] | None = None
    #: Other processes whose CPU counts (a second floor process beside `pid`).
    also: tuple[int, ...] = ()


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its child processes (a server's workers) so far."""
    total = cpu_seconds(pid)
    for child in children(pid):
        try:
            total += cpu_seconds(child)
        except OSError:  # ended meanwhile
            continue
    return total


def peer_runtime() -> dict[str, str]:
    """The event loop and HTTP parser uvicorn gives the FastAPI peer in this environment (its `auto`
    choices: uvloop and httptools when installed, else asyncio's loop and h11)."""
    found = {name: importlib.util.find_spec(name) is not None for name in ("uvloop", "httptools")}
    return {
        "loop": "uvloop" if found["uvloop"] else "asyncio",
        "http": "httptools" if found["httptools"] else "h11",
    }


def grpc_frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message: not compressed, its length as 4 big-endian bytes, the message."""
    return b"\0" + struct.pack(">I", len(message)) + message


def h2load_command(crowd: Crowd, calls: int, callers: int, log: Path) -> list[str]:
    """h2load's arguments for `calls` calls from `callers` concurrent callers, each call's time to `log`."""
    h2load = shutil.which("h2load")
    if h2load is None:
        raise RuntimeError(
            "grpcgrade bench --per-sample drives the servers with h2load (Debian's nghttp2-client; "
            "make system-deps installs it)"
        )
    cmd = [h2load, "-n", str(calls), "-t", "1", "-d", str(crowd.body), f"--log-file={log}"]
    if crowd.grpc:
        connections = max(1, -(-callers // GRPC_STREAMS_PER_CONNECTION))
        cmd += ["-c", str(connections), "-m", str(-(-callers // connections))]
        cmd += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
    else:
        cmd += ["--h1", "-c", str(callers), "-H", "content-type: application/json"]
    return [*cmd, crowd.url]


def drive(crowd: Crowd, calls: int, callers: int, workdir: Path) -> dict[str, float]:
    """One h2load run against `crowd`: calls/s, p50/p99 latency, failed calls, CPU per call (server, h2load)."""
    log = workdir / f"{crowd.name}.h2load"
    log.unlink(missing_ok=True)
    answered = crowd.answered() if crowd.answered is not None else 0.0
    pids = (crowd.pid, *crowd.also)
    cpu = sum(tree_cpu_seconds(pid) for pid in pids)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        h2load_command(crowd, calls, callers, log), capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(tree_cpu_seconds(pid) for pid in pids) - cpu
    if done.returncode != 0:
        raise RuntimeError(f"h2load failed against {crowd.name}: {done.stderr or done.stdout}")
    starts, ends, latencies, failed = [], [], [], 0
    for line in log.read_text().splitlines():
        start, status, micros = (int(x) for x in line.split("\t"))
        starts.append(start)
        ends.append(start + micros)
        latencies.append(micros / 1000)
        failed += not 200 <= status < 300
    failed += calls - len(latencies)  # never answered at all
    if crowd.answered is not None:  # gRPC: HTTP 200 with an error in the trailers is a failure too
        failed = max(failed, calls - _settled(crowd.answered, answered + calls) + int(answered))
    seconds = (max(ends) - min(starts)) / 1e6 if starts else float("inf")
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    generator = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    name = crowd.name
    return {
        f"{name}_per_second": round(calls / seconds, 1),
        f"{name}_p50_ms": round(q[49], 1),
        f"{name}_p99_ms": round(q[98], 1),
        f"{name}_failed": failed,
        f"{name}_server_cpu_us": round(cpu / calls * 1e6, 1),
        f"{name}_h2load_cpu_us": round(generator / calls * 1e6, 1),
    }


def _settled(count: Callable[[], float], expected: float, bound: float = 2.0) -> int:
    """`count()` once it reaches `expected`, or after `bound` seconds: face processes send their counts to
    the server's /metrics every `counters.BATCH_SECONDS`, so the last calls' counts arrive a moment late."""
    end = time.monotonic() + bound
    now = count()
    while now < expected and time.monotonic() < end:
        time.sleep(0.05)
        now = count()
    return int(now)


def _listening(proc: subprocess.Popen[bytes], ports: list[int], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"a comparison server exited: {log.read_text()}")
        up = 0
        for port in ports:
            with socket.socket() as s:
                up += s.connect_ex(("127.0.0.1", port)) == 0
        if up == len(ports):
            return
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"a comparison server did not listen within 60 s: {log.read_text()}")


def _spawn(workdir: Path, kind: str, *args: str, ports: list[int], name: str = "") -> subprocess.Popen[bytes]:
    """`bench_peer`'s `kind` of server, once it listens on every one of `ports` (its log: `name` or `kind`)."""
    log = workdir / f"{name or kind}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "grpcgrade.bench_peer", kind, *args], stdout=out, stderr=out)
    _listening(proc, ports, log)
    return proc


def _answered(server: ServerProcess) -> Callable[[], float]:
    return lambda: server.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="OK")


def _count(url: str) -> float:
    from urllib.request import urlopen

    with urlopen(url, timeout=30) as answer:
        return float(answer.read())


def _bodies(workdir: Path, spec: list[dict[str, Any]], sample: dict[str, Any]) -> dict[str, Path]:
    """The one sample as each server takes it: a framed EvaluateRequest, the peer's JSON, OpenRLHF's body."""
    from .service.convert import sample_to_pb, specs_to_pb
    from .v1 import grading_pb2 as pb

    request = pb.EvaluateRequest(graders=specs_to_pb(spec), sample=sample_to_pb(sample), view=pb.RESULT_VIEW_SCORES)
    openrlhf = {"query": [sample["response"]], "labels": [sample.get("reference", "")]}
    bodies = {"grpc": workdir / "evaluate.bin", "peer": workdir / "peer.json", "http": workdir / "openrlhf.json"}
    bodies["grpc"].write_bytes(grpc_frame(request.SerializeToString()))
    bodies["peer"].write_text(json.dumps(sample))
    bodies["http"].write_text(json.dumps(openrlhf))
    return bodies


def _start(stack: ExitStack, workdir: Path, grader: str, sample: dict[str, Any], workers: int | None) -> list[Crowd]:
    """Every server of the module docstring started (and stopped by `stack`), the peer first."""
    preset = PRESETS[grader]
    spec = [{"name": preset.grader, "params": preset.params}]
    bodies = _bodies(workdir, spec, sample)
    port = free_port()
    peer = _spawn(workdir, "fastapi", preset.grader, json.dumps(preset.params), str(port), ports=[port])
    stack.callback(_end, peer)
    crowds = [Crowd("fastapi", f"http://127.0.0.1:{port}/reward", bodies["peer"], peer.pid)]
    reward = {"rewards": {"bench": spec}, "default_reward": "bench", "cache": {"enabled": False}}
    for name, config in (("grpc", reward), ("grpc_uncoalesced", {**reward, "coalesce_linger_seconds": 0})):
        path = workdir / f"{name}.yaml"
        path.write_text(json.dumps(config))
        args = ["--config", str(path), "--log-level", "error"]
        server = start_server(workdir, *args, *(["--workers", str(workers)] if workers is not None else []), http=True)
        stack.callback(server.stop)
        url = f"http://{server.target}{EVALUATE_PATH}"
        crowds.append(Crowd(name, url, bodies["grpc"], server.proc.pid, grpc=True, answered=_answered(server)))
        if name == "grpc":  # the HTTP face of the server as it is configured by default (one face process)
            crowds.append(Crowd("http", f"{server.http}/get_reward", bodies["http"], server.proc.pid))
    cores = os.cpu_count() or 1
    more = ["--workers", str(workers)] if workers is not None else []
    if cores > 1:  # and with a face process per core, sharing the cores with the engine
        args = ["--config", str(workdir / "grpc.yaml"), "--log-level", "error", "--http-processes", str(cores)]
        server = start_server(workdir, *args, *more, http=True)  # `--http-processes`
        stack.callback(server.stop)
        crowds.append(Crowd("http_cores", f"{server.http}/get_reward", bodies["http"], server.proc.pid))
        args = ["--config", str(workdir / "grpc.yaml"), "--log-level", "error", "--grpc-processes", str(cores)]
        server = start_server(workdir, *args, *more)  # `--grpc-processes`
        stack.callback(server.stop)
        url = f"http://{server.target}{EVALUATE_PATH}"
        answered = _answered(server)
        crowds.append(Crowd("grpc_cores", url, bodies["grpc"], server.proc.pid, grpc=True, answered=answered))
    crowds += _native(stack, workdir, bodies["grpc"], more)
    grpc_port, http_port = free_port(), free_port()
    floor = _spawn(workdir, "floor", grader, "{}", str(grpc_port), str(http_port), ports=[grpc_port, http_port])
    stack.callback(_end, floor)
    url, counted = f"http://127.0.0.1:{grpc_port}{EVALUATE_PATH}", f"http://127.0.0.1:{http_port}/answered"
    crowds.append(Crowd("floor_grpc", url, bodies["grpc"], floor.pid, grpc=True, answered=lambda: _count(counted)))
    crowds.append(Crowd("floor_http", f"http://127.0.0.1:{http_port}/get_reward", bodies["http"], floor.pid))
    if cores > 1:  # a bare grpc.aio process per core on one port (grpc.aio binds with SO_REUSEPORT)
        floors, counters, shared = [], [], free_port()
        for k in range(cores):
            port = free_port()
            one = _spawn(
                workdir, "floor", grader, "{}", str(shared), str(port), ports=[shared, port], name=f"floor-{k}"
            )
            stack.callback(_end, one)
            floors.append(one)
            counters.append(f"http://127.0.0.1:{port}/answered")
        url = f"http://127.0.0.1:{shared}{EVALUATE_PATH}"
        crowds.append(
            Crowd("floor_grpc_cores", url, bodies["grpc"], floors[0].pid, grpc=True,
                  answered=lambda: sum(_count(c) for c in counters), also=tuple(f.pid for f in floors[1:]))
        )  # fmt: skip
    return crowds


def _native(stack: ExitStack, workdir: Path, body: Path, more: list[str]) -> list[Crowd]:
    """The native gRPC face's server and its floor (the Go face's `--floor` on every core), when built."""
    from .service.native_face import binary

    try:
        program = binary()
    except ConfigError:
        return []
    args = ["--config", str(workdir / "grpc.yaml"), "--log-level", "error", "--grpc-face", "native"]
    server = start_server(workdir, *args, *more)
    stack.callback(server.stop)
    url = f"http://{server.target}{EVALUATE_PATH}"
    crowds = [Crowd("grpc_native", url, body, server.proc.pid, grpc=True, answered=_answered(server))]
    listener = stack.enter_context(socket.create_server(("127.0.0.1", 0), backlog=4096))
    with open(workdir / "floor-native.log", "wb") as out:
        floor = subprocess.Popen(
            [program, "--floor", f"--listen-fd={listener.fileno()}"], stdin=subprocess.PIPE, stdout=out, stderr=out,
            pass_fds=(listener.fileno(),), env={**os.environ, "GOMAXPROCS": str(os.cpu_count() or 1)},
        )  # fmt: skip
    stack.callback(_end, floor)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}{EVALUATE_PATH}"
    # Every call is answered OK (a status in the trailers h2load does not read cannot be anything else).
    crowds.append(Crowd("floor_grpc_native", url, body, floor.pid, grpc=True))
    return crowds


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(30)


def run_per_sample(
    grader: str = "json_validator", calls: int = 20_000, callers: int = 4_000, workers: int | None = None
) -> dict[str, Any]:
    """The figures of the module docstring, as a dict (ratios, calls/s, p50 and p99 in ms, CPU per call, load)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "grpcgrade bench --per-sample needs FastAPI and uvicorn for its peer: "
            "pip install fastapi 'uvicorn[standard]' (make bench installs them)"
        ) from exc
    report: dict[str, Any] = {
        "grader": grader,
        "calls": calls,
        "callers": callers,
        "cores": os.cpu_count() or 1,
        "load_generator": "h2load",
        "peer": peer_runtime(),
        "load_average": {"start": [round(x, 2) for x in os.getloadavg()]},
    }
    figures: dict[str, dict[str, float]] = {}
    sample = make_samples(PRESETS[grader].data, 1)[0]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        crowds = _start(stack, workdir, grader, sample, workers)
        for crowd in crowds:  # warm-up: connections, the graders, the first chunk of each server
            drive(crowd, min(calls, 2 * callers), callers, workdir)
        for _ in range(ROUNDS):
            for crowd in crowds:
                new = drive(crowd, calls, callers, workdir)
                old = figures.get(crowd.name)
                if old is None or new[f"{crowd.name}_per_second"] > old[f"{crowd.name}_per_second"]:
                    figures[crowd.name] = new
    for values in figures.values():
        report.update(values)
    peer_rate, peer_cpu = report["fastapi_per_second"], report["fastapi_server_cpu_us"]
    for crowd in crowds[1:]:
        name = crowd.name
        report[f"{name}_x_fastapi"] = round(report[f"{name}_per_second"] / peer_rate, 2)
        # calls a CPU-second answers, as a multiple of the peer's: capacity whatever else ran meanwhile
        report[f"{name}_calls_per_cpu_x_fastapi"] = round(peer_cpu / max(report[f"{name}_server_cpu_us"], 1e-9), 2)
    report["goals"] = {}
    if not any(crowd.name == "grpc_native" for crowd in crowds):
        report["grpc_native"] = "not built (make native-face)"
    for key, goal in GOALS.items():  # met by the protocol's best server: its default, a face process per core, native
        protocol = key.split("_")[0]
        by = max((n for n in (protocol, f"{protocol}_cores", f"{protocol}_native") if f"{n}_x_fastapi" in report),
                 key=lambda n: report[f"{n}_x_fastapi"])  # fmt: skip
        value = report[f"{by}_x_fastapi"]
        report["goals"][key] = {"goal": f">= {goal:g}", "met": value >= goal, "by": by, "value": value}
    report["load_average"]["end"] = [round(x, 2) for x in os.getloadavg()]
    return report
