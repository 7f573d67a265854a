"""What bounds the HTTP face against hostile clients: its bodies, how long they take to arrive and to read,
and its connections (docs/security.md lists every limit with its default).

The HTTP face runs on the gRPC server's event loop, so nothing a client sends may hold that loop:

* A body is refused with 413 before it is read when its Content-Length is over `http.max_body_bytes`
  (aiohttp's `client_max_size` stops a chunked one at the same size), and must arrive within
  `http.body_timeout_seconds` (408 after).
* A body is parsed off the loop. CPython's C JSON decoder holds the GIL for a whole call (a few MB of
  `[[],[],...]` takes seconds), so a thread alone would still stall the loop; bodies over
  `INLINE_PARSE_BYTES` are parsed in a thread by the standard library's pure-Python decoder instead,
  which runs as bytecode and so hands the GIL back to the loop every switch interval (5 ms). Slower for
  the parse, never a stall. The sizes of the fields a face passes on whole (OpenAI's `item` and
  `grader`) are measured there too, by the pure-Python encoder, so that nothing large is encoded on the
  loop later.
* Connections: a cap (`http.max_connections`; past it a new connection is closed at once), a time to
  send a complete request head (`http.header_timeout_seconds`, from the connection's start), and an idle
  keep-alive timeout (`http.idle_timeout_seconds`, aiohttp's `keepalive_timeout`, which also ends a
  connection whose next request head does not arrive in that time).
"""

from __future__ import annotations

import asyncio
import json
import json.decoder
import json.scanner
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from grpcgrade.core.config import HttpConfig

log = logging.getLogger("grpcgrade.http")
T = TypeVar("T")

#: Bodies up to this size are parsed on the loop by the C decoder: a few milliseconds at worst.
INLINE_PARSE_BYTES = 16 * 1024
#: JSON nested deeper than this is refused (protobuf's Struct limit is the same).
MAX_JSON_DEPTH = 100
#: Arrays and objects a large body may hold. Each is a Python object the garbage collector then walks on
#: every full collection, holding the GIL (and so the event loop) throughout; trainers' bodies hold text.
MAX_JSON_CONTAINERS = 100_000
#: Threads parsing large bodies at once; more wait their turn (each holds the GIL a share of the time).
PARSE_THREADS = 2

_parsers = ThreadPoolExecutor(max_workers=PARSE_THREADS, thread_name_prefix="grpcgrade-http-json")


class BodyError(ValueError):
    """A body a face cannot take; `status` is the HTTP status (400, 408 or 413), each face answers it in
    its own error format."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def _bytecode_decoder() -> json.JSONDecoder:
    """The standard library's decoder with its pure-Python scanner (the C one holds the GIL throughout),
    counting the arrays and objects it makes: past MAX_JSON_CONTAINERS it stops (413)."""
    decoder = json.JSONDecoder()
    made = 0

    def counted(parse: Callable[..., Any]) -> Callable[..., Any]:
        def parse_counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal made
            made += 1
            if made > MAX_JSON_CONTAINERS:
                raise BodyError(f"the request body has more than {MAX_JSON_CONTAINERS} arrays and objects", 413)
            return parse(*args, **kwargs)

        return parse_counted

    # py_make_scanner reads these from the decoder once, when it is made.
    decoder.parse_object = counted(decoder.parse_object)  # type: ignore[attr-defined]  # the stubs omit them
    decoder.parse_array = counted(decoder.parse_array)  # type: ignore[attr-defined]  # the stubs omit them
    decoder.parse_string = json.decoder.py_scanstring  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


def depth_within(value: Any, limit: int) -> bool:
    """True when `value` nests at most `limit` containers deep (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True


def json_size(value: Any) -> int:
    """The UTF-8 size of `value` as compact JSON, encoded by the pure-Python encoder (`iterencode` without
    one-shot), piece by piece: no single C call on a large value."""
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)
    return sum(len(piece.encode("utf-8", errors="surrogatepass")) for piece in encoder.iterencode(value))


