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
from .rewards import Reward, SpecData, check_weights, rewards
from .samples import SampleProblem, select_all
from .workers import WorkerPool

#: (grader name, ok count, error count, seconds) once per grader per chunk.
Observer = Callable[[str, int, int, float], None]
#: A chunk as the engine takes it: (index in the request, kwargs or the reason the sample is unusable).
Chunk = Sequence[tuple[int, "dict[str, Any] | SampleProblem"]]


@dataclass(frozen=True)
class GradedChunk:
    """A chunk's results column by column, as graders produce them: `columns[j][k]` is job j's result
    for the sample at `indices[k]`, `rewards[k]` that sample's reward."""

    indices: list[int]
    columns: list[list[GraderResult]]
    rewards: list[float | None]


@dataclass(frozen=True)
class Job:
    """A resolved spec: the grader instance and how to run it."""

    spec: SpecData
    grader: BaseGrader
    inputs: Inputs
    remote: bool


def _with_problems(job: Job, kwargs: list[Any], results: list[GraderResult]) -> list[GraderResult]:
    graded = iter(results)
    name = job.grader.name
    return [
        GraderError(name, str(kw), code="INVALID_SAMPLE") if isinstance(kw, SampleProblem) else next(graded)
        for kw in kwargs
    ]


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

    async def grade_chunk(self, jobs: list[Job], chunk: Chunk, timeout: float | None = None) -> GradedChunk:
        timeout = timeout or self.grader_timeout
        indices = [index for index, _ in chunk]
        kwargs = [kw for _, kw in chunk]
        problems = [isinstance(kw, SampleProblem) for kw in kwargs]
        good = [kw for kw, bad in zip(kwargs, problems, strict=True) if not bad] if any(problems) else kwargs
        if len(jobs) == 1:  # no task per job for the common single-grader call
            columns = [await self._run_job(jobs[0], select_all(good, jobs[0].inputs), timeout)]  # type: ignore[arg-type]
        else:
            runs = (self._run_job(job, select_all(good, job.inputs), timeout) for job in jobs)  # type: ignore[arg-type]
            columns = list(await asyncio.gather(*runs))
        if good is not kwargs:  # put the unusable samples' errors back in their places
            columns = [_with_problems(job, kwargs, column) for job, column in zip(jobs, columns, strict=True)]
        return GradedChunk(indices, columns, rewards([job.spec for job in jobs], columns))

    def window(self, jobs: list[Job]) -> int:
        """Chunks in flight per call: enough to keep every worker busy, few enough to bound memory."""
        if self.pool is not None and any(job.remote for job in jobs):
            return 2 * self.pool.size + 1
        return 2

    async def stream(
        self, jobs: list[Job], chunks: Iterable[Chunk], timeout: float | None = None
    ) -> AsyncIterator[GradedChunk]:
        """Grade chunk after chunk, yielding each as it finishes (not necessarily in order)."""
        source = iter(chunks)
        pending: set[asyncio.Task[GradedChunk]] = set()

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
