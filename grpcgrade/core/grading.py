"""Running one grader over a chunk of samples, the same way inline and in a worker process.

Every sample gets exactly one result: a grader's exception, a non-finite score or a malformed rank
becomes a `GraderError` for that sample only (decision D7). A per-sample time limit is enforced with
SIGALRM where the caller runs on the main thread (the event loop of the server, a worker's task loop):
the grader's Python code is interrupted and the next sample goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

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

from .errors import ErrorCode, GraderCancelled, GraderTimeout, SampleProblem
from .histograms import EMPTY, Histogram, count_pairs, histogram
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


#: What a chunk's grading reports to the metrics: each grader's work, and a configured reward's values.
Stats = GraderStats | RewardStats


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


def failed_stats(name: str, code: str, samples: int = 1) -> GraderStats:
    """The stats of samples that could not be graded at all (a worker died or hung on one)."""
    return GraderStats(name, 0, samples, 0.0, EMPTY, ((code, samples),))


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


_inputs: weakref.WeakKeyDictionary[BaseGrader, Inputs] = weakref.WeakKeyDictionary()


def inputs_of(grader: BaseGrader) -> Inputs:
    """The grader's declared inputs; signature inspection costs ~60 µs, so once per built grader."""
    inputs = _inputs.get(grader)
    if inputs is None:
        inputs = _inputs[grader] = grader.input_names()
    return inputs


_column_inputs: weakref.WeakKeyDictionary[BaseGrader, tuple[str, ...]] = weakref.WeakKeyDictionary()


def column_inputs(grader: BaseGrader) -> tuple[str, ...]:
    """The text fields `grader.score_column` takes; empty when it has none it can be called with."""
    fields = _column_inputs.get(grader)
    if fields is None:
        fields = ()
        if grader.score_column is not None:
            inputs = declared_names(grader.score_column)
            if not inputs.open and inputs.names and inputs.names <= set(TEXT_FIELDS):
                fields = tuple(sorted(inputs.names))
        _column_inputs[grader] = fields
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


class _Watch:
    """The sample being timed: when it started, how long it may take, and whether its call still wants it.

    `fired` makes the alarm raise at most once per sample: a second tick cannot land in the grading loop's
    own `except` block (where nothing would catch it) while the first timeout is being recorded.
    """

    active = False
    fired = False
    start = 0.0
    limit = float("inf")
    cancelled: Callable[[], bool] | None = None  # set in a worker while it grades a call's chunk


def _on_alarm(signum: int, frame: Any) -> None:
    if not _Watch.active or _Watch.fired:
        return
    if time.perf_counter() - _Watch.start >= _Watch.limit:
        _Watch.fired = True
        raise GraderTimeout
    if _Watch.cancelled is not None and _Watch.cancelled():
        _Watch.fired = True
        raise GraderCancelled


ALARM_MAX_INTERVAL = 0.1  # how late a cancellation reaches a sample that is running Python code


@contextlib.contextmanager
def _alarm(seconds: float | None) -> Iterator[bool]:
    """A periodic SIGALRM for a whole chunk; it raises only in a sample that has run past `seconds` (at most
    10% late) or whose call was cancelled. The handler is installed once per process and the timer armed
    per chunk: two cheap syscalls per chunk, nothing per sample. Off the main thread there is no limit."""
    watching = bool(seconds) or _Watch.cancelled is not None
    if not watching or threading.current_thread() is not threading.main_thread():
        yield False
        return
    if signal.getsignal(signal.SIGALRM) is not _on_alarm:  # first chunk, or a grader swapped it out
        signal.signal(signal.SIGALRM, _on_alarm)
    _Watch.limit = seconds or float("inf")
    interval = min(max((seconds or 1.0) / 10, 0.005), ALARM_MAX_INTERVAL)
    signal.setitimer(signal.ITIMER_REAL, interval, interval)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _Watch.active = False


def _check_cancelled() -> None:
    if _Watch.cancelled is not None and _Watch.cancelled():
        raise GraderCancelled


def check_result(grader: BaseGrader, result: Any, kwargs: dict[str, Any]) -> GraderResult:
    """Only well-formed, finite results reach a trainer."""
    name = grader.name
    if isinstance(result, GraderError):
        return result
    if isinstance(result, GraderScore):
        if not is_finite_score(result.score):
            return GraderError(
                name, f"grader returned a non-finite score {result.score!r}", code=ErrorCode.INVALID_RESULT
            )
        return result
    if isinstance(result, GraderRank):
        n = len(kwargs.get("responses") or result.rank)
        if sorted(result.rank) != list(range(1, n + 1)):
            return GraderError(
                name, f"rank {result.rank} is not a permutation of 1..{n}", code=ErrorCode.INVALID_RESULT
            )
        return result
    expected = "GraderRank" if grader.mode is GraderMode.LISTWISE else "GraderScore"
    return GraderError(name, f"grader returned {type(result).__name__}, not {expected}", code=ErrorCode.INVALID_RESULT)


