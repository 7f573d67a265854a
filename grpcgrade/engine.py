"""The grading engine: grader specs resolved once per call, samples graded chunk by chunk.

Cheap graders run inline (a process hop would cost more than the work); heavy synchronous graders run
in the worker pool, several chunks in flight so every core works. Chunks come back as they finish, and
a new chunk starts only when a finished one has been handed on, so a slow reader slows the grading
instead of growing a queue.
"""

from __future__ import annotations

import asyncio
import difflib
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .grader import BaseGrader, GraderError, GraderResult, Inputs, InvalidParams
from .grading import grade_async, grade_sync
from .registry import Registry
from .rewards import Reward, SpecData, check_weights, combine
from .samples import SampleProblem, select
from .workers import WorkerPool

#: (grader name, ok count, error count, seconds) once per grader per chunk.
Observer = Callable[[str, int, int, float], None]
#: A chunk as the engine takes it: (index in the request, kwargs or the reason the sample is unusable).
Chunk = Sequence[tuple[int, "dict[str, Any] | SampleProblem"]]


@dataclass(frozen=True)
class GradedSample:
    index: int
    results: list[GraderResult]
    reward: float | None


@dataclass(frozen=True)
class Job:
    """A resolved spec: the grader instance and how to run it."""

    spec: SpecData
    grader: BaseGrader
    inputs: Inputs
    remote: bool


class UnknownReward(LookupError):
    def __init__(self, name: str, known: list[str]) -> None:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        super().__init__(f"unknown reward {name!r}{hint}")


class Engine:
    def __init__(
        self,
        registry: Registry,
        pool: WorkerPool | None = None,
        rewards: dict[str, Reward] | None = None,
        grader_timeout: float | None = 30.0,
        observer: Observer | None = None,
        local_graders: Iterable[str] = (),
    ) -> None:
        self.registry = registry
        self.pool = pool
        self.rewards = rewards or {}
        self.grader_timeout = grader_timeout
        self.observer = observer
        self._local = set(local_graders)  # graders only this process knows (config-defined)
        self._inputs: weakref.WeakKeyDictionary[BaseGrader, Inputs] = weakref.WeakKeyDictionary()

    # -- resolution ---------------------------------------------------------------------------------

    def resolve(self, specs: list[SpecData], reward: str = "") -> list[Job]:
        """Graders for a call, built (or taken from the cache) once. Raises for a bad request."""
        if reward and specs:
            raise InvalidParams("reward", "give either `reward` or `graders`, not both")
        if reward:
            if reward not in self.rewards:
                raise UnknownReward(reward, sorted(self.rewards))
            specs = self.rewards[reward].specs
        if not specs:
            raise InvalidParams("graders", "the request names no grader and no reward")
        check_weights(specs)
        jobs = []
        for spec in specs:
            grader = self.registry.build(spec.name, spec.params)
            canonical = self.registry.entry(spec.name).name
            remote = self.pool is not None and grader.heavy and grader.is_sync and canonical not in self._local
            inputs = self._inputs.get(grader)
            if inputs is None:  # signature inspection costs ~60 µs: once per built grader, not per call
                inputs = self._inputs[grader] = grader.input_names()
            jobs.append(Job(spec, grader, inputs, remote))
        return jobs

    # -- grading ------------------------------------------------------------------------------------

    async def _run_job(self, job: Job, batch: list[dict[str, Any]], timeout: float | None) -> list[GraderResult]:
        if not batch:
            return []
        start = time.perf_counter()
        if job.remote:
            assert self.pool is not None
            name = self.registry.entry(job.spec.name).name
            results, _ = await self.pool.run(name, job.spec.params, batch, timeout)
        elif job.grader.is_sync:
            results = grade_sync(job.grader, batch, timeout)
        else:
            results = await grade_async(job.grader, batch, timeout)
        if self.observer is not None:
            errors = sum(1 for r in results if isinstance(r, GraderError))
            self.observer(job.grader.name, len(results) - errors, errors, time.perf_counter() - start)
        return results

    async def grade_chunk(self, jobs: list[Job], chunk: Chunk, timeout: float | None = None) -> list[GradedSample]:
        timeout = timeout or self.grader_timeout
        good = [(pos, kw) for pos, (_, kw) in enumerate(chunk) if not isinstance(kw, SampleProblem)]
        batches = [[select(kw, job.inputs) for _, kw in good] for job in jobs]
        if len(jobs) == 1:  # no task per job for the common single-grader call
            per_job = [await self._run_job(jobs[0], batches[0], timeout)]
        else:
            runs = (self._run_job(job, b, timeout) for job, b in zip(jobs, batches, strict=True))
            per_job = await asyncio.gather(*runs)
        table: list[list[GraderResult] | None] = [None] * len(chunk)
        for k, (pos, _) in enumerate(good):
            table[pos] = [results[k] for results in per_job]
        specs = [job.spec for job in jobs]
        out = []
        for pos, (index, kw) in enumerate(chunk):
            row = table[pos]
            if row is None:
                row = [GraderError(job.grader.name, str(kw), code="INVALID_SAMPLE") for job in jobs]
            out.append(GradedSample(index, row, combine(specs, row)))
        return out

    def window(self, jobs: list[Job]) -> int:
        """Chunks in flight per call: enough to keep every worker busy, few enough to bound memory."""
        if self.pool is not None and any(job.remote for job in jobs):
            return 2 * self.pool.size + 1
        return 2

    async def stream(
        self, jobs: list[Job], chunks: Iterable[Chunk], timeout: float | None = None
    ) -> AsyncIterator[list[GradedSample]]:
        """Grade chunk after chunk, yielding each as it finishes (not necessarily in order)."""
        source = iter(chunks)
        pending: set[asyncio.Task[list[GradedSample]]] = set()

        def launch() -> None:
            chunk = next(source, None)
            if chunk is not None:
                pending.add(asyncio.ensure_future(self.grade_chunk(jobs, chunk, timeout)))

        for _ in range(self.window(jobs)):
            launch()
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    pending.discard(task)
                    yield task.result()
                    launch()
        finally:
            for task in pending:
                task.cancel()
