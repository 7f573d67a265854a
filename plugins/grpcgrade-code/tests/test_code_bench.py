"""`grpcgrade bench --sandbox` measures the sandbox against a bare run of the same program, in one run.

It reports figures; it asserts no speed (the machine's load is not the test's business).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def test_the_sandbox_figures_are_measured_side_by_side(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "grpcgrade.cli", "bench", "--sandbox", "12", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["sandbox_runs"] == 12 and report["sandbox_concurrency"] >= 1
    for key in ("sandboxed_runs_per_second", "bare_runs_per_second", "sandboxed_ms", "bare_ms"):
        assert report[key] > 0
    overhead = report["sandboxed_ms"] - report["bare_ms"]
    assert report["sandbox_startup_overhead_ms"] == pytest.approx(overhead, abs=0.02)
    assert report["sandbox_program"].startswith("/usr/")  # the interpreter both sides ran
