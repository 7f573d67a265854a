"""Running one grader over a chunk of samples, the same way inline and in a worker process.

Every sample gets exactly one result: a grader's exception, a non-finite score or a malformed rank
becomes a `GraderError` for that sample only (decision D7). A per-sample time limit, the call's deadline
and its cancellation hold on any thread: a chunk's timer (`_alarm`) is SIGALRM on the main thread (the
event loop of the server, a worker's task loop) and a timer thread elsewhere (an actor's thread, a
caller's thread pool); either interrupts the grader's Python code and the next sample goes on. What a
chunk is timed against is its own (`_Watch`, one per chunk), and whether its call still wants it comes
from the context (`cancellable`), not from process globals.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import numbers
import operator
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, NamedTuple, TypeVar

try:  # CPython's own: `signal.getsignal` wraps it in an enum lookup that raises for a function (3.9 µs a chunk)
    from _signal import getsignal as _handler_of  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - another interpreter
    _handler_of = signal.getsignal

from grpcgrade.grader import (
    BaseGrader,
    GraderError,
    GraderMode,
    GraderRank,
    GraderResult,
    GraderScore,
    Inputs,
    declared_names,
    is_finite_score,
)

from .context import SAMPLE_TIME_LIMIT
from .errors import (
    MAX_ERROR_CHARS,
    NOT_A_RESULT,
    ErrorCode,
    GraderCancelled,
    GraderOverBudget,
    GraderRateLimited,
    GraderTimeout,
    SampleProblem,
    describe,
    encodable,
)
from .histograms import EMPTY, Histogram, count_pairs, histogram
from .memo import IdentityMemo
from .metadata import SCALAR_TYPES, bounded, is_flat
from .rewards import NUMBER_TYPES, Result, RewardStats
from .samples import TEXT_FIELDS, select_all


class GraderStats(NamedTuple):
    """One grader's work on one chunk, as the metrics count it (the observer's argument)."""

    grader: str
    ok: int
    errors: int
    seconds: float
    #: The distribution of the chunk's scores (rank results have none).
    scores: Histogram = EMPTY
    #: The errors by code: ((code, count), ...), each code once.
    error_codes: tuple[tuple[str, int], ...] = ()
    #: The chunk's samples that failed with this grader the first of the call's graders to fail on them, so
    #: the graders' `failed` add up to the chunk's failed samples (the failure budget's count); filled
    #: where a chunk's graders run together (`grade_chunk_sync`, `failed_stats`), 0 elsewhere.
    failed: int = 0


#: What a chunk's grading reports to the metrics: each grader's work, and a configured reward's values.
Stats = GraderStats | RewardStats


def grading_seconds(stats: Iterable[Stats]) -> float:
    """The graders' time over a chunk, as its stats count it (a configured reward's stats have none)."""
    return sum(stat.seconds for stat in stats if isinstance(stat, GraderStats))


def grader_stats(name: str, results: list[GraderResult], seconds: float) -> GraderStats:
    """A grader's stats for a chunk's results, in one pass over them when none failed."""
    scores = [r.score for r in results if r.__class__ is GraderScore]
    errors: tuple[tuple[str, int], ...] = ()
    failed = 0
    if len(scores) < len(results):  # errors, ranks, or subclasses of GraderScore
        scores = [r.score for r in results if isinstance(r, GraderScore)]
        errors = count_pairs((r.code, 1) for r in results if isinstance(r, GraderError))
        failed = sum(n for _, n in errors)
    return GraderStats(name, len(results) - failed, failed, seconds, histogram(scores), errors)


def failed_stats(name: str, code: str, samples: int = 1, first: bool = False) -> GraderStats:
    """The stats of samples that could not be graded at all (a worker died or hung on one); `first`: this
    grader is the first of its chunk's, which counts them as failed samples (`GraderStats.failed`)."""
    return GraderStats(name, 0, samples, 0.0, EMPTY, ((code, samples),), samples if first else 0)


def problem_stats(name: str, samples: int) -> GraderStats:
    """The stats of a chunk's unusable samples (`SampleProblem`), graded apart from the others."""
    return failed_stats(name, ErrorCode.INVALID_SAMPLE, samples)


