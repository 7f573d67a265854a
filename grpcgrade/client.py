"""Python clients: `GradingClient` (blocking) and `AsyncGradingClient` (asyncio, with `Coalescer` for callers
that grade sample by sample). The trainers' reward functions are built on them in grpcgrade.integrations
(TRL's `reward_function` is also `grpcgrade.reward_function`); the clients never import those.

Every call carries a deadline. UNAVAILABLE (and a draining server's CANCELLED) is retried by gRPC's own
retry policy (service config), and with several addresses or a `dns:///` name the channel balances
round-robin over the replicas, so a retried call lands on another one. Large batches are split into
chunks, several in flight, and the results come back in input order.

The reward guard's options (docs/reward-guard.md) go with each call: `budget_seconds` is the whole call's,
so each chunk's request carries the time left when it is sent; `max_failure_ratio` applies to each chunk's
request on its own; `cache` to all of them. A call ended by its failure budget raises `FailureBudgetExceeded`.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import math
import numbers
import queue
import re
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, cast

import grpc
import grpc.experimental
from google.protobuf.json_format import MessageToDict

from grpcgrade.service.convert import SampleColumns as SampleColumns  # a batch as columns: the cheapest to send
from grpcgrade.service.convert import (
    add_samples,
    as_columns,
    check_samples,
    graders_list,
    sample_to_pb,
    specs_to_pb,
    unsendable,
    unsent_rows,
)

from .batch_scores import BatchScores as BatchScores  # what batch_scores returns
from .core.admission import PUSHBACK_KEY as PUSHBACK_KEY  # a refusal for load's retry hint (docs/security.md)
from .core.context import CALLER_HEADER
from .core.errors import UnsendableSample as UnsendableSample  # a sample the client cannot send
from .core.retry import backoff
from .errors import FailureBudgetExceeded as FailureBudgetExceeded
from .errors import GradingError as GradingError
from .errors import ServerUnavailable, typed
from .gc_pause import DEFAULT_SECONDS as GC_PAUSE_SECONDS
from .gc_pause import paused as gc_paused
from .gc_pause import resume as gc_resume
from .v1 import grading_pb2 as pb
from .v1 import grading_pb2_grpc as pb_grpc

log = logging.getLogger("grpcgrade.client")

SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": "grpcgrade.v1.GradingService"}],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.1s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                # CANCELLED too: a draining server cancels calls that reached it but no handler yet
                # (grpc/grpc#41785); they never ran, so a retry on another replica is safe.
                "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
            },
        }
    ],
}

#: How long a coalescer waits for more samples after the first one of a batch (seconds).
DEFAULT_LINGER = 0.005
#: The most samples one coalesced BatchEvaluate carries; a full batch leaves at once.
DEFAULT_MAX_BATCH = 1024

Target = str | Sequence[str]
Graders = Iterable[str | Mapping[str, Any] | pb.GraderSpec] | None
Progress = Callable[[int, int], None]
#: A call's answers put in place: (index of the call's first sample, its streamed messages) -> samples placed.
Place = Callable[[int, Iterable[pb.BatchEvaluateResponse]], int]
#: The reward guard's options of a call: budget_seconds, max_failure_ratio, cache.
Guards = tuple[float, "float | None", "Cache"]
#: A call's use of the server's result cache: "on", "off", None (the server's default per grader) or the enum.
Cache = str | int | None  # int: a grading_pb2.CacheMode value
CACHE_MODES: dict[str | None, pb.CacheMode] = {
    None: pb.CACHE_MODE_UNSPECIFIED,
    "on": pb.CACHE_MODE_ON,
    "off": pb.CACHE_MODE_OFF,
}
#: The budget a chunk's request carries when the call's budget ran out before it was sent: the smallest
#: positive one (0 would mean no budget at all), so the server answers every sample BUDGET_EXCEEDED at once.
SPENT_BUDGET = math.ulp(0.0)


def cache_mode(cache: Cache) -> pb.CacheMode:
    """`cache=` as the request's enum; ValueError for anything else."""
    if isinstance(cache, int) and not isinstance(cache, bool) and cache in pb.CacheMode.values():
        return cast("pb.CacheMode", cache)
    if (cache is None or isinstance(cache, str)) and cache in CACHE_MODES:
        return CACHE_MODES[cache]
    raise ValueError(f"cache must be 'on', 'off', None or a grading_pb2.CacheMode, not {cache!r}")


#: How long a call keeps retrying while the server answers UNAVAILABLE (it is down, restarting, or not there
#: yet) before it raises `ServerUnavailable`: a rolling restart must not end a training run. Per client:
#: `unavailable_seconds=`.
DEFAULT_UNAVAILABLE_SECONDS = 60.0
#: The pause between those retries grows from the first to the last value (doubling).
RETRY_PAUSES = (0.2, 2.0)


def _retrying(method: Callable[..., Any]) -> Callable[..., Any]:
    """A client method whose grpc errors are raised as the `GradingError` family, and whose call is made again
    while the server is unavailable, for up to the client's `unavailable_seconds`."""

    @functools.wraps(method)
    def call(self: _Base, *args: Any, **kwargs: Any) -> Any:
        pause, deadline = RETRY_PAUSES[0], None
        while True:
            try:
                return method(self, *args, **kwargs)
            except grpc.RpcError as exc:
                error = typed(exc, self.target)
                deadline = self._retry_or_raise(error, deadline, pause)
            time.sleep(pause)
            pause = min(pause * 2, RETRY_PAUSES[1])

    return call


def _aretrying(method: Callable[..., Any]) -> Callable[..., Any]:
    """`_retrying` for the asyncio client's coroutine methods."""

    @functools.wraps(method)
    async def call(self: _Base, *args: Any, **kwargs: Any) -> Any:
        pause, deadline = RETRY_PAUSES[0], None
        while True:
            try:
                return await method(self, *args, **kwargs)
            except grpc.RpcError as exc:
                error = typed(exc, self.target)
                deadline = self._retry_or_raise(error, deadline, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_PAUSES[1])

    return call


