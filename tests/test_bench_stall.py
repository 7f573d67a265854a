"""`grpcgrade bench --http-stall` runs end to end against a real server with hostile HTTP clients; it reports
figures, it asserts no speed. And the event-loop watch it reads (GRPCGRADE_SLOW_CALLBACK_MS) logs lines
it can parse."""

from __future__ import annotations

import json
import subprocess
import sys

from grpcgrade.bench_stall import shapes, slow_callbacks
from grpcgrade.core.config import HttpConfig
from grpcgrade.core.json_body import MAX_JSON_CONTAINERS, MAX_JSON_DEPTH, check_shape
from grpcgrade.core.samples import Limits
from grpcgrade.service.loop_watch import ENV
from grpcgrade.testing import start_server

#: What each hostile body is answered, from the limits: `item` over max_field_chars is 400 on OpenAI's
#: route, and so is `item` nested to the body's depth limit (100), deeper than a gRPC Sample carries to the
#: engine's process (`http.forward.MAX_VALUE_LEVELS`); every other body is within every limit, so graded
#: (a trainer's face answers 200).
EXPECTED = {"huge_string": "400", "escaped_string": "400", "deep_nesting": "400"}


def test_every_hostile_body_is_at_most_the_limit_and_within_the_json_bounds() -> None:
    http, limits = HttpConfig(), Limits()
    made = shapes(http.max_body_bytes, limits.max_samples_per_batch, limits.max_field_chars,
                  MAX_JSON_CONTAINERS, MAX_JSON_DEPTH)  # fmt: skip
    assert len({s.name for s in made}) == len(made) >= 8
    for shape in made:
        assert len(shape.body) <= http.max_body_bytes, shape.name
        check_shape(json.loads(shape.body))  # raises past the depth or container bound
    batch = json.loads(next(s.body for s in made if s.name == "get_reward_batch"))
    assert len(batch["query"]) == limits.max_samples_per_batch


def test_the_stall_bench_reports_each_phase_and_every_answer(tmp_path) -> None:
    cmd = [sys.executable, "-m", "grpcgrade.cli", "bench", "--http-stall", "--stall-seconds", "0.5", "--workers", "1"]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    names = list(report["bodies_bytes"])
    assert list(report["phases"]) == ["baseline", *names, "all_at_once"]
    for name, figures in report["phases"].items():
        assert figures["calls"] > 0 and figures["errors"] == 0, (name, figures)  # the probe is always answered
        assert figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    answers = report["http_answers"]
    for name in names:
        status = EXPECTED.get(name, "200")
        mine = {k: v for k, v in answers.items() if k.startswith(f"{name} ")}
        assert list(mine) == [f"{name} {status}"], (name, answers)
    assert {k.split()[0] for k in answers if k.startswith("slow_")} == {"slow_idle", "slow_head", "slow_body"}
    added = report["under_attack"]["max_ms"] - report["baseline"]["p50_ms"]
    assert abs(report["worst_added_stall_ms"] - added) < 0.05
    assert report["goal"]["met"] == (report["worst_added_stall_ms"] <= 100)
    assert set(report["loop_callbacks"]) == {"cpu_ge_100ms", "wall_ge_100ms", "wall_ge_10ms", "most_cpu"}


def test_the_loop_watch_logs_every_slow_callback_with_its_cpu(tmp_path) -> None:
    """With a threshold below any callback's length every callback is logged: its line parses, with the
    loop thread's CPU (never more than the wall time it took, plus the clocks' resolution)."""
    server = start_server(tmp_path, "--workers", "0", env={ENV: "0.000001"})
    try:
        with server.client() as client:
            client.evaluate({"response": "1"}, [{"name": "json_validator"}])
        lines = slow_callbacks(server.log())
    finally:
        server.stop()
    assert lines and all(cpu <= wall + 1.0 for _, wall, cpu, _ in lines)
    assert any("Evaluate" in what for *_, what in lines)