def _plus(a: Any, b: Any) -> Any:
    """Two parts' values of one stats field, joined: names kept, histograms and counts added."""
    if isinstance(a, str):
        return a
    if isinstance(a, Histogram):
        return a.plus(b)
    if isinstance(a, tuple):
        return count_pairs((*a, *b))
    return a + b


def join_stats(parts: Sequence[Sequence[Stats]]) -> list[Stats]:
    """The stats of a chunk that was graded piece by piece: each grader's (and reward's) summed over the
    pieces, in the order they first appear."""
    joined: dict[tuple[type, str], Stats] = {}
    for part in parts:
        for stats in part:
            key = (type(stats), stats[0])
            seen = joined.get(key)
            joined[key] = stats if seen is None else type(stats)(*map(_plus, seen, stats))
    return list(joined.values())


_inputs: IdentityMemo[BaseGrader, Inputs] = IdentityMemo()


def inputs_of(grader: BaseGrader) -> Inputs:
    """The grader's declared inputs; signature inspection costs ~60 µs, so once per built grader."""
    inputs = _inputs.get(grader)
    if inputs is None:
        inputs = _inputs.put(grader, grader.input_names())
    return inputs


_column_inputs: IdentityMemo[BaseGrader, tuple[str, ...]] = IdentityMemo()


def column_inputs(grader: BaseGrader) -> tuple[str, ...]:
    """The text fields `grader.score_column` takes; empty when it has none it can be called with."""
    fields = _column_inputs.get(grader)
    if fields is None:
        fields = ()
        if grader.score_column is not None:
            inputs = declared_names(grader.score_column)
            if not inputs.open and inputs.names and inputs.names <= set(TEXT_FIELDS):
                fields = tuple(sorted(inputs.names))
        _column_inputs.put(grader, fields)
    return fields


def usable(chunk: list[Any]) -> list[dict[str, Any]]:
    """The chunk's gradable samples: the chunk itself when none is a `SampleProblem`."""
    if any(isinstance(kw, SampleProblem) for kw in chunk):
        return [kw for kw in chunk if not isinstance(kw, SampleProblem)]
    return chunk


def with_problems(name: str, chunk: list[Any], results: list[GraderResult]) -> list[GraderResult]:
    """A grader's results for `usable(chunk)`, with each unusable sample's INVALID_SAMPLE back in place."""
    graded = iter(results)
    return [
        GraderError(name, str(kw), code=ErrorCode.INVALID_SAMPLE) if isinstance(kw, SampleProblem) else next(graded)
        for kw in chunk
    ]


#: Whether the call the current work belongs to still wants it: set for a task in a worker by the executor
#: that runs it (`cancellable`), read by the grading loops. A context variable, not a process global: each
#: thread (and asyncio task) sees its own.
_cancel_check: ContextVar[Callable[[], bool] | None] = ContextVar("grpcgrade_cancel_check", default=None)


@contextlib.contextmanager
def cancellable(check: Callable[[], bool]) -> Iterator[None]:
    """Grading inside stops with `GraderCancelled` (between samples, or at the next tick inside one) once
    `check()` is true."""
    token = _cancel_check.set(check)
    try:
        yield
    finally:
        _cancel_check.reset(token)


