"""Worker processes for CPU-heavy graders, so one batch keeps every core busy.

A chunk travels as (grader name, params, samples), or, for a batch whose graders all run here, as the
request's protobuf bytes (see `wire`); each worker builds graders once from its own registry and reuses
them. Workers are spawned, not forked, because gRPC objects must not cross a fork.

Faults: a worker that dies (killed, out of memory) breaks the pool; it is replaced and the chunks that
were in flight are retried once, then reported as WORKER_LOST errors, never dropped. A worker stuck in C
code past the chunk's watchdog is killed the same way, and the chunk is retried sample by sample so
only the sample that hangs gets a TIMEOUT. The other calls' chunks that the killed pool held (queued, or
running beside the stuck one) are not theirs to lose: they run again, whole, in the new pool.

Cancellation: each chunk in a worker has a slot in a shared array of flags. When its call is cancelled
or passes its deadline, the server raises the flag and the worker stops the chunk at the next sample, or
within `ALARM_MAX_INTERVAL` inside one (see `grading`), so abandoned work does not hold a worker.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from grpcgrade.grader import GraderError, GraderResult

from . import grading
from .errors import ErrorCode, GraderCancelled
from .grading import GraderStats, failed_stats, grade_chunk_sync, grade_sync, join_stats

log = logging.getLogger(__name__)

WATCHDOG_GRACE_SECONDS = 2.0  # pickling and a busy queue; the per-sample limit itself is enforced in the worker
CANCEL_SLOTS = 4096  # chunks in a worker at once that can be cancelled; past that, a chunk runs to its end
MAX_REQUEUES = 3  # times a chunk runs again because another call's stuck sample took its pool down
#: How often the pool looks at which queued chunks a worker has taken: a chunk's watchdog starts then. One
#: look for every queued chunk at once (a queued chunk each looking for itself cost ~50 ms of the server's
#: CPU per 8,192-sample chrf step, measured).
TAKEN_POLL_SECONDS = 0.05

_flags: Any = None  # the shared cancel flags, in a worker
_taken: Any = None  # the shared flags a worker raises as it takes a chunk, in a worker


class _Requeue(Exception):
    """The chunk was lost with a pool the watchdog killed for another chunk's sake: run it again, whole."""


def _init_worker(
    log_levels: dict[str, int], log_formatter: logging.Formatter | None, flags: Any = None, taken: Any = None
) -> None:
    global _flags, _taken
    _flags, _taken = flags, taken
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A spawned process starts with logging unset: log as the server does (--log-format json: JSON lines).
    from grpcgrade import logs

    logs.apply(log_levels, log_formatter)
    from .registry import get_registry

    warm(get_registry())


def warm(registry: Any) -> None:
    """Every grader that builds with its default params, built and warmed up (`BaseGrader.warm_up`) in this
    process: the first request then pays no import or dictionary load."""
    for entry in registry.entries:
        try:
            registry.build(entry.name, {}).warm_up()
        except Exception as exc:  # a grader that needs params, or cannot warm: its first sample pays
            log.debug("not warmed: grader %s: %s", entry.name, exc)


def _ping() -> int:
    return os.getpid()