def error_from(grader: BaseGrader, exc: BaseException, timeout: float | None) -> GraderError:
    if isinstance(exc, GraderTimeout):
        return GraderError(grader.name, f"grader ran past its time limit of {timeout:g} s", code=ErrorCode.TIMEOUT)
    if isinstance(exc, RecursionError):
        return GraderError(grader.name, "input nested too deeply to grade", code=ErrorCode.INVALID_SAMPLE)
    if isinstance(exc, TypeError) and "argument" in str(exc):
        return GraderError(grader.name, f"missing or unexpected input: {exc}", code=ErrorCode.INVALID_SAMPLE)
    return GraderError(grader.name, f"{type(exc).__name__}: {exc}", code=ErrorCode.GRADER_FAILED)


def grade_sync(grader: BaseGrader, batch: list[dict[str, Any]], timeout: float | None) -> list[GraderResult]:
    """Grade a chunk with a synchronous grader; one result per sample, in order.

    The timer is live only while `evaluate` runs (`_Watch.active`), and raises at most once per sample, so a
    timeout always lands inside the `try` that records it. A cancelled call's chunk stops with
    `GraderCancelled` (between samples, or inside one at the next tick): its results would be thrown away.
    """
    out: list[GraderResult] = []
    evaluate = grader.evaluate
    with _alarm(timeout):
        for kwargs in batch:
            _check_cancelled()
            try:
                _Watch.start, _Watch.fired = time.perf_counter(), False
                _Watch.active = True
                try:
                    result = evaluate(**kwargs)
                finally:
                    _Watch.active = False
                out.append(check_result(grader, result, kwargs))
            except GraderTimeout as exc:
                out.append(error_from(grader, exc, timeout))
            except Exception as exc:
                out.append(error_from(grader, exc, timeout))
    return out


async def grade_async(grader: BaseGrader, batch: list[dict[str, Any]], timeout: float | None) -> list[GraderResult]:
    """Grade a chunk with an async grader: the samples run concurrently, each under the time limit."""
    if grader.bounds_own_time:
        timeout = None

    async def one(kwargs: dict[str, Any]) -> GraderResult:
        try:
            result = await asyncio.wait_for(grader.aevaluate(**kwargs), timeout)
            return check_result(grader, result, kwargs)
        except TimeoutError:
            return error_from(grader, GraderTimeout(), timeout)
        except Exception as exc:
            return error_from(grader, exc, timeout)

    batch_method = getattr(grader, "aevaluate_batch", None)
    if batch_method is not None:
        try:
            results = await asyncio.wait_for(batch_method(batch), timeout)
        except TimeoutError:
            return [error_from(grader, GraderTimeout(), timeout) for _ in batch]
        except Exception as exc:
            return [error_from(grader, exc, timeout) for _ in batch]
        return [
            error_from(grader, r, timeout) if isinstance(r, BaseException) else check_result(grader, r, kw)
            for r, kw in zip(results, batch, strict=True)
        ]
    return list(await asyncio.gather(*(one(kw) for kw in batch)))


def grade_chunk_sync(
    graders: Sequence[BaseGrader], chunk: list[Any], timeout: float | None
) -> tuple[list[list[GraderResult]], list[GraderStats]]:
    """Every grader over a chunk, one after the other, where the chunk is (inline, or a whole chunk in a
    worker): `columns[j][k]` is grader j's result for sample k, unusable samples included as errors."""
    good = usable(chunk)
    columns: list[list[GraderResult]] = []
    stats: list[GraderStats] = []
    for grader in graders:
        start = time.perf_counter()
        results = grade_sync(grader, select_all(good, inputs_of(grader)), timeout)
        if good is not chunk:  # the unusable samples' INVALID_SAMPLE errors are counted too
            results = with_problems(grader.name, chunk, results)
        stats.append(grader_stats(grader.name, results, time.perf_counter() - start))
        columns.append(results)
    return columns, stats


def grade_column(
    grader: BaseGrader, columns: Mapping[str, Sequence[str]], n: int, timeout: float | None
) -> list[float] | None:
    """The grader's scores for a chunk in one `score_column` call, or None when the chunk must be graded
    sample by sample: the call raised, ran past `timeout` (the whole column has one sample's limit), or gave
    anything but n finite numbers (`grade_sync` then gives each sample the result or error it would get)."""
    _check_cancelled()
    with _alarm(timeout):
        try:
            _Watch.start, _Watch.fired = time.perf_counter(), False
            _Watch.active = True
            try:
                scores = grader.score_column(**{name: columns[name] for name in column_inputs(grader)})  # type: ignore[misc]
            finally:
                _Watch.active = False
        except (GraderTimeout, Exception):
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
    `score_column`): `columns[j][k]` grader j's score for sample k, or, where its column call could not
    answer, its result from grading the chunk's `kwargs()` sample by sample."""
    out: list[list[Result]] = []
    stats: list[GraderStats] = []
    chunk: list[Any] | None = None
    for grader in graders:
        start = time.perf_counter()
        scores = grade_column(grader, columns, n, timeout)
        if scores is not None:
            out.append(list(scores))
            stats.append(GraderStats(grader.name, n, 0, time.perf_counter() - start, histogram(scores)))
            continue
        chunk = kwargs() if chunk is None else chunk
        (results,), (stat,) = grade_chunk_sync([grader], chunk, timeout)
        out.append(list(results))
        stats.append(stat._replace(seconds=time.perf_counter() - start))
    return out, stats
