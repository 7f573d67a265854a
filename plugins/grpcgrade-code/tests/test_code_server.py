"""`code_tests` as a trainer meets it: a real server with 2 worker processes, over gRPC, hostile samples in
the same batch as honest ones, and a fake secret in the server's environment."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from grpcgrade.testing import ServerProcess, health_status, start_server

SECRET_NAME, SECRET = "GRPCGRADE_TEST_SECRET", "the-server-secret-5b1f"
FAST = {"time_limit_seconds": 1, "memory_limit_mb": 256, "preamble": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {SECRET_NAME: SECRET, "GRPCGRADE_CODE_MAX_CONCURRENCY": "2"}
    srv = start_server(tmp_path_factory.mktemp("code-server"), "--workers", "2", metrics=False, env=env)
    yield srv
    srv.stop()


def block(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


ECHO_TESTS = {"inputs": ["hello\n"], "outputs": ["hello\n"]}
HOSTILE = {
    "correct": "print(input())",
    "wrong": "print(input().upper())",
    "runtime_error": "raise SystemExit(3)",
    "infinite_loop": "while True:\n    pass",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(10**7))",
    "gigabyte_output": "import sys\nfor _ in range(16384):\n    sys.stdout.write('x' * 65536)",
    "write_outside_tmp": "open('/box/pwned', 'w').write('x')",
    "read_server_env": "import os\nprint(os.environ.get('GRPCGRADE_TEST_SECRET', 'hello'))",
    "read_server_files": "print(open('/proc/1/environ').read())",
    "network": "import socket\nsocket.create_connection(('127.0.0.1', int(input() and 50051)), timeout=1)",
    "sleep": "import time\ntime.sleep(60)",
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint(input())",
}
VERDICT = {
    "correct": "passed",
    "wrong": "wrong_answer",
    "runtime_error": "runtime_error",
    "infinite_loop": "time_limit",
    "fork_bomb": "time_limit",
    "memory_bomb": "memory_limit",
    "gigabyte_output": "output_limit",
    "write_outside_tmp": "runtime_error",
    "read_server_env": "passed",  # the secret is not there: it prints the default
    "read_server_files": "runtime_error",  # no /proc
    "network": "runtime_error",  # refused: the sandbox has a loopback of its own
    "sleep": "time_limit",
    "kill_parent": "passed",  # the sandbox's PID 1 ignores it; the program carries on
}


def test_hostile_programs_get_their_verdicts_and_harm_nobody(server: ServerProcess) -> None:
    samples = []
    for name, code in HOSTILE.items():
        samples.append({"id": name, "response": block(code), "extra": {"tests": ECHO_TESTS}})
        samples.append({"id": f"{name}/neighbour", "response": block("print(input())"), "extra": {"tests": ECHO_TESTS}})
    with server.client(timeout=120) as client:
        replies = client.batch_evaluate(samples, [{"name": "code_tests", "params": FAST}])
    results = {reply.id: reply.results[0] for reply in replies}
    assert set(results) == {s["id"] for s in samples}
    for name, verdict in VERDICT.items():
        result = results[name]
        assert not result.HasField("error"), (name, result.error.message)
        assert list(result.metadata["verdicts"]) == [verdict], (name, result.reason)
        assert result.score == (1.0 if verdict == "passed" else 0.0)
        neighbour = results[f"{name}/neighbour"]
        assert neighbour.score == 1.0 and not neighbour.HasField("error")
    everything = json.dumps([str(r) for r in results.values()])
    assert SECRET not in everything
    assert health_status(server.target) == health_pb2.HealthCheckResponse.SERVING
    assert server.proc.poll() is None


def test_two_hundred_samples_with_two_workers_lose_none(server: ServerProcess) -> None:
    rng = random.Random(19)
    samples, expected = [], {}
    for i in range(200):
        a, b = rng.randint(-999, 999), rng.randint(-999, 999)
        op = "+" if i % 3 else "-"  # every third program subtracts: wrong unless b == 0
        code = f"a, b = map(int, input().split())\nprint(a {op} b)"
        tests = {"inputs": [f"{a} {b}\n"], "outputs": [f"{a + b}\n"]}
        samples.append({"id": f"s{i}", "response": block(code), "extra": {"tests": json.dumps(tests)}})
        expected[f"s{i}"] = 1.0 if op == "+" or b == 0 else 0.0
    # What is tested is that none is lost or misscored, not the time limit: each program's limit is 10 s, so
    # a sandbox that waited for a core on a loaded machine (1 s was passed once in CI, at load 4-5, by
    # a program that takes ~30 ms) is still graded.
    params = {**FAST, "time_limit_seconds": 10}
    with server.client(timeout=300, chunk_size=16) as client:
        replies = client.batch_evaluate(samples, [{"name": "code_tests", "params": params}])
    got = {reply.id: reply.results[0] for reply in replies}
    assert len(replies) == 200 and set(got) == set(expected)
    assert all(not r.HasField("error") for r in got.values())
    assert {k: r.score for k, r in got.items()} == expected


def test_the_plugin_is_listed(server: ServerProcess) -> None:
    with server.client(timeout=30) as client:
        listing = client.list_graders()
    plugin = next(p for p in listing.plugins if p.name == "code")
    assert (plugin.distribution, plugin.status, list(plugin.graders)) == ("grpcgrade-code", "loaded", ["code_tests"])


def test_a_wrong_setting_stops_the_plugin_with_a_message(tmp_path: Path) -> None:
    env = {**os.environ, "GRPCGRADE_CODE_BACKEND": "docker"}
    out = subprocess.run(
        [sys.executable, "-m", "grpcgrade.cli", "graders"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    (line,) = [line for line in out.stdout.splitlines() if "grpcgrade-code" in line]
    assert line.split()[:2] == ["code", "grpcgrade-code"] and "failed" in line
    assert "GRPCGRADE_CODE_BACKEND='docker': must be one of bubblewrap, sandbox_fusion" in line
