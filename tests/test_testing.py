"""`grpcgrade.testing`, the harness our tests, the benchmark and plugin authors' tests start real servers with."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from grpcgrade import testing


def test_ports_taken_after_free_port_cost_the_server_a_new_start_not_the_suite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between `free_port` and the server's bind another suite's process may take the port. Here a listener
    holds it, with SO_REUSEPORT as another server's HTTP face holds its port, and `free_port` hands it out
    three times: the server that cannot bind it exits saying so and is started again on fresh ports (it was
    the suite's error, "server exited with 1"), and no port of the server is the taken one (an HTTP face
    given it would have shared it with the listener, silently)."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        handed = [port] * 3
        free_port = testing.free_port
        monkeypatch.setattr(testing, "free_port", lambda: handed.pop() if handed else free_port())
        server = testing.start_server(tmp_path, "--workers", "0", http=True)
        try:
            assert port not in (server.port, server.metrics_port, server.http_port)
            assert testing.health_status(server.target) == health_pb2.HealthCheckResponse.SERVING
            face = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
            face.request("GET", "/no-such-route")  # the face answers; the listener would never
            assert face.getresponse().status == 404
            face.close()
        finally:
            server.stop()


def test_a_start_that_fails_after_the_spawn_leaves_no_server_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step of `start_server` after the server's spawn that raises (here the HTTP face's port not found
    among its processes' sockets, as when a face is not listening yet) stops the server and everything it
    started (its worker, its face process), instead of leaving them running for the rest of the suite."""
    seen: set[int] = set()
    children = testing.children

    def recording(pid: int) -> list[int]:
        out = children(pid)
        seen.update([pid, *out])
        return out

    monkeypatch.setattr(testing, "children", recording)
    monkeypatch.setattr(testing, "listening_ports", lambda pids: set())
    try:
        with pytest.raises(ValueError):
            testing.start_server(tmp_path, "--workers", "1", http=True)
        assert len(seen) >= 3  # the server, its worker and its face process (and the resource tracker)
        testing.eventually(
            lambda: not [p for p in seen if testing.process_state(p) not in (None, "Z")],
            "the server's processes gone",
            bound=10,
        )
    finally:
        for pid in seen:  # before the fix: what the failed start left
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
