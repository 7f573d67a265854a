"""Admission control: a crowd of callers is either held and answered or refused at once, never dropped.

Per-sample trainers (veRL's reward loop, slime, NeMo Gym) send thousands of calls at once. Before this,
gRPC's core queued the calls the Python server had not taken up yet and, past its own pending limit
(`grpc.server.max_pending_requests`, 1,000 soft and 3,000 hard by default), cancelled the rest: of 4,000
concurrent Evaluate calls on 2 cores, a third ended CANCELLED, with nothing to tell the caller to retry.

Now the server takes every call up (gRPC's pending limit is raised to `limits.max_pending_calls`) and
decides here, before any work, whether it holds it: while the calls being handled, the samples accepted
and not yet answered, the bytes of the requests held (gRPC messages once arrived, HTTP bodies as they
arrive: `hold`) and the process's resident memory are under their limits (`Limits`), it is admitted and
answered; past one it is refused at once with `Overloaded`, which the faces send as
RESOURCE_EXHAUSTED with `grpc-retry-pushback-ms` (HTTP: 503 with Retry-After). The Python client waits
the hint and sends the call again, until its deadline. While the server's workers cannot grade at all
(`cannot_grade`), every call is refused the same way with `CannotGrade` (UNAVAILABLE), not held until its
deadline.

Counting is plain integers on the event loop (every face runs there): no lock, a few hundred nanoseconds
a call. The memory figure is read from /proc at most every `MEMORY_READ_SECONDS`.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .errors import CannotGrade, Overloaded
from .samples import Limits

#: How stale the resident-memory figure may be: reading /proc on every call would cost more than the call.
MEMORY_READ_SECONDS = 0.1
#: The native gRPC face's bound (`limits.max_pending_calls` calls in flight on it): the face refuses past it
#: before this process sees the call, and sends how many it refused (`service.native_face`).
PENDING_CALLS = "max_pending_calls"
#: The trailer of a refusal for load: gRPC's retry hint in milliseconds (`grpc-retry-pushback-ms`, gRFC A6),
#: which gRPC's own retry policy reads; the server sends it, the Python client and the faces' link read it.
PUSHBACK_KEY = "grpc-retry-pushback-ms"
#: The bound on the requests (gRPC messages, HTTP bodies) a process holds at once (`Limits.max_pending_request_bytes`).
REQUEST_BYTES = "max_pending_request_bytes"
#: The limits a call can be refused for, as the metrics label them.
LIMITS = ("max_concurrent_calls", "max_queued_samples", "max_memory_bytes", PENDING_CALLS, REQUEST_BYTES)


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 where there is none, so the limit never refuses)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Admission:
    """The server's count of calls and queued samples against its limits; one per server, shared by the
    gRPC service and the HTTP faces."""

    def __init__(
        self,
        limits: Limits,
        memory: Callable[[], int] = resident_bytes,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.calls = 0
        self.samples = 0
        self.request_bytes = 0  # the requests of admitted calls: gRPC messages, HTTP bodies
        self.refused: Counter[str] = Counter()  # by the limit that refused
        #: Why no call can be graded now (the server's workers cannot be kept up: `Executor.trouble`), set by
        #: the server as its health check changes; None while they can. Every call is refused meanwhile.
        self.cannot_grade: str | None = None
        self._memory, self._clock = memory, clock
        self._rss, self._rss_at = 0, -MEMORY_READ_SECONDS

    def resident(self) -> int:
        now = self._clock()
        if now - self._rss_at >= MEMORY_READ_SECONDS:
            self._rss, self._rss_at = self._memory(), now
        return self._rss

    def _refuse(self, limit: str, message: str) -> Overloaded:
        self.refused[limit] += 1
        return Overloaded(limit, message, self.limits.retry_after_seconds)

    def _check_samples(self, samples: int) -> None:
        limit = self.limits.max_queued_samples
        if self.samples and self.samples + samples > limit:
            raise self._refuse(
                "max_queued_samples", f"{self.samples} samples queued, {samples} more would pass {limit}"
            )

    def enter(self, samples: int = 0, request_bytes: int = 0) -> None:
        """Admit a call of `samples` samples (0: not known yet, see `reserve`) whose request (a gRPC message,
        an HTTP body) is `request_bytes`, or raise Overloaded. Like samples, a request that finds none held is
        admitted whatever its size (up to `limits.max_message_bytes`, `http.max_body_bytes`). CannotGrade
        while `cannot_grade` says why."""
        if self.cannot_grade is not None:
            raise CannotGrade(self.cannot_grade, self.limits.retry_after_seconds)
        limits = self.limits
        if self.calls >= limits.max_concurrent_calls:
            raise self._refuse("max_concurrent_calls", f"{self.calls} calls being handled")
        if limits.max_memory_bytes and self.resident() >= limits.max_memory_bytes:
            raise self._refuse("max_memory_bytes", f"{self._rss >> 20} MiB resident")
        self._check_samples(samples)
        self.check_bytes(request_bytes)
        self.calls += 1
        self.samples += samples
        self.request_bytes += request_bytes

    def leave(self, samples: int = 0, request_bytes: int = 0) -> None:
        """A call admitted with `enter(samples, request_bytes)` has ended (answered, failed or cancelled)."""
        self.calls -= 1
        self.samples -= samples
        self.request_bytes -= request_bytes

    def hold(self, more: int, own: int = 0) -> None:
        """`more` bytes of a request that holds `own` already have arrived (an HTTP body, counted as it is
        read, so a client trickling a large declared body holds only what it sent); Overloaded past
        `max_pending_request_bytes`, unless nothing but this request is held. `leave` gives them back."""
        self.check_bytes(more, own)
        self.request_bytes += more

    def check_bytes(self, more: int, own: int = 0) -> None:
        """Overloaded when `more` bytes for a request holding `own` would pass `max_pending_request_bytes`
        while other requests hold some."""
        held, most = self.request_bytes, self.limits.max_pending_request_bytes
        if more and most and held > own and held + more > most:
            raise self._refuse(REQUEST_BYTES, f"{held} bytes of requests held, {more} more would pass {most}")

    def reserve(self, samples: int) -> None:
        """An admitted call's samples, once its body has been read (the HTTP faces); Overloaded past the
        queued-samples limit. `release` them when the call ends."""
        self._check_samples(samples)
        self.samples += samples

    def release(self, samples: int) -> None:
        self.samples -= samples

    @contextmanager
    def admitted(self, samples: int = 0) -> Iterator[None]:
        """`enter` ... `leave` around a call's handling."""
        self.enter(samples)
        try:
            yield
        finally:
            self.leave(samples)
