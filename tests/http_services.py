"""Real HTTP grading services on 127.0.0.1 for the tests: http.server in a thread, behaviour per test."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: What a behaviour returns: (HTTP status, JSON body or raw bytes, extra headers).
Reply = tuple[int, Any, dict[str, str]]
#: A reply header (value "") that keeps the body's length undeclared: the client reads to the connection's end.
UNDECLARED = "X-Test-Undeclared-Length"
#: (number of this request, counting from 1; its JSON body) -> the reply.
Behaviour = Callable[[int, dict[str, Any]], Reply]


@dataclass
class Service:
    """One service; `requests` holds every body it received, in order of arrival, `paths` their paths."""

    behave: Behaviour
    delay: float = 0.0
    #: Write a body in pieces of this many bytes, a moment apart, as a network delivers a large answer (0: whole).
    piece: int = 0
    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, body: dict[str, Any], path: str = "") -> Reply:
        with self.lock:
            self.requests.append(body)
            self.paths.append(path)
            number = len(self.requests)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.delay)
            return self.behave(number, body)
        finally:
            with self.lock:
                self.in_flight -= 1


@contextlib.contextmanager
def http_service(behave: Behaviour, delay: float = 0.0, piece: int = 0) -> Iterator[Service]:
    """A service answering POSTs on a free loopback port until the block ends."""
    service = Service(behave, delay, piece)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, payload, headers = service.handle(body, self.path)
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            try:
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    if name != UNDECLARED:
                        self.send_header(name, value)
                if UNDECLARED not in headers:  # else HTTP/1.0's end of the body: the connection closes
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                step = service.piece or len(data) or 1
                for start in range(0, len(data), step):
                    if start:
                        self.wfile.flush()
                        time.sleep(0.005)
                    self.wfile.write(data[start : start + step])
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    service.url = f"http://127.0.0.1:{server.server_address[1]}/grade"
    try:
        yield service
    finally:
        server.shutdown()
        server.server_close()
