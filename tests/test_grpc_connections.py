"""The public gRPC port's connection bounds (`grpc.max_connections`, `grpc.handshake_timeout_seconds`,
`grpc.idle_timeout_seconds`; docs/security.md), against real servers and raw TCP clients: connections
past the cap are closed at once, one that never finishes its handshakes is closed after its time, one
with no call after its idle time (and a gRPC client whose connection was closed so reconnects by itself),
and a flood of silent connections no longer runs the server out of descriptors. Each holds for whoever
serves the port: the engine's process, the Python gRPC face processes and the native (Go) face.

What a raw client sends is HTTP/2's (RFC 9113): the client preface, then a SETTINGS frame."""

from __future__ import annotations

import resource
import socket
import time
from pathlib import Path

import pytest

from grpcgrade.client import GradingClient
from grpcgrade.core.config import GrpcConfig, parse_config
from grpcgrade.core.errors import ConfigError
from grpcgrade.service.options import connection_cap
from grpcgrade.testing import ServerProcess, eventually, scrape, start_server

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: An empty SETTINGS frame (9-byte header: length 0, type 4, no flags, stream 0), then its ACK of the server's.
SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]) + bytes([0, 0, 0, 4, 1, 0, 0, 0, 0])
#: HTTP/2's GOAWAY frame type.
GOAWAY = 7

#: Who serves the public port: the engine's process, one Python face process, the native face.
SERVERS = [
    pytest.param([], id="engine"),
    pytest.param(["--grpc-processes", "1"], id="python-face"),
    pytest.param(["--grpc-face", "native", "--grpc-processes", "1"], id="native-face", marks=pytest.mark.native),
]

SAMPLE = {"response": "4", "reference": "4"}


def serve(tmp: Path, grpc_section: str, more: list[str]) -> ServerProcess:
    (tmp / "config.yaml").write_text(f"grpc: {grpc_section}\n")
    return start_server(tmp, "--workers", "0", "--config", "config.yaml", *more)


class Raw:
    """A raw TCP connection to the port; `closed()` says whether the server has closed it (what it sent
    before that is kept in `received`)."""

    def __init__(self, port: int, send: bytes = b"") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if send:
            self.sock.sendall(send)
        self.sock.setblocking(False)
        self.received = b""
        self.ended = False

    def closed(self) -> bool:
        while not self.ended:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return False
            except OSError:  # reset
                data = b""
            if not data:
                self.ended = True
            self.received += data
        return True

    def frame_types(self) -> list[int]:
        """The types of the HTTP/2 frames received."""
        types, at = [], 0
        while at + 9 <= len(self.received):
            length = int.from_bytes(self.received[at : at + 3], "big")
            types.append(self.received[at + 3])
            at += 9 + length
        return types

    def close(self) -> None:
        self.sock.close()


def opened(port: int, n: int, send: bytes = b"") -> list[Raw]:
    return [Raw(port, send) for _ in range(n)]


def stop(srv: ServerProcess, raws: list[Raw]) -> None:
    """Our connections closed first: a server stopping waits its grace period for connections still open."""
    for raw in raws:
        raw.close()
    srv.stop()


def answered(target: str, timeout: float = 30) -> float:
    """A call on a new connection, answered (the client waits for the port as long as `timeout`)."""
    with GradingClient(target, timeout=timeout) as client:
        return client.evaluate(SAMPLE, ["string_match"]).results[0].score


@pytest.fixture
def raws() -> list[Raw]:
    return []


@pytest.mark.parametrize("more", SERVERS)
def test_connections_past_the_cap_are_closed_at_once_and_the_cap_frees_as_they_end(tmp_path, raws, more):
    srv = serve(tmp_path, "{max_connections: 40, handshake_timeout_seconds: 600}", more)
    try:
        # 60 connections that finish their handshakes and stay: only the cap can close any of them
        raws += opened(srv.port, 60, PREFACE + SETTINGS)
        eventually(lambda: sum(r.closed() for r in raws) >= 20, "20 of 60 connections closed past a cap of 40")
        assert sum(not r.closed() for r in raws) <= 40
        for raw in raws:
            if raw.closed():  # closed at once: no frame of the server's, not even its SETTINGS
                assert raw.received == b""
        # while the cap is taken, a new connection is closed too; once ours end it is taken up again. The
        # cap counts every client's connections: one that ended just before ours came (start_server's last
        # health check, whose end the server may see after our 60 arrived) leaves a place a new one takes
        # and keeps; of three new ones, one may take that place, the others are closed
        late = opened(srv.port, 3, PREFACE + SETTINGS)
        raws += late
        eventually(lambda: sum(r.closed() for r in late) >= 2, "new connections past the cap closed")
        assert sum(not r.closed() for r in raws) <= 40
        for raw in raws:
            raw.close()
        assert answered(srv.target) == 1.0
    finally:
        stop(srv, raws)


