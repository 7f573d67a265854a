"""The one work type and the one result type of the execution layer.

A `WorkItem` is a group of a call's graders over a run of its samples: the graders' specs (each process
builds them from its own registry), the samples as keyword arguments or as bytes in a service's codec
(`Encoded`), the per-sample time limit and the call's deadline, which crosses to another process as the
seconds left (`task`). A `ChunkResult` is what comes back: the results as columns (or the codec's encoded
answer), the graders' stats, and the failures the quarantine learns from: (sample index, grader position,
error) of each result that timed out or lost its worker, found where the answer was made, so nobody parses
an answer again to learn them.

Both are generic where the executors' fault policy needs them to be (`executors.Executor.run`): an item
splits into one item per sample (`split`, by slicing its samples or cutting its bytes with the codec), one
sample that could not be graded has a result of errors (`failed`), and the parts' results concatenate
(`join`, `ChunkResult.concat`), so isolating the sample that kills a process is the same whatever travels.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from grpcgrade.grader import BaseGrader, GraderError, GraderResult

from .codecs import codec_named
from .executors import Task
from .grading import (
    Stats,
    column_inputs,
    failed_stats,
    grade_chunk_sync,
    grade_columns,
    grade_sync,
    grader_stats,
    inputs_of,
    join_stats,
)
from .histograms import EMPTY
from .result_cache import QUARANTINE_CODES
from .rewards import Result, RewardStats, SpecData, reward_stats, rewards
from .samples import requirements

#: (sample index in the request, grader position in the item, error) of a result that timed out or lost its
#: worker: what the quarantine keeps.
Failure = tuple[int, int, GraderError]


@dataclass(frozen=True)
class Encoded:
    """Samples as bytes in a service's codec (`codecs.Codec`, named "module:attribute"), with the codec's
    `options` (the answer's view, the sample limits...)."""

    codec: str
    data: bytes
    options: Any = None


@dataclass(frozen=True)
class ChunkResult:
    """A group's results over a run of samples. `indices` are the samples' places in the request; the
    results are `columns[j][k]` (grader j, sample k) with `rewards[k]` where the group holds every grader
    of the call, or the codec's `encoded` answer (named `codec`) instead of both. `stats` are each grader's
    (and the configured reward's) as counted where it was graded; `failures` see `Failure`. `partial`: some
    rows of a chunk, handed on as they finished (`Engine.grade_rows`)."""

    indices: Sequence[int]
    columns: list[list[GraderResult]] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)
    encoded: bytes | None = None
    codec: str = ""
    stats: Sequence[Stats] = ()
    failures: Sequence[Failure] = ()
    partial: bool = False

    @property
    def size(self) -> int:
        return len(self.indices)

    def rows(self, ks: Sequence[int]) -> ChunkResult:
        """Rows `ks` (positions in this result) of a result of columns, as a partial result."""
        return ChunkResult(
            [self.indices[k] for k in ks],
            [[column[k] for k in ks] for column in self.columns],
            [self.rewards[k] for k in ks] if self.rewards else [],
            partial=True,
        )

    @staticmethod
    def concat(parts: Sequence[ChunkResult]) -> ChunkResult:
        """Consecutive parts of one chunk's result as one result."""
        first = parts[0]
        indices: Sequence[int] = [i for part in parts for i in part.indices]
        if indices and list(range(indices[0], indices[0] + len(indices))) == indices:
            indices = range(indices[0], indices[0] + len(indices))
        stats = join_stats([part.stats for part in parts])
        failures = [f for part in parts for f in part.failures]
        if first.encoded is not None:
            encoded = codec_named(first.codec).concat([part.encoded or b"" for part in parts])
            return ChunkResult(indices, encoded=encoded, codec=first.codec, stats=stats, failures=failures)
        columns = [[r for part in parts for r in part.columns[j]] for j in range(len(first.columns))]
        values = [v for part in parts for v in part.rewards]
        return ChunkResult(indices, columns, values, stats=stats, failures=failures)


