"""The grading engine: a call's plan made once, when its graders are resolved, then executed chunk by chunk.

`resolve` builds the call's `plan.Plan`: which graders run together, where (inline in the server process,
in the executor, or on the event loop for graders that await I/O), whether a chunk travels in the service's
codec, how the call is cut into chunks and how many are in flight. The engine then only executes it:

- **whole chunks**: a plan of one group of every grader in the executor sends each chunk as one work item
  (`work.WorkItem`), as the service's encoded samples when it offers a codec (`Batch.encoded`; see
  `codecs`), else as keyword arguments; the answer comes back as the codec's bytes (or as columns), so
  cheap graders use every core too. A small call of graders of bounded cost is run inline instead, while
  the event loop's inline share allows (`Plan.inline`, the one choice made at run time).
- **per group**: otherwise each grader is its own group: in the executor, inline (synchronous graders that
  run nowhere else), or on the event loop (async graders); the result cache and the quarantine
  (`cached_grading`) stand in front of the groups they filter.
- **row by row**: a plan with graders that await I/O per sample hands each sample on as soon as its own
  results are in (`grade_rows`), so a slow one delays only its sample; the call's window then counts
  samples in flight.

Every group's result is a `work.ChunkResult`; the quarantine learns from its `failures`, wherever it was
graded. Several chunks are in flight so every core works; they come back as they finish, and a new chunk
starts only when a finished one has been handed on, so a slow reader slows the grading instead of growing
a queue.

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
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from grpcgrade.grader import GraderError, GraderResult

from .budget import OutputBudget
from .cached_grading import CachedGrading
from .errors import ErrorCode, InvalidParams, SampleProblem, UnknownGrader, UnknownReward
from .executors import Executor, InProcess
from .grading import (
    Stats,
    budget_error,
    failed_stats,
    grade_async,
    grader_stats,
    grading_seconds,
    inputs_of,
    join_stats,
    problem_stats,
    usable,
    with_problems,
)
from .guard import CUT_GRACE_SECONDS, FailureTally
from .plan import (
    INLINE_MAX_BYTES,
    INLINE_MAX_SECONDS,
    INLINE_MAX_SHARE,
    INLINE_RESULTS_MAX_BYTES,
    INLINE_WINDOW_SECONDS,
    Group,
    InlineShare,
    Job,
    Place,
    Plan,
    place,
)
from .registry import Registry
from .result_cache import CacheMode
from .rewards import Reward, SpecData, check_weights, number_repeats, reward_stats, rewards
from .samples import select_all
from .tokens import TOKENIZER_PARAM
from .work import ChunkResult, Encoded, WorkItem, faults

__all__ = [
    "INLINE_MAX_BYTES",
    "INLINE_MAX_SECONDS",
    "INLINE_MAX_SHARE",
    "INLINE_RESULTS_MAX_BYTES",
    "INLINE_WINDOW_SECONDS",
    "Batch",
    "ChunkResult",
    "Engine",
    "InlineShare",
    "Job",
    "Plan",
]

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
#: Resolved calls the engine keeps, by the caller's key (`Engine.resolve_keyed`): a trainer names the same
#: graders in every call, and resolving them again (specs, weights, the registry's graders, their inputs)
#: cost 40-70 us of each call (measured in process; 6-12 us kept). Keys longer than `RESOLVED_KEY_BYTES`
#: are not kept, so the kept keys take at most ~1 MiB.
RESOLVED_KEPT = 256
RESOLVED_KEY_BYTES = 4096


@dataclass(frozen=True)
class Batch:
    """A batch as the service hands it over: `size` samples, cut into chunks on demand.

    `chunk(a, b)` gives samples a..b-1 as keyword arguments; `encoded(a, b)`, where the service has a codec
    (`codecs`), the same samples in it, for whole chunks. Cutting is lazy: a chunk is made when it is
    graded. `nbytes` is the size of the request's samples where the service knows it (else 0: not small).
    """

    size: int
    chunk: Callable[[int, int], Chunk]
    encoded: Callable[[int, int], Encoded] | None = None
    nbytes: int = 0
    inline_max_bytes: int = INLINE_MAX_BYTES  # the most of it graded inline (`Plan.inline`), by its answer's form


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
        self.inline = InProcess()  # what runs in the server process: inline groups, small bounded chunks
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
        self.cached = cached  # the result cache and the quarantine: the filter; None: neither
        self.unissued = 0  # heavy calls' samples not yet handed out in a chunk, over every running call
        self._resolved: OrderedDict[tuple[bytes, str, CacheMode], Plan] = OrderedDict()

    # -- resolution and the plan --------------------------------------------------------------------

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

    def resolve(self, specs: list[SpecData], reward: str = "", cache: CacheMode = CacheMode.DEFAULT) -> Plan:
        """A call's plan: its graders, built (or taken from the cache) once, whether the result cache serves
        each (`cache`: the call's choice), and how they are graded (`plan`). Raises for a bad request."""
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
        return self.plan(jobs)

    def resolve_keyed(
        self, key: bytes, specs: Callable[[], list[SpecData]], reward: str = "", cache: CacheMode = CacheMode.DEFAULT
    ) -> Plan:
        """`resolve(specs(), reward, cache)`, whose graders are kept by `key` (the caller's encoding of the specs:
        the same key must mean the same specs) and reused by the next call with the same key, with its plan;
        the plan is made again when the filter's say (the quarantine) has changed since."""
        whole = (key, reward, cache)
        kept = self._resolved.get(whole)
        if kept is not None:
            self._resolved.move_to_end(whole)
            if self._filtered(kept.jobs) == kept.filtered:
                return kept
            plan = self.plan(kept.jobs)
        else:
            plan = self.resolve(specs(), reward, cache)
            if len(key) > RESOLVED_KEY_BYTES:
                return plan
        self._resolved[whole] = plan
        if len(self._resolved) > RESOLVED_KEPT:
            self._resolved.popitem(last=False)
        return plan

    def _filtered(self, jobs: Sequence[Job]) -> tuple[bool, ...]:
        """Whether the filter (cache, quarantine) stands in front of each job, now."""
        cached = self.cached
        return tuple(cached is not None and cached.filters(job) for job in jobs)

    def plan(self, jobs: Sequence[Job]) -> Plan:
        """The plan of `jobs` (a plan already: itself), as the placement policy (`plan.place`) makes it
        with the filter's say and the executor's size."""
        if isinstance(jobs, Plan):
            return jobs
        filtered = self._filtered(jobs)
        return place(jobs, filtered, self.pool.size if self.pool is not None else None, self.inline_share)

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

    def chunks(self, jobs: Sequence[Job], samples: int, requested: int = 0) -> Iterator[tuple[int, int]]:
        """How a call's samples are cut: (start, stop) of each chunk (and streamed response), in order. The
        request's size, else by the plan's chunk policy: cheap graders `CHEAP_CHUNK` each, heavy ones guided
        (see `HEAVY_CHUNK`), each chunk's size chosen when it is handed out. Never more than
        `MAX_CHUNKS_PER_CALL` chunks (a hop and a message each)."""
        if requested or not self.plan(jobs).guided:
            size = _fixed_size(samples, requested)
            return iter([(a, min(a + size, samples)) for a in range(0, samples, size)])
        return self._guided(samples, -(-samples // MAX_CHUNKS_PER_CALL))

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

    def whole_chunks(self, jobs: Sequence[Job]) -> bool:
        """Whether the plan of `jobs` sends whole chunks to the executor (`Plan.whole_chunks`)."""
        return self.plan(jobs).whole_chunks

    def inline_small(self, jobs: Sequence[Job], nbytes: int) -> bool:
        """Whether a call of `jobs` of `nbytes` is graded inline now (`Plan.inline`)."""
        return self.plan(jobs).inline(nbytes)

    # -- executing a plan ---------------------------------------------------------------------------

    def _observe(self, stats: Iterable[Stats]) -> None:
        if self.observer is not None:
            for stat in stats:
                self.observer(stat)

    def _item(
        self,
        plan: Plan,
        group: Group,
        samples: list[Any] | Encoded,
        size: int,
        timeout: float | None,
        deadline: float | None,
        start: int = 0,
        reward: str = "",
        selected: bool = False,
    ) -> WorkItem:
        """A group's work item over `samples` (the request's `start`...; `selected`: see `WorkItem`)."""
        jobs = [plan[j] for j in group.positions]
        whole = len(jobs) == len(plan)
        return WorkItem(
            tuple(job.spec for job in jobs),
            tuple(job.grader.name for job in jobs),
            samples,
            start,
            size,
            timeout,
            deadline,
            whole,
            reward if whole else "",
            tuple(job.grader for job in jobs),
            selected,
        )

    async def _execute(
        self, plan: Plan, group: Group, item: WorkItem, nbytes: int = 0, most: int = INLINE_MAX_BYTES
    ) -> ChunkResult:
        """`item` run where the plan places its group: inline when the plan allows a call this small now (of at
        most `most` bytes), else in the executor or inline as placed. Its stats are counted here."""
        result: ChunkResult
        if plan.inline(nbytes, most):
            result = self._small_here(item)
        elif group.place is Place.EXECUTOR and self.pool is not None:
            result = await self.pool.run(item)
        else:
            result = await self.inline.run(item)
        self._observe(result.stats)
        plan.rate.learn(_own_bytes(item, nbytes), grading_seconds(result.stats))
        return result

    def _small_here(self, item: WorkItem) -> ChunkResult:
        """A small item of bounded cost run in this process now (`Plan.inline`), its time counted against
        the event loop's inline share."""
        began = time.perf_counter()
        result = item.run_here()
        self.inline_share.spent(time.perf_counter() - began)
        return result

    def _learn(
        self, jobs: Sequence[Job], result: ChunkResult, sample: Callable[[int], Any], limit: float | None
    ) -> None:
        """The quarantine learns a result's failures (`sample(index)`: that sample's fields)."""
        if self.cached is not None and result.failures:
            self.cached.learn(jobs, result.failures, sample, limit)

    async def _grade_group(
        self,
        plan: Plan,
        group: Group,
        batch: list[dict[str, Any]],
        timeout: float | None,
        unusable: int = 0,
        deadline: float | None = None,
    ) -> ChunkResult:
        """A group of one grader over `batch` (the chunk's usable samples, selected for it), where the plan
        places it; its stats count the chunk's `unusable` samples as INVALID_SAMPLE. Past the call's
        `deadline` the samples left are BUDGET_EXCEEDED."""
        job = plan[group.positions[0]]
        name = job.grader.name
        if not batch:
            if unusable:
                self._observe([problem_stats(name, unusable)])
            return ChunkResult([], [[]])
        if group.place in (Place.EXECUTOR, Place.INLINE):
            item = self._item(plan, group, batch, len(batch), timeout, deadline, selected=True)
            executor = self.pool if group.place is Place.EXECUTOR and self.pool is not None else self.inline
            result: ChunkResult = await executor.run(item)
            stats = result.stats
        else:
            start = time.perf_counter()
            results = await grade_async(job.grader, batch, timeout, deadline)
            stats = [grader_stats(name, results, time.perf_counter() - start)]
            result = ChunkResult(range(len(batch)), [results], stats=stats, failures=faults([results]))
        self._observe(join_stats([stats, [problem_stats(name, unusable)]]) if unusable else stats)
        return result

    async def _run_group(
        self,
        plan: Plan,
        group: Group,
        batch: list[dict[str, Any]],
        timeout: float | None,
        unusable: int = 0,
        deadline: float | None = None,
    ) -> list[GraderResult]:
        """A group of one grader's results for `batch`, through the filter when the plan says so; the
        quarantine learns the failures either way."""
        job = plan[group.positions[0]]

        def grade(part: list[dict[str, Any]]) -> Awaitable[ChunkResult]:
            return self._grade_group(plan, group, part, timeout, unusable, deadline)

        if group.filtered and self.cached is not None:
            return await self.cached.run(job, batch, grade, timeout)
        result = await grade(batch)
        self._learn([job], result, batch.__getitem__, timeout)
        return result.columns[0]

    async def grade_chunk(
        self,
        jobs: Sequence[Job],
        chunk: Chunk,
        timeout: float | None = None,
        reward: str = "",
        deadline: float | None = None,
        nbytes: int = 0,
    ) -> ChunkResult:
        """One chunk of keyword arguments, as the plan of `jobs` says: one work item of every grader, or each
        group where it runs (a chunk of `nbytes` may run inline: `Plan.inline`). `reward` names the
        configured reward the call asked for: its values are counted for the metrics. Past the call's
        `deadline` (`time.monotonic()`) the samples left are answered BUDGET_EXCEEDED."""
        plan = self.plan(jobs)
        timeout = self.timeout(timeout)
        indices = [index for index, _ in chunk]
        kwargs = [kw for _, kw in chunk]
        together = plan.together
        if together is not None:
            item = self._item(plan, together, kwargs, len(kwargs), timeout, deadline, reward=reward)
            result = await self._execute(plan, together, item, nbytes)
            self._learn(plan, result, kwargs.__getitem__, timeout)
            return ChunkResult(indices, result.columns, result.rewards, stats=result.stats)
        good = usable(kwargs)
        unusable = len(kwargs) - len(good)
        own = len(plan) > 1  # graders in this process share the samples' lists and dicts otherwise
        runs = (
            self._run_group(
                plan, group, select_all(good, plan[group.positions[0]].inputs, own), timeout, unusable, deadline
            )
            for group in plan.groups
        )
        columns = list(await asyncio.gather(*runs))
        if good is not kwargs:
            columns = [with_problems(j.grader.name, kwargs, c) for j, c in zip(plan, columns, strict=True)]
        values = rewards([job.spec for job in plan], columns)
        if reward:
            self._observe([reward_stats(reward, values)])
        return ChunkResult(indices, columns, values)

    async def _grade_encoded(
        self,
        plan: Plan,
        batch: Batch,
        a: int,
        b: int,
        timeout: float | None,
        reward: str,
        deadline: float | None,
    ) -> ChunkResult:
        """Samples a..b-1 as one work item of every grader in the service's codec: the answer comes back
        encoded, and its failures with it."""
        together = plan.together
        assert together is not None and batch.encoded is not None
        samples = batch.encoded(a, b)
        item = self._item(plan, together, samples, b - a, timeout, deadline, a, reward)
        # A call's size, where the service did not say it: its encoding's, when it is one chunk.
        nbytes = batch.nbytes or (len(samples.data) if (a, b) == (0, batch.size) else 0)
        result = await self._execute(plan, together, item, nbytes, batch.inline_max_bytes)
        self._learn(plan, result, lambda i: batch.chunk(i, i + 1)[0][1], timeout)
        return result

    async def grade_rows(
        self,
        jobs: Sequence[Job],
        chunk: Chunk,
        timeout: float | None = None,
        reward: str = "",
        deadline: float | None = None,
    ) -> AsyncIterator[ChunkResult]:
        """A chunk of a plan graded row by row (`Plan.rows`), its rows yielded as they finish (as `partial`
        results): each group of a grader that grades chunks grades the chunk as `grade_chunk` does (in a
        worker, through the filter), each `ROWS` group each sample on its own, so a slow sample delays no
        other. One the result cache serves is graded sample by sample too (the cache grades identical
        inputs in flight once). Past the call's `deadline` the samples still waiting are answered
        BUDGET_EXCEEDED (by `grade_async`)."""
        plan = self.plan(jobs)
        timeout = self.timeout(timeout)
        indices = [index for index, _ in chunk]
        kwargs = [kw for _, kw in chunk]
        good = usable(kwargs)
        rows = [k for k, kw in enumerate(kwargs) if not isinstance(kw, SampleProblem)]
        unusable = len(kwargs) - len(good)
        own = len(plan) > 1
        columns: list[list[GraderResult]] = [
            [GraderError(job.grader.name, str(kw), code=ErrorCode.INVALID_SAMPLE) for kw in kwargs] for job in plan
        ]
        waiting = [len(plan) if not isinstance(kw, SampleProblem) else 0 for kw in kwargs]
        tasks: dict[asyncio.Future[list[GraderResult]], tuple[int, list[int]]] = {}
        for group in plan.groups:
            (j,) = group.positions
            job = plan[j]
            batch = select_all(good, job.inputs, own)
            if group.place is not Place.ROWS:
                run = self._run_group(plan, group, batch, timeout, unusable, deadline)
                tasks[asyncio.ensure_future(run)] = (j, rows)
                continue
            if unusable:
                self._observe([problem_stats(job.grader.name, unusable)])
            for k, selected in zip(rows, batch, strict=True):
                one = self._run_group(plan, group, [selected], timeout, 0, deadline)
                tasks[asyncio.ensure_future(one)] = (j, [k])
        done_rows = [k for k, left in enumerate(waiting) if not left]  # unusable: answered already
        try:
            while tasks or done_rows:
                if done_rows:
                    yield self._rows(plan, indices, columns, sorted(done_rows), reward)
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
        self, plan: Plan, indices: list[int], columns: list[list[GraderResult]], ks: list[int], reward: str
    ) -> ChunkResult:
        """Rows `ks` of a chunk (`grade_rows`), with their rewards (counted for the metrics with `reward`)."""
        part = ChunkResult(indices, columns).rows(ks)
        values = rewards([job.spec for job in plan], part.columns)
        if reward:
            self._observe([reward_stats(reward, values)])
        return replace(part, rewards=values)

    def _whole_inline(
        self,
        plan: Plan,
        batch: Batch,
        timeout: float | None,
        reward: str,
        deadline: float | None,
        failures: FailureTally | None,
    ) -> ChunkResult:
        """A small call (`_small_inline`) graded here and now, whole, as one work item of every grader in the
        service's codec; counted against the call's failure budget (TooManyFailures past it). No coroutine:
        inline work never waits, and a trainer's step is the call that is only this."""
        together = plan.together
        assert together is not None and batch.encoded is not None
        item = self._item(plan, together, batch.encoded(0, batch.size), batch.size, timeout, deadline, 0, reward)
        result = self._small_here(item)
        self._observe(result.stats)
        plan.rate.learn(_own_bytes(item, batch.nbytes), grading_seconds(result.stats))
        self._learn(plan, result, lambda i: batch.chunk(i, i + 1)[0][1], timeout)
        if failures is not None:
            failures.add_stats(result.stats)
            failures.check()
        return result

    def graded_now(
        self,
        jobs: Sequence[Job],
        batch: Batch,
        timeout: float | None = None,
        budget: OutputBudget | None = None,
        reward: str = "",
        deadline: float | None = None,
        failures: FailureTally | None = None,
    ) -> ChunkResult | None:
        """A call that is one chunk (the caller knows: `one_chunk`) graded here and now when it is small
        (`_small_inline`), as `grade_batch` would grade it; None when it is not small now (then
        `grade_batch`). Its answer is handed on at once, so the output budget is not charged for it."""
        plan = self.plan(jobs)
        if not self._small_inline(plan, batch, budget, deadline):
            return None
        return self._whole_inline(plan, batch, self.timeout(timeout), reward, deadline, failures)

    def one_chunk(self, jobs: Sequence[Job], samples: int, requested: int = 0) -> bool:
        """Whether `chunks` cuts a call of `samples` into one chunk, decided without cutting it."""
        return bool(requested or not self.plan(jobs).guided) and _fixed_size(samples, requested) >= samples

    @staticmethod
    def _small_inline(plan: Plan, batch: Batch, budget: OutputBudget | None, deadline: float | None) -> bool:
        """Whether a batch is graded inline now as its encoding, in one piece, with nothing to wait for: its
        call is small (`Plan.inline`), the output budget has room, and its deadline (if any) is ahead.

        Such a call (a trainer's step) is awaited as it is, without `_pipelined`'s task and wait: inline
        work runs to its end in its first step, so the pipeline could only add a task, a wait and a turn of
        the event loop (~90 us of a ~700 us step, measured), and the deadline it watches is kept by the
        grading itself (`grading`'s timer answers the samples left BUDGET_EXCEEDED)."""
        return (
            plan.whole_chunks
            and batch.encoded is not None
            and plan.inline(batch.nbytes, batch.inline_max_bytes)
            and (budget is None or budget.has_room())
            and (deadline is None or time.monotonic() < deadline)
        )

    async def grade_batch(
        self,
        jobs: Sequence[Job],
        batch: Batch,
        chunks: Iterator[tuple[int, int]],
        timeout: float | None = None,
        budget: OutputBudget | None = None,
        reward: str = "",
        deadline: float | None = None,
        failures: FailureTally | None = None,
    ) -> AsyncIterator[ChunkResult]:
        """Grade a batch chunk after chunk as its plan says (`chunks`: see `Engine.chunks`, taken one at a
        time as chunks start, and closed at the end); each chunk's `ChunkResult` is yielded as it finishes
        (not necessarily in order): encoded by the service's codec for whole chunks it offered one for,
        else as columns. With a `budget`, an encoded answer is charged from when it is graded until the next
        chunk is asked for (it has been handed on), and each chunk starts only when the budget has room.
        `reward`: as for `grade_chunk` (a whole chunk counts its reward where it is graded).

        The call's guards (see `guard`): once its `deadline` (`time.monotonic()`) passes, no chunk starts,
        running ones answer what they have not graded with BUDGET_EXCEEDED, and the chunks that have not
        come back `CUT_GRACE_SECONDS` later are cancelled; every sample not yet answered then comes last,
        as one result of BUDGET_EXCEEDED results. With `failures`, each chunk is counted before it
        is yielded, and TooManyFailures is raised (the running chunks cancelled) once they are too many."""
        plan = self.plan(jobs)
        timeout = self.timeout(timeout)
        if self._small_inline(plan, batch, budget, deadline):
            head = list(itertools.islice(chunks, 2))
            if head == [(0, batch.size)]:  # one chunk, the whole call: no pipeline
                graded = self._whole_inline(plan, batch, timeout, reward, deadline, failures)
                size = _output_bytes(graded)
                if budget is not None:
                    budget.charge(size)
                try:
                    yield graded
                finally:
                    if budget is not None:
                        budget.release(size)
                return
            chunks = itertools.chain(head, chunks)
        issued: list[tuple[int, int]] = []  # the chunks started, in order
        source = chunks  # closed at the end (a guided call's generator)

        def bounds() -> Iterator[tuple[int, int]]:
            for bound in chunks:
                issued.append(bound)
                yield bound

        steps: Iterator[Awaitable[ChunkResult] | Streamed[ChunkResult]]
        window = plan.window
        if plan.rows:  # the window counts samples in flight: each row handed on frees one
            first = next(chunks, None)
            chunks = itertools.chain([first] if first is not None else [], chunks)
            window *= first[1] - first[0] if first is not None else 1
            chunk = batch.chunk
            steps = (
                Streamed[ChunkResult](self.grade_rows(plan, chunk(a, b), timeout, reward, deadline), b - a)
                for a, b in bounds()
            )
        elif plan.whole_chunks and batch.encoded is not None:
            steps = (self._grade_encoded(plan, batch, a, b, timeout, reward, deadline) for a, b in bounds())
        else:
            chunk = batch.chunk
            steps = (self.grade_chunk(plan, chunk(a, b), timeout, reward, deadline) for a, b in bounds())
        names = [job.grader.name for job in plan]
        answered: set[int] = set()  # the first samples of the chunks answered whole
        rows: set[int] = set()  # the samples answered in parts of a chunk (`grade_rows`)
        pipeline = _pipelined(steps, window, budget, deadline, units=_rows_of)
        try:
            async for graded in pipeline:
                if graded.partial:
                    rows.update(graded.indices)
                else:
                    answered.add(graded.indices[0])  # a chunk of samples a..b-1 starts at a
                if failures is not None:
                    if graded.encoded is not None:
                        failures.add_stats(graded.stats)
                    else:
                        failures.add_columns(names, graded.columns, graded.rewards)
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
            yield ChunkResult(cut, [[budget_error(name)] * len(cut) for name in names], [None] * len(cut))


def _own_bytes(item: WorkItem, nbytes: int) -> int:
    """The size of the samples `item` carries: its encoding's, else `nbytes` (the caller's count; for the
    chunks of a larger call that is the call's size, which says nothing of one chunk's)."""
    return len(item.samples.data) if isinstance(item.samples, Encoded) else nbytes


def _fixed_size(samples: int, requested: int) -> int:
    """The size of every chunk of a call cut by size (`Engine.chunks`): the request's, else `CHEAP_CHUNK`, and
    large enough that the call is at most `MAX_CHUNKS_PER_CALL` chunks."""
    return max(requested or CHEAP_CHUNK, -(-samples // MAX_CHUNKS_PER_CALL))


def _output_bytes(graded: object) -> int:
    """What a finished chunk holds, where known without per-sample work: an encoded answer's bytes."""
    encoded = graded.encoded if isinstance(graded, ChunkResult) else None
    return len(encoded) if encoded is not None else 0


def _rows_of(part: ChunkResult) -> int:
    """The samples a part of a streamed chunk answers: the window units it frees."""
    return part.size


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
