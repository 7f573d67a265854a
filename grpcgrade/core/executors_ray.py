"""The Ray executor (`grpcgrade serve --ray ADDRESS`, the `grpcgrade[ray]` extra): the workers as Ray
actors over a cluster's CPUs, so one endpoint grades with every node.

veRL, OpenRLHF, NeMo-RL, ROLL and slime already run a Ray cluster; this puts the reward's workers on it
instead of on the server's machine alone. It is the third implementation of the executor interface
(`executors`): the engine hands it the same work items (`work.WorkItem`: the same chunking, time limits
and codecs as local workers) and gets the same results and typed outcomes back, and `Executor.run`'s fault
policy is the same: a chunk whose actor died or hung is run again sample by sample.

- One actor per CPU of the cluster (or `--workers N`), each holding one CPU and spread over the nodes
  (`SPREAD`); each loads the plugins and warms the graders once, as a local worker does (`registry.warm`).
  Every node needs grpcgrade and the plugins installed, in the environment its Ray workers run.
- Each actor holds one work item at a time. What crosses is a `Task`: seconds left, never a clock reading
  (another machine's monotonic clock is not ours).
- An actor that dies (its node lost, its process killed, out of memory) is `WorkerDied`; one past the
  work's watchdog (`executors.watchdog`) is killed, `WorkTimedOut`. Either way a new actor takes its place,
  counted in `restarts` (the `grpcgrade_worker_pool_restarts_total` metric, as for local workers).
- Cancelling a call's work sends the actor a cancel message (a second, tiny method on a threaded actor);
  its grading loop stops at the next sample or tick (`grading.cancellable`), and the actor is handed out
  again once it has.

The server is the Ray driver: `ray.init(address=...)` at start, the actors killed and the driver
disconnected at stop. Ray is imported only here, and only when `--ray` is given.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import os
from typing import Any

from . import grading
from .errors import GraderCancelled
from .executors import Executor, Item, Task, WorkerDied, WorkTimedOut, watchdog

log = logging.getLogger(__name__)


def _ray() -> Any:
    """Ray, imported when used (an optional extra); typed loosely: its stubs are not everywhere mypy runs."""
    return importlib.import_module("ray")


#: The namespace the server's actors live in on the cluster (they are named by nothing else).
NAMESPACE = "grpcgrade"


class GradingActor:
    """One worker on the cluster: the registry's graders, warmed, and one task at a time. A threaded actor
    of two: `run` grades, `cancel` (tiny) may arrive while it does."""

    def __init__(self) -> None:
        ray = _ray()

        from .registry import get_registry, warm

        warm(get_registry())
        self.where = (os.getpid(), ray.get_runtime_context().get_node_id())
        self.stop = -1  # the sequence number of the item the server cancelled

    def ready(self) -> tuple[int, str]:
        """This actor's process id and node, once its graders are warm."""
        return self.where

    def run(self, seq: int, task: Task) -> tuple[str, Any]:
        try:
            with grading.cancellable(lambda: self.stop == seq):
                return "ok", task()
        except GraderCancelled:
            return "cancelled", None

    def cancel(self, seq: int) -> None:
        self.stop = seq


class RayExecutor(Executor):
    """Work on a Ray cluster's actors; see the module docstring."""

    def __init__(self, address: str, size: int | None = None) -> None:
        ray = _ray()
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, ignore_reinit_error=True)
        self._ray = ray
        self.size = size or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(num_cpus=1, max_concurrency=2, max_restarts=0)(GradingActor)
        self._actors: dict[Any, tuple[int, str] | None] = {self._start(): None for _ in range(self.size)}
        self._idle: asyncio.Queue[Any] | None = None
        self._seq = itertools.count()
        self.restarts = 0

    def _start(self) -> Any:
        return self._remote.options(scheduling_strategy="SPREAD").remote()

    @property
    def nodes(self) -> set[str]:
        """The nodes the actors that are up run on."""
        return {where[1] for where in self._actors.values() if where is not None}

    def pids(self) -> list[int]:
        """The actors' process ids (each on its own node's machine)."""
        return [where[0] for where in self._actors.values() if where is not None]

    def alive(self) -> int:
        return sum(1 for where in self._actors.values() if where is not None)

    async def _up(self, actor: Any) -> None:
        """Wait for `actor` to be warm, then hand it out."""
        try:
            self._actors[actor] = await actor.ready.remote()
        except self._ray.exceptions.RayActorError:
            log.warning("a Ray actor died before it was up; starting another")
            self._replace(actor)
            return
        if self._idle is not None:
            self._idle.put_nowait(actor)

    async def ready(self) -> None:
        self._idle = asyncio.Queue()
        await asyncio.gather(*(self._up(actor) for actor in list(self._actors)))
        log.info("Ray executor: %d actors on %d nodes (pids %s)", self.alive(), len(self.nodes), self.pids())

    def _replace(self, actor: Any) -> None:
        """A dead or hung actor's place goes to a new one (warmed before it is handed out)."""
        self._actors.pop(actor, None)
        self._ray.kill(actor, no_restart=True)
        self.restarts += 1
        fresh = self._start()
        self._actors[fresh] = None
        task = asyncio.get_running_loop().create_task(self._up(fresh))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _back(self, actor: Any, answer: asyncio.Future[Any]) -> None:
        """A cancelled item's actor, once it has stopped: handed out again (or replaced if it died)."""
        if answer.cancelled() or isinstance(answer.exception(), self._ray.exceptions.RayActorError):
            self._replace(actor)
        elif self._idle is not None:
            self._idle.put_nowait(actor)

    async def submit(self, work: Item) -> Any:
        assert self._idle is not None, "ready() first"
        actor = await self._idle.get()
        seq = next(self._seq)
        answer = asyncio.wrap_future(actor.run.remote(seq, work.task()).future())
        try:
            done, _ = await asyncio.wait({answer}, timeout=watchdog(work))
        except asyncio.CancelledError:
            actor.cancel.remote(seq)
            answer.add_done_callback(lambda f: self._back(actor, f))
            raise
        if not done:
            self._replace(actor)
            answer.cancel()
            raise WorkTimedOut(f"a Ray actor held {work.size} samples past the watchdog")
        try:
            kind, value = answer.result()
        except self._ray.exceptions.RayActorError as exc:
            self._replace(actor)
            raise WorkerDied(f"the Ray actor died: {type(exc).__name__}") from None
        except self._ray.exceptions.RayTaskError as exc:
            self._idle.put_nowait(actor)
            cause = exc.cause
            raise cause if isinstance(cause, Exception) else RuntimeError(str(exc)) from None
        self._idle.put_nowait(actor)
        if kind == "cancelled":  # cancelled by a call that has gone: nobody reads this
            raise asyncio.CancelledError
        return value

    def close(self, patience: float = 3.0) -> None:
        for actor in list(self._actors):
            self._ray.kill(actor, no_restart=True)
        self._actors.clear()
        self._ray.shutdown()