def parse_body(raw: bytes, sized: Sequence[str] = ()) -> tuple[Any, dict[str, int]]:
    """The body as JSON, and the JSON size of each of its top-level `sized` fields present; BodyError
    naming what is wrong. Runs on the loop only for small bodies (`read_json`)."""
    too_deep = BodyError(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        text = raw.decode("utf-8")
        body = json.loads(text) if len(raw) <= INLINE_PARSE_BYTES else _bytecode_decoder().decode(text)
    except RecursionError:  # nesting past the interpreter's limit: a bad body, not the server's trouble
        raise too_deep from None
    except BodyError:
        raise
    except ValueError:
        raise BodyError("the request body is not valid JSON") from None
    # fewer brackets than the limit cannot nest past it: counted in C, no walk (most bodies are shallow)
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and not depth_within(body, MAX_JSON_DEPTH):
        raise too_deep
    sizes = {key: json_size(body[key]) for key in sized if isinstance(body, dict) and key in body}
    return body, sizes


async def read_body(request: web.Request, http: HttpConfig) -> bytes:
    """The body's bytes: 413 before reading one whose declared length is over the limit, 408 when it does
    not arrive within the body timeout (a client trickling it would hold its connection and memory)."""
    declared = request.content_length
    if declared is not None and declared > http.max_body_bytes:
        raise BodyError(too_large(declared, http.max_body_bytes), status=413)
    if request.content.is_eof():  # the whole body arrived with the head: nothing to wait for, no timer
        return await request.read()
    try:
        async with asyncio.timeout(http.body_timeout_seconds):  # a timer; wait_for would add a task too
            return await request.read()
    except TimeoutError:
        raise BodyError(f"the request body did not arrive within {http.body_timeout_seconds:g} s", 408) from None
    except web.HTTPRequestEntityTooLarge:  # a chunked body, stopped by client_max_size as it passed the limit
        raise BodyError(too_large(None, http.max_body_bytes), status=413) from None


def too_large(size: int | None, limit: int) -> str:
    sent = f"{size} bytes" if size is not None else "a request body"
    return f"{sent}, over the HTTP face's limit http.max_body_bytes={limit}"


async def read_json(request: web.Request, http: HttpConfig, sized: Sequence[str] = ()) -> tuple[Any, dict[str, int]]:
    """The request's body parsed (`parse_body`), off the loop when it is large."""
    raw = await read_body(request, http)
    if len(raw) <= INLINE_PARSE_BYTES:
        return parse_body(raw, sized)
    return await asyncio.get_running_loop().run_in_executor(_parsers, parse_body, raw, tuple(sized))


async def off_loop(request: web.Request, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the parsing threads: for the walks over a large body a face makes after parsing. A
    body small enough to parse on the loop (`INLINE_PARSE_BYTES`) is walked there too: a thread's round trip
    costs more than a one-sample body's walk (a crowd of one-sample posts spent a fifth of the loop on it)."""
    size = request.content_length
    if size is not None and size <= INLINE_PARSE_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(_parsers, fn, *args)


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

    async def start(self, runner: web.AppRunner, host: str, port: int) -> int:
        """Listen on host:port (0: a free one) for `runner`, set up already; returns the port."""
        self.runner = runner
        loop = asyncio.get_running_loop()
        # A listen backlog as deep as the connection cap (the kernel caps it at net.core.somaxconn): with
        # asyncio's default of 100, a crowd connecting at once overflows it and the kernel drops their SYNs,
        # which the callers resend only after 1, 3, 7... s (4,000 callers: 352 calls/s, the slowest answered
        # after 55 s).
        self._listener = await loop.create_server(
            self._protocol, host, port, reuse_address=True, backlog=self.http.max_connections
        )
        return int(self._listener.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop accepting (the runner's cleanup then ends the open connections)."""
        if self._listener is not None:
            self._listener.close()


#: aiohttp's limits on a request head (its defaults, stated here so that docs/security.md can list them).
HEAD_LIMITS = {"max_line_size": 8190, "max_field_size": 8190, "max_headers": 128}


def mark_head_arrived(request: web.Request) -> None:
    """Called for every request that reached the application: its connection's head timer stops."""
    if isinstance(request.protocol, _Connection):
        request.protocol.head_arrived()