@dataclass(frozen=True)
class WorkItem:
    """A group of a call's graders over samples `start`..`start+size-1` of its request (see the module
    docstring). `names` are the graders' names as built where the call arrived, for the errors of samples
    no process could grade; `whole`: the group is every grader of the call, so the item's results carry
    the samples' rewards (and, with `reward`, a configured reward's stats). `graders`, the instances built
    where the call arrived, serve an item run in that process (`run_here`) and never cross. A group of one
    grader the engine grades apart (beside an async grader, or behind the filter) is `selected`."""

    specs: tuple[SpecData, ...]
    names: tuple[str, ...]
    samples: list[Any] | Encoded  # keyword arguments (or the SampleProblem that makes one unusable)
    start: int
    size: int
    timeout: float | None  # per sample; the watchdog allows `size` of them
    deadline: float | None = None  # the call's, on this process's `time.monotonic()`
    whole: bool = False
    reward: str = ""
    graders: tuple[BaseGrader, ...] | None = field(default=None, compare=False, repr=False)
    #: One grader's usable samples, already as it takes them (`samples.select`, which is not idempotent:
    #: `reference` is offered under other names): graded as they are.
    selected: bool = False

    def task(self) -> Task:
        """What runs the item in another process: the item without its graders, its deadline made the
        seconds the call has left from now."""
        left = None if self.deadline is None else self.deadline - time.monotonic()
        return Task(run_item, (replace(self, deadline=None, graders=None),), left)

    def run_here(self) -> ChunkResult:
        """The item run in this process, with the graders built here."""
        return run_item(self, self.deadline)

    def slice(self, start: int, stop: int) -> WorkItem:
        """Samples `start`..`stop-1` of this item (positions within it) as an item of their own."""
        samples = self.samples
        if isinstance(samples, Encoded):
            part: list[Any] | Encoded = replace(samples, data=codec_named(samples.codec).cut(samples.data, start, stop))
        else:
            part = samples[start:stop]
        return replace(self, samples=part, start=self.start + start, size=stop - start)

    def split(self) -> list[WorkItem]:
        return [self.slice(k, k + 1) for k in range(self.size)]

    def failed(self, code: str, message: str) -> ChunkResult:
        """The result of this one-sample item when no process could grade it: every grader's error (which
        one was at fault is unknown)."""
        errors: list[list[GraderResult]] = [[GraderError(name, message, code=code)] for name in self.names]
        stats: list[Stats] = [failed_stats(name, code, first=j == 0) for j, name in enumerate(self.names)]
        if self.reward:
            stats.append(RewardStats(self.reward, EMPTY, 1))
        return _answer(self, None, errors, [None] if self.whole else [], stats, faults(errors, self.start))  # type: ignore[arg-type]

    def join(self, parts: list[ChunkResult]) -> ChunkResult:
        return ChunkResult.concat(parts)


def _column_fields(graders: Sequence[BaseGrader]) -> set[str] | None:
    """The text fields every grader's `score_column` takes, or None when one of them has none."""
    fields: set[str] = set()
    for grader in graders:
        inputs = column_inputs(grader)
        if not inputs:
            return None
        fields.update(inputs)
    return fields


def run_item(item: WorkItem, deadline: float | None = None) -> ChunkResult:
    """Grade `item` in this process: its graders (its own, or built from this process's registry) over its
    samples, decoded first when they are encoded, and the answer encoded there too. Past the call's
    `deadline` (`time.monotonic()`) the samples left are answered BUDGET_EXCEEDED."""
    graders = item.graders
    if graders is None:
        from .registry import get_registry

        registry = get_registry()
        graders = tuple(registry.build(spec.name, spec.params) for spec in item.specs)
    samples = item.samples
    columns: list[list[Result]]
    decoded = None
    if isinstance(samples, Encoded):
        required = requirements((g.name, inputs_of(g)) for g in graders)
        decoded = codec_named(samples.codec).decode(samples.data, samples.options, required)
        fields = _column_fields(graders) if deadline is None else None
        # The scores of graders with a `score_column`: text columns in, scores out, no dict per sample. (A
        # call with a step budget is graded sample by sample: the budget cuts between samples.)
        text = decoded.text(fields) if fields is not None else None
        if text is not None:
            columns, stats = grade_columns(graders, text, decoded.n, decoded.kwargs, item.timeout)
        else:
            columns, stats = grade_chunk_sync(graders, decoded.kwargs(), item.timeout, deadline)  # type: ignore[assignment]
    elif item.selected:
        (grader,) = graders
        began = time.perf_counter()
        results = grade_sync(grader, samples, item.timeout, deadline)
        columns, stats = [results], [grader_stats(grader.name, results, time.perf_counter() - began)]  # type: ignore[list-item]
    else:
        columns, stats = grade_chunk_sync(graders, samples, item.timeout, deadline)  # type: ignore[assignment]
    out: list[Stats] = list(stats)
    values = rewards(list(item.specs), columns) if item.whole else []
    if item.whole and item.reward:
        out.append(reward_stats(item.reward, values))
    failures = (
        faults(columns, item.start) if any(c in QUARANTINE_CODES for s in stats for c, _ in s.error_codes) else []
    )
    return _answer(item, decoded, columns, values, out, failures)


def faults(columns: Sequence[Sequence[Any]], start: int = 0) -> list[Failure]:
    """The failures the quarantine keeps among `columns` (`columns[j][k]`: grader j, sample `start + k`)."""
    return [
        (start + k, j, r)
        for j, column in enumerate(columns)
        for k, r in enumerate(column)
        if isinstance(r, GraderError) and r.code in QUARANTINE_CODES
    ]


def _answer(
    item: WorkItem,
    decoded: Any,
    columns: list[list[Result]],
    values: list[float | None],
    stats: list[Stats],
    failures: list[Failure],
) -> ChunkResult:
    """The item's result: its columns, or the codec's answer for encoded samples."""
    indices = range(item.start, item.start + item.size)
    samples = item.samples
    if not isinstance(samples, Encoded):
        return ChunkResult(list(indices), columns, values, stats=stats, failures=failures)  # type: ignore[arg-type]
    codec = codec_named(samples.codec)
    if decoded is None:  # a result made without grading (`failed`): the sample read for what the answer names
        decoded = codec.decode(samples.data, samples.options, {})
    labels = [(spec.label, name) for spec, name in zip(item.specs, item.names, strict=True)]
    data = codec.encode(decoded, item.start, labels, columns, values or [None] * decoded.n, samples.options)
    return ChunkResult(indices, encoded=data, codec=samples.codec, stats=stats, failures=failures)
