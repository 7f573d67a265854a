"""The public ports, bound so that a port in use fails the start, naming the option that gave it.

Face processes listen on a port with SO_REUSEPORT, which the kernel lets every socket of the same user share,
and grpc binds with it too where it may. So a start cannot rely on its own bind failing: a second server
given the port of a running one would bind beside it and take half its callers, silently. Each port is
first probed with a socket that asks for SO_REUSEADDR only, which any listener on the port refuses,
whether or not that listener shares.
"""

from __future__ import annotations

import socket
from typing import Any

from grpcgrade.core.errors import PortUnavailable


def _address(option: str, host: str, port: int) -> tuple[socket.AddressFamily, Any]:
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except OSError as exc:
        raise PortUnavailable(option, host, port, exc.strerror or str(exc)) from exc
    return family, address


def check_free(option: str, host: str, port: int) -> None:
    """PortUnavailable now when `host:port` cannot be bound (a listener on it, shared or not; not this
    machine's address), with the operating system's reason: grpc would say so only after its C core had
    logged lines of its own. Port 0 (any free port) is always free."""
    if not port:
        return
    family, address = _address(option, host, port)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc binds: TIME_WAIT is no obstacle
        try:
            probe.bind(address)
        except OSError as exc:
            raise PortUnavailable(option, host, port, exc.strerror or str(exc)) from exc


def reserve_port(host: str, port: int, option: str = "http_port") -> socket.socket:
    """A socket bound to host:port (0: a free port) with SO_REUSEPORT, not listening: the face processes
    listen beside it. PortUnavailable (naming `option`) when the port is taken, shared or not."""
    check_free(option, host, port)
    family, address = _address(option, host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise PortUnavailable(option, host, port, exc.strerror or str(exc)) from exc
    return sock
