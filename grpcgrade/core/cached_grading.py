"""The result cache and the quarantine as one filter in front of a call's groups of graders.

The plan (`plan.place`) asks the filter which graders it `filters`: one that uses the cache (or has inputs
in quarantine) is a group of its own, not part of whole chunks, and the filter stands in front of it
(`run`): each sample's key is looked up first, quarantined samples get their error at once, cache hits
their stored result, and only the misses are graded, each distinct input once (a GRPO group repeats its
prompt, and identical completions are common). Successes are stored. The quarantine learns from every
group's result, filtered or not, whole chunks included: a result carries its failures (TIMEOUT, WORKER_LOST:
`work.Failure`), found where the answer was made (`learn`). A call none of whose graders uses either pays
one check per grader per call and nothing per sample.

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
from typing import Any

from grpcgrade.grader import BaseGrader, GraderError, GraderResult

from .plan import Job
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
from .work import ChunkResult, Failure

#: Grades a part of a group's samples (a group of one grader): its result, `columns[0]` the results.
Grade = Callable[[list[dict[str, Any]]], Awaitable[ChunkResult]]


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

    def filters(self, job: Job) -> bool:
        """Whether the filter stands in front of this grader in a call (never in whole chunks): it uses the
        cache, or has inputs in quarantine."""
        return job.use_cache or self._quarantined(job)

    # -- grading ----------------------------------------------------------------------------------------

    async def run(
        self, job: Job, batch: list[dict[str, Any]], grade: Grade, limit: float | None = None
    ) -> list[GraderResult]:
        """`grade(batch)`'s results, with the cache and the quarantine in front of it; `limit` is the call's
        per-sample time limit."""
        if not job.use_cache and not self._quarantined(job):  # the quarantine was cleared since the plan
            graded = await grade(batch)
            self.learn([job], graded.failures, batch.__getitem__, limit)
            return graded.columns[0]
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
            for (key, positions), result in zip(todo.items(), graded.columns[0], strict=True):
                first = positions[0]
                out[first] = result
                if cache is not None:
                    stored = cache.store(key, result, scope)
                    self._settle(key, stored)
                    for other in positions[1:]:
                        out[other] = stored or result
            firsts = [positions[0] for positions in todo.values()]
            for row, _, error in graded.failures:
                self._add(job, keys[firsts[row]], batch[firsts[row]], error, limit)
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
                again = await grade([batch[i] for i in alone])
                for i, result in zip(alone, again.columns[0], strict=True):
                    out[i] = result
                for row, _, error in again.failures:
                    self._add(job, keys[alone[row]], batch[alone[row]], error, limit)
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

    def learn(
        self, jobs: Sequence[Job], failures: Iterable[Failure], sample: Callable[[int], Any], limit: float | None
    ) -> None:
        """The quarantine learns a result's failures: (sample index, grader position in `jobs`, error);
        `sample(index)` gives that sample's fields as the engine holds them (or why it was unusable)."""
        if self.quarantine is None:
            return
        for index, position, error in failures:
            kwargs = sample(index)
            if isinstance(kwargs, dict):
                self.note_sample(jobs[position], kwargs, error, limit)

    def note_sample(self, job: Job, kwargs: dict[str, Any], error: GraderError, limit: float | None = None) -> None:
        """Quarantine one sample (all its fields, as the engine holds them) for this grader, when its error
        is one the quarantine keeps."""
        if error.code in QUARANTINE_CODES:
            self._record(job, select(kwargs, job.inputs), error, limit)