def _pushback(exc: grpc.RpcError) -> Any:
    """The retry hint of a RESOURCE_EXHAUSTED refusal, None for any other error or a refusal without one."""
    code, trailers = getattr(exc, "code", None), getattr(exc, "trailing_metadata", None)
    if not callable(code) or code() != grpc.StatusCode.RESOURCE_EXHAUSTED or not callable(trailers):
        return None
    return next((v for k, v in trailers() or () if k == PUSHBACK_KEY), None)


def refusal_pause(exc: grpc.RpcError, attempt: int, deadline: float) -> float | None:
    """How long to wait before sending again a call the server refused for load (RESOURCE_EXHAUSTED with
    its retry hint: nothing of it was graded), backing off from the hint with jitter as attempts go on; None
    for any other error, or when the pause would pass `deadline` (`time.monotonic()`)."""
    hint = _pushback(exc)
    try:
        seconds = int(hint) / 1000 if hint is not None else -1.0
    except ValueError:
        return None
    if seconds < 0:  # no hint (another RESOURCE_EXHAUSTED), or the server says not to retry
        return None
    pause = backoff(attempt, max(seconds, 0.001), after=seconds / 2)
    return pause if time.monotonic() + pause < deadline else None


#: The views a one-chunk call is asked for in one message (`BatchEvaluateUnary`): scores and errors only, so
#: the answer is small; a full view's reasons and metadata can be long, and stream in parts.
UNARY_VIEWS = frozenset((pb.RESULT_VIEW_COLUMNS, pb.RESULT_VIEW_SCORES))


def unary_refused(exc: grpc.RpcError) -> bool:
    """Whether a BatchEvaluateUnary call is to be made again as BatchEvaluate: the server is older than it
    (UNIMPLEMENTED), or the answer was over one message (RESOURCE_EXHAUSTED without a retry hint; a request
    over the batch limit is refused the same way then, and that refusal is raised)."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    return code == grpc.StatusCode.UNIMPLEMENTED or (
        code == grpc.StatusCode.RESOURCE_EXHAUSTED and _pushback(exc) is None
    )


def set_guards(
    request: pb.BatchEvaluateRequest,
    started: float,
    budget_seconds: float,
    max_failure_ratio: float | None,
    cache: Cache,
) -> None:
    """The reward guard's fields of one chunk's request: the budget left of the call started at `started`
    (`time.monotonic()`), the failure ratio, the cache mode. Out-of-range values go as they are: the server
    refuses them, naming the field."""
    if budget_seconds > 0 and math.isfinite(budget_seconds):
        request.budget_seconds = max(budget_seconds - (time.monotonic() - started), SPENT_BUDGET)
    else:
        request.budget_seconds = budget_seconds
    if max_failure_ratio is not None:
        request.max_failure_ratio = max_failure_ratio
    request.cache = cache_mode(cache)


#: How far past a call's budget its deadline falls at the least: time for the server to answer the samples
#: the budget cut, and for the answer to travel back, before a deadline would fail them all.
BUDGET_ANSWER_SECONDS = 5.0


def call_timeout(request: pb.BatchEvaluateRequest, timeout: float) -> float:
    """A chunk's call deadline: the client's `timeout`, or the budget left plus `BUDGET_ANSWER_SECONDS` when
    that is later, so that the budget ends the step (the samples not graded come back BUDGET_EXCEEDED, the
    rest with their scores) and not the deadline, which fails every sample of the call."""
    budget = request.budget_seconds
    if budget > 0 and math.isfinite(budget):
        return max(timeout, budget + BUDGET_ANSWER_SECONDS)
    return timeout


def channel_target(target: Target) -> str:
    """One address, a gRPC name (`dns:///svc:50051`), or several addresses balanced round-robin. An
    `http://host:port` URL (what an HTTP habit writes) is its `host:port`; an `https://` one is refused:
    TLS is the client's `credentials=`, not a scheme. ValueError naming the target for anything else: gRPC
    would take `localhost` (no port) as port 443 and retry a malformed one until `unavailable_seconds`."""
    if isinstance(target, str):
        return _address(target)
    addresses = [_address(a) for a in target]
    if len(addresses) == 1:
        return addresses[0]
    return _balanced(addresses)


#: gRPC's own name schemes (`dns:///name:port`, `unix:/path`, `ipv4:a:p,b:p`...): such a target goes as it is.
GRPC_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:", "xds:", "google-c2p:")
#: A target written `host:port` or `[ipv6]:port`: the host, the port.
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+(?:%[\w.-]+)?\]|[A-Za-z0-9_.-]+):(\d+)")


def _address(target: str) -> str:
    if target.startswith("http://"):
        target = target[len("http://") :].rstrip("/")
    if target.startswith("https://"):
        raise ValueError(
            f"grpcgrade: target {target!r} is an HTTPS URL; give host:port and TLS as credentials= "
            "(grpcgrade.client.tls_credentials)"
        )
    if target.startswith(GRPC_SCHEMES):
        return target
    host_port = _HOST_PORT.fullmatch(target)
    if host_port is None:
        raise ValueError(
            f"grpcgrade: target {target!r} is not host:port, [ipv6]:port or a gRPC name (dns:///host:port, unix:/path)"
        )
    if not 1 <= int(host_port[2]) <= 65535:
        # gRPC takes the port modulo 65536: localhost:99999 would reach whatever listens on 34463
        raise ValueError(f"grpcgrade: target {target!r}: the port must be from 1 to 65535")
    return target


def _balanced(addresses: list[str]) -> str:
    """Several addresses as one gRPC target, balanced round-robin. gRPC lists only IP addresses of one
    family (`ipv4:a:p,b:p`, `ipv6:[a]:p,[b]:p`), so a name is resolved here, once, when the client is made
    (every address it has; IPv4 when each name has one): for a set of servers that changes, give one DNS
    name instead. ValueError for a gRPC name in the list or a name that does not resolve."""
    found: list[list[ipaddress.IPv4Address | ipaddress.IPv6Address]] = []
    ports = []
    for address in addresses:
        host_port = _HOST_PORT.fullmatch(address)
        if host_port is None:
            raise ValueError(f"grpcgrade: target {address!r}: a list holds host:port addresses, not gRPC names")
        host, port = host_port[1].strip("[]").partition("%")[0], host_port[2]
        try:
            ips = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
            except OSError as exc:
                raise ValueError(
                    f"grpcgrade: target {address!r} in the list: {host!r} does not resolve ({exc})"
                ) from None
            ips = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
        found.append(ips)
        ports.append(port)
    for version, scheme in ((4, "ipv4:"), (6, "ipv6:")):
        if all(any(ip.version == version for ip in ips) for ips in found):
            listed = (
                f"{ip}:{port}" if version == 4 else f"[{ip}]:{port}"
                for ips, port in zip(found, ports, strict=True)
                for ip in ips
                if ip.version == version
            )
            return scheme + ",".join(dict.fromkeys(listed))
    raise ValueError(f"grpcgrade: targets {addresses!r} mix IPv4 and IPv6 addresses, which gRPC cannot balance")


def channel_options(max_message_bytes: int, server_name: str | None = None) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
        ("grpc.enable_retries", 1),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 60_000),
    ]
    if server_name:  # the name the server's certificate is checked against, when it is not the address's
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


def tls_credentials(
    ca: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None
) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files: trust `ca` (None: the system's roots) and, for mutual TLS,
    present the client certificate `cert` with its private key `key`."""
    if bool(cert) != bool(key):
        raise ValueError("a client certificate needs its key and a key its certificate (give both, or neither)")
    return grpc.ssl_channel_credentials(
        Path(ca).read_bytes() if ca else None,
        Path(key).read_bytes() if key else None,
        Path(cert).read_bytes() if cert else None,
    )


