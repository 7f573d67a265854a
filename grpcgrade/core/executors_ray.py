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
  counted in `restarts` (the `grpcgrade_worker_pool_restarts_total` metric, as for local workers). A call
  the server holds open on every actor (`watch`) ends when the actor dies, so one lost while idle is
  replaced at once too, not found dead by the next work item.
- Actors dying before they are up follow the local pool's rule (`executors.StartFailures`): one of the
  first fails the server's start; later, each slot waits longer between tries, and once every slot has
  failed three times in a row the executor is unhealthy (`trouble`: the health check says NOT_SERVING,
  calls are refused UNAVAILABLE and work waiting for an actor is answered WORKER_UNAVAILABLE) until one
  stays up. Any Ray failure other than a grader's own exception (`RayTaskError`) costs the actor its place,
  since what it holds is unknown.
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
import socket
import threading
import time
from typing import Any

from . import grading
from .errors import ClusterUnreachable, GraderCancelled
from .executors import Executor, Item, NoProcess, StartFailures, Task, WorkerDied, WorkTimedOut, watchdog

log = logging.getLogger(__name__)


def _ray() -> Any:
    """Ray, imported when used (an optional extra); typed loosely: its stubs are not everywhere mypy runs."""
    return importlib.import_module("ray")


#: The namespace the server's actors live in on the cluster (they are named by nothing else).
NAMESPACE = "grpcgrade"


class GradingActor:
    """One worker on the cluster: the registry's graders, warmed, and one task at a time. A threaded actor
    of three: `run` grades, `cancel` (tiny) may arrive while it does, `watch` is held open by the server."""

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

    def watch(self) -> None:
        """Never returns: the server holds this call open so that the actor's death (its process killed, its
        node lost) ends it at once, idle or not, as a local worker's pipe does."""
        threading.Event().wait()


#: How long the executor may have no actor up (all lost, their replacements waiting for CPUs) before it
#: says it cannot grade (`healthy`): longer than a replacement's start, which leaves a one-actor pool with
#: none up for a second or two.
NO_ACTOR_SECONDS = 15.0
#: How often work waiting for an actor looks whether the executor can still grade (`trouble`).
TROUBLE_POLL_SECONDS = 1.0
#: How long the server gives the Ray head's port to answer before it says no cluster is there.
CONNECT_SECONDS = 10.0


