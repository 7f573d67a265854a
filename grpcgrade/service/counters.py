"""The counters a face process moves (HTTP or gRPC), sent to the server's process, whose /metrics serves them.

An HTTP face counts its requests (`grpcgrade_http_requests_total`), failed and unusable samples, and
failure-ratio refusals; a gRPC face counts its calls as the server's own gRPC port does (go-grpc-prometheus'
`grpc_server_*`, through `interceptors.ServiceInterceptor`); both count the calls their own admission control
refused for load (`grpcgrade_calls_refused_total`, added to the engine's process's). A face process keeps no
Prometheus registry of its own: each increment (or latency observed) is written down, and what its calls and
requests counted goes to the server's process every `BATCH_SECONDS`, summed, in one message on the face's
pipe (a message per request cost an HTTP face a pickle and a pipe write each: 6-9% of its CPU under a crowd,
py-spy). The server's
process adds them to its own counters of the same names and labels; before it answers a scrape it asks each
face for what it has counted so far (`FLUSH`, answered `FLUSHED` after the counts: `faces.FaceProcesses.drain`),
so a scrape sees every request and call answered before it began: one /metrics, as when the faces ran in the
server's process.
Per-process totals merged at scrape time (prometheus_client's multiprocess mode) would need every metric of
the server made multiprocess-aware, gauges and callbacks too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from grpcgrade.core.admission import Admission
from grpcgrade.core.coalesce import ServerCoalescer
from grpcgrade.core.grading import Stats

#: The counters a face process moves, by their `metrics.Metrics` attribute.
COUNTERS = frozenset((
    *("http_requests", "http_failed_samples", "http_unusable_samples", "failure_budget_calls"),
    *("started", "received", "sent", "handled", "calls_refused"),
))  # fmt: skip
#: The histograms a face process observes into, by their `metrics.Metrics` attribute.
HISTOGRAMS = frozenset(("handling",))

#: The coalescer's counts (`core.coalesce.ServerCoalescer.chunks`, `.samples`), sent as they grow.
COALESCED = ("chunks", "samples")

#: How long a batched face's counts wait to go to the server's process, gathering the calls of that time into
#: one message: once per event-loop turn, sending cost a gRPC face 5-6% of its CPU under a crowd (a pickle
#: and a pipe write a turn, py-spy). A scrape does not wait for it: it asks (`FLUSH`).
BATCH_SECONDS = 0.05

#: The server's process asking a face for its counts now (`(FLUSH, n)` on the face's pipe), and the face's
#: answer once they are sent (`(FLUSHED, n)`, after its counts' message).
FLUSH = "flush"
FLUSHED = "flushed"

#: One increment: (Metrics attribute, label values in the metric's order, amount or value observed).
Increment = tuple[str, tuple[str, ...], float]


class _Child:
    __slots__ = ("_counter", "_values")

    def __init__(self, counter: _Counter, values: tuple[str, ...]) -> None:
        self._counter, self._values = counter, values

    def inc(self, amount: float = 1.0) -> None:
        self._counter.sink.add((self._counter.name, self._values, amount))

    observe = inc  # a histogram's: the value observed travels as the amount


class _Counter:
    """A counter (or histogram) as the faces use one: `labels(...).inc(n)` / `.observe(v)`, or `inc(n)`
    for one without labels."""

    def __init__(self, sink: FaceCounters, name: str) -> None:
        self.sink, self.name = sink, name

    def labels(self, *values: str) -> _Child:
        return _Child(self, values)

    def inc(self, amount: float = 1.0) -> None:
        self.sink.add((self.name, (), amount))


class FaceCounters:
    """A face process's counters (the attributes of `metrics.Metrics` the faces move); `send` takes one
    message of increments (None: counted nowhere, for a face without a server's process). `batched`: what
    is counted is sent `BATCH_SECONDS` later without a `flush` (a face process's counts)."""

    http_requests: _Counter
    http_failed_samples: _Counter
    http_unusable_samples: _Counter
    failure_budget_calls: _Counter
    started: _Counter
    received: _Counter
    sent: _Counter
    handled: _Counter
    handling: _Counter
    calls_refused: _Counter

    def __init__(
        self, send: Callable[[list[Increment], list[Stats]], None] | None = None, *, batched: bool = False
    ) -> None:
        self.send = send
        self.batched = batched
        self._scheduled = False
        self.pending: list[Increment] = []
        #: Grading stats for the server's metrics (`Metrics.observe_grading`): samples answered here.
        self.stats: list[Stats] = []
        for name in (*COUNTERS, *HISTOGRAMS):
            setattr(self, name, _Counter(self, name))
        #: The face's coalescers (`core.coalesce.ServerCoalescer`), whose counts go with each flush.
        self.coalescers: list[ServerCoalescer] = []
        self._coalesced: dict[tuple[int, str], int] = {}
        #: The face's admission controls (`core.admission.Admission`), whose refusals go with each flush: a
        #: call the face refused for load counts in `grpcgrade_calls_refused_total` as the server's own do.
        self.admissions: list[Admission] = []
        self._refused: dict[tuple[int, str], int] = {}

    def watch(self, coalescers: Sequence[ServerCoalescer | None]) -> None:
        """Also send what these coalescers gather."""
        self.coalescers.extend(c for c in coalescers if c is not None)

    def watch_refusals(self, admission: Admission) -> None:
        """Also send the calls this admission control refuses (by the limit that refused)."""
        self.admissions.append(admission)

    def add(self, increment: Increment) -> None:
        self.pending.append(increment)
        self._schedule()

    def _schedule(self) -> None:
        if self.batched and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(BATCH_SECONDS, self.flush)

    def flush(self) -> None:
        """The increments so far to the server's process."""
        self._scheduled = False
        for k, coalescer in enumerate(self.coalescers):  # what the face's coalescers gathered since
            for name in COALESCED:
                now, last = getattr(coalescer, name), self._coalesced.get((k, name), 0)
                if now != last:
                    self.pending.append((name, (), now - last))
                    self._coalesced[k, name] = now
        for k, admission in enumerate(self.admissions):  # the calls the face refused since
            for limit, now in admission.refused.items():
                last = self._refused.get((k, limit), 0)
                if now != last:
                    self.pending.append(("calls_refused", (limit,), now - last))
                    self._refused[k, limit] = now
        if self.pending or self.stats:
            pending, stats, self.pending, self.stats = self.pending, self.stats, [], []
            if self.send is not None:
                self.send(_summed(pending), stats)

    def observe(self, stats: list[Stats]) -> None:
        """Grading stats the engine did not see (`link.EngineLink.observer`), sent with the next flush."""
        self.stats.extend(stats)
        self._schedule()


def _summed(increments: list[Increment]) -> list[Increment]:
    """The counters' increments summed by counter and labels (a crowd's calls move the same few counters:
    one increment each to add, not one per call); a histogram's observations are each their own."""
    totals: dict[tuple[str, tuple[str, ...]], float] = {}
    observed: list[Increment] = []
    for name, values, amount in increments:
        if name in HISTOGRAMS:
            observed.append((name, values, amount))
        else:
            totals[name, values] = totals.get((name, values), 0.0) + amount
    return [(name, values, amount) for (name, values), amount in totals.items()] + observed
