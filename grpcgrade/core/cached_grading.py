"""The engine's use of the result cache and the quarantine, around one grader's run over a chunk.

A grader that uses the cache (or has samples in quarantine) is graded per grader, not in whole chunks:
each sample's key is looked up first, quarantined samples get their error at once, cache hits their stored
result, and only the misses are graded, each distinct input once (a GRPO group repeats its prompt, and
identical completions are common). Successes are stored; a TIMEOUT or WORKER_LOST puts the input in
quarantine wherever it was graded, whole chunks included. A call none of whose graders uses either pays
one check per call and nothing per sample.

Identical inputs in flight at once are graded once as well: async graders are graded sample by sample (a
slow judgment holds only its own sample), so the duplicates of a GRPO group arrive as separate runs, often
from separate calls. A miss whose key is being graded already waits for that grading instead of starting
its own; it takes the result only when it is a success the cache kept (an error, a budget cut or a
cancelled owner belongs to the owner's call), and otherwise grades its sample itself.

Counts per grader (hits, misses, quarantine hits) are plain counters the metrics read when scraped.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from grpcgrade.grader import BaseGrader, GraderError, GraderResult

from .grading import GraderStats, Stats
from .result_cache import (
    QUARANTINE_CODES,
    CacheConfig,
    CacheMode,
    Quarantine,
    QuarantineConfig,
    ResultCache,
    content_key,
    scope_of,
)
from .samples import select

if TYPE_CHECKING:
    from .engine import Job

Grade = Callable[[list[dict[str, Any]]], Awaitable[list[GraderResult]]]


def quarantinable(stats: Iterable[Stats]) -> bool:
    """Whether a chunk's stats report a result the quarantine keeps (TIMEOUT, WORKER_LOST)."""
    return any(isinstance(s, GraderStats) and any(c in QUARANTINE_CODES for c, _ in s.error_codes) for s in stats)