class _Watch:
    """One chunk's timing: the sample being timed (when it started, how long it may take), the call's
    deadline (`time.monotonic()`) and whether the call still wants the work.

    `verdict` decides, at each tick, what the running sample must raise; `fired` makes that happen at most
    once per sample, so a second tick cannot land in the grading loop's own `except` block (where nothing
    would catch it) while the first is being recorded. On a thread other than the main one, the ticks come
    from `_Ticker` and `lock` keeps a tick from landing between a sample's end and the next.
    """

    __slots__ = ("active", "cancelled", "deadline", "fired", "limit", "lock", "over", "start", "thread")

    def __init__(self, seconds: float | None, deadline: float | None, cancelled: Callable[[], bool] | None) -> None:
        self.limit = seconds or float("inf")
        self.deadline = float("inf") if deadline is None else deadline
        self.cancelled = cancelled
        self.over = deadline is not None and time.monotonic() >= deadline  # the chunk's later samples: not graded
        self.active = self.fired = False
        self.start = 0.0
        self.lock: threading.Lock | None = None  # set when ticked from another thread
        self.thread = 0

    def verdict(self) -> type[BaseException] | None:
        """What the running sample must raise now, if anything (noted as fired)."""
        if not self.over and time.monotonic() >= self.deadline:
            self.over = True
            if self.active and not self.fired:
                self.fired = True
                return GraderOverBudget
            return None
        if not self.active or self.fired:
            return None
        if time.perf_counter() - self.start >= self.limit:
            self.fired = True
            return GraderTimeout
        if self.cancelled is not None and self.cancelled():
            self.fired = True
            return GraderCancelled
        return None

    def begin(self) -> None:
        """A sample starts: the timer runs for it."""
        if self.lock is None:
            self.start, self.fired = time.perf_counter(), False
            self.active = True
            return
        with self.lock:
            self.start, self.fired = time.perf_counter(), False
            self.active = True

    def end(self) -> None:
        """The sample is done: no tick may land after this (on another thread, one pending is withdrawn)."""
        if self.lock is None:
            self.active = False
            return
        with self.lock:
            self.active = False
            _raise_in(self.thread, None)

    def check_cancelled(self) -> None:
        if self.cancelled is not None and self.cancelled():
            raise GraderCancelled


