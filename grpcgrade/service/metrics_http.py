"""The /metrics endpoint's HTTP server: prometheus-client's WSGI exposition behind a server bounded against
its clients.

It runs in the engine's process, a thread per connection beside the event loop (as prometheus-client's own
server does), and the image has it listen on every address (`--metrics-host 0.0.0.0`, for Prometheus).
Measured before these bounds: a client that opened connections one by one and sent a byte to each every
2 s held a thread per connection for as long as it went on (1,000 threads in the engine's process after
5 s: a per-read time limit never passes when bytes keep coming), and every connection that sent nothing
wrote a traceback to the server's log. Now:

* at most `MAX_CONNECTIONS` connections are handled at once; past it a new one is closed at once, unread;
* a request must arrive whole within `REQUEST_SECONDS` of its connection's start, however slowly its
  bytes trickle, and a connection silent for `IDLE_SECONDS` is closed;
* a connection that ends so (or in any error) is logged at debug level, never as a traceback.

A scrape sends its request at once, and Prometheus scrapes a target one request at a time, so neither
bound touches one.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger("grpcgrade.service.metrics")

#: Connections handled at once (each a thread of the engine's process).
MAX_CONNECTIONS = 32
#: Seconds from a connection's start within which its whole request must arrive.
REQUEST_SECONDS = 5.0
#: Seconds a connection may stay silent.
IDLE_SECONDS = 3.0


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, each read waiting at most `IDLE_SECONDS` and never past the request's deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the request did not arrive within {REQUEST_SECONDS:g} s")
        self.sock.settimeout(min(IDLE_SECONDS, left))
        return self.sock.recv_into(buffer)


class _Handler(WSGIRequestHandler):
    timeout = IDLE_SECONDS  # socketserver sets it on the connection (the answer's writes)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the standard reader, replaced by one that keeps the request's deadline
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, time.monotonic() + REQUEST_SECONDS))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Scrapes are not logged."""


class _BoundedServer(ThreadingWSGIServer):
    """prometheus-client's threading WSGI server, handling at most `MAX_CONNECTIONS` at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # closed at once, unread
            return
        try:
            super().process_request(request, client_address)  # its thread gives the slot back
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics: a connection from %s ended in error", client_address, exc_info=True)


def serve_wsgi(host: str, port: int, app: Any) -> tuple[ThreadingWSGIServer, threading.Thread]:
    """`app` served on host:port by the bounded server, in a daemon thread (started)."""
    httpd = make_server(host, port, app, _BoundedServer, handler_class=_Handler)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True)
    thread.start()
    return httpd, thread
