"""The counters an HTTP face process moves, sent to the server's process, whose /metrics serves them.

A face process counts its requests (`grpcgrade_http_requests_total`), failed and unusable samples, and
failure-ratio refusals. It keeps no Prometheus registry of its own: each increment is written down, and a
request's increments go to the server's process in one message on the face's pipe before the response is
written (`flush`, from the app's counting middleware). The server's process adds them to its own counters
of the same names and labels, and reads what its face processes sent before it answers a scrape
(`faces.FaceProcesses.drain`): a client that has its answer sees it counted, as when the face ran in the
server's process. Per-process totals merged at scrape time (prometheus_client's multiprocess mode) would
need every metric of the server made multiprocess-aware, gauges and callbacks too, for four counters.
"""

from __future__ import annotations

from collections.abc import Callable

from grpcgrade.core.coalesce import ServerCoalescer
from grpcgrade.core.grading import Stats

#: The counters a face process moves, by their `metrics.Metrics` attribute.
COUNTERS = frozenset(("http_requests", "http_failed_samples", "http_unusable_samples", "failure_budget_calls"))

#: The coalescer's counts (`core.coalesce.ServerCoalescer.chunks`, `.samples`), sent as they grow.
COALESCED = ("chunks", "samples")

#: One increment: (Metrics attribute, label values in the counter's order, amount).
Increment = tuple[str, tuple[str, ...], float]


class _Child:
    __slots__ = ("_counter", "_values")

    def __init__(self, counter: _Counter, values: tuple[str, ...]) -> None:
        self._counter, self._values = counter, values

    def inc(self, amount: float = 1.0) -> None:
        self._counter.sink.pending.append((self._counter.name, self._values, amount))


class _Counter:
    """A counter as the faces use one: `labels(...).inc(n)`, or `inc(n)` for one without labels."""

    def __init__(self, sink: FaceCounters, name: str) -> None:
        self.sink, self.name = sink, name

    def labels(self, *values: str) -> _Child:
        return _Child(self, values)

    def inc(self, amount: float = 1.0) -> None:
        self.sink.pending.append((self.name, (), amount))


class FaceCounters:
    """A face process's counters (the attributes of `metrics.Metrics` the faces move); `send` takes one
    message of increments (None: counted nowhere, for a face without a server's process)."""

    def __init__(self, send: Callable[[list[Increment], list[Stats]], None] | None = None) -> None:
        self.send = send
        self.pending: list[Increment] = []
        #: Grading stats for the server's metrics (`Metrics.observe_grading`): samples answered here.
        self.stats: list[Stats] = []
        self.http_requests = _Counter(self, "http_requests")
        self.http_failed_samples = _Counter(self, "http_failed_samples")
        self.http_unusable_samples = _Counter(self, "http_unusable_samples")
        self.failure_budget_calls = _Counter(self, "failure_budget_calls")
        self.coalescer: ServerCoalescer | None = None
        self._coalesced = {name: 0 for name in COALESCED}

    def flush(self) -> None:
        """The increments so far to the server's process."""
        if self.coalescer is not None:  # what the face's coalescer gathered since
            for name, last in self._coalesced.items():
                now = getattr(self.coalescer, name)
                if now != last:
                    self.pending.append((name, (), now - last))
                    self._coalesced[name] = now
        if self.pending or self.stats:
            pending, stats, self.pending, self.stats = self.pending, self.stats, [], []
            if self.send is not None:
                self.send(pending, stats)

    def observe(self, stats: list[Stats]) -> None:
        """Grading stats the engine did not see (`forward.EngineLink.observer`), sent with the next flush."""
        self.stats.extend(stats)
