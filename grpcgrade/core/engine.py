"""The grading engine: grader specs resolved once per call, samples graded chunk by chunk.

Where work runs, in the words used throughout (code, tests, docs):
- **inline**: in the server process. Async graders (LLM judges, remote HTTP) always run inline, on the
  event loop; synchronous graders only when there are no workers (`--workers 0`) or the server's own
  configuration keeps them there (server-only graders). A synchronous grader on the loop would stall
  every call, health checks included, for as long as a request can make it run.
- **in a worker**: through the executor (`executors`: the local worker pool, or another implementation of
  the interface). Every other synchronous grader runs in a worker, one chunk per grader, beside the call's
  async graders; a unary call's graders go to one worker together.
- **row by row**: async graders grade each sample on its own (`grade_rows`), so a slow one delays only its
  sample; the call's window then counts samples in flight.
- **whole chunks**: when every grader of a batch can run in a worker, whole chunks go there as the
  service's serialized samples and come back as its serialized response (see `service.wire`), so cheap
  graders use every core too.
- **small bounded batches inline**: a batch (or unary call) of at most `INLINE_MAX_BYTES` whose graders
  all declare `bounded_cost` (work bounded by the input's size, nothing the request supplies runs) is
  graded where it arrives, the whole-chunk work run in the server process: a hop costs more than it.

The engine chooses among them; the service only translates. Several chunks are in flight so every core
works; they come back as they finish, and a new chunk starts only when a finished one has been handed on,
so a slow reader slows the grading instead of growing a queue.

A call's guards (see `guard`) work the same on every path: its deadline goes with each chunk, so what is
running stops at it with BUDGET_EXCEEDED, and what has not come back shortly after it is cut here; its
failure tally is kept chunk by chunk and ends the call once it is over the allowance.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from grpcgrade.grader import BaseGrader, GraderError, GraderResult, Inputs

from .budget import OutputBudget
from .cached_grading import CachedGrading, quarantinable
from .errors import ErrorCode, InvalidParams, SampleProblem, UnknownGrader, UnknownReward
from .executors import Executor, InProcess, Work
from .grading import (
    Stats,
    budget_error,
    failed_stats,
    grade_async,
    grade_chunk_sync,
    grade_sync,
    grader_stats,
    inputs_of,
    join_stats,
    problem_stats,
    usable,
    with_problems,
)
from .guard import CUT_GRACE_SECONDS, FailureTally
from .registry import Registry
from .result_cache import CacheMode
from .rewards import Reward, SpecData, check_weights, number_repeats, reward_stats, rewards
from .samples import select_all
from .tokens import TOKENIZER_PARAM
from .workers import chunk_work, grader_work

T = TypeVar("T")

#: Called once per grader per chunk, wherever the chunk ran (and once per chunk of a configured reward).
Observer = Callable[[Stats], None]
#: A chunk as the engine takes it: (index in the request, kwargs or the reason the sample is unusable).
Chunk = Sequence[tuple[int, "dict[str, Any] | SampleProblem"]]

CHEAP_CHUNK = 1024  # measured: gains level off at 256-1024 samples per message; a hop per chunk favours 1024
#: Heavy graders' chunks shrink as the server's heavy samples are handed out ("guided" scheduling): each is
#: the samples not yet handed out, in this call and every other heavy call running, over `GUIDED_SHARES` x
#: workers, within these bounds. Big early chunks pay the hop rarely; small late ones leave no worker idle
#: at the end. Counting the other calls' samples keeps a call's chunks big while more work waits behind it:
#: a client's 1,024-sample calls, four at once, are cut like one call of their sum, not each down to the
#: smallest chunks.
HEAVY_CHUNK = 256
HEAVY_MIN_CHUNK = 8
GUIDED_SHARES = 2
MAX_CHUNKS_PER_CALL = 1024  # a request's tiny chunk_size is raised to keep within this
#: The most request bytes graded inline, on the event loop, by graders of bounded cost: the longest any such
#: request can hold the loop is a bounded-cost grader over this much input. json_validator's worst case, a
#: 512 KiB JSON object or array of floats, takes 11-15 ms of CPU (measured; 256 KiB: ~5 ms). 512 KiB holds
#: a trainer's small step (512 short samples, ~300 KB), which one process grades faster than a hop.
INLINE_MAX_BYTES = 512 * 1024
#: Inline grading takes at most this share of the event loop's time, per window: past it, small calls hop to
#: the workers like any other, so many concurrent callers still use every core and the loop stays free.
INLINE_MAX_SHARE = 0.25
INLINE_WINDOW_SECONDS = 1.0


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


@dataclass(frozen=True)
class GradedChunk:
    """A chunk's results column by column, as graders produce them: `columns[j][k]` is job j's result
    for the sample at `indices[k]`, `rewards[k]` that sample's reward."""

    indices: list[int]
    columns: list[list[GraderResult]]
    rewards: list[float | None]
    #: Some rows of a chunk, handed on as they finished (`Engine.grade_rows`): `indices` need not be a run.
    partial: bool = False


