"""Server-side coalescing: concurrent one-sample calls with the same plan are graded as one chunk.

A trainer that grades sample by sample (veRL's reward loop, slime, NeMo Gym's /verify, AReaL) sends one
call per sample. Graded one by one, each sample pays a chunk's fixed cost: a hop to a worker and back, the
graders' per-chunk work, the stats. Here the samples of calls that arrive together with the same plan
(the same graders and parameters, reward, cache use, time limit and caller) wait at most `linger` seconds for each
other and go to the engine as one chunk, of at most `max_chunk` samples (a full chunk leaves at once);
each call gets its own sample's results and reward back. The Python client's own `Coalescer` does the
same on the caller's side; this one serves every caller, in any language, over gRPC and HTTP.

Only calls that would hop are gathered: a call the engine grades inline (cheap graders, a small sample)
has no hop to share, and is graded at once. A lone call waits only while another chunk of its plan is
being graded: with nothing of its plan in
flight a call's chunk leaves on the next turn of the event loop (gathering the calls that arrived in the
same turn), so a quiet server adds no latency; under load the calls that arrive while a chunk is graded
gather for the next one, up to `linger`.

One sample's failure never costs another its result: the engine answers per sample. A call cancelled
(its deadline passed, its client gone) before its chunk leaves is left out of it; once every call of a
chunk being graded has gone, the chunk is cancelled, and with it the work in the worker, as a cancelled
batch's is (graded to its time limit, it would hold a worker for nobody and quarantine the sample as a
TIMEOUT nobody asked about). An error grading the whole chunk (the engine raising) is every caller's
error, as it would have been for each alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from grpcgrade.grader import GraderResult

from .context import CALLER, DEFAULT_CALLER
from .engine import CHEAP_CHUNK, Chunk, ChunkResult, Job
from .errors import SampleProblem

#: How long a call waits for others of its plan while one of its chunks is being graded (seconds): the
#: engine's own coalescer's, and the HTTP faces' (`coalesce_linger_seconds`' default). The HTTP faces keep
#: it though each of their chunks is a call to the engine's process, as a gRPC face's is: measured with
#: 4,000 callers their chunks already held 230-770 samples at 2 ms (a face's loop, busy with the crowd's
#: requests, turns slower than the linger), and 10 ms gained the crowd nothing beyond noise (7,020/7,667
#: against 6,838/7,142 calls/s, 141-150 against 155-159 us of server CPU a call) while it cost 16 callers
#: 21-44% of their calls/s (2,499-3,323 against 4,206-4,476; p99 13-18 against 5-7 ms), also with a face
#: process per core (2026-11-26, load 3-6, `json_validator`; docs/performance.md, "How long a call waits").
DEFAULT_LINGER_SECONDS = 0.002
#: The least the gRPC faces wait: the Python face processes (`service.grpc_face`) and the Go face, given it
#: as its `--linger` (`service.native_face`). Measured on the Python faces with 4,000 callers: at 2 ms a
#: crowd's chunks held 5 samples, each a BatchEvaluate across processes; at 10 ms 27-36, and the crowd got
#: 4,100/5,367 against 2,661/3,062 calls/s at 352/306 against 585/575 us of server CPU a call (two face
#: processes, load 6-8). The price is a small crowd's: 16 callers got 1,047/1,131 against 1,935/2,669
#: calls/s. Sending the waiting calls as soon as their plan's chunk came back (rather than at the linger)
#: won those back (1,973-2,348/s) but shrank the crowd's chunks to 8 and cost it a quarter more CPU a call
#: (422-450 us): a crowd is what the faces are for. A lone call never waits: with nothing of its plan in
#: flight it leaves on the next turn of the loop.
FACE_LINGER_SECONDS = 0.01
#: The longest linger a configuration may set: a wait every call of a busy server may pay.
MAX_LINGER_SECONDS = 0.1

Kwargs = dict[str, Any] | SampleProblem
#: One sample's answer: each grader's result, in the plan's order, and its reward.
Answer = tuple[list[GraderResult], float | None]


@dataclass
class _Plan:
    """The calls of one plan waiting to be graded, and how many of its chunks are being graded."""

    jobs: Sequence[Job]
    timeout: float | None
    reward: str
    waiting: list[tuple[Kwargs, int, asyncio.Future[Answer]]] = field(default_factory=list)
    running: int = 0
    timer: asyncio.Handle | None = None


def plan_key(jobs: Sequence[Job], timeout: float | None, reward: str, caller: str = DEFAULT_CALLER) -> Hashable:
    """What calls must share to be graded together. The registry builds each distinct (name, params) once,
    so the same grader object means the same grader and parameters. The caller too: a chunk is graded under
    one caller's name (`context.CALLER`, an LLM judge's fair share), so calls of two callers are two chunks."""
    return (
        tuple((id(job.grader), job.spec.label, job.spec.weight, job.spec.gate, job.use_cache) for job in jobs),
        timeout,
        reward,
        caller,
    )


class ChunkGrading(Protocol):
    """What the coalescer grades chunks with: the `Engine`, or an HTTP face process's link to the engine's
    process (`service.http.forward.EngineLink`), which gathers one-sample posts into one call."""

    def inline_small(self, jobs: Sequence[Job], nbytes: int) -> bool: ...

    async def grade_chunk(
        self, jobs: Sequence[Job], chunk: Chunk, timeout: float | None = None, reward: str = "",
        deadline: float | None = None, nbytes: int = 0,
    ) -> ChunkResult: ...  # fmt: skip


class ServerCoalescer:
    """Grades one-sample calls in chunks of calls with the same plan; one per server (and one per HTTP face
    process, in front of its link to the engine)."""

    def __init__(
        self, engine: ChunkGrading, linger: float = DEFAULT_LINGER_SECONDS, max_chunk: int = CHEAP_CHUNK
    ) -> None:
        if linger < 0 or max_chunk < 1:
            raise ValueError("linger must be >= 0 and max_chunk >= 1")
        self.engine = engine
        self.linger = linger
        self.max_chunk = max_chunk
        self._plans: dict[Hashable, _Plan] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Chunks graded and the samples in them (for the bench and tests: samples / chunks is the gain).
        self.chunks = 0
        self.samples = 0

    async def grade(
        self, jobs: Sequence[Job], kwargs: Kwargs, timeout: float | None, reward: str = "", nbytes: int = 0
    ) -> Answer:
        """One sample's results (in `jobs`' order) and reward, graded with the calls of its plan that are
        waiting too. `nbytes`: the sample's request size, for the engine's inline choice (summed per chunk).

        A call the engine grades inline anyway (cheap graders, a small sample, the loop's inline share not
        spent) is graded at once: gathering it saves no hop, and waiting costs each call a future, a
        suspension and a resumption, more than its grading (a crowd of 4,000 json_validator callers: 615
        against 477 us of server CPU a call, measured with `grpcgrade bench --per-sample`)."""
        if self.engine.inline_small(jobs, nbytes):
            graded = await self.engine.grade_chunk(jobs, [(0, kwargs)], timeout, reward, nbytes=nbytes)
            return [column[0] for column in graded.columns], graded.rewards[0]
        key = plan_key(jobs, timeout, reward, CALLER.get())
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _Plan(jobs, timeout, reward)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        plan.waiting.append((kwargs, nbytes, future))
        if len(plan.waiting) >= self.max_chunk:
            self._flush(key, plan)
        elif plan.timer is None:
            # Nothing of this plan being graded: leave on the next turn (with whoever came in this one).
            delay = self.linger if plan.running else 0.0
            plan.timer = asyncio.get_running_loop().call_later(delay, self._flush, key, plan)
        return await future

    def _flush(self, key: Hashable, plan: _Plan) -> None:
        if plan.timer is not None:
            plan.timer.cancel()
            plan.timer = None
        batch, plan.waiting = plan.waiting[: self.max_chunk], plan.waiting[self.max_chunk :]
        if plan.waiting:  # more than a chunk waited: the rest goes at once too
            plan.timer = asyncio.get_running_loop().call_soon(self._flush, key, plan)
        batch = [waiting for waiting in batch if not waiting[2].done()]  # calls gone meanwhile: not graded
        if not batch:
            return
        plan.running += 1
        task = asyncio.get_running_loop().create_task(self._grade(key, plan, batch))
        self._tasks.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)
        futures = [future for _, _, future in batch]

        def abandoned(_: asyncio.Future[Answer]) -> None:
            if all(future.cancelled() for future in futures):
                task.cancel()  # every caller has gone: the engine cancels the chunk's work in the worker

        for future in futures:
            future.add_done_callback(abandoned)

    async def _grade(self, key: Hashable, plan: _Plan, batch: list[tuple[Kwargs, int, asyncio.Future[Answer]]]) -> None:
        self.chunks += 1
        self.samples += len(batch)
        try:
            chunk = [(i, kwargs) for i, (kwargs, _, _) in enumerate(batch)]
            nbytes = sum(n for _, n, _ in batch)
            graded: ChunkResult = await self.engine.grade_chunk(
                plan.jobs, chunk, plan.timeout, plan.reward, nbytes=nbytes
            )
        except BaseException as exc:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            plan.running -= 1
            if not plan.running and not plan.waiting and plan.timer is None and self._plans.get(key) is plan:
                del self._plans[key]  # an idle plan holds nothing
        for k, (_, _, future) in enumerate(batch):
            if not future.done():
                future.set_result(([column[k] for column in graded.columns], graded.rewards[k]))
