"""What each model's judgments cost, per model and caller: the counts the metrics export.

Kept here, as plain numbers the judge client adds to once per HTTP request (a few dict updates: nothing
next to the request itself), and read by the service's metrics collector when Prometheus scrapes, so the
LLM layer needs no metrics library. The cost is an estimate: tokens in and out (as the answers report
them) times the model's configured prices.

A caller's name is the caller's own choice, so the number of callers counted apart is bounded
(`MAX_CALLERS`): configured callers always have their own series; past the bound, others count as
`OTHER_CALLER`.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field

#: Upper bounds (`le`) of the queue-wait and latency histograms, in seconds; `+Inf` is implied.
SECONDS_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: The callers counted apart, besides the configured ones.
MAX_CALLERS = 32
OTHER_CALLER = "other"


@dataclass
class Seconds:
    """A histogram of durations: `counts[i]` falls in bucket i (not cumulative; the last is +Inf)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(SECONDS_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(SECONDS_BUCKETS, seconds)] += 1
        self.total += seconds


@dataclass
class Tally:
    """One model's requests for one caller."""

    requests: int = 0
    throttled: dict[int, int] = field(default_factory=dict)  # HTTP status (429, 503) -> answers
    retries: int = 0
    rate_limited: int = 0  # judgments given up: their time ran out while the limits held them back
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    queue_wait: Seconds = field(default_factory=Seconds)
    latency: Seconds = field(default_factory=Seconds)


class Usage:
    """Every model's tallies, by (model, caller). Added to on the event loop, read by the scrape thread."""

    def __init__(self, callers: Iterable[str] = ()) -> None:
        self.lock = threading.Lock()
        self.tallies: dict[tuple[str, str], Tally] = {}
        self.configured = set(callers)
        self.seen: set[str] = set()

    def configure(self, callers: Iterable[str]) -> None:
        """The configured callers: each always counted under its own name."""
        self.configured = set(callers)

    def tally(self, model: str, caller: str) -> Tally:
        """The tally to add to (held under `lock` while adding is not needed: the loop is the only writer,
        and a scrape reading a count mid-update sees it before or after)."""
        if caller not in self.configured and caller not in self.seen:
            if len(self.seen) >= MAX_CALLERS:
                caller = OTHER_CALLER
            else:
                self.seen.add(caller)
        key = (model, caller)
        found = self.tallies.get(key)
        if found is None:
            with self.lock:
                found = self.tallies.setdefault(key, Tally())
        return found

    def snapshot(self) -> list[tuple[str, str, Tally]]:
        with self.lock:
            return [(model, caller, tally) for (model, caller), tally in self.tallies.items()]


#: The process's tallies (one server per process); `models.configure` tells it the configured callers.
USAGE = Usage()
