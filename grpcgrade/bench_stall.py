"""`grpcgrade bench --http-stall`: how long hostile HTTP clients make gRPC callers wait (issue 33's goal: no
HTTP request stalls gRPC callers by more than 100 ms).

The HTTP face runs in processes of its own and grades through the server's process over gRPC
(`service.http.faces`); what reaches the server's event loop is the face's BatchEvaluate calls, in pieces,
and anything they make the loop do at length shows as gRPC latency, as does a machine whose cores the
faces keep busy. One real server (`--http-port`), and a probe process calling it at a
steady rate, open loop (each call is due at a fixed time and its latency counts from then, so a stalled
loop cannot hide): unary `Evaluate` and a small `BatchEvaluate`. The probe runs alone first (the baseline),
then while hostile HTTP clients send, shape by shape and then all at once, bodies at the limit
(`http.max_body_bytes`) of the shapes that cost most to read, parse, walk, grade and answer: JSON nested
to the allowed depth, the allowed number of small containers, huge and escaped strings, a trainer batch
of 100k samples, OpenAI's `item` at and far over its limit, slime's and NeMo Gym's bodies grown every way
they can grow; beside them, connections that stay idle or trickle their head or body.

The report: the probe's p50/p99/max latency alone and under attack, per phase, and the worst added stall
(the worst latency under attack minus the baseline's median) against the goal. The machine's share of it
is told apart by the server's own instrument (`service.loop_watch`): every event-loop callback of
`WATCH_MS` or more, with the loop thread's CPU time in it; a callback long in CPU is work the server did
on its loop (the goal: none of 100 ms), one long only in wall time waited for a core or the GIL. The
load average is part of the report: on a shared machine the latency figures are as good as its quiet.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The goal: the worst latency a gRPC caller sees under attack, over its median alone.
GOAL_ADDED_MS = 100.0
#: Loop callbacks this long or longer are recorded by the server (and those of GOAL_ADDED_MS counted apart).
WATCH_MS = 10.0
#: The probe's offered rates: unary Evaluate calls/s, and BatchEvaluate calls/s of BATCH_SAMPLES samples.
UNARY_RATE, BATCH_RATE, BATCH_SAMPLES = 200.0, 20.0, 8
#: Connections held open all through the attack of each slow kind (idle, trickling head, trickling body).
SLOW_CONNECTIONS = 100
REWARD = "exact"
CONFIG = f"""
default_reward: {REWARD}
cache: {{enabled: false}}
rewards:
  {REWARD}:
    graders: [{{name: string_match}}]
