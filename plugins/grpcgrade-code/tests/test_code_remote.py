"""The SandboxFusion backend against a real HTTP service on 127.0.0.1 that implements the documented
run_code API: it runs each program in this machine's bubblewrap sandbox and answers as SandboxFusion does
(sandbox/server/sandbox_api.py), or misbehaves as a test asks (503s, a refusal, a SandboxError, a body too
large), so retries and failure semantics are seen end to end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from code_helpers import backend_in_use
from grpcgrade_code import CodeTestsGrader, Limits, Outcome, RunResult, SandboxUnavailable, run
from grpcgrade_code.bubblewrap import BubblewrapBackend
from grpcgrade_code.sandbox_fusion import SandboxFusionBackend

from grpcgrade import ErrorCode, GraderError, GraderScore
from grpcgrade.testing import free_port, start_server

LANGUAGES = {"python": "python", "cpp": "cpp", "nodejs": "javascript"}
LOCAL = BubblewrapBackend(max_concurrency=4)


def command(result: RunResult) -> dict[str, Any]:
    status = "TimeLimitExceeded" if result.outcome is Outcome.TIME_LIMIT else "Finished"
    code = result.exit_code if result.exit_code is not None else 128 + (result.signal or 9)
    return {"status": status, "execution_time": result.seconds, "return_code": code,
            "stdout": result.stdout, "stderr": result.stderr}  # fmt: skip


def run_code(body: dict[str, Any]) -> dict[str, Any]:
    """SandboxFusion's run_code, on this machine's sandbox."""
    limits = Limits(time_seconds=body["run_timeout"], memory_mb=body["memory_limit_MB"])
    result = asyncio.run(run(LOCAL, LANGUAGES[body["language"]], body["code"], body["stdin"] or "", limits))
    if result.outcome is Outcome.COMPILE_ERROR and body["language"] == "cpp":
        compiled = {"status": "Finished", "return_code": 1, "stdout": "", "stderr": result.stderr}
        return {"status": "Failed", "message": "", "compile_result": compiled, "run_result": None}
    ran = command(result)
    ok = ran["status"] == "Finished" and ran["return_code"] == 0
    return {"status": "Success" if ok else "Failed", "message": "", "compile_result": None, "run_result": ran}


#: (number of this request, from 1; its body) -> (HTTP status, JSON body or raw bytes).
Behaviour = Callable[[int, dict[str, Any]], tuple[int, Any]]


@dataclass
class Service:
    behave: Behaviour
    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextlib.contextmanager
def service(behave: Behaviour = lambda n, body: (200, run_code(body))) -> Iterator[Service]:
    svc = Service(behave)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            assert self.path == "/run_code"
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with svc.lock:
                svc.requests.append(body)
                number = len(svc.requests)
                svc.in_flight += 1
                svc.max_in_flight = max(svc.max_in_flight, svc.in_flight)
            try:
                status, payload = svc.behave(number, body)
            finally:
                with svc.lock:
                    svc.in_flight -= 1
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    svc.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield svc
    finally:
        server.shutdown()
        server.server_close()


def remote(url: str, **options: Any) -> SandboxFusionBackend:
    return SandboxFusionBackend(url, **{"retry_backoff_seconds": 0.01, **options})


def go(backend: SandboxFusionBackend, code: str, stdin: str = "", language: str = "python") -> RunResult:
    return asyncio.run(run(backend, language, code, stdin, Limits(time_seconds=1, memory_mb=256)))


def test_programs_run_remotely_with_their_outcomes() -> None:
    with service() as svc:
        backend = remote(svc.url)
        assert go(backend, "print(input()[::-1])", "abc").stdout == "cba\n"
        assert go(backend, "raise SystemExit(4)").outcome is Outcome.RUNTIME_ERROR
        assert go(backend, "while True:\n    pass").outcome is Outcome.TIME_LIMIT
        assert go(backend, "x = bytearray(10**10)").outcome is Outcome.MEMORY_LIMIT
        assert go(backend, "def f(:").outcome is Outcome.COMPILE_ERROR
        assert go(backend, "int main() { return nope; }", language="cpp").outcome is Outcome.COMPILE_ERROR
    first = svc.requests[0]
    assert first == {
        "code": "print(input()[::-1])",
        "language": "python",
        "stdin": "abc",
        "compile_timeout": 20.0,
        "run_timeout": 1,
        "memory_limit_MB": 256,
        "files": {},
        "fetch_files": [],
    }


def test_the_grader_on_the_remote_backend() -> None:
    tests = {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
    with service() as svc, backend_in_use(remote(svc.url)):
        grader = CodeTestsGrader(preamble=False)
        good = asyncio.run(grader.aevaluate(response="print(sum(map(int, input().split())))", tests=tests))
        bad = asyncio.run(grader.aevaluate(response="print(1 / 0)", tests=tests))
    assert isinstance(good, GraderScore) and good.score == 1.0 and good.metadata["backend"] == "sandbox_fusion"
    assert isinstance(bad, GraderScore) and bad.metadata["verdicts"] == ["runtime_error"] * 2


def test_transient_failures_are_retried() -> None:
    def flaky(n: int, body: dict[str, Any]) -> tuple[int, Any]:
        return (503, {"detail": "overloaded"}) if n <= 2 else (200, run_code(body))

    with service(flaky) as svc:
        assert go(remote(svc.url), "print(7)").stdout == "7\n"
    assert len(svc.requests) == 3


def test_a_service_that_keeps_failing_is_unavailable_after_the_retries() -> None:
    with service(lambda n, body: (503, b"no")) as svc, pytest.raises(SandboxUnavailable, match="failed 3 times"):
        go(remote(svc.url, max_retries=2), "print(7)")
    assert len(svc.requests) == 3


@pytest.mark.parametrize(
    ("behave", "message"),
    [
        (lambda n, body: (400, {"detail": "bad language"}), "answered HTTP 400"),
        (lambda n, body: (200, {"status": "SandboxError", "message": "runner crashed"}), "runner crashed"),
        (lambda n, body: (200, {"hello": "world"}), "not SandboxFusion's"),
        (lambda n, body: (200, b"<html>"), "not JSON"),
    ],
)
def test_failures_that_retrying_cannot_help_are_not_retried(behave: Behaviour, message: str) -> None:
    with service(behave) as svc, pytest.raises(SandboxUnavailable, match=message):
        go(remote(svc.url), "print(7)")
    assert len(svc.requests) == 1


def test_an_unreachable_service_is_unavailable() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(SandboxUnavailable, match="ConnectError"):
        go(remote(f"http://127.0.0.1:{port}", max_retries=1), "print(7)")


def test_an_answer_over_the_size_limit_is_the_programs_output() -> None:
    def huge(n: int, body: dict[str, Any]) -> tuple[int, Any]:
        ran = {"status": "Finished", "return_code": 0, "stdout": "x" * (13 << 20), "stderr": ""}
        return 200, {"status": "Success", "message": "", "run_result": ran}

    with service(huge) as svc:
        assert go(remote(svc.url), "print('x' * 10**9)").outcome is Outcome.OUTPUT_LIMIT


def test_the_concurrency_limit_holds_and_waiting_is_not_run_time() -> None:
    def slow(n: int, body: dict[str, Any]) -> tuple[int, Any]:
        time.sleep(0.2)
        return 200, run_code(body)

    with service(slow) as svc:
        backend = remote(svc.url, max_concurrency=2)

        async def six() -> list[RunResult]:
            return await asyncio.gather(
                *(run(backend, "python", "print(1)", "", Limits(time_seconds=1)) for _ in range(6))
            )

        results = asyncio.run(six())
    assert [r.outcome for r in results] == [Outcome.OK] * 6
    assert svc.max_in_flight == 2


def test_a_server_configured_for_the_remote_backend(tmp_path_factory: pytest.TempPathFactory) -> None:
    sample = {"id": "s", "response": "print(input())", "extra": {"tests": {"inputs": ["hi"], "outputs": ["hi"]}}}
    graders = [{"name": "code_tests", "params": {"preamble": False}}]
    with service() as svc:
        env = {"GRPCGRADE_CODE_BACKEND": "sandbox_fusion", "GRPCGRADE_CODE_SANDBOX_FUSION_URL": svc.url}
        server = start_server(tmp_path_factory.mktemp("remote"), "--workers", "0", metrics=False, env=env)
        try:
            with server.client(timeout=60) as client:
                reply = client.evaluate(sample, graders)
        finally:
            server.stop()
    assert reply.results[0].score == 1.0 and reply.reward == 1.0
    assert reply.results[0].metadata["backend"] == "sandbox_fusion"
    assert svc.requests[0]["stdin"] == "hi"


def test_a_server_whose_sandbox_service_is_down_masks_the_reward(tmp_path_factory: pytest.TempPathFactory) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {"GRPCGRADE_CODE_BACKEND": "sandbox_fusion", "GRPCGRADE_CODE_SANDBOX_FUSION_URL": url,
           "GRPCGRADE_CODE_MAX_RETRIES": "0"}  # fmt: skip
    server = start_server(tmp_path_factory.mktemp("down"), "--workers", "0", metrics=False, env=env)
    try:
        with server.client(timeout=60) as client:
            sample = {"response": "print(1)", "extra": {"tests": {"inputs": [""], "outputs": ["1"]}}}
            reply = client.evaluate(sample, ["code_tests"])
    finally:
        server.stop()
    (result,) = reply.results
    assert result.error.code == ErrorCode.SANDBOX_UNAVAILABLE
    assert not reply.HasField("reward")


def test_an_error_result_is_not_a_score() -> None:
    """The in-process form of the same rule: the grader returns GraderError, never a 0."""
    tests = {"inputs": [""], "outputs": ["1"]}
    with backend_in_use(remote("http://127.0.0.1:1", max_retries=0)):
        result = asyncio.run(CodeTestsGrader().aevaluate(response="print(1)", tests=tests))
    assert isinstance(result, GraderError) and result.code == ErrorCode.SANDBOX_UNAVAILABLE