@dataclass(frozen=True)
class WholeChunk:
    """A chunk graded in a worker as a unit: `payload` is whatever the service's work returned (for the
    gRPC service, the serialized response message), `size` the samples it answers."""

    payload: Any
    size: int
    start: int = 0  # the index of its first sample in the request
    stats: Sequence[Stats] = ()  # each grader's (and the reward's), as the worker counted them


@dataclass(frozen=True)
class Batch:
    """A batch as the service hands it over: `size` samples, cut into chunks on demand, either way.

    `chunk(a, b)` gives samples a..b-1 as keyword arguments; `whole(a, b, timeout, deadline)`, where the
    service can make one, the same samples as one unit of whole-chunk work, graded until the call's
    `deadline` (see `guard`). Cutting is lazy: a chunk is made when it is graded. `nbytes` is the size of
    the request's samples where the service knows it (else 0: not small).
    """

    size: int
    chunk: Callable[[int, int], Chunk]
    whole: Callable[[int, int, float | None, float | None], Work] | None = None
    nbytes: int = 0
    #: In a whole chunk's answer, the (sample index, grader position, error) of each result that timed out
    #: or lost its worker: what the quarantine keeps. Asked only of answers whose stats count one.
    failures: Callable[[Any], list[tuple[int, int, GraderError]]] | None = None


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


