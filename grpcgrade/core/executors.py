"""Executors: where a unit of grading work runs, behind one interface.

The engine hands an executor a work item (`work.WorkItem`: a group of graders over a run of samples) and
awaits its result (`work.ChunkResult`); it never learns whether the work ran in the server process
(`InProcess`), in one of this machine's worker processes (`workers.WorkerPool`, a supervisor of its own),
or on another machine (a Ray executor implements the same interface). An executor implements three
things:

- `submit(item)`: run the item once, somewhere, and return its result, or raise one of the typed outcomes
  `WorkerDied` (the process running it died: killed, out of memory) or `WorkTimedOut` (it ran past its
  watchdog, `watchdog(work)`, and the process running it was stopped). Any other exception is the work's
  own and is raised as it is.
- **cancel**: cancelling the task awaiting `submit` cancels the work. The executor tells whatever runs it
  to stop (the grading loops stop at the next sample, or within `grading.ALARM_MAX_INTERVAL` inside one) and
  the process is free again once it has; nobody waits for the answer.
- `size` (how many items run at once), `alive()` (the processes up now: what the metrics report),
  `trouble()` (why it cannot grade at all, None while it can: what the health check reports, and what
  the server refuses calls with meanwhile; `healthy()` is its absence),
  `restarts` (processes replaced so far), `ready()` (every process up and warmed) and `close(patience)`.

`Executor.run` is the fault policy every executor shares: a chunk whose process died or hung is run again
sample by sample, so only the sample that kills or hangs a process is answered WORKER_LOST or TIMEOUT, and
every other sample still gets its result. Work that finds the executor unable to grade, or is waiting for a
process when it becomes so (`NoProcess`), is answered WORKER_UNAVAILABLE at once (not quarantined: the
sample did nothing), never held until its deadline.

An item is anything with the `Item` shape: grading's is `work.WorkItem` (the executors' tests run plain
functions through the same shape). What crosses to another process or machine is a `Task`: the function, its arguments,
and the time the call has left, in *seconds* (`seconds_left`), never an absolute clock reading: a deadline on this
machine's monotonic clock means nothing on another machine's. The process that runs a task turns the
seconds back into a deadline on its own clock as it starts it.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import CANNOT_GRADE, ErrorCode

log = logging.getLogger(__name__)

#: What a work item's watchdog allows beyond `timeout x size`: pickling, a busy machine, a worker's start.
#: The per-sample limit itself is enforced where the work runs (`grading`).
WATCHDOG_GRACE_SECONDS = 2.0


#: A process that dies before it is up waits this long (doubling, to `RESPAWN_MAX_SECONDS`) to start again,
#: so a plugin that kills every new process (or a cluster whose nodes cannot import it) costs a process every
#: few seconds, not a busy loop.
RESPAWN_FIRST_SECONDS = 0.1
RESPAWN_MAX_SECONDS = 5.0
#: Deaths before ready in a row, in every slot, that make an executor unhealthy (`Executor.healthy`).
UNHEALTHY_STARTS = 3


class StartFailures:
    """Per slot (a place for one process, kept as its process is replaced), the processes that died in a row
    before they were up: how long the next one waits to start, and whether the executor can keep any
    process up. One rule for the local pool and the Ray actors."""

    def __init__(self) -> None:
        self._in_a_row: dict[int, int] = {}

    def up(self, slot: int) -> None:
        """`slot`'s process is up: its failures are behind it."""
        self._in_a_row.pop(slot, None)

    def ended(self, slot: int, was_up: bool) -> float:
        """`slot`'s process ended (`was_up`: after it was up); returns the seconds before the next starts."""
        fails = self._in_a_row.get(slot, 0) + (0 if was_up else 1)
        self._in_a_row[slot] = fails
        return 0.0 if not fails else min(RESPAWN_FIRST_SECONDS * 2 ** (fails - 1), RESPAWN_MAX_SECONDS)

    def healthy(self, slots: Iterable[int]) -> bool:
        """False once every slot's process has died `UNHEALTHY_STARTS` times in a row before it was up."""
        return any(self._in_a_row.get(slot, 0) < UNHEALTHY_STARTS for slot in slots)


class WorkerDied(Exception):
    """`submit`'s outcome when the process running the work died before it answered."""


class NoProcess(Exception):
    """`submit`'s outcome when the executor cannot keep any process up (`trouble()`) while the work waits for
    one: nothing would take it before its deadline. The message says why."""


class WorkTimedOut(Exception):
    """`submit`'s outcome when the work ran past its watchdog: the process running it was stopped."""


