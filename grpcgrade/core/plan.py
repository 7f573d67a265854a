"""A call's plan: decided once, when its graders are resolved, and only executed after that.

Four choices make a call's path, and each is made here, once per request, instead of again for every
chunk: which graders run together (`Group`), where each group runs (`Place`: the placement policy), whether
a chunk travels in the service's codec (a group of every grader, in the executor), and how the call is cut
and how much of it is in flight (the chunk policy, `guided`, and the `window`). The engine reads the plan;
the one choice left to run time is the one that depends on the server's load: whether a small call of
graders of bounded cost may be graded inline now (`Plan.inline`, against the event loop's `InlineShare` and
the plan's own `GradingRate`).

The placement policy:
- every grader can run in a worker (synchronous, not server-only) and none goes through the result cache
  or has inputs in quarantine: one group of all of them, in the executor (whole chunks; inline when small,
  see `INLINE_MAX_BYTES`).
- every grader synchronous and none can run in a worker (no executor: `--workers 0`, or graders only the
  server's configuration defines), nor filtered: one group, inline.
- otherwise one group per grader: in the executor if it can run there, inline if it is synchronous,
  on the event loop if it awaits I/O (`ROWS`, sample by sample, unless it grades whole chunks with
  `aevaluate_batch`: `LOOP`); a grader the cache serves or with inputs in quarantine is `filtered`, looked
  up first (`cached_grading`).
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from grpcgrade.grader import BaseGrader, Inputs

from .rewards import SpecData
from .samples import requirements

#: The most request bytes graded inline, on the event loop, by graders of bounded cost: the longest any such
#: request can hold the loop is a bounded-cost grader over this much input. json_validator's worst case, a
#: 512 KiB JSON object or array of floats, takes 11-15 ms of CPU (measured; 256 KiB: ~5 ms). 512 KiB holds
#: a trainer's small step (512 short samples, ~300 KB), which one process grades faster than a hop.
INLINE_MAX_BYTES = 512 * 1024
#: Inline grading takes at most this share of the event loop's time, per window: past it, small calls hop to
#: the workers like any other, so many concurrent callers still use every core and the loop stays free.
INLINE_MAX_SHARE = 0.25
INLINE_WINDOW_SECONDS = 1.0
#: The most request bytes graded inline for a call answered with a result message per sample (the full
#: view, scores as items), instead of `INLINE_MAX_BYTES`: such grading makes Python objects per sample in
#: the server's process and holds the event loop while the workers wait for their next chunks. Measured on
#: 2 cores (json_validator, 100,000 samples as 1,024-sample calls of ~450 KB, four in flight, alternating
#: with the bound at 512 KiB, the views taking turns, medians of six): the full view 127k -> 135k and
#: 115k -> 122k samples/s, scores as items 194k -> 209k and 185k -> 177k (load 2.5); scores as columns,
#: which make no object per sample, ran 287k inline and 271k hopping, so they keep `INLINE_MAX_BYTES`. A
#: bound of 64 KiB read the same as 128 KiB. A trainer's step of 8-256 samples stays under it.
INLINE_RESULTS_MAX_BYTES = 128 * 1024
#: The longest a call's grading is expected to hold the event loop inline, by its plan's `GradingRate`: a
#: call expected to take longer goes to a worker, whatever its size (a grader of bounded cost may still be
#: slow per byte). json_validator's worst case within `INLINE_MAX_BYTES` takes 11-15 ms of CPU; the rate is
#: learnt from wall time, which a busy machine stretches (a 1,024-sample chunk of scores as columns: 3 ms
#: of CPU), so the bound sits above both.
INLINE_MAX_SECONDS = 0.02
#: How much each chunk moves `GradingRate`'s average: a plan's cost changes with the view asked of it, and
#: a few chunks should be enough to follow it.
RATE_WEIGHT = 0.25


class InlineShare:
    """The event loop's time spent grading inline in the current window, against `INLINE_MAX_SHARE`.

    A fixed window (reset when it has passed) rather than a moving average: two numbers, no per-call list,
    and the bound it gives is the one that matters: at most `share x window` (plus one call) per window.
    """

    def __init__(
        self,
        share: float = INLINE_MAX_SHARE,
        window: float = INLINE_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.window, self.clock = share * window, window, clock
        self.start, self.busy = clock(), 0.0

    def _roll(self) -> None:
        now = self.clock()
        if now - self.start >= self.window:
            self.start, self.busy = now, 0.0

    def allows(self) -> bool:
        """Whether one more small call may be graded inline now."""
        self._roll()
        return self.busy < self.limit

    def spent(self, seconds: float) -> None:
        self._roll()
        self.busy += seconds


class GradingRate:
    """Seconds of grading per request byte of a plan's chunks, wherever they were graded (their stats), as a
    moving average: how long `Plan.inline` expects a call to hold the event loop. Unknown (0) until a chunk
    is graded, so a plan's first small call goes inline; a plan whose graders turn out slow per byte keeps
    only its smaller calls inline (`INLINE_MAX_SECONDS`), and a plan's kept calls (`Engine.resolve_keyed`)
    carry what it learnt from call to call."""

    __slots__ = ("per_byte",)

    def __init__(self) -> None:
        self.per_byte = 0.0

    def expected(self, nbytes: int) -> float:
        return self.per_byte * nbytes

    def learn(self, nbytes: int, seconds: float) -> None:
        """A chunk of `nbytes` took `seconds` of grading (nothing learnt where its size is unknown)."""
        if nbytes > 0:
            rate = seconds / nbytes
            self.per_byte = rate if not self.per_byte else self.per_byte + RATE_WEIGHT * (rate - self.per_byte)


@dataclass(frozen=True)
class Job:
    """A resolved spec: the grader instance and where it can run."""

    spec: SpecData
    grader: BaseGrader
    inputs: Inputs
    worker_capable: bool  # synchronous, and every worker's registry has it (not a server-only grader)
    use_cache: bool = False  # the result cache answers this call's samples for this grader

    @property
    def in_worker(self) -> bool:
        """Graded in a worker even when the call's other graders are not: nothing a request can make slow
        runs on the event loop (a hop costs ~0.2 ms; a stalled loop costs every call)."""
        return self.worker_capable


class Place(enum.Enum):
    """Where a group runs (the words the code, tests and docs use)."""

    INLINE = "inline"  # in the server process (`executors.InProcess`)
    EXECUTOR = "executor"  # in the executor: this machine's worker pool, or Ray's actors
    LOOP = "loop"  # an async grader on the event loop, a chunk in one call (`aevaluate_batch`)
    ROWS = "rows"  # an async grader on the event loop, each sample on its own


@dataclass(frozen=True)
class Group:
    """Graders of a call that run together (`positions` in the call), where they run, and whether the result
    cache and the quarantine look their samples up first (`filtered`: a group of one grader)."""

    positions: tuple[int, ...]
    place: Place
    filtered: bool = False


def per_sample(grader: BaseGrader) -> bool:
    """An async grader graded sample by sample; one with `aevaluate_batch` asks for whole chunks."""
    return not grader.is_sync and getattr(grader, "aevaluate_batch", None) is None


@dataclass(frozen=True, eq=False)
class Plan(Sequence[Job]):
    """A call's graders (it reads as their sequence) and how they are graded (see the module docstring)."""

    jobs: tuple[Job, ...]
    groups: tuple[Group, ...]
    window: int  # chunks in flight per call; with `rows`, times the samples of a chunk
    guided: bool  # heavy graders: chunks shrink as the server's heavy samples are handed out
    bounded: bool  # one group, in the executor, every grader of bounded cost: small calls may run inline
    share: InlineShare  # the event loop's inline time, which `inline` asks
    filtered: tuple[bool, ...] = ()  # whether the filter stood in front of each job when the plan was made
    rate: GradingRate = field(default_factory=GradingRate)  # its chunks' grading time, which `inline` asks

    @overload
    def __getitem__(self, index: int) -> Job: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Job]: ...

    def __getitem__(self, index: int | slice) -> Job | Sequence[Job]:
        return self.jobs[index]

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    @functools.cached_property
    def required(self) -> dict[str, str]:
        """The inputs the graders require (`samples.requirements`), made once per plan: a kept plan
        (`Engine.resolve_keyed`) serves every call of a crowd."""
        return requirements((job.grader.name, job.inputs) for job in self.jobs)

    @property
    def together(self) -> Group | None:
        """The group of every grader, synchronous, when the call has one and the filter has no say in it: a
        chunk is then one work item."""
        first = self.groups[0]
        whole = len(first.positions) == len(self.jobs) and not first.filtered
        return first if whole and first.place in (Place.EXECUTOR, Place.INLINE) else None

    @property
    def whole_chunks(self) -> bool:
        """Whole chunks go to the executor: one group of every grader, placed there. Its samples travel in
        the service's codec when it offers one."""
        together = self.together
        return together is not None and together.place is Place.EXECUTOR

    @property
    def rows(self) -> bool:
        """Graded row by row: a grader awaits I/O per sample, so each sample is handed on when its own
        results are in, and one slow judgment holds only its sample."""
        return any(group.place is Place.ROWS for group in self.groups)

    def inline(self, nbytes: int, most: int = INLINE_MAX_BYTES) -> bool:
        """The run-time choice: a call of `nbytes` (0: unknown, not small) of a `bounded` plan is graded inline,
        the whole-chunk work run in the server process, when it is at most `most` bytes (the service's
        limit for its answer: `INLINE_RESULTS_MAX_BYTES` for a result per sample), is expected to take at
        most `INLINE_MAX_SECONDS` (`rate`), and inline grading has taken less than its share of the event
        loop lately."""
        return (
            self.bounded
            and 0 < nbytes <= most
            and self.rate.expected(nbytes) <= INLINE_MAX_SECONDS
            and self.share.allows()
        )


