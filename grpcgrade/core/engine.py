"""The grading engine: grader specs resolved once per call, samples graded chunk by chunk.

When every grader of a call can run in a worker process, whole chunks go there (`stream_work` with the
units of work `wire` makes). Otherwise cheap graders run inline (a process hop would cost more than the
work), heavy synchronous graders in the worker pool and async ones in the event loop. Several chunks are
in flight so every core works; they come back as they finish, and a new chunk starts only when a finished
one has been handed on, so a slow reader slows the grading instead of growing a queue.
"""

from __future__ import annotations

import asyncio
import difflib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from grpcgrade.grader import BaseGrader, GraderError, GraderResult, Inputs, InvalidParams

from .grading import grade_async, grade_sync, inputs_of, usable, with_problems
from .registry import Registry
from .rewards import Reward, SpecData, check_weights, rewards
from .samples import SampleProblem, select_all
from .workers import Work, WorkerPool, grader_work

T = TypeVar("T")

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
    portable: bool  # a worker process can run it: synchronous, and every worker's registry has it

    @property
    def remote(self) -> bool:
        """Graded in a worker even when the call's other graders are not: worth a process hop per chunk."""
        return self.portable and self.grader.heavy


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
            portable = self.pool is not None and grader.is_sync and canonical not in self._local
            jobs.append(Job(spec, grader, inputs_of(grader), portable))
        return jobs

    # -- grading ------------------------------------------------------------------------------------

    async def _run_job(self, job: Job, batch: list[dict[str, Any]], timeout: float | None) -> list[GraderResult]:
        if not batch:
            return []
        start = time.perf_counter()
        if job.remote:
            assert self.pool is not None
            name = self.registry.entry(job.spec.name).name
            results, _ = await self.pool.run(grader_work(name, job.spec.params, batch, timeout))
        elif job.grader.is_sync:
            results = grade_sync(job.grader, batch, timeout)
        else:
            results = await grade_async(job.grader, batch, timeout)
        if self.observer is not None:
            errors = sum(1 for r in results if isinstance(r, GraderError))
            self.observer(job.grader.name, len(results) - errors, errors, time.perf_counter() - start)
        return results

    async def grade_chunk(self, jobs: list[Job], chunk: Chunk, timeout: float | None = None) -> GradedChunk:
        timeout = self.timeout(timeout or 0.0)
        indices = [index for index, _ in chunk]
        kwargs = [kw for _, kw in chunk]
        good = usable(kwargs)
        if len(jobs) == 1:  # no task per job for the common single-grader call
            columns = [await self._run_job(jobs[0], select_all(good, jobs[0].inputs), timeout)]
        else:
            runs = (self._run_job(job, select_all(good, job.inputs), timeout) for job in jobs)
            columns = list(await asyncio.gather(*runs))
        if good is not kwargs:
            columns = [with_problems(j.grader.name, kwargs, c) for j, c in zip(jobs, columns, strict=True)]
        return GradedChunk(indices, columns, rewards([job.spec for job in jobs], columns))

    def window(self, jobs: list[Job]) -> int:
        """Chunks in flight per call: enough to keep every worker busy, few enough to bound memory."""
        if self.pool is not None and (self.offloads(jobs) or any(job.remote for job in jobs)):
            return 2 * self.pool.size + 1
        return 2

    def offloads(self, jobs: list[Job]) -> bool:
        """Whole chunks go to the workers (see `wire`) when every grader of the call can run there."""
        return all(job.portable for job in jobs)

    async def stream(
        self, jobs: list[Job], chunks: Iterable[Chunk], timeout: float | None = None
    ) -> AsyncIterator[GradedChunk]:
        """Grade chunk after chunk, yielding each as it finishes (not necessarily in order)."""
        async for graded in _pipelined((self.grade_chunk(jobs, c, timeout) for c in chunks), self.window(jobs)):
            yield graded

    async def stream_work(self, jobs: list[Job], works: Iterable[Work]) -> AsyncIterator[tuple[Any, int]]:
        """Run units of `wire` work in the pool, yielding (payload, samples in it) as each finishes."""
        assert self.pool is not None
        pool, observer = self.pool, self.observer

        async def run(work: Work) -> tuple[Any, int]:
            payload, stats = await pool.run(work)
            if observer is not None:
                for stat in stats:
                    observer(*stat)
            return payload, work.size

        async for done in _pipelined((run(w) for w in works), self.window(jobs)):
            yield done

    def timeout(self, requested: float) -> float | None:
        """A call's per-sample time limit: its own, else the server's."""
        return requested or self.grader_timeout


async def _pipelined(steps: Iterator[Awaitable[T]], window: int) -> AsyncIterator[T]:
    """Await `steps` with `window` in flight, yielding results as they finish. A step starts only when a
    finished one has been handed on, so a slow reader slows the work instead of growing a queue."""
    pending: set[asyncio.Future[T]] = set()

    def launch() -> None:
        step = next(steps, None)
        if step is not None:
            pending.add(asyncio.ensure_future(step))

    for _ in range(window):
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