def _raise_in(thread: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in `thread` at its next Python instruction (None: withdraw one not raised yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None if exc is None else ctypes.py_object(exc))


_main: _Watch | None = None  # the chunk being timed on the main thread, which SIGALRM's handler reads


def _on_alarm(signum: int, frame: Any) -> None:
    watch = _main
    if watch is not None:
        exc = watch.verdict()
        if exc is not None:
            raise exc


class _Ticker:
    """The timer of chunks graded off the main thread (where SIGALRM cannot reach): one thread, started
    on first use, that ticks every watched chunk and raises what its verdict says in the thread grading it,
    as the signal handler does on the main thread. Like the signal, it interrupts Python code only."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watches: dict[int, tuple[_Watch, float]] = {}  # id -> (watch, interval)
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def add(self, watch: _Watch, interval: float) -> None:
        with self.lock:
            self.watches[id(watch)] = (watch, interval)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="grpcgrade-grading-timer", daemon=True)
                self.thread.start()
        self.wake.set()

    def remove(self, watch: _Watch) -> None:
        with self.lock:
            self.watches.pop(id(watch), None)

    def _run(self) -> None:
        while True:
            with self.lock:
                watched = list(self.watches.values())
            for watch, _ in watched:
                assert watch.lock is not None
                with watch.lock:
                    exc = watch.verdict()
                    if exc is not None:
                        _raise_in(watch.thread, exc)
            self.wake.clear()
            self.wake.wait(min((interval for _, interval in watched), default=None))


_ticker = _Ticker()
ALARM_MAX_INTERVAL = 0.1  # how late a cancellation reaches a sample that is running Python code
#: After a call's deadline, how long the later graders of a chunk graded one grader after the other may
#: still take to finish the samples the first graded in time (see `grade_chunk_sync`); well within the
#: engine's `guard.CUT_GRACE_SECONDS`, so what they finish comes back before the engine cuts the chunk.
FINISH_SECONDS = 0.3


@contextlib.contextmanager
def _alarm(seconds: float | None, deadline: float | None = None) -> Iterator[_Watch]:
    """The timer of a whole chunk; it raises only in a sample that has run past `seconds` (at most 10%
    late), whose call was cancelled (`cancellable`), or that is running when the call's `deadline` passes.
    On the main thread a periodic SIGALRM (the handler installed once per process, the timer armed per
    chunk: two cheap syscalls per chunk, nothing per sample); on any other thread `_Ticker`."""
    global _main
    watch = _Watch(seconds, deadline, _cancel_check.get())
    if not (seconds or watch.cancelled is not None or deadline is not None):
        yield watch  # nothing to time
        return
    interval = min(max((seconds or 1.0) / 10, 0.005), ALARM_MAX_INTERVAL)
    if threading.current_thread() is not threading.main_thread():
        watch.lock, watch.thread = threading.Lock(), threading.get_ident()
        _ticker.add(watch, interval)
        try:
            yield watch
        finally:
            _ticker.remove(watch)
            watch.end()
        return
    if _handler_of(signal.SIGALRM) is not _on_alarm:  # first chunk, or a grader swapped it out (26 ns a look)
        signal.signal(signal.SIGALRM, _on_alarm)
    outer, _main = _main, watch
    signal.setitimer(signal.ITIMER_REAL, interval, interval)
    try:
        yield watch
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        watch.active = False
        _main = outer


def check_result(grader: BaseGrader, result: Any, kwargs: dict[str, Any]) -> GraderResult:
    """Only well-formed, finite results reach a trainer. A reason or metadata of None counts as empty; of
    another wrong type, the result is INVALID_RESULT (it would fail the response of its whole chunk). An
    error a grader returned keeps its message, made a string.

    This runs once per sample and grader: the common result (a finite float score, a str reason, flat
    metadata) is recognised first, in a few C-level checks, and returned as it is (measured: ~230 ns a
    json_validator result, against ~125 ns when only the score was checked)."""
    if type(result) is GraderScore:
        score, metadata = result.score, result.metadata
        if (
            type(score) is float
            and math.isfinite(score)
            and type(result.reason) is str
            and type(metadata) is dict
            and (not metadata or SCALAR_TYPES.issuperset(map(type, metadata.values())))  # `is_flat`, inlined
        ):
            return result
    return _checked(grader, result, kwargs)


def _checked(grader: BaseGrader, result: Any, kwargs: dict[str, Any]) -> GraderResult:
    """`check_result`'s every case."""
    name = grader.name
    if isinstance(result, GraderError):
        return _metadata_bounded(result if _error_well_formed(result) else _error_made_well_formed(result))
    if isinstance(result, (GraderScore, GraderRank)):
        if type(result.reason) is not str or type(result.metadata) is not dict:
            problem = _shape_problem(result)
            if problem:
                return GraderError(name, f"grader returned {problem}", code=ErrorCode.INVALID_RESULT)
            result = replace(result, reason=result.reason or "", metadata=result.metadata or {})
        result = _metadata_bounded(result)
    if isinstance(result, GraderScore):
        if not isinstance(result.score, (int, float)):  # numpy's float32 and int64, a Fraction: the float
            if not isinstance(result.score, numbers.Real):
                problem = f"a score of type {type(result.score).__name__}, not a number"
                return GraderError(name, f"grader returned {problem}", code=ErrorCode.INVALID_RESULT)
            with contextlib.suppress(OverflowError, ValueError, TypeError):  # then refused just below
                result = replace(result, score=float(result.score))
        if not is_finite_score(result.score):
            return GraderError(
                name, f"grader returned a non-finite score {_shown(result.score)}", code=ErrorCode.INVALID_RESULT
            )
        return result
    if isinstance(result, GraderRank):
        rank = _whole_numbers(result.rank)
        n = len(kwargs.get("responses") or rank or ())
        if rank is None or sorted(rank) != list(range(1, n + 1)):
            return GraderError(
                name, f"rank {_shown(result.rank)} is not a permutation of 1..{n}", code=ErrorCode.INVALID_RESULT
            )
        exact = type(result.rank) is list and all(type(v) is int for v in result.rank)  # 1.0 == 1: not enough
        return result if exact else replace(result, rank=rank)
    expected = "GraderRank" if grader.mode is GraderMode.LISTWISE else "GraderScore"
    return GraderError(name, f"grader returned {type(result).__name__}, not {expected}", code=ErrorCode.INVALID_RESULT)


def _whole_numbers(values: Any) -> list[int] | None:
    """A rank's entries as Python ints (numpy's integers, and floats with no fraction, as scipy's `rankdata`
    gives them), or None when one is not a whole number (1.7, a bool) or `values` is not a sequence: such a
    rank may equal a permutation (1.0 == 1) or become one when truncated (1.7 to 1), and is no rank."""
    out = []
    try:
        for v in values:
            if isinstance(v, float):
                if not v.is_integer():
                    return None
                out.append(int(v))
            elif isinstance(v, bool):
                return None
            else:
                out.append(operator.index(v))
    except Exception:  # noqa: BLE001 - not a sequence of whole numbers, however it fails
        return None
    return out


ResultT = TypeVar("ResultT", GraderScore, GraderRank, GraderError)


def _metadata_bounded(result: ResultT) -> ResultT:
    """The result, its metadata cut where it nests too deeply or holds itself (`metadata.bounded`)."""
    if not result.metadata or is_flat(result.metadata):
        return result
    return replace(result, metadata=bounded(result.metadata))


def _shape_problem(result: GraderScore | GraderRank) -> str:
    """What is wrong with a result's reason or metadata, or "" when each is of its type or None."""
    if result.reason is not None and not isinstance(result.reason, str):
        return f"a reason of type {type(result.reason).__name__}, not str"
    if result.metadata is not None and not isinstance(result.metadata, Mapping):
        return f"metadata of type {type(result.metadata).__name__}, not a dict"
    return ""


def _error_well_formed(error: GraderError) -> bool:
    return (
        type(error.error) is str
        and isinstance(error.code, str)
        and type(error.reason) is str
        and isinstance(error.metadata, dict)
    )


def _error_made_well_formed(error: GraderError) -> GraderError:
    """An error a grader returned with fields of the wrong type: still its sample's error, its texts made
    strings and an unknown code GRADER_FAILED."""
    return replace(
        error,
        error=_as_text(error.error),
        code=error.code if isinstance(error.code, str) else ErrorCode.GRADER_FAILED,
        reason=_as_text(error.reason),
        metadata=error.metadata if isinstance(error.metadata, Mapping) else {},
    )


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else describe(value)


def _shown(score: object) -> str:
    """A wrong score as its error message shows it: its repr, at most 40 characters."""
    try:
        text = repr(score)
    except Exception:  # noqa: BLE001 - an int past 4300 digits, a hostile __repr__
        return f"<{type(score).__name__}>"
    return encodable(text if len(text) <= 40 else text[:39] + "\N{HORIZONTAL ELLIPSIS}")


def error_from(grader: BaseGrader, exc: BaseException, timeout: float | None) -> GraderError:
    if isinstance(exc, GraderTimeout):
        limit = timeout if timeout is not None else SAMPLE_TIME_LIMIT.get()  # a grader that bounds its own time
        said = f" of {limit:g} s" if limit is not None else ""
        return GraderError(grader.name, f"grader ran past its time limit{said}", code=ErrorCode.TIMEOUT)
    if isinstance(exc, GraderRateLimited):
        return GraderError(grader.name, describe(exc, MAX_ERROR_CHARS), code=ErrorCode.RATE_LIMITED)
    if isinstance(exc, RecursionError):
        return GraderError(grader.name, "input nested too deeply to grade", code=ErrorCode.INVALID_SAMPLE)
    said = describe(exc, MAX_ERROR_CHARS)  # one whose message cannot be read still fails only its sample
    if isinstance(exc, TypeError) and "argument" in said:
        return GraderError(grader.name, f"missing or unexpected input: {said}", code=ErrorCode.INVALID_SAMPLE)
    return GraderError(grader.name, f"{type(exc).__name__}: {said}", code=ErrorCode.GRADER_FAILED)


def budget_error(grader: str) -> GraderError:
    """A sample's result for a grader that did not grade it before the call's deadline (`budget_seconds`)."""
    return GraderError(grader, "the call's step budget (budget_seconds) ran out", code=ErrorCode.BUDGET_EXCEEDED)


def grade_sync(
    grader: BaseGrader, batch: list[dict[str, Any]], timeout: float | None, deadline: float | None = None
) -> list[GraderResult]:
    """Grade a chunk with a synchronous grader; one result per sample, in order.

    The timer is live only while `evaluate` runs (`_Watch.active`), and raises at most once per sample, so a
    timeout always lands inside the `try` that records it. A cancelled call's chunk stops with
    `GraderCancelled` (between samples, or inside one at the next tick): its results would be thrown away.
    Once the call's `deadline` (`time.monotonic()`) passes, the running sample is stopped at the next tick
    and it and the rest of the chunk get BUDGET_EXCEEDED; the results before it are kept.
    """
    out: list[GraderResult] = []
    evaluate = grader.evaluate
    with _alarm(timeout, deadline) as watch:
        for kwargs in batch:
            watch.check_cancelled()
            if watch.over:
                out.extend([budget_error(grader.name)] * (len(batch) - len(out)))
                break
            try:
                watch.begin()
                try:
                    result = evaluate(**kwargs)
                finally:
                    watch.end()
                out.append(check_result(grader, result, kwargs))
            except GraderTimeout as exc:
                out.append(error_from(grader, exc, timeout))
            except GraderOverBudget:
                out.append(budget_error(grader.name))
            except NOT_A_RESULT:
                raise
            except BaseException as exc:  # noqa: BLE001 - a grader's own exception is its sample's error
                out.append(error_from(grader, exc, timeout))
    return out


def _within(timeout: float | None, deadline: float | None) -> tuple[float | None, bool]:
    """The time a sample may still take: its own limit, or less when the call's deadline comes first; and
    whether the deadline is the bound (so a wait that ends at it is the budget's doing, not the grader's).

    Which bound ended a wait is decided here, when it starts, never by reading the clock after it: an
    event loop's timer may fire a little before `time.monotonic()` reaches its time (uvloop's, by up to the
    age of the clock it reads once a turn), and a sample cut by the budget would read as a grader past its
    time limit."""
    if deadline is None:
        return timeout, False
    left = deadline - time.monotonic()
    if timeout is None or left <= timeout:
        return left, True
    return timeout, False


async def grade_async(
    grader: BaseGrader, batch: list[dict[str, Any]], timeout: float | None, deadline: float | None = None
) -> list[GraderResult]:
    """Grade a chunk with an async grader: the samples run concurrently, each under the time limit; those
    still running when the call's `deadline` passes are stopped with BUDGET_EXCEEDED. A grader that bounds
    its own time gets the limit as `context.SAMPLE_TIME_LIMIT` instead (an LLM judge counts it from its
    first attempt, not from its wait for a turn under its model's limits)."""
    if grader.bounds_own_time:
        SAMPLE_TIME_LIMIT.set(timeout)  # in this task's context, which each sample's task copies
        timeout = None

    def timed_out(by_deadline: bool) -> GraderError:
        return budget_error(grader.name) if by_deadline else error_from(grader, GraderTimeout(), timeout)

    async def one(kwargs: dict[str, Any]) -> GraderResult:
        limit, by_deadline = _within(timeout, deadline)
        try:
            result = await asyncio.wait_for(grader.aevaluate(**kwargs), limit)
            return check_result(grader, result, kwargs)
        except TimeoutError:
            return timed_out(by_deadline)
        except NOT_A_RESULT:
            raise
        except BaseException as exc:  # noqa: BLE001 - as in `grade_sync`
            return error_from(grader, exc, timeout)

    batch_method = getattr(grader, "aevaluate_batch", None)
    if batch_method is not None:
        limit, by_deadline = _within(timeout, deadline)
        try:
            results = await asyncio.wait_for(batch_method(batch), limit)
        except TimeoutError:
            return [timed_out(by_deadline) for _ in batch]
        except NOT_A_RESULT:
            raise
        except BaseException as exc:  # noqa: BLE001 - as in `grade_sync`
            return [error_from(grader, exc, timeout) for _ in batch]
        return [
            error_from(grader, r, timeout) if isinstance(r, BaseException) else check_result(grader, r, kw)
            for r, kw in zip(results, batch, strict=True)
        ]
    return list(await asyncio.gather(*(one(kw) for kw in batch)))


def grade_chunk_sync(
    graders: Sequence[BaseGrader], chunk: list[Any], timeout: float | None, deadline: float | None = None
) -> tuple[list[list[GraderResult]], list[GraderStats]]:
    """Every grader over a chunk, one after the other, where the chunk is (inline, or a whole chunk in a
    worker): `columns[j][k]` is grader j's result for sample k, unusable samples included as errors.

    Past the call's `deadline`, what is left is BUDGET_EXCEEDED (see `grade_sync`). Graders run one after
    the other, so the first grader's samples graded before the deadline still get the later graders'
    results if they come within `FINISH_SECONDS` after it; a sample one grader did not reach in time is
    not graded by the later ones (BUDGET_EXCEEDED from each)."""
    good = usable(chunk)
    columns: list[list[GraderResult]] = []
    stats: list[GraderStats] = []
    failed: set[int] = set()  # samples some grader failed on, filled only for chunks with errors
    cut: set[int] = set()  # samples of `good` a grader did not reach by the deadline
    for j, grader in enumerate(graders):
        start = time.perf_counter()
        batch = select_all(good, inputs_of(grader), own=len(graders) > 1)
        if deadline is None:
            results = grade_sync(grader, batch, timeout)
        elif not cut:
            results = grade_sync(grader, batch, timeout, deadline + (FINISH_SECONDS if j else 0.0))
        else:
            graded = iter(
                grade_sync(
                    grader, [kw for k, kw in enumerate(batch) if k not in cut], timeout, deadline + FINISH_SECONDS
                )
            )
            results = [budget_error(grader.name) if k in cut else next(graded) for k in range(len(batch))]
        if deadline is not None:
            cut.update(
                k for k, r in enumerate(results) if isinstance(r, GraderError) and r.code == ErrorCode.BUDGET_EXCEEDED
            )
        if good is not chunk:  # the unusable samples' INVALID_SAMPLE errors are counted too
            results = with_problems(grader.name, chunk, results)
        graded_stats = grader_stats(grader.name, results, time.perf_counter() - start)
        if graded_stats.errors:
            graded_stats = graded_stats._replace(failed=_first_failures(results, failed))
        stats.append(graded_stats)
        columns.append(results)
    return columns, stats


def _first_failures(column: list[GraderResult], failed: set[int]) -> int:
    """How many of the column's errors are on samples no earlier grader failed on (added to `failed`)."""
    first = 0
    for k, result in enumerate(column):
        if isinstance(result, GraderError) and k not in failed:
            failed.add(k)
            first += 1
    return first


def grade_column(
    grader: BaseGrader, columns: Mapping[str, Sequence[str]], n: int, timeout: float | None
) -> list[float] | None:
    """The grader's scores for a chunk in one `score_column` call, or None when the chunk must be graded
    sample by sample: the call raised, ran past `timeout` (the whole column has one sample's limit), or gave
    anything but n finite numbers (`grade_sync` then gives each sample the result or error it would get)."""
    with _alarm(timeout) as watch:
        watch.check_cancelled()
        try:
            watch.begin()
            try:
                scores = grader.score_column(**{name: columns[name] for name in column_inputs(grader)})  # type: ignore[misc]
            finally:
                watch.end()
        except NOT_A_RESULT:
            raise
        except BaseException:  # noqa: BLE001 - a timeout, or anything the column raised: graded sample by sample
            return None
    try:  # C loops for the common case; a sum is finite only when every term is
        fine = len(scores) == n and {*map(type, scores)} <= NUMBER_TYPES and math.isfinite(sum(scores))
    except (TypeError, OverflowError):
        fine = False
    return list(scores) if fine else None


def grade_columns(
    graders: Sequence[BaseGrader],
    columns: Mapping[str, Sequence[str]],
    n: int,
    kwargs: Callable[[], list[Any]],
    timeout: float | None,
) -> tuple[list[list[Result]], list[GraderStats]]:
    """Every grader over a chunk given as text columns (the scores view, every grader with a
    `score_column`): `columns[j][k]` grader j's score for sample k; where a column call cannot answer, the
    chunk's `kwargs()` graded sample by sample by every grader instead (`grade_chunk_sync`)."""
    out: list[list[Result]] = []
    stats: list[GraderStats] = []
    for grader in graders:
        start = time.perf_counter()
        scores = grade_column(grader, columns, n, timeout)
        if scores is None:
            return grade_chunk_sync(graders, kwargs(), timeout)  # type: ignore[return-value]
        out.append(list(scores))
        stats.append(GraderStats(grader.name, n, 0, time.perf_counter() - start, histogram(scores)))
    return out, stats
