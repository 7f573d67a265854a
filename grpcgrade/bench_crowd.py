"""`grpcgrade bench --per-sample`: a crowd of one-sample callers, against the FastAPI peer users write.

Trainers that grade as rollouts finish send one sample per call, thousands at once. This measures, in one
run on the same samples and the same grader, the calls per second answered by

- the plain FastAPI per-sample server (`bench_peer`: uvicorn, one process, the grader inline), over HTTP;
- grpcgrade's unary `Evaluate` (the scores view), from the async Python client;
- grpcgrade's HTTP face (`POST /get_reward`, one query per request), from the same HTTP client as the peer;

each with `callers` concurrent callers calling back to back, and reports each as a ratio to the peer (the
goals: gRPC >= 3x, HTTP >= 2x) with its p50 and p99 latency. The server coalesces the concurrent one-sample
calls (`core.coalesce`); `--per-sample` also runs it with coalescing off, so its share shows. Each side
runs twice, taking turns, and keeps its better run: on a shared machine load changes within seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .bench import PRESETS, make_samples
from .testing import free_port, start_server

#: The issue's goals: per-sample calls/s as a multiple of the FastAPI peer's.
GOALS = {"grpc_x_fastapi": 3.0, "http_x_fastapi": 2.0}
ROUNDS = 2


async def _crowd(
    call: Callable[[dict[str, Any]], Awaitable[float | None]], samples: list[dict[str, Any]], callers: int
) -> tuple[list[float], float, int]:
    """`callers` tasks taking samples in turn and calling back to back: latencies, seconds, failures."""
    latencies: list[float] = []
    failures = 0
    queue = iter(samples)

    async def caller() -> None:
        nonlocal failures
        for sample in queue:
            t0 = time.perf_counter()
            try:
                value = await call(sample)
            except Exception:  # noqa: BLE001 - counted: a failed call is a figure, not the end of the run
                failures += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if value is None:
                failures += 1

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return latencies, time.perf_counter() - start, failures


async def _http_run(
    url: str, body: Callable[[dict[str, Any]], dict[str, Any]], key: str, samples: list[dict[str, Any]], callers: int
) -> tuple[list[float], float, int]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def call(sample: dict[str, Any]) -> float | None:
            while True:
                async with session.post(url, json=body(sample)) as r:
                    if r.status == 503:  # refused for load: after the hint, as a trainer would
                        await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
                        continue
                    r.raise_for_status()
                    value = (await r.json())[key]
                    return value[0] if isinstance(value, list) else value

        await call(samples[0])  # warm-up: the connection pool, the grader
        return await _crowd(call, samples, callers)


async def _grpc_run(
    target: str, spec: list[dict[str, Any]], samples: list[dict[str, Any]], callers: int
) -> tuple[list[float], float, int]:
    from .client import AsyncGradingClient
    from .v1 import grading_pb2 as pb

    async with AsyncGradingClient(target, timeout=600) as client:

        async def call(sample: dict[str, Any]) -> float | None:
            response = await client.evaluate(sample, spec, view=pb.RESULT_VIEW_SCORES)
            return response.reward if response.HasField("reward") else None

        await call(samples[0])
        return await _crowd(call, samples, callers)


def _figures(name: str, run: tuple[list[float], float, int], calls: int) -> dict[str, float]:
    latencies, seconds, failures = run
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return {
        f"{name}_per_second": round(calls / seconds, 1),
        f"{name}_p50_ms": round(q[49] * 1000, 1),
        f"{name}_p99_ms": round(q[98] * 1000, 1),
        f"{name}_failed": failures,
    }


def _peer(grader: str, params: dict[str, Any], workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    log = open(workdir / "peer.log", "wb")  # noqa: SIM115 - the peer's whole life
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpcgrade.bench_peer", grader, json.dumps(params), str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    import socket

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the FastAPI peer exited: {(workdir / 'peer.log').read_text()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the FastAPI peer did not listen within 60 s")


def run_per_sample(
    grader: str = "json_validator", calls: int = 20_000, callers: int = 4_000, workers: int | None = None
) -> dict[str, Any]:
    """The figures of the module docstring, as a dict (ratios, calls/s, p50 and p99 in ms, load)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "grpcgrade bench --per-sample needs FastAPI and uvicorn for its peer: pip install fastapi uvicorn "
            "(make bench installs them)"
        ) from exc
    preset = PRESETS[grader]
    spec = [{"name": preset.grader, "params": preset.params}]
    samples = make_samples(preset.data, calls)
    cores = os.cpu_count() or 1
    report: dict[str, Any] = {
        "grader": grader,
        "calls": calls,
        "callers": callers,
        "cores": cores,
        "load_average": {"start": [round(x, 2) for x in os.getloadavg()]},
    }
    figures: dict[str, dict[str, float]] = {}

    def keep(name: str, run: tuple[list[float], float, int]) -> None:
        new = _figures(name, run, calls)
        old = figures.get(name)
        if old is None or new[f"{name}_per_second"] > old[f"{name}_per_second"]:
            figures[name] = new

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        config = workdir / "crowd.yaml"
        reward = {"rewards": {"bench": spec}, "default_reward": "bench", "cache": {"enabled": False}}
        config.write_text(json.dumps(reward))
        off = workdir / "crowd-off.yaml"
        off.write_text(json.dumps({**reward, "coalesce_linger_seconds": 0}))
        peer, peer_port = _peer(preset.grader, preset.params, workdir)
        servers = {}
        try:
            for name, path in (("on", config), ("off", off)):
                http_port = free_port()
                args = ["--config", str(path), "--http-port", str(http_port), "--log-level", "error"]
                if workers is not None:
                    args += ["--workers", str(workers)]
                servers[name] = (start_server(workdir, *args, metrics=False), http_port)
            peer_url = f"http://127.0.0.1:{peer_port}/reward"

            def openrlhf(sample: dict[str, Any]) -> dict[str, Any]:
                return {"query": [sample["response"]], "labels": [sample.get("reference", "")]}

            for _ in range(ROUNDS):
                keep("fastapi", asyncio.run(_http_run(peer_url, dict, "reward", samples, callers)))
                server, http_port = servers["on"]
                keep("grpc", asyncio.run(_grpc_run(server.target, spec, samples, callers)))
                url = f"http://127.0.0.1:{http_port}/get_reward"
                keep("http", asyncio.run(_http_run(url, openrlhf, "rewards", samples, callers)))
                server, http_port = servers["off"]
                keep("grpc_uncoalesced", asyncio.run(_grpc_run(server.target, spec, samples, callers)))
        finally:
            for server, _ in servers.values():
                server.stop()
            peer.terminate()
            peer.wait(30)
    for values in figures.values():
        report.update(values)
    peer_rate = report["fastapi_per_second"]
    for name in ("grpc", "http", "grpc_uncoalesced"):
        report[f"{name}_x_fastapi"] = round(report[f"{name}_per_second"] / peer_rate, 2)
    report["goals"] = {k: {"goal": f">= {v:g}", "met": report[k] >= v} for k, v in GOALS.items()}
    report["load_average"]["end"] = [round(x, 2) for x in os.getloadavg()]
    return report