def read_token(path: str | Path) -> str:
    """The bearer token in a file: its first non-empty line (a server's token file also works)."""
    for line in Path(path).read_text().splitlines():
        if line.strip():
            return line.strip()
    raise ValueError(f"{path}: the token file holds no token")


def result_to_dict(response: pb.EvaluateResponse) -> dict[str, Any]:
    """An EvaluateResponse as plain data (what `grpcgrade eval` writes)."""
    data = MessageToDict(response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    if not response.HasField("reward"):
        data["reward"] = None
    return data


def _chunks(items: Sequence[Any], size: int) -> list[tuple[int, Sequence[Any]]]:
    return [(start, items[start : start + size]) for start in range(0, len(items), size)]


LINGER_SECONDS = 0.5  # a part-filled chunk is sent once the input has paused this long
_TICK = 0.1  # how often an idle stream lets finished chunks through
_END = object()


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _lazy_chunks(samples: Iterable[Any], size: int, linger: float) -> Iterator[list[Any]]:
    """Chunks of `samples`, read by a thread into a bounded queue: full ones, part-filled ones once the input
    pauses for `linger` seconds, and empty ones every _TICK while nothing arrives (the caller's moment to
    hand on finished results). What iterating `samples` raises is raised here."""
    inbox: queue.Queue[Any] = queue.Queue(maxsize=size)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                inbox.put(item, timeout=_TICK)
                return True
            except queue.Full:
                continue
        return False

    def feed() -> None:
        try:
            for sample in samples:
                if not put(sample):
                    return
        except BaseException as exc:  # handed to the consumer, which raises it
            put(_Raised(exc))
            return
        put(_END)

    threading.Thread(target=feed, name="grpcgrade-samples", daemon=True).start()
    chunk: list[Any] = []
    waited = 0.0
    try:
        while True:
            try:
                item = inbox.get(timeout=_TICK)
            except queue.Empty:
                waited += _TICK
                if chunk and waited >= linger:
                    yield chunk
                    chunk, waited = [], 0.0
                else:
                    yield []
                continue
            if item is _END:
                break
            if isinstance(item, _Raised):
                raise item.exc
            chunk.append(item)
            waited = 0.0
            if len(chunk) >= size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk
    finally:
        stop.set()


def _seconds(name: str, value: Any, *, zero: bool = False) -> float:
    """A client option of seconds: a finite number, > 0 (>= 0 with `zero`); ValueError naming it. gRPC
    took an infinite or NaN deadline as one already past (every call DEADLINE_EXCEEDED at once)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ValueError(f"{name} must be a finite number of seconds {'>= 0' if zero else '> 0'}, got {value!r}")
    return float(value)


def _count(name: str, value: Any) -> int:
    """A client option counting something: a whole number >= 1; TypeError or ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


def _header(name: str, value: Any) -> str:
    """A value sent as gRPC metadata (`token`, `caller`): printable ASCII, or gRPC fails every call INTERNAL
    ("Invalid metadata"). ValueError naming the option, never showing the value (a token is a secret)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not (value.isascii() and value.isprintable()):
        raise ValueError(f"{name} must be printable ASCII (it travels as gRPC metadata)")
    return value


class _Base:
    """What both clients share. `caller` names this client to the server (`x-grpcgrade-caller`): its calls'
    judgments take that caller's share of each judge model's limits (docs/llm-judges.md#fair-share).
    `gc_pause`: a call of several chunks holds Python's cyclic garbage collector off for at most this many
    seconds while its results arrive (0: never), so it does not walk them over and over (`gc_pause`)."""

    def __init__(
        self,
        target: Target,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        chunk_size: int = 1024,
        max_in_flight: int = 4,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        server_name: str | None = None,
        unavailable_seconds: float = DEFAULT_UNAVAILABLE_SECONDS,
        caller: str | None = None,
        gc_pause: float = GC_PAUSE_SECONDS,
    ) -> None:
        self.target = channel_target(target)
        # a multi-chunk call's seconds with Python's cyclic collector off (`gc_pause`)
        self.gc_pause = _seconds("gc_pause", gc_pause, zero=True)
        self.timeout = _seconds("timeout", timeout)
        self.unavailable_seconds = _seconds("unavailable_seconds", unavailable_seconds, zero=True)
        self.chunk_size = _count("chunk_size", chunk_size)
        self.max_in_flight = _count("max_in_flight", max_in_flight)
        max_message_bytes = _count("max_message_bytes", max_message_bytes)
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {_header('token', token)}"),) if token else ()
        )
        if caller:  # this client's share of the server's judge models (docs/llm-judges.md#fair-share)
            self._metadata += ((CALLER_HEADER, _header("caller", caller)),)
        self._credentials = credentials
        self._options = channel_options(max_message_bytes, server_name)
        self._columns_ok = True  # False once a server showed it does not read SampleColumns
        self._unary_ok = True  # False once a server showed it has no BatchEvaluateUnary

    def _deadline(self, timeout: float | None) -> float:
        """A call's seconds: its own `timeout=` (checked as the client's is), else the client's."""
        return self.timeout if not timeout else _seconds("timeout", timeout)

    def _retry_or_raise(self, error: GradingError, deadline: float | None, pause: float) -> float:
        """When the caller may try again (the server is unavailable and the client's `unavailable_seconds`
        are not spent), the time retrying ends; else raise `error`."""
        if not isinstance(error, ServerUnavailable):
            raise error from None
        now = time.monotonic()
        deadline = now + self.unavailable_seconds if deadline is None else deadline
        if now + pause > deadline:
            raise ServerUnavailable(
                error.code(),
                f"{error.details()} (no server answered for {self.unavailable_seconds:g} s of retries: "
                "the client's unavailable_seconds)",
                self.target,
            ) from None
        return deadline

    @staticmethod
    def _evaluate_request(
        sample: Mapping[str, Any] | pb.Sample, graders: Graders, reward: str, grader_timeout: float, view: pb.ResultView
    ) -> pb.EvaluateRequest:
        return pb.EvaluateRequest(
            graders=specs_to_pb(graders),
            sample=sample_to_pb(sample),
            reward=reward,
            grader_timeout_seconds=grader_timeout,
            view=view,
        )

    def _admin(self, method: str, grader: str, timeout: float | None) -> Any:
        """An AdminService call (`ListQuarantine`, `ClearQuarantine`, `ClearCache`) on this client's channel:
        its answer, or with the async client an awaitable of it."""
        from .v1 import admin_pb2, admin_pb2_grpc

        request = getattr(admin_pb2, f"{method}Request")(grader=grader)
        stub = admin_pb2_grpc.AdminServiceStub(self.channel)  # type: ignore[attr-defined]  # each client has one
        return getattr(stub, method)(request, timeout=self._deadline(timeout), metadata=self._metadata)

    @staticmethod
    def _missing(out: list[pb.EvaluateResponse | None]) -> list[pb.EvaluateResponse]:
        """Every sample must have come back; a gap is the server's bug, never silently a None."""
        missing = [i for i, r in enumerate(out) if r is None]
        if missing:
            raise RuntimeError(f"server returned no result for {len(missing)} samples (first index {missing[0]})")
        return out  # type: ignore[return-value]

    def _batch_request(
        self,
        samples: Sequence[Any],
        graders: Graders,
        reward: str,
        grader_timeout: float,
        view: pb.ResultView,
        columns: bool = True,
        request: pb.BatchEvaluateRequest | None = None,
        first: int = 0,
    ) -> pb.BatchEvaluateRequest:
        """A BatchEvaluate request, its samples as SampleColumns where they fit (and `columns`), else one
        Sample message each; written into `request` when given (a BatchEvaluateUnaryRequest's `batch`: copying
        a request into one costs three times its serialization)."""
        if request is None:
            request = pb.BatchEvaluateRequest()
        request.graders.extend(specs_to_pb(graders))
        request.reward = reward
        request.grader_timeout_seconds = grader_timeout
        request.view = view
        as_cols = as_columns(samples) if columns and self._columns_ok else None
        if as_cols is not None:
            try:
                as_cols.fill_columns(request.columns)
            except (TypeError, ValueError, OverflowError) as exc:
                raise unsendable(samples, exc, first) from None
        else:
            add_samples(request.samples, samples, first)
        return request

    @staticmethod
    def _one_per_sample(view: pb.ResultView) -> pb.ResultView:
        if view == pb.RESULT_VIEW_COLUMNS:
            raise ValueError("RESULT_VIEW_COLUMNS answers columns, not one result per sample: call batch_scores")
        return view

    def _unary(self, view: pb.ResultView, chunks: int) -> bool:
        """Whether a call of `chunks` chunks is asked for in one message (BatchEvaluateUnary): a trainer's
        step, one chunk in a view of scores (`UNARY_VIEWS`), to a server that has the method. One message
        each way costs both ends less than a stream: ~110 us of the client's CPU and ~70 of the server's a
        step (docs/performance.md, "The 8-sample step in one message")."""
        return chunks == 1 and view in UNARY_VIEWS and self._unary_ok

    def _unary_refused(self, exc: grpc.RpcError) -> bool:
        """`unary_refused`, remembering a server without the method."""
        if not unary_refused(exc):
            return False
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            self._unary_ok = False
        return True

    def _no_columns(self, request: pb.BatchEvaluateRequest, answered: int, n: int) -> bool:
        """A server older than SampleColumns ignores them and answers no sample: then this client sends
        `samples` from now on, and the caller sends this chunk again."""
        if answered or not n or not request.HasField("columns"):
            return False
        self._columns_ok = False
        return True

    @staticmethod
    def _place(out: list[pb.EvaluateResponse | None], start: int, messages: Iterable[pb.BatchEvaluateResponse]) -> int:
        n = 0
        for message in messages:
            for item in message.items:
                out[start + item.index] = item.result
                n += 1
        return n


class GradingClient(_Base):
    """A blocking client; reuse one per process (it holds one channel)."""

    def __init__(self, target: Target, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        # A BatchEvaluate stream is read by the thread that made the call, so it needs no thread of its own:
        # without this option grpc starts one per call on an idle channel (most of a small step's cost).
        options = [*self._options, (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
        if self._credentials is not None:
            self.channel = grpc.secure_channel(self.target, self._credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(self.target, options=options)
        self.stub = pb_grpc.GradingServiceStub(self.channel)

    def __enter__(self) -> GradingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    @_retrying
    def evaluate(
        self,
        sample: Mapping[str, Any] | pb.Sample,
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        view: pb.ResultView = pb.RESULT_VIEW_FULL,
        cache: Cache = None,
    ) -> pb.EvaluateResponse:
        request = self._evaluate_request(sample, graders, reward, grader_timeout, view)
        request.cache = cache_mode(cache)
        deadline = time.monotonic() + (self._deadline(timeout))
        attempt = 0
        while True:  # a refusal for load is sent again after the server's hint, until the deadline
            try:
                return self.stub.Evaluate(request, timeout=deadline - time.monotonic(), metadata=self._metadata)
            except grpc.RpcError as exc:
                pause = refusal_pause(exc, attempt, deadline)
                if pause is None:
                    raise
            time.sleep(pause)
            attempt += 1

    @_retrying
    def batch_evaluate(
        self,
        samples: Sequence[Mapping[str, Any] | pb.Sample],
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        view: pb.ResultView = pb.RESULT_VIEW_FULL,
        on_progress: Progress | None = None,
        budget_seconds: float = 0.0,
        max_failure_ratio: float | None = None,
        cache: Cache = None,
    ) -> list[pb.EvaluateResponse]:
        """One result per sample, in input order; raises grpc.RpcError if any chunk's call fails.

        `view=pb.RESULT_VIEW_SCORES` leaves out reasons and metadata: less work for both ends.
        The reward guard (docs/reward-guard.md): `budget_seconds` for the whole call (0: none), after which
        the samples not yet graded come back BUDGET_EXCEEDED; `max_failure_ratio` for each chunk's call
        (`chunk_size` samples), past which it raises `FailureBudgetExceeded`; `cache` "on"/"off"/None."""
        out: list[pb.EvaluateResponse | None] = [None] * len(samples)
        place = functools.partial(self._place, out)
        guards = (budget_seconds, max_failure_ratio, cache)
        self._each_chunk(
            samples, graders, reward, self._one_per_sample(view), grader_timeout, timeout, guards, place, on_progress
        )
        return self._missing(out)

    @_retrying
    def batch_scores(
        self,
        samples: Sequence[Mapping[str, Any] | pb.Sample] | SampleColumns,
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        on_progress: Progress | None = None,
        budget_seconds: float = 0.0,
        max_failure_ratio: float | None = None,
        cache: Cache = None,
    ) -> BatchScores:
        """The batch's rewards and scores as columns (`BatchScores`: None where a grader failed): a trainer's
        call, the least work on both ends. Samples travel as SampleColumns where they can (columns, or dicts
        of text fields) and results as RESULT_VIEW_COLUMNS; pointwise graders only (INVALID_ARGUMENT for a
        listwise one). Options as for `batch_evaluate`.

        A sample the client cannot send (`UnsendableSample`: a lone surrogate in a text...) is masked, not
        an error, as a trainer needs: its reward and scores are None, why in `unsent`, and a warning is
        logged; the others are graded (sent again without it, should it have been found mid-batch)."""
        options = (graders, reward, timeout, grader_timeout, on_progress, (budget_seconds, max_failure_ratio, cache))
        try:
            return self._scores(samples, *options)
        except UnsendableSample:
            unsent, rows = _unsent(samples)
            if not unsent:
                raise
            return self._scores([samples[i] for i in rows], *options).spread(rows, len(samples), unsent)

    def _scores(
        self,
        samples: Sequence[Any],
        graders: Graders,
        reward: str,
        timeout: float | None,
        grader_timeout: float,
        on_progress: Progress | None,
        guards: Guards,
    ) -> BatchScores:
        table = BatchScores(len(samples))
        view = pb.RESULT_VIEW_COLUMNS
        self._each_chunk(samples, graders, reward, view, grader_timeout, timeout, guards, table.add, on_progress)
        return table.check()

    def _each_chunk(
        self,
        samples: Sequence[Any],
        graders: Graders,
        reward: str,
        view: pb.ResultView,
        grader_timeout: float,
        timeout: float | None,
        guards: Guards,
        place: Place,
        on_progress: Progress | None,
    ) -> None:
        """Every `chunk_size` samples as one BatchEvaluate call, `max_in_flight` at once; `place(start,
        messages)` puts a call's answers where they belong and says how many it placed. A one-chunk batch
        is called on this thread (no thread pool: a small step's fixed cost). A server older than columns is
        sent the chunk again as `samples` (see `_no_columns`)."""
        check_samples(samples)
        graders = graders_list(graders)
        done = 0
        lock = threading.Lock()
        started = time.monotonic()

        def answers(wrapped: pb.BatchEvaluateUnaryRequest, deadline: float, unary: bool) -> Iterator[Any]:
            if unary:
                yield self.stub.BatchEvaluateUnary(wrapped, timeout=deadline, metadata=self._metadata).answer
            else:
                yield from self.stub.BatchEvaluate(wrapped.batch, timeout=deadline, metadata=self._metadata)

        def run(start: int, part: Sequence[Any], columns: bool = True, attempt: int = 0, unary: bool = False) -> None:
            nonlocal done
            wrapped = pb.BatchEvaluateUnaryRequest()  # the request is written in place, for either method
            request = self._batch_request(part, graders, reward, grader_timeout, view, columns, wrapped.batch, start)
            set_guards(request, started, *guards)
            deadline = call_timeout(request, self._deadline(timeout))
            try:
                got = place(start, answers(wrapped, deadline, unary))
            except grpc.RpcError as exc:
                if unary and self._unary_refused(exc):
                    run(start, part, columns, attempt)  # as BatchEvaluate
                    return
                pause = refusal_pause(exc, attempt, started + deadline)
                if pause is None:
                    raise typed(exc, self.target) from None
                time.sleep(pause)  # refused for load before anything was graded: sent again
                run(start, part, columns, attempt + 1, unary)
                return
            if self._no_columns(request, got, len(part)):
                run(start, part, columns=False)
                return
            with lock:
                done += got
                if on_progress:
                    on_progress(done, len(samples))

        chunks = _chunks(samples, self.chunk_size)
        if len(chunks) <= 1:
            for start, part in chunks:
                run(start, part, unary=self._unary(view, len(chunks)))
            return
        with ThreadPoolExecutor(min(self.max_in_flight, len(chunks))) as executor, gc_paused(self.gc_pause) as left:
            futures = [executor.submit(run, s, p) for s, p in chunks]
            if left is not None:  # the collector back on when the pause's time is up, however long the call runs
                ended, running = wait(futures, timeout=left, return_when=FIRST_EXCEPTION)
                if running and not any(future.exception() for future in ended):  # time up, the call runs on
                    gc_resume()
            for future in futures:
                future.result()

    def evaluate_stream(
        self,
        samples: Iterable[Mapping[str, Any] | pb.Sample],
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        view: pb.ResultView = pb.RESULT_VIEW_FULL,
        linger: float = LINGER_SECONDS,
        on_progress: Callable[[int], None] | None = None,
    ) -> Generator[pb.EvaluateResponse, None, None]:
        """One result per sample, in input order, yielded as soon as it and those before it are back.

        `samples` is read lazily, so it may be a generator over a file of any size: at most
        2 x max_in_flight chunks are held. A chunk is sent when it is full, or once the input has paused for
        `linger` seconds, so a slow producer sees results before it ends. `on_progress(n)` is called (from
        a worker thread) as each streamed message of n results arrives. Raises grpc.RpcError if a call fails,
        and whatever iterating `samples` raises."""
        graders = graders_list(graders)
        view = self._one_per_sample(view)
        lock = threading.Lock()
        calls: set[Any] = set()  # the streams in flight, cancelled if the caller stops early or one fails
        stopped = threading.Event()

        def run(part: list[Any], start: int) -> list[pb.EvaluateResponse]:
            out: list[pb.EvaluateResponse | None] = [None] * len(part)
            request = self._batch_request(part, graders, reward, grader_timeout, view, columns=False, first=start)
            stream = self.stub.BatchEvaluate(request, timeout=self._deadline(timeout), metadata=self._metadata)
            with lock:
                calls.add(stream)
                if stopped.is_set():
                    stream.cancel()
            try:
                for message in stream:
                    got = self._place(out, 0, [message])
                    if on_progress:
                        with lock:
                            on_progress(got)
            finally:
                with lock:
                    calls.discard(stream)
            return self._missing(out)

        pending: deque[Future[list[pb.EvaluateResponse]]] = deque()
        executor = ThreadPoolExecutor(self.max_in_flight)
        finished = False
        start = 0  # the next chunk's first sample, counted from the stream's start
        try:
            for part in _lazy_chunks(samples, self.chunk_size, linger):
                if part:
                    pending.append(executor.submit(run, part, start))
                    start += len(part)
                while pending and (pending[0].done() or len(pending) > 2 * self.max_in_flight):
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
            finished = True
        except grpc.RpcError as exc:
            raise typed(exc, self.target) from None
        finally:
            if not finished:  # an error, or the caller stopped reading: nothing more is wanted
                for future in pending:
                    future.cancel()
                with lock:
                    stopped.set()
                    for call in calls:
                        call.cancel()
            executor.shutdown(wait=True)

    @_retrying
    def list_graders(self, *, timeout: float | None = None) -> pb.ListGradersResponse:
        return self.stub.ListGraders(pb.ListGradersRequest(), timeout=self._deadline(timeout), metadata=self._metadata)

    def wait_ready(self, timeout: float) -> None:
        """Block until the channel is connected; ConnectionError naming the target after `timeout` seconds."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise ConnectionError(f"no grpcgrade server reachable at {self.target} within {timeout:g} s") from None

    @_retrying
    def check(self, graders: Graders = None, reward: str = "", *, timeout: float | None = None) -> None:
        """Ask the server to resolve `graders` or `reward` without grading anything (a BatchEvaluate of no
        samples): an unknown name or bad params raise grpc.RpcError (NOT_FOUND, INVALID_ARGUMENT) now."""
        request = self._batch_request([], graders_list(graders), reward, 0.0, pb.RESULT_VIEW_SCORES)
        for _ in self.stub.BatchEvaluate(request, timeout=self._deadline(timeout), metadata=self._metadata):
            pass

    # -- administration (AdminService, on the same channel and token) --------------------------------

    @_retrying
    def list_quarantine(self, grader: str = "", *, timeout: float | None = None) -> Any:
        """The server's quarantined inputs (an `admin_pb2.ListQuarantineResponse`), or only `grader`'s."""
        return self._admin("ListQuarantine", grader, timeout)

    @_retrying
    def clear_quarantine(self, grader: str = "", *, timeout: float | None = None) -> int:
        """Forget the quarantined inputs (or only `grader`'s) so they are graded again; how many there were."""
        return int(self._admin("ClearQuarantine", grader, timeout).cleared)

    @_retrying
    def clear_cache(self, grader: str = "", *, timeout: float | None = None) -> int:
        """Forget the cached results (or only `grader`'s) so their inputs are graded again; how many there were."""
        return int(self._admin("ClearCache", grader, timeout).cleared)


class AsyncGradingClient(_Base):
    """An asyncio client; create it inside the running event loop."""

    def __init__(self, target: Target, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        if self._credentials is not None:
            self.channel = grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
        else:
            self.channel = grpc.aio.insecure_channel(self.target, options=self._options)
        self.stub = pb_grpc.GradingServiceStub(self.channel)

    async def __aenter__(self) -> AsyncGradingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def wait_ready(self, timeout: float) -> None:
        """Wait until the channel is connected; ConnectionError naming the target after `timeout` seconds."""
        try:
            await asyncio.wait_for(self.channel.channel_ready(), timeout)
        except TimeoutError:
            raise ConnectionError(f"no grpcgrade server reachable at {self.target} within {timeout:g} s") from None

    @_aretrying
    async def check(self, graders: Graders = None, reward: str = "", *, timeout: float | None = None) -> None:
        """Ask the server to resolve `graders` or `reward` without grading anything (a BatchEvaluate of no
        samples): an unknown name or bad params raise grpc.RpcError (NOT_FOUND, INVALID_ARGUMENT) now."""
        request = self._batch_request([], graders_list(graders), reward, 0.0, pb.RESULT_VIEW_SCORES)
        async for _ in self.stub.BatchEvaluate(request, timeout=self._deadline(timeout), metadata=self._metadata):
            pass

    @_aretrying
    async def evaluate(
        self,
        sample: Mapping[str, Any] | pb.Sample,
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        view: pb.ResultView = pb.RESULT_VIEW_FULL,
        cache: Cache = None,
    ) -> pb.EvaluateResponse:
        request = self._evaluate_request(sample, graders, reward, grader_timeout, view)
        request.cache = cache_mode(cache)
        deadline = time.monotonic() + (self._deadline(timeout))
        attempt = 0
        while True:  # a refusal for load is sent again after the server's hint, until the deadline
            try:
                return await self.stub.Evaluate(request, timeout=deadline - time.monotonic(), metadata=self._metadata)
            except grpc.RpcError as exc:
                pause = refusal_pause(exc, attempt, deadline)
                if pause is None:
                    raise
            await asyncio.sleep(pause)
            attempt += 1

    @_aretrying
    async def batch_evaluate(
        self,
        samples: Sequence[Mapping[str, Any] | pb.Sample],
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        view: pb.ResultView = pb.RESULT_VIEW_FULL,
        on_progress: Progress | None = None,
        budget_seconds: float = 0.0,
        max_failure_ratio: float | None = None,
        cache: Cache = None,
    ) -> list[pb.EvaluateResponse]:
        """`GradingClient.batch_evaluate`, awaited (the reward guard's options as there)."""
        out: list[pb.EvaluateResponse | None] = [None] * len(samples)
        place = functools.partial(self._place, out)
        guards = (budget_seconds, max_failure_ratio, cache)
        view = self._one_per_sample(view)
        await self._each_chunk(samples, graders, reward, view, grader_timeout, timeout, guards, place, on_progress)
        return self._missing(out)

    @_aretrying
    async def batch_scores(
        self,
        samples: Sequence[Mapping[str, Any] | pb.Sample] | SampleColumns,
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        on_progress: Progress | None = None,
        budget_seconds: float = 0.0,
        max_failure_ratio: float | None = None,
        cache: Cache = None,
    ) -> BatchScores:
        """`GradingClient.batch_scores`, awaited."""
        options = (graders, reward, timeout, grader_timeout, on_progress, (budget_seconds, max_failure_ratio, cache))
        try:
            return await self._scores(samples, *options)
        except UnsendableSample:
            unsent, rows = _unsent(samples)
            if not unsent:
                raise
            return (await self._scores([samples[i] for i in rows], *options)).spread(rows, len(samples), unsent)

    async def _scores(
        self,
        samples: Sequence[Any],
        graders: Graders,
        reward: str,
        timeout: float | None,
        grader_timeout: float,
        on_progress: Progress | None,
        guards: Guards,
    ) -> BatchScores:
        table = BatchScores(len(samples))
        view = pb.RESULT_VIEW_COLUMNS
        await self._each_chunk(samples, graders, reward, view, grader_timeout, timeout, guards, table.add, on_progress)
        return table.check()

    async def _each_chunk(
        self,
        samples: Sequence[Any],
        graders: Graders,
        reward: str,
        view: pb.ResultView,
        grader_timeout: float,
        timeout: float | None,
        guards: Guards,
        place: Place,
        on_progress: Progress | None,
    ) -> None:
        """`GradingClient._each_chunk` on this event loop, each message placed as it arrives."""
        check_samples(samples)
        graders = graders_list(graders)
        gate = asyncio.Semaphore(self.max_in_flight)
        done = 0
        started = time.monotonic()

        async def answers(wrapped: pb.BatchEvaluateUnaryRequest, deadline: float, unary: bool) -> AsyncIterator[Any]:
            if unary:
                yield (await self.stub.BatchEvaluateUnary(wrapped, timeout=deadline, metadata=self._metadata)).answer
            else:
                stream = self.stub.BatchEvaluate(wrapped.batch, timeout=deadline, metadata=self._metadata)
                async for message in stream:
                    yield message

        async def run(
            start: int, part: Sequence[Any], columns: bool = True, attempt: int = 0, unary: bool = False
        ) -> None:
            nonlocal done
            pause = None
            again = False  # refused as BatchEvaluateUnary: sent as BatchEvaluate
            async with gate:
                wrapped = pb.BatchEvaluateUnaryRequest()  # the request is written in place, for either method
                request = self._batch_request(
                    part, graders, reward, grader_timeout, view, columns, wrapped.batch, start
                )
                set_guards(request, started, *guards)
                deadline = call_timeout(request, self._deadline(timeout))
                got = 0
                try:
                    async for message in answers(wrapped, deadline, unary):
                        placed = place(start, [message])
                        got += placed
                        done += placed
                        if on_progress:
                            on_progress(done, len(samples))
                except grpc.RpcError as exc:
                    again = unary and self._unary_refused(exc)
                    pause = refusal_pause(exc, attempt, started + deadline) if not got and not again else None
                    if pause is None and not again:
                        raise typed(exc, self.target) from None
            if again:
                await run(start, part, columns, attempt)
            elif pause is not None:  # refused for load before anything was graded: sent again
                await asyncio.sleep(pause)
                await run(start, part, columns, attempt + 1, unary)
            elif self._no_columns(request, got, len(part)):
                await run(start, part, columns=False)

        chunks = _chunks(samples, self.chunk_size)
        unary = self._unary(view, len(chunks))
        with gc_paused(self.gc_pause if len(chunks) > 1 else 0) as left:
            # the collector back on when the pause's time is up, however long the call runs
            timer = None if left is None else asyncio.get_running_loop().call_later(left, gc_resume)
            try:
                await asyncio.gather(*(run(s, p, unary=unary) for s, p in chunks))
            finally:
                if timer is not None:
                    timer.cancel()

    @_aretrying
    async def list_graders(self, *, timeout: float | None = None) -> pb.ListGradersResponse:
        return await self.stub.ListGraders(
            pb.ListGradersRequest(), timeout=self._deadline(timeout), metadata=self._metadata
        )

    @_aretrying
    async def list_quarantine(self, grader: str = "", *, timeout: float | None = None) -> Any:
        """The server's quarantined inputs (an `admin_pb2.ListQuarantineResponse`), or only `grader`'s."""
        return await self._admin("ListQuarantine", grader, timeout)

    @_aretrying
    async def clear_quarantine(self, grader: str = "", *, timeout: float | None = None) -> int:
        """Forget the quarantined inputs (or only `grader`'s) so they are graded again; how many there were."""
        return int((await self._admin("ClearQuarantine", grader, timeout)).cleared)

    @_aretrying
    async def clear_cache(self, grader: str = "", *, timeout: float | None = None) -> int:
        """Forget the cached results (or only `grader`'s) so their inputs are graded again; how many there were."""
        return int((await self._admin("ClearCache", grader, timeout)).cleared)

    def coalescer(
        self,
        graders: Graders = None,
        reward: str = "",
        *,
        linger: float = DEFAULT_LINGER,
        max_batch: int = DEFAULT_MAX_BATCH,
        grader_timeout: float = 0.0,
        view: pb.ResultView = pb.RESULT_VIEW_SCORES,
        **guards: Any,
    ) -> Coalescer:
        """One-sample calls that arrive together leave as one BatchEvaluate (see `Coalescer`); `guards`:
        `budget_seconds`, `max_failure_ratio`, `cache`, for each coalesced call."""
        return Coalescer(self, graders_list(graders), reward, linger, max_batch, grader_timeout, view, **guards)


def _unsent(samples: Sequence[Any]) -> tuple[dict[int, str], list[int]]:
    """The samples of a trainer's batch the client cannot send (by index, with why) and the rows of the
    others, once writing the batch failed; the masked ones are logged. None at fault alone: the batch as a
    whole could not be written."""
    unsent = unsent_rows(samples)
    if not unsent:
        return unsent, []
    first = next(iter(unsent.values()))
    log.warning("grpcgrade: %d of %d samples cannot be sent and are masked; %s", len(unsent), len(samples), first)
    return unsent, [i for i in range(len(samples)) if i not in unsent]


def _sendable(
    batch: list[tuple[Any, asyncio.Future[pb.EvaluateResponse]]],
) -> list[tuple[Any, asyncio.Future[pb.EvaluateResponse]]]:
    """A coalesced batch whose call could not be written: each sample the client cannot send fails its own
    caller (the error `evaluate` would have raised for it alone), and the rest are returned to be sent.
    Only after a write failed: the usual batch is written once."""
    usable = []
    for sample, future in batch:
        try:
            sample_to_pb(sample)
        except (TypeError, ValueError) as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            usable.append((sample, future))
    return usable


class Coalescer:
    """`await coalescer.evaluate(sample)` from many tasks at once: the samples that arrive within `linger`
    seconds of the first (at most `max_batch`) go to the server as one BatchEvaluate, and each caller gets
    its own sample's result. A trainer's reward loop that calls once per sample (veRL's) then costs a few
    batch calls per step instead of thousands of unary ones. If the batch call fails, every caller of that
    batch gets the error; nothing is answered twice or dropped. The reward guard's options
    (`budget_seconds`, `max_failure_ratio`, `cache`) apply to each coalesced call.
    """

    def __init__(
        self,
        client: AsyncGradingClient,
        graders: list[Any],
        reward: str,
        linger: float = DEFAULT_LINGER,
        max_batch: int = DEFAULT_MAX_BATCH,
        grader_timeout: float = 0.0,
        view: pb.ResultView = pb.RESULT_VIEW_SCORES,
        budget_seconds: float = 0.0,
        max_failure_ratio: float | None = None,
        cache: Cache = None,
    ) -> None:
        if max_batch < 1 or linger < 0:
            raise ValueError("max_batch must be >= 1 and linger >= 0")
        self.client = client
        self.graders = graders
        self.reward = reward
        self.linger = linger
        self.max_batch = max_batch
        self.grader_timeout = grader_timeout
        self.view = view
        self.guards: dict[str, Any] = {
            "budget_seconds": budget_seconds,
            "max_failure_ratio": max_failure_ratio,
            "cache": cache_mode(cache),
        }
        self._pending: list[tuple[Any, asyncio.Future[pb.EvaluateResponse]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: BatchEvaluate calls made so far (for logs and tests).
        self.batches = 0

    async def evaluate(self, sample: Mapping[str, Any] | pb.Sample) -> pb.EvaluateResponse:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[pb.EvaluateResponse] = loop.create_future()
        self._pending.append((sample, future))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)  # held until done: the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[Any, asyncio.Future[pb.EvaluateResponse]]]) -> None:
        self.batches += 1
        try:
            results = await self.client.batch_evaluate(
                [s for s, _ in batch],
                self.graders,
                self.reward,
                grader_timeout=self.grader_timeout,
                view=self.view,
                **self.guards,
            )
        except (TypeError, ValueError) as exc:  # a sample the client cannot send (`convert.sample_error`)
            usable = _sendable(batch)
            if len(usable) < len(batch):  # its caller alone gets the error; the others are sent again
                if usable:
                    await self._send(usable)
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
