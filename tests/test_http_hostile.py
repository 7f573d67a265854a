"""The HTTP face against hostile clients, on a real server: credentials that are not UTF-8, bodies past
the limit, connections that never finish their headers or sit idle, more connections than the cap; and
gRPC callers keep being answered meanwhile (issue 33)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from grpcgrade.service.openai_http import MOUNT_PATH
from grpcgrade.testing import ServerProcess, free_port, start_server

CONFIG = """
default_reward: exact
rewards:
  exact:
    graders: [{name: string_match}]
"""
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "config.yaml").write_text(CONFIG)
    (tmp / "tokens").write_text(TOKEN + "\n")
    port = free_port()
    args = ["--workers", "1", "--config", "config.yaml", "--auth-token-file", "tokens", "--http-port", str(port)]
    srv = start_server(tmp, *args)
    srv.http_port = port  # type: ignore[attr-defined]
    yield srv
    srv.stop()


def raw_request(port: int, head: bytes, body: bytes = b"", timeout: float = 30) -> bytes:
    """Send `head` (request line and headers, without the blank line) and `body` as they are; the answer's
    bytes up to the server's close (every request here says Connection: close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + b"\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize("path", ["/get_reward", "/rewards/exact/get_reward", MOUNT_PATH + "/run"])
def test_credentials_that_are_not_utf8_are_401_and_one_log_line(hostile_server: ServerProcess, path: str) -> None:
    """`Authorization: Bearer \\xe9` answered 500 with a 26-line traceback per request before."""
    before = hostile_server.log()
    head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    answer = raw_request(hostile_server.http_port, head + b"Authorization: Bearer \xe9\xff", b'{"query": ["x"]}')
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    deadline = time.monotonic() + 10  # the log line is written as the answer goes out; this only bounds it
    while hostile_server.log() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    new = hostile_server.log()[len(before) :].splitlines()
    assert len(new) == 1 and "Authorization" in new[0] and "Traceback" not in new[0], new
