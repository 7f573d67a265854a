"""A call's two guards (issue 17): the step budget and the failure budget.

- **Step budget** (`budget_seconds`): a trainer's step must not wait on one pathological sample. The
  call's deadline travels with its work: the grading loops (inline, in a worker, async) stop at it and
  answer the running sample and the rest of their chunk with BUDGET_EXCEEDED; whatever has not come back
  shortly after it (a worker stuck in C code, a chunk still queued) is cut by the engine. Each sample is
  answered exactly once, and the call itself ends normally.
- **Failure budget** (`max_failure_ratio`): a step that is mostly masks is worth less than a clear error.
  A sample has failed when a grader errored on it (any code, BUDGET_EXCEEDED included); once the failures
  exceed the ratio of the call's samples, the call ends with `TooManyFailures`, which names the grader
  with the most errors and its most frequent error code.

Counting never looks at a chunk that has no failure: a whole chunk's worker already counts its failed
samples and error codes (`GraderStats.failed`, `.error_codes`), and a chunk graded here is looked at only when
one of its rewards is absent.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from fractions import Fraction

from grpcgrade.grader import GraderError, GraderResult

from .errors import InvalidParams, TooManyFailures
from .grading import GraderStats, Stats

#: The largest step budget a call may ask for (a day): a budget is a bound, and every bound has one.
MAX_BUDGET_SECONDS = 86_400.0
#: After the deadline, how long the engine waits for chunks to come back with what they graded before it
#: cuts them: a grading loop notices the deadline within `grading.ALARM_MAX_INTERVAL`, a chunk's later
#: graders finish within `grading.FINISH_SECONDS`, plus the hop back from a worker.
CUT_GRACE_SECONDS = 1.0


def step_deadline(budget_seconds: float, started: float) -> float | None:
    """The call's deadline on `time.monotonic()`'s clock (shared by the server's worker processes), or
    None for no budget (0). Raises InvalidParams naming `budget_seconds` for a negative, NaN, infinite or
    too large value."""
    if budget_seconds == 0:
        return None
    if not math.isfinite(budget_seconds) or budget_seconds < 0 or budget_seconds > MAX_BUDGET_SECONDS:
        raise InvalidParams(
            "budget_seconds",
            f"must be a positive number of seconds up to {MAX_BUDGET_SECONDS:g} (0: no budget), got {budget_seconds!r}",
        )
    return started + budget_seconds


def failure_limit(ratio: float | None, samples: int) -> int | None:
    """How many of `samples` may fail, or None for no limit. The ratio is read as written (0.29 allows 29
    of 100, not 28 as its binary value would). Raises InvalidParams naming `max_failure_ratio` outside [0, 1]."""
    if ratio is None:
        return None
    if not 0.0 <= ratio <= 1.0:  # NaN fails both comparisons
        raise InvalidParams("max_failure_ratio", f"must be a fraction between 0 and 1, got {ratio!r}")
    return math.floor(Fraction(repr(ratio)) * samples)


def call_guards(
    budget_seconds: float, max_failure_ratio: float | None, samples: int, started: float
) -> tuple[float | None, FailureTally | None]:
    """A call's deadline and failure tally from its request (either None when not asked for); raises
    InvalidParams naming the field that is out of range."""
    deadline = step_deadline(budget_seconds, started)
    allowed = failure_limit(max_failure_ratio, samples)
    if allowed is None or max_failure_ratio is None:
        return deadline, None
    return deadline, FailureTally(max_failure_ratio, samples, allowed)


class FailureTally:
    """The failed samples of one call so far, and each grader's errors by code (for the message)."""

    def __init__(self, ratio: float, samples: int, allowed: int) -> None:
        self.ratio, self.samples, self.allowed = ratio, samples, allowed
        self.failed = 0
        self.codes: dict[str, Counter[str]] = {}

    def _add_codes(self, grader: str, codes: Iterable[tuple[str, int]]) -> None:
        counter = self.codes.setdefault(grader, Counter())
        for code, count in codes:
            counter[code] += count

    def add_stats(self, stats: Sequence[Stats]) -> None:
        """A chunk counted where it was graded (a whole chunk's worker)."""
        for s in stats:
            if isinstance(s, GraderStats) and s.errors:
                self.failed += s.failed
                self._add_codes(s.grader, s.error_codes)

    def add_columns(
        self, names: Sequence[str], columns: Sequence[Sequence[GraderResult]], rewards: Sequence[float | None]
    ) -> None:
        """A chunk graded here: looked at only when some sample has no reward (a failure has none)."""
        if None not in rewards:
            return
        failed: set[int] = set()
        for name, column in zip(names, columns, strict=True):
            codes: Counter[str] = Counter()
            for k, result in enumerate(column):
                if isinstance(result, GraderError):
                    codes[result.code] += 1
                    failed.add(k)
            if codes:
                self._add_codes(name, codes.items())
        self.failed += len(failed)

    def check(self) -> None:
        """Raises TooManyFailures once the failures are past the call's allowance."""
        if self.failed > self.allowed:
            raise TooManyFailures(self.message())

    def message(self) -> str:
        totals = {grader: sum(c.values()) for grader, c in self.codes.items()}
        worst = max(totals, key=lambda g: totals[g])  # the first grader of the call on a tie
        (code, count), *_ = self.codes[worst].most_common(1)
        others = ", ".join(f"{g!r} x{n}" for g, n in totals.items() if g != worst)
        return (
            f"{self.failed} of {self.samples} samples failed, over max_failure_ratio={self.ratio:g} "
            f"({self.allowed} allowed): grader {worst!r} {code} x{count} of its {totals[worst]} errors"
            + (f"; other graders' errors: {others}" if others else "")
        )