@pytest.mark.parametrize("more", SERVERS)
def test_a_connection_that_does_not_finish_its_handshake_is_closed_after_its_time(tmp_path, raws, more):
    srv = serve(tmp_path, "{handshake_timeout_seconds: 1}", more)
    try:
        raws += [
            Raw(srv.port),  # silent
            Raw(srv.port, PREFACE[:10]),  # half the preface
            Raw(srv.port, PREFACE),  # the preface without its SETTINGS frame
        ]
        handshaken = Raw(srv.port, PREFACE + SETTINGS)
        raws.append(handshaken)
        eventually(lambda: all(r.closed() for r in raws[:3]), "unfinished handshakes closed after 1 s", bound=30)
        assert not handshaken.closed()  # a finished handshake is not this bound's (the idle time's, 300 s)
        assert answered(srv.target) == 1.0
    finally:
        stop(srv, raws)


@pytest.mark.parametrize("more", SERVERS)
def test_an_idle_connection_is_sent_away_and_a_client_reconnects_by_itself(tmp_path, raws, more):
    srv = serve(tmp_path, "{idle_timeout_seconds: 1}", more)
    try:
        raw = Raw(srv.port, PREFACE + SETTINGS)
        raws.append(raw)
        eventually(lambda: raw.closed() or GOAWAY in raw.frame_types(), "an idle connection sent away", bound=30)
        raw.closed()
        assert GOAWAY in raw.frame_types()
        # A client idle past the time finds its connection gone and makes another, unseen by its caller.
        with GradingClient(srv.target, timeout=30) as client:
            assert client.evaluate(SAMPLE, ["string_match"]).results[0].score == 1.0
            time.sleep(3)  # idle for three times the idle time: its connection is sent away meanwhile
            assert client.evaluate(SAMPLE, ["string_match"]).results[0].score == 1.0
    finally:
        stop(srv, raws)


def test_a_flood_of_silent_connections_leaves_the_server_its_descriptors(tmp_path, raws):
    """The fault this bound came from: 1,100 connections that sent nothing to a server whose open-files
    limit was 1,024 took every descriptor it had for gRPC's 120 s handshake time; no new client, metrics
    scrape or sandbox could start meanwhile. Here (limit 512, cap 200): the scrape is answered during the
    flood, and new calls once the silent connections have been closed."""
    srv = serve(tmp_path, "{max_connections: 200, handshake_timeout_seconds: 2}", [])
    try:
        resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, (512, 512))
        raws += opened(srv.port, 600)
        eventually(lambda: sum(r.closed() for r in raws) >= 400, "connections past the cap closed")
        assert scrape(srv.metrics_port)  # the server still opens a connection of another kind
        eventually(lambda: all(r.closed() for r in raws), "silent connections closed after their 2 s", bound=30)
        assert answered(srv.target) == 1.0
    finally:
        stop(srv, raws)


def test_the_cap_keeps_half_the_open_files_limit_for_the_server_itself(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda _kind: (1024, 4096))
    assert connection_cap(10_000) == 512
    assert connection_cap(100) == 100


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"max_connections": 0}, "grpc: max_connections: must be at least 1, got 0"),
        ({"max_connections": 2.5}, "grpc: max_connections: must be a whole number, got 2.5"),
        ({"max_connections": 10**7}, "grpc: max_connections: must be at most 1,000,000"),
        ({"handshake_timeout_seconds": -1}, "grpc: handshake_timeout_seconds: must be at least 0.001, got -1"),
        ({"handshake_timeout_seconds": True}, "grpc: handshake_timeout_seconds: must be a number, got True"),
        ({"idle_timeout_seconds": 1e9}, "grpc: idle_timeout_seconds: must be at most 86,400"),
        ({"idle_timeout_seconds": "5m"}, "grpc: idle_timeout_seconds: must be a number, got '5m'"),
    ],
)
def test_the_connection_bounds_are_checked(section, message):
    with pytest.raises(ConfigError) as refused:
        parse_config({"grpc": section}, "c.yaml")
    assert message in str(refused.value)


def test_the_connection_bounds_are_read():
    read = parse_config(
        {"grpc": {"max_connections": 50, "handshake_timeout_seconds": 2, "idle_timeout_seconds": 60}}, "c.yaml"
    ).grpc
    assert (read.max_connections, read.handshake_timeout_seconds, read.idle_timeout_seconds) == (50, 2.0, 60.0)
    assert parse_config({}, "c.yaml").grpc == GrpcConfig()