class Item(Protocol):
    """What an executor runs: `size` samples under a per-sample `timeout`, sent elsewhere as `task()` or run in
    this process by `run_here()`. When a process dies or hangs on it, `split()` gives it sample by sample,
    `failed(code, message)` is the result of a one-sample item that could not be done, and `join(parts)`
    puts split results back together, so the fault handling is the same whatever travels."""

    @property
    def size(self) -> int: ...

    @property
    def timeout(self) -> float | None: ...

    def task(self) -> Task: ...

    def run_here(self) -> Any: ...

    def split(self) -> Sequence[Item]: ...

    def failed(self, code: str, message: str) -> Any: ...

    def join(self, parts: list[Any]) -> Any: ...


@dataclass(frozen=True)
class Task:
    """What crosses to the process (or machine) that runs a work item: picklable, and free of clock
    readings. `seconds_left` is the call's time left when the task was sent (None: no deadline)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    seconds_left: float | None = None

    def __call__(self) -> Any:
        if self.seconds_left is None:
            return self.fn(*self.args)
        return self.fn(*self.args, deadline=time.monotonic() + self.seconds_left)


def watchdog(work: Item) -> float | None:
    """How long a process may hold `work` before it is taken for hung (None: no per-sample limit, no
    watchdog; the call's deadline still stops the grading where it runs)."""
    return work.timeout * work.size + WATCHDOG_GRACE_SECONDS if work.timeout else None


class Executor(abc.ABC):
    """Runs work items; see the module docstring for the contract an implementation keeps."""

    size: int
    restarts: int = 0

    @abc.abstractmethod
    async def submit(self, work: Item) -> Any:
        """Run `work` once; raises `WorkerDied` or `WorkTimedOut` when it could not be done."""

    @abc.abstractmethod
    async def ready(self) -> None:
        """Returns once every process is up, has loaded the plugins and warmed the graders."""

    def alive(self) -> int:
        """The processes up now."""
        return self.size

    def trouble(self) -> str | None:
        """Why the executor cannot grade now, None while it can: none of its processes can be kept up (each
        one replaced dies before it is ready). What the server's health check reports."""
        return None

    def healthy(self) -> bool:
        """Whether the executor can grade (`trouble()` is None)."""
        return self.trouble() is None

    @abc.abstractmethod
    def close(self, patience: float = 3.0) -> None:
        """At exit, after the drain: processes get `patience` seconds to finish what they hold, then stop."""

    async def run(self, work: Item) -> Any:
        """`work`'s result; a sample that kills or hangs its process gets `work.failed`, alone. A work item
        of one sample whose process died is tried once more (the death may have been someone else's doing,
        the OOM killer's or an operator's), then answered WORKER_LOST; all of an item is WORKER_UNAVAILABLE while
        no process can be kept up (`NoProcess`)."""
        attempts = 0
        while True:
            trouble = self.trouble()
            try:
                if trouble is not None:
                    raise NoProcess(trouble)
                return await self.submit(work)
            except NoProcess as exc:  # nothing would take it: answered now, each sample on its own
                why = f"{CANNOT_GRADE}: {exc}"
                if work.size == 1:
                    return work.failed(ErrorCode.WORKER_UNAVAILABLE, why)
                return work.join([part.failed(ErrorCode.WORKER_UNAVAILABLE, why) for part in work.split()])
            except WorkTimedOut:
                if work.size == 1:
                    return work.failed(ErrorCode.TIMEOUT, f"grader ran past its time limit of {work.timeout:g} s")
                return await self._one_by_one(work)
            except WorkerDied as exc:
                log.warning("worker lost while grading %d samples: %s", work.size, exc)
                attempts += 1
                if work.size > 1:  # find the sample that kills workers; the others still get results
                    return await self._one_by_one(work)
                if attempts >= 2:
                    return work.failed(ErrorCode.WORKER_LOST, "the worker process grading this sample died twice")

    async def _one_by_one(self, work: Item) -> Any:
        """Sample by sample, each its own work item: the sample that kills or hangs a process takes no other
        sample with it (each process grades one item at a time; one sent ahead to it is run elsewhere), and
        the others run side by side."""
        return work.join(list(await asyncio.gather(*(self.run(part) for part in work.split()))))


class InProcess(Executor):
    """Runs work in the server process, on the calling thread, with the graders built there: small work of
    bounded cost, where a hop to another process costs more than the work (`plan.Plan.inline`), and the
    graders that run nowhere else (no executor, or server-only graders). It cannot survive the work killing
    its process; it has no watchdog (the per-sample limit and the call's deadline hold through `grading`'s
    timer)."""

    size = 1

    async def submit(self, work: Item) -> Any:
        return work.run_here()

    async def ready(self) -> None:
        return None  # the server process is up

    def close(self, patience: float = 3.0) -> None:
        return None  # nothing of its own to stop
