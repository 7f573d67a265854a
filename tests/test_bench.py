"""`grpcgrade bench` runs end to end on a small batch; it reports figures, it asserts no speed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    cmd = [sys.executable, "-m", "grpcgrade.cli", "bench", "--grader", "json_validator", "--samples", "3000"]
    cmd += ["--workers", "1", "--unary-calls", "200", "--concurrency", "4", "--unary-rate", "400", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path_factory.mktemp("bench"))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_figure_is_measured_and_its_ratio_is_to_the_bare_loop(report):
    figures = report["items_per_second"]
    for key in (
        "bare_loop",
        "in_process_grader",
        "batch_evaluate_grpc",
        "batch_evaluate_grpc_scores_view",
        "unary_evaluate_grpc",
        "grpc_floor_minimal_server",
    ):
        assert figures[key] > 0
        assert report["ratio_to_bare_loop"][key] == pytest.approx(figures[key] / figures["bare_loop"], abs=1e-3)
    assert (report["samples"], report["workers"]) == (3000, 1)
    assert report["start_to_serving_s"] > 0  # the workers up and warm


def test_unary_latency_is_reported_both_ways(report):
    assert report["unary_concurrency"] == 4
    assert 0 < report["unary_p50_ms"] <= report["unary_p99_ms"]
    assert report["unary_offered_per_second"] == 400
    assert 0 < report["unary_paced_p50_ms"] <= report["unary_paced_p99_ms"]
    assert report["unary_paced_per_second"] > 0
