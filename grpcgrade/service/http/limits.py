"""What bounds the HTTP face against hostile clients: its bodies, how long they take to arrive and to read,
and its connections (docs/security.md lists every limit with its default).

The HTTP face runs in processes of its own (`http.process`), so nothing here runs on the gRPC server's
event loop; still nothing a client sends may hold a face's loop, where every other HTTP client of that
process waits (`grpcgrade bench --http-stall` measures both):

* A body is refused with 413 before it is read when its Content-Length is over `http.max_body_bytes`
  (aiohttp's `client_max_size` stops a chunked one at the same size), and must arrive within
  `http.body_timeout_seconds` (408 after). The bodies a face process holds at once, as read and until
  their answers, are bounded by `limits.max_pending_request_bytes` (`HeldBody`; past it 503 with the retry
  hint: before reading a body whose declared size would pass it, else as the body arrives).
* A body over `INLINE_PARSE_BYTES` is parsed in a separate process (`core.json_body`), by the C decoder,
  its depth and its arrays and objects counted there. Not in a thread: the C decoder holds the GIL for a
  whole call (a few MB of `[[],[],...]` takes seconds), and a pure-Python decoder in a thread, which hands
  the GIL back every switch interval, still starved the loop (a thread that computes takes the GIL back
  each time the loop releases it for I/O: gRPC callers waited seconds behind a 200 kB body). Taking the
  parsed body back is one unpickling in this process, bounded by `MAX_JSON_CONTAINERS`. The sizes of the
  fields a face passes on whole (OpenAI's `item` and `grader`) are measured there too.
* Connections: a cap (`http.max_connections`; past it a new connection is closed at once), a time to
  send a complete request head (`http.header_timeout_seconds`, from the connection's start), and an idle
  keep-alive timeout (`http.idle_timeout_seconds`, aiohttp's `keepalive_timeout`, which also ends a
  connection whose next request head does not arrive in that time).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from grpcgrade.core.admission import Admission
from grpcgrade.core.config import HttpConfig
from grpcgrade.core.executors import Task
from grpcgrade.core.json_body import MAX_JSON_CONTAINERS, MAX_JSON_DEPTH, BodyError, init_process, parse_body
from grpcgrade.core.workers import WorkerPool

__all__ = ["MAX_JSON_CONTAINERS", "MAX_JSON_DEPTH", "BodyError", "parse_body"]  # the faces find them here

log = logging.getLogger("grpcgrade.http")
T = TypeVar("T")

#: Bodies up to this size are parsed on the loop by the C decoder: a few milliseconds at worst.
INLINE_PARSE_BYTES = 16 * 1024
#: Processes parsing large bodies at once; more wait their turn.
PARSE_PROCESSES = 2
#: Threads for the walks a face makes over a parsed body (`off_loop`).
WALK_THREADS = 2

_walkers = ThreadPoolExecutor(max_workers=WALK_THREADS, thread_name_prefix="grpcgrade-http-walk")


#: How long a parsing process may hold one body before it is taken for hung, killed and replaced (plus the
#: executors' watchdog grace). An 8 MiB body parses in well under a second.
PARSE_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class _ParseItem:
    """One body to parse, as an executor's item (`core.executors.Item`)."""

    raw: bytes
    sized: tuple[str, ...]
    size: int = 1
    timeout: float | None = PARSE_TIMEOUT_SECONDS

    def task(self) -> Task:
        return Task(parse_body, (self.raw, self.sized))

    def run_here(self) -> Any:
        return parse_body(self.raw, self.sized)

    def split(self) -> list[_ParseItem]:
        return []  # one body: nothing to split

    def failed(self, code: str, message: str) -> BodyError:
        return BodyError(f"the request body could not be parsed ({code}): {message}", status=503)

    def join(self, parts: list[Any]) -> Any:
        return parts[0]


