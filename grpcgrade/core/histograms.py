"""Score and reward distributions, counted where the numbers are produced: once per chunk, not per sample.

A dashboard sees reward hacking and judge drift as a distribution that moves, so every grader's scores and
every configured reward's values are kept as Prometheus histograms. Observing each sample with
prometheus-client in the server (~1 µs) would cost more than a cheap grader does, so a chunk's numbers are
counted where the chunk is graded (in a worker, or inline) in one go: sorted (C), then one bisection per
bucket bound, which gives the cumulative counts Prometheus exposes (~40 ns a sample in all). The server adds
the chunk's counts to its totals (`service.metrics`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import NamedTuple

#: Upper bounds (`le`) of the score and reward buckets; `+Inf` is implied. Fine steps over [0, 1], where
#: most graders score; coarser ones for penalties (negative) and unbounded scores above 1.
SCORE_BUCKETS: tuple[float, ...] = (
    -1.0,
    -0.5,
    -0.25,
    0.0,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    1.0,
    2.0,
    5.0,
)


class Histogram(NamedTuple):
    """Numbers as Prometheus counts them: `buckets[i]` how many are <= `SCORE_BUCKETS[i]` (cumulative),
    `observed` how many in all (the `+Inf` bucket), `total` their sum, `squares` the sum of their squares (a
    standard deviation needs it; Prometheus' own histogram has no such series)."""

    buckets: tuple[int, ...] = (0,) * len(SCORE_BUCKETS)
    observed: int = 0
    total: float = 0.0
    squares: float = 0.0

    def plus(self, other: Histogram) -> Histogram:
        return Histogram(
            tuple(a + b for a, b in zip(self.buckets, other.buckets, strict=True)),
            self.observed + other.observed,
            self.total + other.total,
            self.squares + other.squares,
        )


EMPTY = Histogram()


def histogram(values: list[float], squares: bool = False) -> Histogram:
    """The histogram of a chunk's finite numbers; `squares` also sums their squares."""
    if not values:
        return EMPTY
    ordered = sorted(values)
    return Histogram(
        tuple(bisect_right(ordered, bound) for bound in SCORE_BUCKETS),
        len(values),
        sum(values),
        sum(v * v for v in values) if squares else 0.0,
    )


def count_pairs(pairs: Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """(key, count) pairs with each key once, counts summed, sorted by key: how error codes travel."""
    out: dict[str, int] = {}
    for key, n in pairs:
        out[key] = out.get(key, 0) + n
    return tuple(sorted(out.items()))