class Engine:
    def __init__(
        self,
        registry: Registry,
        pool: Executor | None = None,
        rewards: dict[str, Reward] | None = None,
        grader_timeout: float | None = 30.0,
        observer: Observer | None = None,
        server_only_graders: Iterable[str] = (),
        cached: CachedGrading | None = None,
        tokenizer: str = "",
    ) -> None:
        self.registry = registry
        self.pool = pool  # where work that may not run on the event loop goes; None: nowhere but here
        self.inline = InProcess()  # small whole chunks of bounded cost (`inline_small`)
        #: The server's tokenizer (`--tokenizer`, `tokenizer:`), given to every grader with a `tokenizer`
        #: parameter its params leave unset; a reward's own `tokenizer:` comes first for its graders.
        self.tokenizer = tokenizer
        self.rewards = {
            name: replace(r, specs=self.with_tokenizer(r.specs, r.tokenizer or tokenizer))
            for name, r in (rewards or {}).items()
        }
        self.grader_timeout = grader_timeout
        self.observer = observer
        self._server_only = set(server_only_graders)  # defined by this process's configuration only
        self.inline_share = InlineShare()
        self.cached = cached  # the result cache and the quarantine; None: neither
        self.unissued = 0  # heavy calls' samples not yet handed out in a chunk, over every running call

    # -- resolution ---------------------------------------------------------------------------------

    def with_tokenizer(self, specs: list[SpecData], tokenizer: str) -> list[SpecData]:
        """`specs` with `tokenizer` in the params of each grader that takes one and names none (a length gate
        then counts a response the trainer sent no count for; see `core.tokens`)."""
        if not tokenizer:
            return specs
        out = []
        for spec in specs:
            try:
                takes = any(p.name == TOKENIZER_PARAM for p in self.registry.entry(spec.name).params)
            except UnknownGrader:
                takes = False  # `resolve` says so, naming it
            if takes and TOKENIZER_PARAM not in spec.params:
                spec = replace(spec, params={**spec.params, TOKENIZER_PARAM: tokenizer})
            out.append(spec)
        return out

    def resolve(self, specs: list[SpecData], reward: str = "", cache: CacheMode = CacheMode.DEFAULT) -> list[Job]:
        """Graders for a call, built (or taken from the cache) once, and whether the result cache serves
        each (`cache`: the call's choice). Raises for a bad request."""
        if reward and specs:
            raise InvalidParams("reward", "give either `reward` or `graders`, not both")
        if reward:
            if reward not in self.rewards:
                raise UnknownReward(reward, sorted(self.rewards))
            specs = self.rewards[reward].specs
        if not specs:
            raise InvalidParams("graders", "the request names no grader and no reward")
        if not reward:
            specs = self.with_tokenizer(specs, self.tokenizer)
        specs = number_repeats(specs)
        check_weights(specs)
        jobs = []
        for spec in specs:
            try:
                grader = self.registry.build(spec.name, spec.params)
            except InvalidParams as exc:
                raise exc.of_grader(spec.name) from exc
            canonical = self.registry.entry(spec.name).name
            capable = self.pool is not None and grader.is_sync and canonical not in self._server_only
            use_cache = self.cached is not None and self.cached.uses_cache(grader, cache)
            jobs.append(Job(spec, grader, inputs_of(grader), capable, use_cache))
        return jobs

    def timeout(self, requested: float | None) -> float | None:
        """A call's per-sample time limit: its own, else the server's; a call may lower the server's limit,
        never raise it (a larger value is capped to it). Raises for a negative, NaN or infinite value."""
        if requested is None or requested == 0:
            return self.grader_timeout
        if not math.isfinite(requested) or requested < 0:
            raise InvalidParams(
                "grader_timeout_seconds", f"must be a positive number of seconds (0: the server's), got {requested!r}"
            )
        return min(requested, self.grader_timeout) if self.grader_timeout else requested

    def chunks(self, jobs: list[Job], samples: int, requested: int = 0) -> Iterator[tuple[int, int]]:
        """How a call's samples are cut: (start, stop) of each chunk (and streamed response), in order. The
        request's size, else by the graders' cost: cheap ones `CHEAP_CHUNK` each, heavy ones guided (see
        `HEAVY_CHUNK`), each chunk's size chosen when it is handed out. Never more than
        `MAX_CHUNKS_PER_CALL` chunks (a hop and a message each)."""
        floor = -(-samples // MAX_CHUNKS_PER_CALL)
        if requested or not any(job.grader.heavy for job in jobs):
            size = max(requested or CHEAP_CHUNK, floor)
            return iter([(a, min(a + size, samples)) for a in range(0, samples, size)])
        return self._guided(samples, floor)

    def _guided(self, samples: int, floor: int) -> Iterator[tuple[int, int]]:
        """Guided chunks of one heavy call; its samples count in `unissued` until handed out, or until the
        call ends (the generator is closed) without them."""
        shares = GUIDED_SHARES * (self.pool.size if self.pool is not None else 1)
        self.unissued += samples
        a = 0
        try:
            while a < samples:
                size = max(min(-(-self.unissued // shares), HEAVY_CHUNK), HEAVY_MIN_CHUNK, floor)
                start, a = a, min(a + size, samples)
                self.unissued -= a - start
                yield start, a
        finally:
            self.unissued -= samples - a

    def whole_chunks(self, jobs: list[Job]) -> bool:
        """Whole chunks go to the workers when every grader of the call can run there (and none needs the
        result cache or has samples in quarantine: those are looked up per grader)."""
        return all(job.worker_capable for job in jobs) and not self._per_grader(jobs)

    def _per_grader(self, jobs: list[Job]) -> bool:
        return self.cached is not None and self.cached.per_grader(jobs)

    def inline_small(self, jobs: list[Job], nbytes: int) -> bool:
        """A call this small, whose graders all declare a bounded cost, is graded inline (no hop), while
        inline grading has taken less than its share of the event loop lately, and unless the result cache
        or the quarantine has a say (then it is graded per grader)."""
        return (
            0 < nbytes <= INLINE_MAX_BYTES
            and all(job.worker_capable and job.grader.bounded_cost for job in jobs)
            and not self._per_grader(jobs)
            and self.inline_share.allows()
        )

    def window(self, jobs: list[Job]) -> int:
        """Chunks in flight per call: enough to keep every worker busy, few enough to bound memory."""
        if self.pool is not None and (self.whole_chunks(jobs) or any(job.in_worker for job in jobs)):
            return 2 * self.pool.size + 1
        return 2

    # -- grading ------------------------------------------------------------------------------------

    def _observe(self, stats: Iterable[Stats]) -> None:
        if self.observer is not None:
            for stat in stats:
                self.observer(stat)

    async def _run_job(
        self,
        job: Job,
        batch: list[dict[str, Any]],
        timeout: float | None,
        unusable: int = 0,
        deadline: float | None = None,
    ) -> list[GraderResult]:
        """The job's results for `batch`; its stats count the chunk's `unusable` samples as INVALID_SAMPLE.
        Past the call's `deadline` the samples left are BUDGET_EXCEEDED."""
        if not batch:
            if unusable:
                self._observe([problem_stats(job.grader.name, unusable)])
            return []
        start = time.perf_counter()
        results: list[GraderResult]
        if job.in_worker:
            assert self.pool is not None
            name = self.registry.entry(job.spec.name).name
            results, _ = await self.pool.run(grader_work(name, job.spec.params, batch, timeout, deadline))
        elif job.grader.is_sync:
            results = grade_sync(job.grader, batch, timeout, deadline)
        else:
            results = await grade_async(job.grader, batch, timeout, deadline)
        stats = grader_stats(job.grader.name, results, time.perf_counter() - start)
        self._observe(join_stats([[stats], [problem_stats(job.grader.name, unusable)]]) if unusable else [stats])
        return results

    async def _run_cached(
        self,
        job: Job,
        batch: list[dict[str, Any]],
        timeout: float | None,
        unusable: int = 0,
        deadline: float | None = None,
    ) -> list[GraderResult]:
        """`_run_job`, with the result cache and the quarantine in front of it (`CachedGrading.run`)."""
        if self.cached is None:
            return await self._run_job(job, batch, timeout, unusable, deadline)
        run = self.cached.run
        return await run(job, batch, lambda part: self._run_job(job, part, timeout, unusable, deadline), timeout)

    def _note(
        self,
        jobs: list[Job],
        chunk: list[Any],
        columns: list[list[GraderResult]],
        stats: Sequence[Stats],
        timeout: float | None,
    ) -> None:
        """The quarantine learns the samples of a chunk graded as a whole that timed out or lost a worker."""
        if self.cached is not None and quarantinable(stats):
            self.cached.note_columns(jobs, chunk, columns, timeout)

    async def grade_chunk(
        self,
        jobs: list[Job],
        chunk: Chunk,
        timeout: float | None = None,
        reward: str = "",
        deadline: float | None = None,
        nbytes: int = 0,
    ) -> GradedChunk:
        """One chunk, each grader where it runs; inline synchronous graders one after the other (also every
        grader of a chunk of `nbytes` that `inline_small` allows). `reward` names the configured reward the
        call asked for: its values are counted for the metrics. Past the call's `deadline`
        (`time.monotonic()`) the samples left are answered BUDGET_EXCEEDED."""
        timeout = self.timeout(timeout)
        indices = [index for index, _ in chunk]
        kwargs = [kw for _, kw in chunk]
        if self.inline_small(jobs, nbytes):
            start = time.perf_counter()
            columns, stats = grade_chunk_sync([job.grader for job in jobs], kwargs, timeout, deadline)
            self.inline_share.spent(time.perf_counter() - start)
            self._observe(stats)
            self._note(jobs, kwargs, columns, stats, timeout)
        elif self.pool is not None and self.whole_chunks(jobs):
            specs = [(self.registry.entry(job.spec.name).name, job.spec.params) for job in jobs]
            columns, stats = await self.pool.run(chunk_work(specs, kwargs, timeout, deadline))
            self._observe(stats)
            self._note(jobs, kwargs, columns, stats, timeout)
        elif all(job.grader.is_sync and not job.in_worker for job in jobs) and not self._per_grader(jobs):
            columns, stats = grade_chunk_sync([job.grader for job in jobs], kwargs, timeout, deadline)
            self._observe(stats)
            self._note(jobs, kwargs, columns, stats, timeout)
        else:
            good = usable(kwargs)
            unusable = len(kwargs) - len(good)
            own = len(jobs) > 1  # graders in this process share the samples' lists and dicts otherwise
            runs = (
                self._run_cached(job, select_all(good, job.inputs, own), timeout, unusable, deadline) for job in jobs
            )
            columns = list(await asyncio.gather(*runs))
            if good is not kwargs:
                columns = [with_problems(j.grader.name, kwargs, c) for j, c in zip(jobs, columns, strict=True)]
        values = rewards([job.spec for job in jobs], columns)
        if reward:
            self._observe([reward_stats(reward, values)])
        return GradedChunk(indices, columns, values)

    def streams_rows(self, jobs: list[Job]) -> bool:
        """A call with graders that await I/O per sample (LLM judges, remote graders) is graded row by row:
        each sample is handed on when its own results are in, so one slow judgment holds only its sample."""
        return any(_per_sample(job) for job in jobs)

    async def grade_rows(
        self,
        jobs: list[Job],
        chunk: Chunk,
        timeout: float | None = None,
        reward: str = "",
        deadline: float | None = None,
    ) -> AsyncIterator[GradedChunk]:
        """A chunk of a call with per-sample async graders (`streams_rows`), its rows yielded as they finish
        (as `partial` GradedChunks): synchronous graders grade the chunk as `grade_chunk` does (in a worker,
        through the cache), each async grader each sample on its own, so a slow sample delays no other.
        An async grader with `aevaluate_batch` grades the chunk in one call, as it asks to; one the result
        cache serves is graded sample by sample too (the cache grades identical inputs in flight once). Past the call's
        `deadline` the samples still waiting are answered BUDGET_EXCEEDED (by `grade_async`)."""
        timeout = self.timeout(timeout)
        indices = [index for index, _ in chunk]
        kwargs = [kw for _, kw in chunk]
        good = usable(kwargs)
        rows = [k for k, kw in enumerate(kwargs) if not isinstance(kw, SampleProblem)]
        unusable = len(kwargs) - len(good)
        own = len(jobs) > 1
        columns: list[list[GraderResult]] = [
            [GraderError(job.grader.name, str(kw), code=ErrorCode.INVALID_SAMPLE) for kw in kwargs] for job in jobs
        ]
        waiting = [len(jobs) if not isinstance(kw, SampleProblem) else 0 for kw in kwargs]
        tasks: dict[asyncio.Future[list[GraderResult]], tuple[int, list[int]]] = {}
        for j, job in enumerate(jobs):
            batch = select_all(good, job.inputs, own)
            if not _per_sample(job):
                run = self._run_cached(job, batch, timeout, unusable, deadline)
                tasks[asyncio.ensure_future(run)] = (j, rows)
                continue
            if unusable:
                self._observe([problem_stats(job.grader.name, unusable)])
            for k, selected in zip(rows, batch, strict=True):
                tasks[asyncio.ensure_future(self._run_cached(job, [selected], timeout, 0, deadline))] = (j, [k])
        done_rows = [k for k, left in enumerate(waiting) if not left]  # unusable: answered already
        try:
            while tasks or done_rows:
                if done_rows:
                    yield self._rows(jobs, indices, columns, sorted(done_rows), reward)
                    done_rows = []
                if not tasks:
                    break
                finished, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    j, ks = tasks.pop(task)
                    for k, result in zip(ks, task.result(), strict=True):
                        columns[j][k] = result
                        waiting[k] -= 1
                        if not waiting[k]:
                            done_rows.append(k)
        finally:  # the call ended or was cut: what still runs for it is cancelled
            for task in tasks:
                task.cancel()

    def _rows(
        self, jobs: list[Job], indices: list[int], columns: list[list[GraderResult]], ks: list[int], reward: str
    ) -> GradedChunk:
        """Rows `ks` of a chunk (`grade_rows`), with their rewards (counted for the metrics with `reward`)."""
        part = [[column[k] for k in ks] for column in columns]
        values = rewards([job.spec for job in jobs], part)
        if reward:
            self._observe([reward_stats(reward, values)])
        return GradedChunk([indices[k] for k in ks], part, values, partial=True)

    async def grade_batch(
        self,
        jobs: list[Job],
        batch: Batch,
        chunks: Iterator[tuple[int, int]],
        timeout: float | None = None,
        budget: OutputBudget | None = None,
        reward: str = "",
        deadline: float | None = None,
        failures: FailureTally | None = None,
    ) -> AsyncIterator[GradedChunk | WholeChunk]:
        """Grade a batch chunk after chunk (`chunks`: see `Engine.chunks`, taken one at a time as chunks start,
        and closed at the end), the engine choosing the path; each
        chunk is yielded as it finishes (not necessarily in order), as a `GradedChunk`, or a `WholeChunk` from a worker.
        With a `budget`, a whole chunk's answer is charged from when it is graded until the next chunk is
        asked for (it has been handed on), and each chunk starts only when the budget has room. `reward`: as
        for `grade_chunk` (a whole chunk counts its reward where it is graded: `Batch.whole` knows it).

        The call's guards (see `guard`): once its `deadline` (`time.monotonic()`) passes, no chunk starts,
        running ones answer what they have not graded with BUDGET_EXCEEDED, and the chunks that have not
        come back `CUT_GRACE_SECONDS` later are cancelled; every sample not yet answered then comes last,
        as one `GradedChunk` of BUDGET_EXCEEDED results. With `failures`, each chunk is counted before it
        is yielded, and TooManyFailures is raised (the running chunks cancelled) once they are too many."""
        timeout = self.timeout(timeout)
        issued: list[tuple[int, int]] = []  # the chunks started, in order
        source = chunks  # closed at the end (a guided call's generator)

        def bounds() -> Iterator[tuple[int, int]]:
            for bound in chunks:
                issued.append(bound)
                yield bound

        steps: Iterator[Awaitable[GradedChunk | WholeChunk] | Streamed[GradedChunk | WholeChunk]]
        window = self.window(jobs)
        if self.streams_rows(jobs):  # the window counts samples in flight: each row handed on frees one
            first = next(chunks, None)
            chunks = itertools.chain([first] if first is not None else [], chunks)
            window *= first[1] - first[0] if first is not None else 1
            chunk = batch.chunk
            steps = (
                Streamed[GradedChunk | WholeChunk](self.grade_rows(jobs, chunk(a, b), timeout, reward, deadline), b - a)
                for a, b in bounds()
            )
        elif batch.whole is not None and self.inline_small(jobs, batch.nbytes):
            whole = batch.whole
            steps = (self._run_inline(whole(a, b, timeout, deadline), a) for a, b in bounds())
        elif batch.whole is not None and self.pool is not None and self.whole_chunks(jobs):
            whole = batch.whole
            steps = (self._run_whole(whole(a, b, timeout, deadline), a, jobs, batch) for a, b in bounds())
        else:
            chunk = batch.chunk
            steps = (self.grade_chunk(jobs, chunk(a, b), timeout, reward, deadline) for a, b in bounds())
        names = [job.grader.name for job in jobs]
        answered: set[int] = set()  # the first samples of the chunks answered whole
        rows: set[int] = set()  # the samples answered in parts of a chunk (`grade_rows`)
        pipeline = _pipelined(steps, window, budget, deadline, units=_rows_of)
        try:
            async for graded in pipeline:
                if isinstance(graded, WholeChunk):
                    answered.add(graded.start)
                    if failures is not None:
                        failures.add_stats(graded.stats)
                else:
                    if graded.partial:
                        rows.update(graded.indices)
                    else:
                        answered.add(graded.indices[0])  # a chunk of samples a..b-1 starts at a
                    if failures is not None:
                        failures.add_columns(names, graded.columns, graded.rewards)
                if failures is not None:
                    failures.check()
                yield graded
        finally:  # ended, cut, failed or closed by the caller: whatever still runs is cancelled now
            await pipeline.aclose()
            close = getattr(source, "close", None)
            if close is not None:
                close()  # a guided call's samples not handed out stop counting as waiting work
        end = issued[-1][1] if issued else 0
        # Only past the deadline: what was not answered is cut.
        cut = [i for a, b in issued if a not in answered for i in range(a, b) if i not in rows]
        cut.extend(range(end, batch.size))
        if cut:
            stats = [failed_stats(n, ErrorCode.BUDGET_EXCEEDED, len(cut), first=j == 0) for j, n in enumerate(names)]
            self._observe([*stats, reward_stats(reward, [None] * len(cut))] if reward else stats)
            if failures is not None:
                failures.add_stats(stats)
                failures.check()
            yield GradedChunk(cut, [[budget_error(name)] * len(cut) for name in names], [None] * len(cut))

    async def _run_inline(self, work: Work, start: int) -> WholeChunk:
        """Whole-chunk work run here, as a worker would run it (`inline_small` said it is small and bounded)."""
        began = time.perf_counter()
        payload, stats = await self.inline.submit(work)
        self.inline_share.spent(time.perf_counter() - began)
        self._observe(stats)
        return WholeChunk(payload, work.size, start, stats)

    async def _run_whole(self, work: Work, start: int, jobs: list[Job], batch: Batch) -> WholeChunk:
        assert self.pool is not None
        payload, stats = await self.pool.run(work)
        self._observe(stats)
        if self.cached is not None and batch.failures is not None and quarantinable(stats):
            for index, position, error in batch.failures(payload):
                kwargs = batch.chunk(index, index + 1)[0][1]
                if isinstance(kwargs, dict):
                    self.cached.note_sample(jobs[position], kwargs, error, work.timeout)
        return WholeChunk(payload, work.size, start, stats)


def _output_bytes(graded: object) -> int:
    """What a finished chunk holds, where known without per-sample work: a whole chunk's serialized answer."""
    payload = graded.payload if isinstance(graded, WholeChunk) else None
    return len(payload) if isinstance(payload, bytes) else 0


def _rows_of(part: GradedChunk | WholeChunk) -> int:
    """The samples a part of a streamed chunk answers: the window units it frees."""
    return len(part.indices) if isinstance(part, GradedChunk) else 1


def _per_sample(job: Job) -> bool:
    """An async grader graded sample by sample (`Engine.grade_rows`); one with `aevaluate_batch` asks for
    whole chunks."""
    return not job.grader.is_sync and getattr(job.grader, "aevaluate_batch", None) is None


@dataclass(frozen=True)
class Streamed(Generic[T]):
    """A step of `_pipelined` that hands on its result in parts: `parts` yields them, and the step holds
    `weight` units of the window until its parts have freed them (each part `units(part)`)."""

    parts: AsyncIterator[T]
    weight: int


async def _next_part(parts: AsyncIterator[T]) -> T:
    return await parts.__anext__()


async def _pipelined(
    steps: Iterator[Awaitable[T] | Streamed[T]],
    window: int,
    budget: OutputBudget | None = None,
    deadline: float | None = None,
    units: Callable[[T], int] | None = None,
) -> AsyncGenerator[T, None]:
    """Await `steps` with `window` units in flight, yielding results as they finish. An awaitable step holds
    one unit until it is done; a `Streamed` one its weight, freed part by part (`units(part)` each; what
    is left when its parts end). A step starts only when a finished one has been handed on (and the budget
    has room), so a slow reader slows the work instead of growing a queue; a step too heavy for the window
    starts when nothing else is in flight. A finished step's output is charged to the budget until it has
    been handed on; while waiting for room, finished steps are still handed on (they are what frees it).

    Once `deadline` (`time.monotonic()`) has passed no step starts, and the steps still running
    `CUT_GRACE_SECONDS` after it are cancelled: the iteration then ends with steps left undone."""
    pending: dict[asyncio.Future[T], Streamed[T] | None] = {}  # each running step's next result
    held: dict[Streamed[T] | None, int] = {}  # the units each streamed step still holds
    in_flight = 0
    charged: dict[asyncio.Future[T], int] = {}
    closed = False
    room: asyncio.Future[None] | None = None

    def charge(task: asyncio.Future[T]) -> None:
        if budget is not None and not closed and not task.cancelled() and task.exception() is None:
            charged[task] = size = _output_bytes(task.result())
            budget.charge(size)

    def launch(awaitable: Awaitable[T], stream: Streamed[T] | None) -> None:
        task = asyncio.ensure_future(awaitable)
        task.add_done_callback(charge)
        pending[task] = stream

    def weight(step: Awaitable[T] | Streamed[T]) -> int:
        return step.weight if isinstance(step, Streamed) else 1

    def fits(step: Awaitable[T] | Streamed[T]) -> bool:
        return in_flight == 0 or in_flight + weight(step) <= window

    upcoming = next(steps, None)
    try:
        while True:
            late = deadline is not None and time.monotonic() >= deadline
            while upcoming is not None and not late and fits(upcoming) and (budget is None or budget.has_room()):
                in_flight += weight(upcoming)
                if isinstance(upcoming, Streamed):
                    held[upcoming] = upcoming.weight
                    launch(_next_part(upcoming.parts), upcoming)
                else:
                    launch(upcoming, None)
                upcoming = next(steps, None)
            if not pending and (upcoming is None or late):
                return
            waits: set[asyncio.Future[Any]] = set(pending)
            if upcoming is not None and not late and fits(upcoming):  # the budget is spent: wait for room
                assert budget is not None
                room = room or asyncio.ensure_future(budget.room())
                waits.add(room)
            wait = None
            if deadline is not None:  # wake at the deadline, then at the end of its grace
                wait = max(0.0, deadline + (CUT_GRACE_SECONDS if late else 0.0) - time.monotonic())
            done, _ = await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if not done and late and time.monotonic() >= deadline + CUT_GRACE_SECONDS:  # type: ignore[operator]
                return  # what still runs is cancelled below; the caller answers its samples
            if room is not None and room in done:
                room = None
            for finished in [task for task in pending if task in done]:
                stream = pending.pop(finished)
                if stream is None:
                    in_flight -= 1
                elif finished.exception() is None or not isinstance(finished.exception(), StopAsyncIteration):
                    freed = min(units(finished.result()) if units is not None else 1, held[stream])
                    held[stream] -= freed
                    in_flight -= freed
                    launch(_next_part(stream.parts), stream)  # the rest goes on while this part is handed on
                else:  # its parts have ended: what it still held is free
                    in_flight -= held.pop(stream)
                    with contextlib.suppress(StopAsyncIteration):
                        finished.result()
                    continue
                try:
                    yield finished.result()
                finally:  # handed on (or the call ended): its answer is no longer held here
                    if budget is not None:
                        budget.release(charged.pop(finished, 0))
    finally:
        closed = True
        if room is not None:
            room.cancel()
        for left in pending:
            left.cancel()
        # A streamed step still running has a next part pending: cancelling it ends its parts too.
        if asyncio.iscoroutine(upcoming):
            upcoming.close()  # never started: nothing to cancel, and no "never awaited" warning
        elif isinstance(upcoming, Streamed):
            close = getattr(upcoming.parts, "aclose", None)
            if close is not None:
                await close()
        if budget is not None:
            budget.release(sum(charged.values()))