def check_reachable(address: str) -> None:
    """Raise ClusterUnreachable when `address` is a host:port nothing answers at: `ray.init` would retry it
    for minutes (more than five, measured), logging a line every few seconds, before failing. Other forms
    (`auto`, `ray://...`) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise ClusterUnreachable(address, exc.strerror or str(exc) or type(exc).__name__) from None


class RayExecutor(Executor):
    """Work on a Ray cluster's actors; see the module docstring."""

    def __init__(self, address: str, size: int | None = None) -> None:
        check_reachable(address)
        ray = _ray()
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, ignore_reinit_error=True)
        self._ray = ray
        cpus = int(ray.cluster_resources().get("CPU", 0))
        self.size = size or max(1, cpus)
        if self.size > cpus:
            log.warning("%d Ray actors asked for, the cluster has %d CPUs: the rest start as CPUs are added",
                        self.size, cpus)  # fmt: skip
        self._remote = ray.remote(num_cpus=1, max_concurrency=3, max_restarts=0)(GradingActor)
        self._actors: dict[Any, tuple[int, str] | None] = {}  # actor -> (pid, node) once it is up
        self._slot_of: dict[Any, int] = {}
        self._starts = StartFailures()
        self._first = [self._start(slot) for slot in range(self.size)]
        self._idle: asyncio.Queue[Any] | None = None
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self.restarts = 0
        self.closed = False
        self._none_up_since: float | None = None  # when the last actor up was lost, while none is
        self._last_death = ""  # how the last actor that died before it was up ended

    def _start(self, slot: int) -> Any:
        actor = self._remote.options(scheduling_strategy="SPREAD").remote()
        self._actors[actor] = None
        self._slot_of[actor] = slot
        return actor

    @property
    def nodes(self) -> set[str]:
        """The nodes the actors that are up run on."""
        return {where[1] for where in self._actors.values() if where is not None}

    def pids(self) -> list[int]:
        """The actors' process ids (each on its own node's machine)."""
        return [where[0] for where in self._actors.values() if where is not None]

    def alive(self) -> int:
        return sum(1 for where in self._actors.values() if where is not None)

    def trouble(self) -> str | None:
        """Why no work can be graded, once every slot's actor has died `UNHEALTHY_STARTS` times in a row
        before it was up (nodes that cannot import grpcgrade or a plugin, a plugin that kills its process as
        it warms), and while no actor has been up for `NO_ACTOR_SECONDS`: their replacements wait for CPUs
        the cluster does not have (every node with CPUs lost, an autoscaler still adding some); else None."""
        if self._none_up_since is not None and time.monotonic() - self._none_up_since > NO_ACTOR_SECONDS:
            return f"no Ray actor has been up for {NO_ACTOR_SECONDS:g} s (none can be placed on the cluster's CPUs)"
        if not self._starts.healthy(range(self.size)):
            return f"every Ray actor started dies before it is up (the last: {self._last_death})"
        return None

    async def _up(self, actor: Any, first: bool = False) -> None:
        """Wait for `actor` to be warm, then hand it out. One of the `first` that dies before it is up fails
        the server's start, as a local worker does; a later one is replaced after its slot's wait."""
        try:
            where = await actor.ready.remote()
        except self._ray.exceptions.RayError as exc:  # its death, or any failure of Ray's to start it
            if first:
                raise RuntimeError(f"a Ray actor ended while starting: {_first_line(exc)}") from None
            if actor in self._actors:
                self._last_death = _first_line(exc)
                log.warning("a Ray actor died before it was up (%s): starting another", self._last_death)
                self._replace(actor)
            return
        if actor not in self._actors:  # replaced, or the executor closed, meanwhile
            return
        self._actors[actor] = where
        self._none_up_since = None
        self._starts.up(self._slot_of[actor])
        watched = asyncio.wrap_future(actor.watch.remote().future())
        watched.add_done_callback(lambda _: self._gone(actor, watched))
        if self._idle is not None:
            self._idle.put_nowait(actor)

    def _gone(self, actor: Any, watched: asyncio.Future[Any]) -> None:
        """`actor`'s watch call ended: it died (or was killed here, when it is no longer ours)."""
        if not watched.cancelled():
            watched.exception()  # looked at: asyncio would log it as never retrieved
        if actor in self._slot_of and not self.closed:
            log.warning("a Ray actor was lost (pid %s on node %s): replacing it", *(self._actors[actor] or ("?", "?")))
            self._replace(actor)

    async def ready(self) -> None:
        self._idle = asyncio.Queue()
        await asyncio.gather(*(self._up(actor, first=True) for actor in self._first))
        log.info("Ray executor: %d actors on %d nodes (pids %s)", self.alive(), len(self.nodes), self.pids())

    def _replace(self, actor: Any) -> None:
        """A dead or hung actor's place goes to a new one, at once, or after a wait when the actors of its
        slot keep dying before they are up (`StartFailures`); the new one is warmed before it is handed out."""
        if actor not in self._slot_of:  # replaced already (its watch and its call both saw it die)
            return
        was_up = self._actors.pop(actor, None) is not None
        slot = self._slot_of.pop(actor)
        if was_up and not self.alive():
            self._none_up_since = time.monotonic()
        self._ray.kill(actor, no_restart=True)
        if self.closed:
            return
        self.restarts += 1
        asyncio.get_running_loop().call_later(self._starts.ended(slot, was_up), self._respawn, slot)

    def _respawn(self, slot: int) -> None:
        if self.closed:
            return
        task = asyncio.get_running_loop().create_task(self._up(self._start(slot)))
        self._tasks.add(task)  # held until done: the loop keeps only a weak reference to a task
        task.add_done_callback(self._tasks.discard)

    def _lost(self, exc: BaseException | None) -> bool:
        """Whether an actor whose call ended with `exc` is to be replaced: it died, or Ray could not run the
        call or bring back its answer, so what the actor holds is unknown. A grader's own exception
        (RayTaskError) leaves it as it was."""
        return isinstance(exc, self._ray.exceptions.RayError) and not isinstance(exc, self._ray.exceptions.RayTaskError)

    def _back(self, actor: Any, answer: asyncio.Future[Any]) -> None:
        """A cancelled item's actor, once it has stopped: handed out again (or replaced if it was lost)."""
        if actor not in self._actors:
            return
        if answer.cancelled() or self._lost(answer.exception()):
            self._replace(actor)
        elif self._idle is not None:
            self._idle.put_nowait(actor)

    async def _next_actor(self) -> Any:
        """The next idle actor, waited for in line; NoProcess as soon as none can be kept up (`trouble`).

        Not `asyncio.wait_for`: on Python 3.11 it returns the inner result when it is done as the caller is
        cancelled, which would lose the cancellation. A getter cancelled before it took an actor leaves the
        actor in the queue (asyncio's Queue passes its wakeup on); one cancelled after, gives it back."""
        idle = self._idle
        assert idle is not None, "ready() first"
        while True:
            trouble = self.trouble()
            if trouble is not None:
                raise NoProcess(trouble)
            getter = asyncio.ensure_future(idle.get())
            try:
                await asyncio.wait({getter}, timeout=TROUBLE_POLL_SECONDS)
            except asyncio.CancelledError:
                if getter.done() and not getter.cancelled():
                    idle.put_nowait(getter.result())
                getter.cancel()
                raise
            if not getter.done():
                getter.cancel()
                continue
            actor = getter.result()
            if actor in self._actors:  # else lost while it waited in line (its watch saw it die)
                return actor

    async def submit(self, work: Item) -> Any:
        assert self._idle is not None, "ready() first"
        actor = await self._next_actor()
        seq = next(self._seq)
        try:
            answer = asyncio.wrap_future(actor.run.remote(seq, work.task()).future())
        except BaseException:  # not sent (the task could not be serialized): the actor holds nothing
            self._idle.put_nowait(actor)
            raise
        try:
            done, _ = await asyncio.wait({answer}, timeout=watchdog(work))
        except asyncio.CancelledError:
            actor.cancel.remote(seq)
            answer.add_done_callback(lambda f: self._back(actor, f))
            raise
        if not done:
            log.warning(
                "Ray actor (pid %s) held its work past the watchdog: killed", (self._actors.get(actor) or ("?",))[0]
            )
            self._replace(actor)
            answer.cancel()
            raise WorkTimedOut(f"a Ray actor held {work.size} samples past the watchdog")
        try:
            kind, value = answer.result()
        except self._ray.exceptions.RayTaskError as exc:
            self._idle.put_nowait(actor)
            cause = exc.cause
            raise cause if isinstance(cause, Exception) else RuntimeError(str(exc)) from None
        except self._ray.exceptions.RayError as exc:  # the actor died, or Ray lost the call or its answer
            self._replace(actor)
            raise WorkerDied(f"the Ray actor was lost: {type(exc).__name__}") from None
        self._idle.put_nowait(actor)
        if kind == "cancelled":  # cancelled by a call that has gone: nobody reads this
            raise asyncio.CancelledError
        return value

    def close(self, patience: float = 3.0) -> None:
        self.closed = True
        for actor in list(self._actors):
            self._ray.kill(actor, no_restart=True)
        self._actors.clear()
        self._ray.shutdown()


def _first_line(exc: BaseException) -> str:
    """An exception's first line, cut short: Ray's actor errors carry the whole story of the death."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"