"""
RUN_PATH = "/v1/fine_tuning/alpha/graders/run"
STRING_CHECK = {"type": "string_check", "name": "s", "input": "{{item.x}}", "reference": "a", "operation": "eq"}
SLOW_LINE = re.compile(r"^(\S+ \S+) .*slow event-loop callback: ([\d.]+) ms wall, ([\d.]+) ms cpu: (.*)$", re.M)


@dataclass(frozen=True)
class Shape:
    """One hostile request: its path and body (sent as they are, back to back, by each of its clients)."""

    name: str
    path: str
    body: bytes


def _fill(limit: int, used: int, unit: str) -> str:
    """A string of `unit` repeated to take the body up to `limit` bytes, given `used` bytes around it."""
    return unit * max(0, (limit - used - 64) // len(unit.encode()))


def shapes(limit: int, max_samples: int, max_field_chars: int, containers: int, depth: int) -> list[Shape]:
    """The hostile bodies, each at most `limit` bytes (the face's body limit), built once."""
    rng = random.Random(33)
    word = "".join(rng.choice("abcdefghij") for _ in range(30))
    out: list[Shape] = []

    def add(name: str, path: str, body: Any) -> None:
        raw = (
            json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
            if not isinstance(body, bytes)
            else body
        )
        assert len(raw) <= limit, (name, len(raw), limit)
        out.append(Shape(name, path, raw))

    # nesting to the allowed depth (the body is level 1, `item` 2): as many deepest stacks as containers allow
    stack_depth = depth - 3  # the body, `item` and `n` above each stack
    stack = "[" * stack_depth + "]" * stack_depth
    stacks = ",".join([stack] * ((containers - 10) // stack_depth))
    deep = f'{{"grader":{json.dumps(STRING_CHECK)},"model_sample":"a","item":{{"x":"a","n":[{stacks}]}}}}'
    add("deep_nesting", RUN_PATH, deep.encode())
    # the allowed number of small containers, padded to the limit with a string
    small = ",".join(["[0]"] * (containers - 10))
    padding = _fill(limit, len(small), "p")
    add("many_containers", "/get_reward", f'{{"query":["a"],"labels":["a"],"pad":[{small}],"z":"{padding}"}}'.encode())
    # one string as long as the body may be, plain and all escapes (the slowest for a decoder)
    add("huge_string", RUN_PATH, {"grader": STRING_CHECK, "model_sample": "a", "item": {"x": _fill(limit, 200, "y")}})
    escaped = "\\u00e9" * ((limit - 200) // 6)
    add("escaped_string", RUN_PATH, f'{{"model_sample":"a","item":{{"x":"{escaped}"}}}}'.encode())
    # OpenAI's item at its limit (graded), and a trainer batch of the most samples the body holds
    item = {"x": "a", "notes": [word] * (max_field_chars // (len(word) + 3) - 10)}
    add("run_item_at_limit", RUN_PATH, {"grader": STRING_CHECK, "model_sample": "a", "item": item})
    per = min(max_samples, (limit - 64) // 2 // (len(word) + 4))
    text = word * (((limit - 64) // 2 // per - 4) // len(word) + 1)
    text = text[: (limit - 64) // 2 // per - 4]
    add("get_reward_batch", "/get_reward", {"query": [text] * per, "labels": [text] * per})
    # slime: a chat prompt of many messages and a response at the field limit
    messages = [{"role": "user", "content": word}] * min(containers - 10, (limit // 2) // (len(word) + 32))
    add("slime_chat_prompt", "/slime", {"prompt": messages, "response": "r" * (max_field_chars - 10), "label": "a"})
    # NeMo Gym: many output items, and task fields (echoed back in the answer) up to the limit
    items = [{"type": "message", "content": [{"type": "output_text", "text": word}]}] * ((containers - 10) // 3)
    used = len(json.dumps(items))
    gym = {"responses_create_params": {"input": "q"}, "response": {"output": items}, "expected_answer": word,
           "task": _fill(limit, used + 200, "t")}  # fmt: skip
    add("nemo_gym_verify", "/verify", gym)
    return out


# ---- the probe (a process of its own: the attackers' work must not delay its timing) ----


def probe(target: str, stop: Any, out: Any, ready: Any) -> None:
    """Call the server at the steady rates until `stop` is set; send [(kind, due, latency or -1)] to `out`."""
    asyncio.run(_probe(target, stop, out, ready))


async def _probe(target: str, stop: Any, out: Any, ready: Any) -> None:
    from .client import AsyncGradingClient

    spec = [{"name": "json_validator"}]
    batch = [{"response": str(i)} for i in range(BATCH_SAMPLES)]
    rows: list[tuple[str, float, float]] = []
    tasks: set[asyncio.Task[None]] = set()

    async def call(kind: str, due: float, run: Callable[[], Any]) -> None:
        try:
            await run()
            rows.append((kind, due, time.monotonic() - due))
        except Exception:  # noqa: BLE001 - a failed call is a figure (errors), not the end of the probe
            rows.append((kind, due, -1.0))

    async with AsyncGradingClient(target, timeout=60) as client:
        for _ in range(50):  # the channel up, the workers warm
            await client.evaluate({"response": "1"}, spec)
            await client.batch_evaluate(batch, spec)
        ready.set()
        start = time.monotonic()
        n_unary = n_batch = 0
        while not stop.is_set():
            now = time.monotonic()
            while start + n_unary / UNARY_RATE <= now:
                due = start + n_unary / UNARY_RATE
                task = asyncio.create_task(call("unary", due, lambda: client.evaluate({"response": "1"}, spec)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n_unary += 1
            while start + n_batch / BATCH_RATE <= now:
                due = start + n_batch / BATCH_RATE
                task = asyncio.create_task(call("batch", due, lambda: client.batch_evaluate(batch, spec)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n_batch += 1
            await asyncio.sleep(min(start + n_unary / UNARY_RATE, start + n_batch / BATCH_RATE) - time.monotonic())
        if tasks:
            await asyncio.wait(tasks, timeout=60)
    out.send(rows)


# ---- the attackers ----


async def _send(port: int, shape: Shape) -> str:
    """One request of `shape` on a connection of its own; the answer's status ("closed" without one)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return "refused"
    try:
        head = (f"POST {shape.path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                f"Connection: close\r\nContent-Length: {len(shape.body)}\r\n\r\n")  # fmt: skip
        writer.write(head.encode() + shape.body)
        await writer.drain()
        status = await reader.readline()
        while await reader.read(1 << 20):
            pass
        parts = status.split()
        return parts[1].decode() if len(parts) > 1 else "closed"
    except OSError:
        return "closed"
    finally:
        writer.close()


async def _hammer(port: int, shape: Shape, until: float, statuses: Counter[str]) -> None:
    while time.monotonic() < until:
        statuses[f"{shape.name} {await _send(port, shape)}"] += 1


async def _slow(port: int, kind: str, until: float, statuses: Counter[str]) -> None:
    """A connection that stays idle, or trickles its head or its body a few bytes a second, reopened
    whenever the server closes it (its timeouts)."""
    head = b"POST /get_reward HTTP/1.1\r\nHost: bench\r\n"
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            statuses[f"slow_{kind} refused"] += 1
            await asyncio.sleep(0.5)
            continue
        try:
            if kind == "body":
                writer.write(head + b"Content-Type: application/json\r\nContent-Length: 8000000\r\n\r\n[")
            elif kind == "head":
                writer.write(head + b"X-Trickle: ")
            while time.monotonic() < until and not reader.at_eof():
                if kind != "idle":
                    writer.write(b" " if kind == "body" else b"X")
                    await writer.drain()
                try:
                    await asyncio.wait_for(reader.read(1024), 1.0)
                except TimeoutError:
                    continue
            statuses[f"slow_{kind} {'closed by the server' if reader.at_eof() else 'open at the end'}"] += 1
        except OSError:
            statuses[f"slow_{kind} closed by the server"] += 1
        finally:
            writer.close()


async def _attack(
    port: int, chosen: list[Shape], seconds: float, clients: int, statuses: Counter[str], slow_connections: int
) -> None:
    until = time.monotonic() + seconds
    slow = [_slow(port, kind, until, statuses) for kind in ("idle", "head", "body") for _ in range(slow_connections)]
    hammers = [_hammer(port, shape, until, statuses) for shape in chosen for _ in range(clients)]
    await asyncio.gather(*slow, *hammers)


# ---- the figures ----


def _latency(rows: list[tuple[str, float, float]]) -> dict[str, float]:
    done = sorted(latency for _, _, latency in rows if latency >= 0)
    if len(done) < 2:
        return {"calls": len(rows), "errors": len(rows) - len(done)}
    q = statistics.quantiles(done, n=100)
    return {
        "calls": len(rows),
        "errors": len(rows) - len(done),
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "max_ms": round(done[-1] * 1000, 2),
    }


def slow_callbacks(log: str) -> list[tuple[float, float, float, str]]:
    """(when it ended, wall ms, cpu ms, callback) of every slow-callback line of the server's log (its text
    format: the line starts with the local time)."""
    out = []
    for m in SLOW_LINE.finditer(log):
        stamp, _, millis = m[1].partition(",")
        when = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis or 0) / 1000
        out.append((when, float(m[2]), float(m[3]), m[4][:200]))
    return out


#: Before the baseline, the server is left until it spends at most this share of a core (its start-up's
#: warm-ups, jieba's dictionary and the patterns, run for seconds after it answers health checks), at most
#: SETTLE_SECONDS.
SETTLED_SHARE, SETTLE_SECONDS = 0.1, 60.0


def _settle(cpu: Callable[[], float]) -> float:
    """Wait until `cpu()` (a process's CPU seconds) grows by at most SETTLED_SHARE a second; the wait."""
    start = time.monotonic()
    before = cpu()
    while time.monotonic() - start < SETTLE_SECONDS:
        time.sleep(1.0)
        now = cpu()
        if now - before <= SETTLED_SHARE:
            break
        before = now
    return time.monotonic() - start


def run_http_stall(
    seconds: float = 6.0, baseline_seconds: float | None = None, clients: int = 2, workers: int | None = None,
    only: list[str] | None = None, slow_connections: int = SLOW_CONNECTIONS, each_shape: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """The whole measurement (module docstring): phases of `seconds` (the baseline `baseline_seconds`, by
    default twice as long), `clients` concurrent senders of each hostile shape; `only` keeps the shapes of
    those names; `each_shape=False` runs them all at once only (the `--goals` line)."""
    baseline_seconds = 2 * seconds if baseline_seconds is None else baseline_seconds
    from .core.config import HttpConfig
    from .core.samples import Limits
    from .service.http.limits import MAX_JSON_CONTAINERS, MAX_JSON_DEPTH
    from .service.loop_watch import ENV as WATCH_ENV
    from .testing import cpu_seconds, start_server

    http, limits = HttpConfig(), Limits()
    chosen = shapes(
        http.max_body_bytes, limits.max_samples_per_batch, limits.max_field_chars, MAX_JSON_CONTAINERS, MAX_JSON_DEPTH
    )
    if only:
        chosen = [s for s in chosen if s.name in only]
    workers = workers or os.cpu_count() or 1
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(),
        "workers": workers,
        "load_average": {"start": [round(x, 2) for x in os.getloadavg()]},
        "probe": f"unary Evaluate {UNARY_RATE:g}/s and BatchEvaluate of {BATCH_SAMPLES} {BATCH_RATE:g}/s, open loop",
        "bodies_bytes": {s.name: len(s.body) for s in chosen},
    }
    phases: list[tuple[str, float, float]] = []
    statuses: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.yaml").write_text(CONFIG)
        server = start_server(
            Path(tmp), "--workers", str(workers), "--config", "config.yaml",
            "--log-level", "warning", env={WATCH_ENV: str(WATCH_MS)}, metrics=False, http=True,
        )  # fmt: skip
        port = server.http_port
        assert port is not None
        settled = _settle(lambda: cpu_seconds(server.proc.pid))
        report["server_settled_seconds"] = round(settled, 1)
        ctx = multiprocessing.get_context("spawn")
        receive, send = ctx.Pipe(duplex=False)
        stop, ready = ctx.Event(), ctx.Event()
        prober = ctx.Process(target=probe, args=(server.target, stop, send, ready), daemon=True)
        try:
            prober.start()
            if not ready.wait(120):
                raise RuntimeError("the probe did not start")
            logged = len(server.log())
            start, clock = time.monotonic(), time.time()
            time.sleep(baseline_seconds)
            phases.append(("baseline", start, time.monotonic()))
            clocks = [(clock, time.time())]
            runs = [(s.name, [s]) for s in chosen] if each_shape else []
            runs += [("all_at_once", chosen)] if len(chosen) > 1 or not runs else []
            for name, part in runs:
                start, clock = time.monotonic(), time.time()
                asyncio.run(_attack(port, part, seconds, clients, statuses, slow_connections))
                phases.append((name, start, time.monotonic()))
                clocks.append((clock, time.time()))
                time.sleep(1.0)  # the last answers out, the server's queues empty: phases apart
            stop.set()
            rows = receive.recv() if receive.poll(120) else []
            prober.join(30)
            callbacks = slow_callbacks(server.log()[logged:])
        finally:
            if prober.is_alive():
                prober.kill()
            server.stop()
    report["load_average"]["end"] = [round(x, 2) for x in os.getloadavg()]
    in_phase = {name: [r for r in rows if a <= r[1] < b] for name, a, b in phases}
    report["phases"] = {name: _latency(part) for name, part in in_phase.items()}
    for (name, *_), (a, b) in zip(phases, clocks, strict=True):  # the loop's own share of each phase's figures
        mine = [(wall, cpu) for when, wall, cpu, _ in callbacks if a <= when < b + 1.0]
        report["phases"][name]["loop_max_cpu_ms"] = max((cpu for _, cpu in mine), default=0.0)
        report["phases"][name]["loop_max_wall_ms"] = max((wall for wall, _ in mine), default=0.0)
    attacked = [r for name, part in in_phase.items() if name != "baseline" for r in part]
    base, attack = _latency(in_phase["baseline"]), _latency(attacked)
    report["baseline"], report["under_attack"] = base, attack
    added = attack.get("max_ms", float("inf")) - base.get("p50_ms", 0.0)
    report["worst_added_stall_ms"] = round(added, 2)
    report["goal"] = {"worst_added_stall_ms": f"<= {GOAL_ADDED_MS:g}", "met": added <= GOAL_ADDED_MS}
    report["loop_callbacks"] = {
        f"cpu_ge_{GOAL_ADDED_MS:g}ms": sum(cpu >= GOAL_ADDED_MS for _, _, cpu, _ in callbacks),
        f"wall_ge_{GOAL_ADDED_MS:g}ms": sum(wall >= GOAL_ADDED_MS for _, wall, _, _ in callbacks),
        f"wall_ge_{WATCH_MS:g}ms": len(callbacks),
        "most_cpu": [
            f"{c:.0f} ms cpu, {w:.0f} ms wall: {d}" for _, w, c, d in sorted(callbacks, key=lambda r: -r[2])[:6]
        ],
    }
    report["http_answers"] = dict(sorted(statuses.items()))
    return report


def text(report: dict[str, Any]) -> str:
    """The report for a terminal."""
    load = " -> ".join(" ".join(f"{x:.2f}" for x in v) for v in report["load_average"].values())
    lines = [f"{report['cores']} cores, {report['workers']} workers; load average (1, 5, 15 min) {load}",
             f"probe: {report['probe']}"]  # fmt: skip
    for name, fig in report["phases"].items():
        keys = ("p50_ms", "p99_ms", "max_ms", "loop_max_cpu_ms")
        cols = "  ".join(f"{k} {fig[k]:>8}" for k in keys if k in fig)
        lines.append(f"  {name:<20} {cols}  calls {fig['calls']} errors {fig['errors']}")
    goal = report["goal"]
    verdict = "met" if goal["met"] else "NOT met"
    lines.append(
        f"worst added stall {report['worst_added_stall_ms']} ms, goal {goal['worst_added_stall_ms']}: {verdict}"
    )
    for key, value in report["loop_callbacks"].items():
        if key == "most_cpu":
            lines.extend(f"    {row}" for row in value)
        else:
            lines.append(f"  loop callbacks {key}: {value}")
    lines.append("HTTP answers: " + ", ".join(f"{k}: {v}" for k, v in report["http_answers"].items()))
    return "\n".join(lines)