class _Parsers:
    """The parsing processes: a `WorkerPool` of their own, the supervisor grading uses (a pipe per process,
    one body in flight each), so a process killed while it writes a parsed body back (the OOM killer's
    doing) costs that body one more try and nothing else. A `ProcessPoolExecutor`, whose processes share one
    result pipe, was left reading half a message forever: every later large body waited with it. Started
    with the face, on its event loop; made anew by each start."""

    def __init__(self) -> None:
        self._pool: WorkerPool | None = None

    def start(self) -> None:
        self.close()
        self._pool = WorkerPool(PARSE_PROCESSES, initializer=init_process, role="json")

    async def parse(self, raw: bytes, sized: tuple[str, ...]) -> tuple[Any, dict[str, int]]:
        if self._pool is None:
            self.start()
        assert self._pool is not None
        answer = await self._pool.run(_ParseItem(raw, sized))
        if isinstance(answer, BodyError):  # its process died twice, or hung
            log.warning("an HTTP body could not be parsed: %s", answer)
            raise answer
        return answer  # type: ignore[no-any-return]

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(patience=0.5)


parsers = _Parsers()


def json_size(value: Any) -> int:
    """The UTF-8 size of `value` as compact JSON, encoded by the pure-Python encoder (`iterencode` without
    one-shot), piece by piece: no single C call on a large value."""
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)
    return sum(len(piece.encode("utf-8", errors="surrogatepass")) for piece in encoder.iterencode(value))


async def read_body(request: web.Request, http: HttpConfig) -> bytes:
    """The body's bytes: 413 before reading one whose declared length is over the limit, 408 when it does
    not arrive within the body timeout (a client trickling it would hold its connection and memory)."""
    declared = request.content_length
    if declared is not None and declared > http.max_body_bytes:
        raise BodyError(too_large(declared, http.max_body_bytes), status=413)
    held = request.get(HELD_KEY)
    if request.content.is_eof():  # the whole body arrived with the head: nothing to wait for, no timer
        body = await request.read()
        if held is not None:
            held.add(len(body))
        return body
    try:
        async with asyncio.timeout(http.body_timeout_seconds):  # a timer; wait_for would add a task too
            if held is None:
                return await request.read()
            return await _read_held(request, held, http.max_body_bytes)
    except TimeoutError:
        raise BodyError(f"the request body did not arrive within {http.body_timeout_seconds:g} s", 408) from None
    except web.HTTPRequestEntityTooLarge:  # a chunked body, stopped by client_max_size as it passed the limit
        raise BodyError(too_large(None, http.max_body_bytes), status=413) from None


def declared_bytes(request: web.Request, http: HttpConfig) -> int:
    """A request's declared body size (at most `http.max_body_bytes`: a larger one is refused 413 unread;
    0 for a chunked body, whose size nothing declares): checked against `limits.max_pending_request_bytes`
    before anything is read."""
    declared = request.content_length
    return 0 if declared is None else min(declared, http.max_body_bytes)


class HeldBody:
    """The bytes of one request's body read so far, counted against `limits.max_pending_request_bytes`
    (`Admission.hold`: Overloaded past it) as they arrive; the middleware gives them back when the request
    ends. Counted as read, not as declared: a client that declares large bodies and trickles them holds
    only what it sent, and cannot take the bound from the others."""

    __slots__ = ("admission", "bytes")

    def __init__(self, admission: Admission) -> None:
        self.admission, self.bytes = admission, 0

    def add(self, more: int) -> None:
        self.admission.hold(more, self.bytes)
        self.bytes += more


#: The request's `HeldBody` (set by the application's middleware).
HELD_KEY = web.RequestKey("grpcgrade_held_body", HeldBody)


async def _read_held(request: web.Request, held: HeldBody, limit: int) -> bytes:
    """The body read piece by piece as it arrives, each piece counted (`HeldBody.add`), stopped past `limit`
    (what aiohttp's `client_max_size` does for `request.read`)."""
    body = bytearray()
    async for piece in request.content.iter_any():
        held.add(len(piece))
        body += piece
        if len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    return bytes(body)


def too_large(size: int | None, limit: int) -> str:
    sent = f"{size} bytes" if size is not None else "a request body"
    return f"{sent}, over the HTTP face's limit http.max_body_bytes={limit}"