def place(jobs: Sequence[Job], filtered: Sequence[bool], executor_size: int | None, share: InlineShare) -> Plan:
    """The plan of `jobs` (`filtered[j]`: job j goes through the cache or the quarantine; `executor_size`:
    the executor's, None without one)."""
    everything = tuple(range(len(jobs)))
    groups: tuple[Group, ...]
    if not any(filtered) and all(job.worker_capable for job in jobs):
        groups = (Group(everything, Place.EXECUTOR),)
    elif not any(filtered) and all(job.grader.is_sync for job in jobs) and not any(j.worker_capable for j in jobs):
        groups = (Group(everything, Place.INLINE),)
    else:
        groups = tuple(Group((j,), _place_of(job), filtered[j]) for j, job in enumerate(jobs))
    in_executor = executor_size is not None and any(group.place is Place.EXECUTOR for group in groups)
    whole = len(groups) == 1 and groups[0].place is Place.EXECUTOR
    return Plan(
        tuple(jobs),
        groups,
        window=2 * executor_size + 1 if in_executor and executor_size is not None else 2,
        guided=any(job.grader.heavy for job in jobs),
        bounded=whole and all(job.grader.bounded_cost for job in jobs),
        share=share,
        filtered=tuple(filtered),
    )


def _place_of(job: Job) -> Place:
    if job.worker_capable:
        return Place.EXECUTOR
    if job.grader.is_sync:
        return Place.INLINE
    return Place.ROWS if per_sample(job.grader) else Place.LOOP


def required_inputs(jobs: Sequence[Job]) -> dict[str, str]:
    """The inputs `jobs`' graders require: a plan's, made once, or made now for a plain list of jobs."""
    if isinstance(jobs, Plan):
        return jobs.required
    return requirements((job.grader.name, job.inputs) for job in jobs)