def _call(slot: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """`fn(*args)` in a worker, stopped early (GraderCancelled) once the server raises the chunk's flag;
    the chunk's `taken` flag tells the server its watchdog starts now."""
    flags = _flags
    if slot < 0 or flags is None:
        return fn(*args)
    if _taken is not None:
        _taken[slot] = 1
    grading._Watch.cancelled = lambda: flags[slot] != 0
    try:
        return fn(*args)
    finally:
        grading._Watch.cancelled = None


def _run(
    name: str,
    params: dict[str, Any],
    batch: list[dict[str, Any]],
    timeout: float | None,
    deadline: float | None = None,
) -> tuple[list[GraderResult], float]:
    from .registry import get_registry

    grader = get_registry().build(name, params)
    start = time.perf_counter()
    results = grade_sync(grader, batch, timeout, deadline)
    return results, time.perf_counter() - start


def _run_chunk(
    specs: list[tuple[str, dict[str, Any]]], chunk: list[Any], timeout: float | None, deadline: float | None = None
) -> tuple[list[list[GraderResult]], list[GraderStats]]:
    from .registry import get_registry

    registry = get_registry()
    return grade_chunk_sync([registry.build(name, params) for name, params in specs], chunk, timeout, deadline)


@dataclass(frozen=True)
class Work:
    """A unit the pool runs: `fn(*args)` in a worker over `size` samples.

    When a worker dies or hangs on it, `split` gives the same work sample by sample, `failed(code,
    message)` stands for a one-sample work that could not be done, and `join` puts split results back
    together, so the pool's fault handling is the same whatever travels.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    size: int
    timeout: float | None  # per sample; the watchdog allows `size` of them
    split: Callable[[], list[Work]]
    failed: Callable[[str, str], Any]
    join: Callable[[list[Any]], Any]


def grader_work(
    name: str,
    params: dict[str, Any],
    batch: list[dict[str, Any]],
    timeout: float | None,
    deadline: float | None = None,
) -> Work:
    """One grader over a chunk of keyword arguments: `([results], seconds)` back. Past the call's
    `deadline` (`time.monotonic()`, the same clock in every process) what is left is BUDGET_EXCEEDED."""
    return Work(
        _run,
        (name, params, batch, timeout, deadline),
        len(batch),
        timeout,
        lambda: [grader_work(name, params, [kw], timeout, deadline) for kw in batch],
        lambda code, message: ([GraderError(name, message, code=code)], 0.0),
        lambda parts: ([r for res, _ in parts for r in res], sum(t for _, t in parts)),
    )


def chunk_work(
    specs: list[tuple[str, dict[str, Any]]], chunk: list[Any], timeout: float | None, deadline: float | None = None
) -> Work:
    """Every grader of a call over a chunk of keyword arguments (or `SampleProblem`s), in one worker:
    `(columns, [GraderStats])` back, as `grade_chunk_sync` gives them (`deadline`: see `grader_work`)."""

    def failed(code: str, message: str) -> tuple[list[list[GraderResult]], list[GraderStats]]:
        columns: list[list[GraderResult]] = [[GraderError(name, message, code=code)] for name, _ in specs]
        return columns, [failed_stats(name, code, first=j == 0) for j, (name, _) in enumerate(specs)]

    def join(parts: list[tuple[list[list[GraderResult]], list[GraderStats]]]) -> Any:
        columns = [[r for cols, _ in parts for r in cols[j]] for j in range(len(specs))]
        stats = join_stats([st for _, st in parts])
        return columns, stats

    return Work(
        _run_chunk,
        (specs, chunk, timeout, deadline),
        len(chunk),
        timeout,
        lambda: [chunk_work(specs, [kw], timeout, deadline) for kw in chunk],
        failed,
        join,
    )


class WorkerPool:
    """A process pool that replaces itself when a worker dies or hangs."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.restarts = 0
        self._started: dict[int, list[Future[int]]] = {}  # per executor: one ping per worker
        self._killed: set[int] = set()  # executors the watchdog killed: their other chunks are innocent
        context = multiprocessing.get_context("spawn")
        self._flags = context.RawArray("b", CANCEL_SLOTS)
        self._taken = context.RawArray("b", CANCEL_SLOTS)
        self._free = list(range(CANCEL_SLOTS))
        self._queued: dict[Future[Any], tuple[int, asyncio.Future[None]]] = {}  # chunks no worker took yet
        self._looking: asyncio.Task[None] | None = None
        self._executor = self._new()

    def _new(self) -> ProcessPoolExecutor:
        from grpcgrade import logs

        executor = ProcessPoolExecutor(
            max_workers=self.size,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(*logs.current(), self._flags, self._taken),
        )
        # Start every worker now, not on the first heavy request; the pings also say when they are up.
        self._started[id(executor)] = [executor.submit(_ping) for _ in range(self.size)]
        return executor

    async def ready(self) -> None:
        """Returns once every worker has started, loaded the plugins and warmed the graders."""
        for ping in self._started.get(id(self._executor), ()):
            await asyncio.wrap_future(ping)

    def alive(self) -> int:
        processes = getattr(self._executor, "_processes", None) or {}
        return sum(1 for p in processes.values() if p.is_alive())

    def _replace(self, broken: ProcessPoolExecutor, kill: bool) -> None:
        if self._executor is broken:
            self.restarts += 1
            log.warning("replacing the worker pool (restart %d)", self.restarts)
            self._executor = self._new()
        self._started.pop(id(broken), None)
        if kill:
            self._killed.add(id(broken))
            for p in list((getattr(broken, "_processes", None) or {}).values()):
                p.kill()
        broken.shutdown(wait=False, cancel_futures=True)

    async def run(self, work: Work) -> Any:
        """`work.fn(*work.args)` in a worker; a sample that kills or hangs workers gets `failed`, alone."""
        attempts = requeues = 0
        while attempts < 2:
            executor = self._executor
            try:
                return await self._submit(executor, work)
            except _Requeue:
                requeues += 1
                if requeues > MAX_REQUEUES:
                    attempts += 1
            except TimeoutError:
                self._replace(executor, kill=True)
                if work.size == 1:
                    return work.failed(ErrorCode.TIMEOUT, f"grader ran past its time limit of {work.timeout:g} s")
                return await self._one_by_one(work)
            except (BrokenProcessPool, RuntimeError) as exc:
                if id(executor) in self._killed and requeues < MAX_REQUEUES:
                    requeues += 1  # the watchdog killed this pool for another chunk: not this one's fault
                    continue
                log.warning("worker lost while grading %d samples: %s", work.size, exc)
                self._replace(executor, kill=False)
                attempts += 1
                if work.size > 1:  # find the sample that kills workers; the others still get results
                    return await self._one_by_one(work)
        return work.failed(ErrorCode.WORKER_LOST, "the worker process grading this sample died twice")

    async def _one_by_one(self, work: Work) -> Any:
        """One at a time, so the sample that kills or hangs a worker takes no other sample with it."""
        return work.join([await self.run(part) for part in work.split()])

    def _slot(self) -> int:
        if not self._free:
            return -1
        slot = self._free.pop()
        self._flags[slot] = self._taken[slot] = 0
        return slot

    def _release(self, slot: int) -> Callable[[Future[Any]], None]:
        def release(_: Future[Any]) -> None:
            self._free.append(slot)  # list.append is atomic: this runs on the executor's thread

        return release

    async def _submit(self, executor: ProcessPoolExecutor, work: Work) -> Any:
        """Run one chunk; the watchdog starts when a worker takes the chunk, not while it waits its turn."""
        for ping in self._started.get(id(executor), ()):  # a worker still importing is not a hung grader
            await asyncio.wrap_future(ping)
        slot = self._slot()
        try:
            future = executor.submit(_call, slot, work.fn, work.args)
        except BaseException:
            if slot >= 0:
                self._free.append(slot)
            raise
        if slot >= 0:
            future.add_done_callback(self._release(slot))
        waiter = asyncio.wrap_future(future)
        try:
            if not future.running() or slot >= 0:
                taken = self._when_taken(future, slot)
                try:
                    await asyncio.wait((waiter, taken), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    self._queued.pop(future, None)
                    taken.cancel()
                if waiter.done():
                    return waiter.result()
            watchdog = work.timeout * work.size + WATCHDOG_GRACE_SECONDS if work.timeout else None
            return await asyncio.wait_for(asyncio.shield(waiter), watchdog)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if future.cancelled() and task is not None and not task.cancelling():
                raise _Requeue from None  # the pool was replaced under it (`_replace` cancels what it held)
            if slot >= 0:
                self._flags[slot] = 1  # the caller went away: the worker stops this chunk
            waiter.cancel()  # and no worker starts it if none has
            raise
        except GraderCancelled:
            raise _Requeue from None  # cannot happen unless the flag was raised for a slot reused: run it again

    def _when_taken(self, future: Future[Any], slot: int) -> asyncio.Future[None]:
        """Resolves once a worker has taken `future`'s chunk (or it has ended); `_look` watches them all."""
        loop = asyncio.get_running_loop()
        taken: asyncio.Future[None] = loop.create_future()
        self._queued[future] = slot, taken
        looking = self._looking
        if looking is None or looking.done() or looking.get_loop() is not loop:
            self._looking = loop.create_task(self._look())
        return taken

    async def _look(self) -> None:
        """Every `TAKEN_POLL_SECONDS` while chunks are queued: resolve `_when_taken` for those a worker took.
        The worker raises the chunk's `taken` flag; ProcessPoolExecutor's `Future.running()` is no sign of
        it (it is true already for a chunk queued in the pipe to the workers), and serves only chunks
        without a slot."""
        while self._queued:
            await asyncio.sleep(TAKEN_POLL_SECONDS)
            for future, (slot, taken) in list(self._queued.items()):
                if (self._taken[slot] if slot >= 0 else future.running()) or future.done():
                    del self._queued[future]
                    if not taken.done():
                        taken.set_result(None)

    def close(self, patience: float = 3.0) -> None:
        """At exit, after the drain: workers get `patience` seconds to finish what they hold (nobody waits
        for it any more), then they are stopped."""
        processes = list((getattr(self._executor, "_processes", None) or {}).values())
        if self._looking is not None and not self._looking.get_loop().is_closed():
            self._looking.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + patience
        for p in processes:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in processes:
            if p.is_alive():
                p.terminate()
                p.join(5)