async def read_json(request: web.Request, http: HttpConfig, sized: Sequence[str] = ()) -> tuple[Any, dict[str, int]]:
    """The request's body parsed (`core.json_body.parse_body`), in a parsing process when it is large."""
    raw = await read_body(request, http)
    if len(raw) <= INLINE_PARSE_BYTES:
        return parse_body(raw, sized)
    return await parsers.parse(raw, tuple(sized))


async def off_loop(request: web.Request, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the walking threads: for the walks over a large body a face makes after parsing. A
    body small enough to parse on the loop (`INLINE_PARSE_BYTES`) is walked there too: a thread's round trip
    costs more than a one-sample body's walk (a crowd of one-sample posts spent a fifth of the loop on it)."""
    size = request.content_length
    if size is not None and size <= INLINE_PARSE_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(_walkers, fn, *args)


class _Refused(asyncio.Protocol):
    """A connection past the cap: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Connection(web.RequestHandler):
    """aiohttp's connection, counted, and ended when its first request head does not arrive in time."""

    guard: ConnectionGuard
    head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.head_timer = asyncio.get_running_loop().call_later(self.guard.http.header_timeout_seconds, self._late)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.guard.open.discard(self)
        self.head_arrived()
        super().connection_lost(exc)

    def head_arrived(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _late(self) -> None:
        self.head_timer = None
        self.guard.late_heads += 1
        self.force_close()  # closes the transport


class ConnectionGuard:
    """Serves a runner's aiohttp server on a listening socket of its own, with the connection limits.

    Build the runner with `runner_options()`: the same per-connection settings go to every connection
    made here (aiohttp's `Server` would pass them too, had it made the connection)."""

    def __init__(self, http: HttpConfig) -> None:
        self.http = http
        self.open: set[_Connection] = set()
        self.refused = 0
        self.late_heads = 0
        self.runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None

    def connection_options(self) -> dict[str, Any]:
        """aiohttp's per-connection settings: no access log, the idle keep-alive timeout, the head's sizes."""
        return {"access_log": None, "keepalive_timeout": self.http.idle_timeout_seconds, **HEAD_LIMITS}

    def _protocol(self) -> asyncio.Protocol:
        server = self.runner.server if self.runner is not None else None
        if server is None or len(self.open) >= self.http.max_connections:
            self.refused += 1
            return _Refused()
        connection = _Connection(server, loop=asyncio.get_running_loop(), **self.connection_options())
        connection.guard = self
        self.open.add(connection)  # counted now: asyncio makes a batch of accepted connections at once
        return connection

    async def start(self, runner: web.AppRunner, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen on host:port (0: a free one) for `runner`, set up already; returns the port. `reuse_port`:
        beside the other face processes on the same port (SO_REUSEPORT: the kernel spreads connections)."""
        self.runner = runner
        loop = asyncio.get_running_loop()
        # A listen backlog as deep as the connection cap (the kernel caps it at net.core.somaxconn): with
        # asyncio's default of 100, a crowd connecting at once overflows it and the kernel drops their SYNs,
        # which the callers resend only after 1, 3, 7... s (4,000 callers: 352 calls/s, the slowest answered
        # after 55 s).
        self._listener = await loop.create_server(
            self._protocol, host, port, reuse_address=True, reuse_port=reuse_port or None,
            backlog=self.http.max_connections,
        )  # fmt: skip
        parsers.start()
        return int(self._listener.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop accepting (the runner's cleanup then ends the open connections)."""
        if self._listener is not None:
            self._listener.close()
        parsers.close()


#: aiohttp's limits on a request head (its defaults, stated here so that docs/security.md can list them).
HEAD_LIMITS = {"max_line_size": 8190, "max_field_size": 8190, "max_headers": 128}


def mark_head_arrived(request: web.Request) -> None:
    """Called for every request that reached the application: its connection's head timer stops."""
    if isinstance(request.protocol, _Connection):
        request.protocol.head_arrived()