class CachedGrading:
    """The server's result cache and quarantine, as the engine uses them (either may be off: None)."""

    def __init__(self, cache: ResultCache | None = None, quarantine: Quarantine | None = None) -> None:
        self.cache = cache
        self.quarantine = quarantine
        self.hits: Counter[str] = Counter()
        self.misses: Counter[str] = Counter()
        self.quarantine_hits: Counter[str] = Counter()
        #: Keys being graded now: the cached result their grading stored (None: nothing kept), for the
        #: identical misses that arrive meanwhile.
        self._inflight: dict[bytes, asyncio.Future[GraderResult | None]] = {}

    @classmethod
    def from_config(cls, cache: CacheConfig, quarantine: QuarantineConfig) -> CachedGrading:
        return cls(
            ResultCache(cache.max_bytes, cache.ttl_seconds) if cache.enabled else None,
            Quarantine(quarantine.max_bytes, quarantine.ttl_seconds) if quarantine.enabled else None,
        )

    # -- deciding ---------------------------------------------------------------------------------------

    def uses_cache(self, grader: BaseGrader, mode: CacheMode) -> bool:
        """Whether a call in `mode` reads and writes the cache for this grader."""
        if self.cache is None or mode is CacheMode.OFF:
            return False
        return mode is CacheMode.ON or grader.cache_by_default

    def _quarantined(self, job: Job) -> bool:
        return bool(self.quarantine) and self.quarantine.holds(scope_of(job.grader, job.spec.params))  # type: ignore[union-attr]

    def per_grader(self, jobs: Sequence[Job]) -> bool:
        """Whether the call must be graded per grader (never in whole chunks) for the cache or quarantine."""
        return any(job.use_cache for job in jobs) or (bool(self.quarantine) and any(map(self._quarantined, jobs)))

    # -- grading ----------------------------------------------------------------------------------------

    async def run(
        self, job: Job, batch: list[dict[str, Any]], grade: Grade, limit: float | None = None
    ) -> list[GraderResult]:
        """`grade(batch)`'s results, with the cache and the quarantine in front of it; `limit` is the call's
        per-sample time limit."""
        if not job.use_cache and not self._quarantined(job):
            results = await grade(batch)
            self.note(job, batch, results, limit)
            return results
        scope, name = scope_of(job.grader, job.spec.params), job.grader.name
        keys = [content_key(scope, kw, job.inputs) for kw in batch]
        out: list[GraderResult | None] = [None] * len(batch)
        todo: dict[bytes, list[int]] = {}  # key -> the positions it answers (several: duplicates)
        cache = self.cache if job.use_cache else None
        quarantine = self.quarantine if self._quarantined(job) else None
        hits = quarantined = 0
        waiting: list[tuple[int, asyncio.Future[GraderResult | None]]] = []  # misses graded by another run
        owned: list[bytes] = []  # keys this run grades that other runs may wait for
        for i, key in enumerate(keys):
            if quarantine is not None and (error := quarantine.answer(key, name, limit)) is not None:
                out[i] = error
                quarantined += 1
            elif cache is not None and (hit := cache.get(key)) is not None:
                out[i] = hit
                hits += 1
            elif cache is not None and key in todo:
                todo[key].append(i)  # graded once, for the first of its duplicates
                hits += 1
            elif cache is not None and (pending := self._inflight.get(key)) is not None:
                waiting.append((i, pending))  # being graded by another run right now
            else:
                todo[key if cache is not None else i.to_bytes(8)] = [i]
                if cache is not None:
                    self._inflight[key] = asyncio.get_running_loop().create_future()
                    owned.append(key)
        try:
            graded = await grade([batch[positions[0]] for positions in todo.values()])  # even none: stats count
            for (key, positions), result in zip(todo.items(), graded, strict=True):
                first = positions[0]
                out[first] = result
                if cache is not None:
                    stored = cache.store(key, result, scope)
                    self._settle(key, stored)
                    for other in positions[1:]:
                        out[other] = stored or result
                if isinstance(result, GraderError) and result.code in QUARANTINE_CODES:
                    self._add(job, keys[first], batch[first], result, limit)
        finally:  # graded, failed or cancelled: nobody waits on this run's keys any more
            for key in owned:
                self._settle(key, None)
        if waiting:
            shared = await self._shared(waiting)
            hits += sum(kept is not None for _, kept in shared)
            alone = [i for i, kept in shared if kept is None]
            for i, kept in shared:
                out[i] = kept
            if alone:  # the other run kept nothing for them: graded here after all, as misses
                for i, result in zip(alone, await grade([batch[i] for i in alone]), strict=True):
                    out[i] = result
                    if isinstance(result, GraderError) and result.code in QUARANTINE_CODES:
                        self._add(job, keys[i], batch[i], result, limit)
                self.misses[name] += len(alone)
        if cache is not None:
            self.hits[name] += hits
            self.misses[name] += len(todo)
        if quarantined:
            self.quarantine_hits[name] += quarantined
        return out  # type: ignore[return-value]  # every position was filled

    def _settle(self, key: bytes, stored: GraderResult | None) -> None:
        """The grading of `key` has ended: the runs waiting for it get what the cache kept (None: nothing)."""
        pending = self._inflight.pop(key, None)
        if pending is not None and not pending.done():
            pending.set_result(stored)

    @staticmethod
    async def _shared(
        waiting: list[tuple[int, asyncio.Future[GraderResult | None]]],
    ) -> list[tuple[int, GraderResult | None]]:
        """What the runs grading these positions' keys kept, once they have ended (shielded: this run
        being cancelled must not cancel a result other runs wait for too)."""
        return [(i, await asyncio.shield(pending)) for i, pending in waiting]

    def _add(self, job: Job, key: bytes, selected: dict[str, Any], error: GraderError, limit: float | None) -> None:
        if self.quarantine is not None:
            scope = scope_of(job.grader, job.spec.params)
            self.quarantine.add(key, error, scope, selected, job.inputs, limit)

    def _record(self, job: Job, selected: dict[str, Any], error: GraderError, limit: float | None) -> None:
        key = content_key(scope_of(job.grader, job.spec.params), selected, job.inputs)
        self._add(job, key, selected, error, limit)

    def note(
        self, job: Job, batch: Sequence[dict[str, Any]], results: Sequence[GraderResult], limit: float | None = None
    ) -> None:
        """Quarantine the inputs among `batch` (as the grader received them) whose result was a TIMEOUT or
        a WORKER_LOST."""
        if self.quarantine is None:
            return
        for selected, result in zip(batch, results, strict=True):
            if isinstance(result, GraderError) and result.code in QUARANTINE_CODES:
                self._record(job, selected, result, limit)

    def note_columns(
        self,
        jobs: Sequence[Job],
        chunk: Sequence[Any],
        columns: Sequence[Sequence[GraderResult]],
        limit: float | None = None,
    ) -> None:
        """`note` for a chunk graded with every grader at once: `chunk` holds each sample's fields (or the
        SampleProblem that made it unusable), `columns[j]` grader j's results."""
        if self.quarantine is None:
            return
        for job, column in zip(jobs, columns, strict=True):
            for kwargs, result in zip(chunk, column, strict=True):
                if isinstance(result, GraderError) and result.code in QUARANTINE_CODES and isinstance(kwargs, dict):
                    self._record(job, select(kwargs, job.inputs), result, limit)

    def note_sample(self, job: Job, kwargs: dict[str, Any], error: GraderError, limit: float | None = None) -> None:
        """Quarantine one sample (all its fields, as the engine holds them) for this grader."""
        if error.code in QUARANTINE_CODES:
            self._record(job, select(kwargs, job.inputs), error, limit)
