"""The local executor: a supervisor of worker processes for CPU-heavy graders, so one batch keeps every
core busy, and no worker's death or hang costs more than the work it held.

`WorkerPool` starts N spawned processes (spawned, not forked: gRPC objects must not cross a fork); each
builds graders once from its own registry, warms them (`registry.warm`) and reuses them. Each worker has a pipe of
its own and holds at most `ITEMS_PER_WORKER` work items: the one it grades and, while every worker is busy,
the next one, already in its pipe (sent ahead), so a worker that finishes an item starts the next at once
instead of waiting for the event loop to hand it one (1-5 ms a hand-off on a busy server). The supervisor
sends a worker each `Task` and waits, on a thread of its own per worker, for the answers on that pipe or
the end of the process (its sentinel), whichever comes first. No pipe, lock or queue is shared between
workers, so:

- a worker that dies (killed, out of memory), even halfway through writing a large answer, takes only its
  own pipe with it: the pipe is dropped whole, half-written message and all, the item it was grading is
  answered `WorkerDied`, and a new process takes its place. No other worker or call notices. An item the
  worker had not yet read from its pipe (the one sent ahead, or every worker killed at once before the
  supervisor noticed) goes to another worker instead: its death was not that item's doing. The worker
  stores each item's sequence number in memory it shares with the supervisor before it unpickles the item
  (`_Worker.taken`), so what it had read, and what not, is known after its death.
- a worker stuck past its work's watchdog (`executors.watchdog`; a grader in C code the time-limit signal
  cannot interrupt, or a process stopped with SIGSTOP) is killed and replaced, alone: `WorkTimedOut` for
  the item it was grading; the item sent ahead goes to another worker. An item's watchdog starts when the
  worker starts it: as it is sent to an idle worker, or as the answer before it comes back.
- cancelling a call's work is a message on the worker's cancel pipe naming the work item: the grading
  loops see it at the next sample, or within `grading.ALARM_MAX_INTERVAL` inside one, and stop; an item
  cancelled before the worker starts it is answered cancelled without being run.

`Executor.run` (see `executors`) turns those outcomes into the samples' results: a chunk whose worker
died or hung is run again sample by sample, so only the sample at fault is WORKER_LOST or TIMEOUT.

A large task or answer is written and read on the worker's own threads, never on the event loop, so a
worker that stops reading or writing (SIGSTOP) holds one thread, not the server.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import io
import itertools
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from . import grading
from .errors import GraderCancelled, describe
from .executors import (
    WATCHDOG_GRACE_SECONDS,
    Executor,
    Item,
    NoProcess,
    StartFailures,
    Task,
    WorkerDied,
    WorkTimedOut,
    watchdog,
)
from .prctl import end_with_parent
from .rewards import SpecData
from .work import WorkItem

__all__ = ["WATCHDOG_GRACE_SECONDS", "WorkerPool", "grader_work"]

log = logging.getLogger(__name__)

#: How often a worker grading a sample looks at its cancel pipe, at most (a poll costs a system call).
CANCEL_POLL_SECONDS = 0.01
#: Work items a worker holds at most: the one it grades and one sent ahead, which it starts as it answers
#: the first. Sent ahead only while no worker is idle; one, not more: an item queued behind a slow one
#: waits for it, where another worker may have come free first.
ITEMS_PER_WORKER = 2
_SEQ = struct.Struct("=q")  # a cancel message: the sequence number of the work item to stop (atomic write)
_READY = "ready"
_STOP = b""  # a task of no bytes: finish, and exit


class _Unread(WorkerDied):
    """A worker died holding an item it had not read: `submit` gives the item to another worker."""


# -- in the worker process -------------------------------------------------------------------------------


class _CancelPipe:
    """In a worker: whether the server has cancelled the item being graded, read from the worker's cancel
    pipe at most every `CANCEL_POLL_SECONDS`. Messages for items already done are dropped; one for an item
    sent ahead (read while the one before it runs) is kept until that item starts."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.seq = -1
        self.hit = False
        self.last = 0.0
        self.ahead: set[int] = set()  # cancelled items not started yet: at most those sent ahead

    def start(self, seq: int) -> bool:
        """Item `seq` starts: whether it was cancelled already (then it is not run). The pipe is read now,
        once (a system call an item): a cancel sent while the item waited may not have been read yet."""
        self.seq, self.hit, self.last = seq, False, 0.0
        if self.ahead:
            self.hit = seq in self.ahead
            self.ahead = {s for s in self.ahead if s > seq}
        return self()

    def __call__(self) -> bool:
        now = time.perf_counter()
        if self.hit or now - self.last < CANCEL_POLL_SECONDS:
            return self.hit
        self.last = now
        try:
            data = os.read(self.fd, 4096)
        except BlockingIOError:
            return False
        for (seq,) in _SEQ.iter_unpack(data[: len(data) // _SEQ.size * _SEQ.size]):
            if seq == self.seq:
                self.hit = True
            elif seq > self.seq:
                self.ahead.add(seq)
        return self.hit


def _worker_main(
    conn: Connection,
    cancel: Connection,
    taken: Any,
    parent: int,
    log_levels: dict[str, int],
    formatter: Any,
    initializer: Callable[[], None] | None = None,
) -> None:
    """A worker's life: start up (load and warm the graders, or run the pool's `initializer` instead), say
    so, then take one task at a time until told to stop or the server goes away (its end of the pipe
    closes)."""
    # The server decides when workers stop (a stop message, then SIGKILL past its patience): a terminal's
    # SIGINT, or a SIGTERM sent to the whole process group (systemd's default stop, `kill -TERM -PGID`),
    # must not end them while the server drains their work. A server that ends without stopping them
    # (SIGKILL, the OOM killer) takes them with it: SIGKILL as it ends, not the pipe's end, which a worker
    # sees only between tasks (a grader stuck in C code would have kept its worker forever).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not end_with_parent(signal.SIGKILL, parent):
        return  # the server ended before the death signal was set
    # A spawned process starts with logging unset: log as the server does (--log-format json: JSON lines).
    from grpcgrade import logs

    logs.apply(log_levels, formatter)
    if initializer is not None:
        initializer()
    else:
        from .registry import get_registry, warm

        warm(get_registry())
    # The start-up's objects (modules, warmed graders, their tables) out of every later full collection, as
    # in the server's process (`service.lifecycle.settle_heap`): a warmed worker's full collection took 45-60
    # ms of CPU, set off every few 1,024-sample chunks by their results (measured: 9-11.5 against 8.1 us a
    # json_validator full-view sample graded).
    gc.freeze()
    os.set_blocking(cancel.fileno(), False)
    cancelled = _CancelPipe(cancel.fileno())
    conn.send_bytes(pickle.dumps((_READY, os.getpid())))
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the server is gone
        if data == _STOP:
            return
        (seq,) = _SEQ.unpack_from(data)
        taken.value = seq  # read: a death from here on is this item's
        try:
            if cancelled.start(seq):  # cancelled while it waited in the pipe: not run
                raise GraderCancelled
            task = pickle.loads(memoryview(data)[_SEQ.size :])
            with grading.cancellable(cancelled):
                answer: tuple[int, str, Any] = (seq, "ok", task())
        except GraderCancelled:
            answer = (seq, "cancelled", None)
        except BaseException as exc:  # noqa: BLE001 - the work's own exception: raised where it was awaited
            answer = (seq, "raised", _portable(exc))
        try:
            out = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - an answer that cannot cross: its error does
            out = pickle.dumps((seq, "raised", RuntimeError(f"the answer could not be sent: {describe(exc)}")))
        try:
            conn.send_bytes(out)
        except OSError:
            return


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives the trip to the server (pickled and built again there), else a RuntimeError
    that says what it was: an exception class whose constructor takes other arguments cannot be rebuilt."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - however it fails to cross
        return RuntimeError(f"{type(exc).__name__}: {describe(exc)}")
    return exc


def grader_work(
    name: str,
    params: dict[str, Any],
    batch: list[dict[str, Any]],
    timeout: float | None,
    deadline: float | None = None,
) -> WorkItem:
    """One grader over a chunk of keyword arguments, as a work item (its result's `columns[0]`)."""
    return WorkItem((SpecData(name, params),), (name,), batch, 0, len(batch), timeout, deadline, selected=True)


# -- in the server process -------------------------------------------------------------------------------


@dataclass
class _Held:
    """An item a worker holds: its sequence number, the future its answer goes to, and its watchdog's limit
    (started as the worker starts the item)."""

    seq: int
    future: asyncio.Future[Any]
    limit: float | None


class _Worker:
    """One worker process as the supervisor sees it: its pipe, its cancel pipe, the items it holds (the one
    it grades first, then the one sent ahead), and two threads of its own: one writes tasks to it, one waits
    for its answers or its end."""

    def __init__(self, pool: WorkerPool, slot: int) -> None:
        from grpcgrade import logs

        context = multiprocessing.get_context("spawn")
        self.pool, self.slot = pool, slot
        self.conn, child = context.Pipe(duplex=True)
        cancel_read, self.cancel = context.Pipe(duplex=False)
        # The last item the process has read from its pipe, in memory it shares with it (one store per item,
        # no message): after its death, an item it held but had not read goes to another worker.
        self.taken = context.RawValue("q", -1)
        self.process = context.Process(
            target=_worker_main,
            args=(child, cancel_read, self.taken, os.getpid(), *logs.current(), pool.initializer),
            name=f"grpcgrade-{pool.role}-{slot}",
        )
        self.process.start()
        child.close()  # only the worker holds its ends now: its death closes the pipe
        cancel_read.close()
        os.set_blocking(self.cancel.fileno(), False)
        self.pid = self.process.pid
        self.up = False  # it said it is ready
        self.exited = False  # its sentinel fired: the process is gone
        self.killed = False  # killed by the pool (its watchdog): its end is coming
        self.held: deque[_Held] = deque()  # in the order sent: the first is the one it grades
        self.timer: asyncio.TimerHandle | None = None  # the first item's watchdog
        self.outbox: queue.SimpleQueue[tuple[int, Task] | bytes | None] = queue.SimpleQueue()
        # Its pipe is closed by the last of its two threads to be done with it, never under one of them: a
        # descriptor closed while the writer is about to write to it is soon a new worker's pipe, and the
        # writer's stop message (a task of no bytes) would then stop the new worker.
        self._holders = 2
        self._holders_lock = threading.Lock()
        threading.Thread(target=self._write, name=f"grpcgrade-worker-{slot}-tx", daemon=True).start()
        threading.Thread(target=self._read, name=f"grpcgrade-worker-{slot}-rx", daemon=True).start()

    def _write(self) -> None:
        """Pickles and sends tasks as they come (here, not on the event loop: a large task takes time, and
        a worker that stops reading blocks this thread only)."""
        try:
            self._send_tasks()
        finally:
            self._let_go()

    def _send_tasks(self) -> None:
        while True:
            item = self.outbox.get()
            if item is None:  # the process has ended: nothing more to send
                return
            data: bytes | memoryview
            if isinstance(item, bytes):
                data = item
            else:
                try:
                    data = _framed(*item)
                except Exception as exc:  # noqa: BLE001 - work that cannot cross is its call's error
                    error = RuntimeError(f"the work could not be sent to a worker: {describe(exc)}")
                    self.pool._post(self._answered, (item[0], "raised", error))
                    continue
            try:
                self.conn.send_bytes(data)
            except OSError:
                return  # the worker is gone; `_read` reports it
            if data == _STOP:
                return

    def _read(self) -> None:
        """Waits on the worker's pipe and its process sentinel together: each answer goes to the event loop;
        at the end of the process (or a pipe broken mid-message) the worker is reported dead, once."""
        sentinel = self.process.sentinel
        while True:
            ready = wait([self.conn, sentinel])
            if self.conn not in ready:
                break  # the process ended with nothing more to read
            try:
                message = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                break  # it died, possibly halfway through an answer: the rest of the pipe is dropped
            except Exception as exc:  # noqa: BLE001 - an answer that cannot be read is the work's failure
                message = (None, "raised", RuntimeError(f"unreadable answer: {describe(exc)}"))  # the first item's
            self.pool._post(self._answered, message)
        self.process.join()
        self.exited = True
        self.outbox.put(None)  # ends the writer, which may be waiting for work
        self._let_go()
        self.pool._post(self.pool._died, self)

    def _let_go(self) -> None:
        """One of its threads is done with its pipe: the last one closes it."""
        with self._holders_lock:
            self._holders -= 1
            last = self._holders == 0
        if last:
            self.conn.close()

    def _answered(self, message: tuple[Any, ...]) -> None:
        """On the event loop: the worker's ready message, or its answer to the first item it holds (answers
        come in the order the items were sent); the item sent ahead, if any, is the one it grades now."""
        if message[0] == _READY:
            self.up = True
            self.pool._idle(self)
            return
        seq, kind, value = message
        if not self.held or seq not in (self.held[0].seq, None):
            return  # for an item it no longer holds (timed out before the answer came)
        future = self._finish().future
        if not future.done():
            if kind == "ok":
                future.set_result(value)
            elif kind == "cancelled":
                future.set_exception(GraderCancelled())
            else:
                future.set_exception(value)
        self.pool._idle(self)

    def _finish(self) -> _Held:
        """The first item it held, now done with: its watchdog stopped, and the next one's started (the
        worker starts it now)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        done = self.held.popleft()
        if self.held:
            self._watch(self.held[0])
        return done

    def _watch(self, item: _Held) -> None:
        if item.limit is not None:
            self.timer = asyncio.get_running_loop().call_later(item.limit, self.hung, item.seq)

    def assign(self, seq: int, task: Task, future: asyncio.Future[Any], limit: float | None) -> None:
        """The worker holds item `seq` now, after those it holds; `future` gets its answer; past `limit`
        seconds from when the worker starts it, it is hung."""
        item = _Held(seq, future, limit)
        self.held.append(item)
        if len(self.held) == 1:
            self._watch(item)
        self.outbox.put((seq, task))

    def running(self) -> bool:
        """Whether its process is running now. Its reader says so once it has noticed the end (`exited`),
        but on a busy machine that thread waits for a core and the GIL first; the process's sentinel is
        readable from the moment it ends, and reading it reaps nothing (the reader's `join` does)."""
        return not self.exited and not wait([self.process.sentinel], 0)

    def room(self) -> bool:
        """Whether it can take another item (sent ahead, when it grades one)."""
        return len(self.held) < ITEMS_PER_WORKER and not self.exited and not self.killed

    def give_up(self, died: type[WorkerDied | WorkTimedOut], why: str, first_only: bool = False) -> None:
        """Its process is gone or being killed: each item it held is answered, `died` for one it had read
        (the one it was grading: its death may be that item's doing), `_Unread` for one it had not (the
        one sent ahead, or one a process stopped before it read it): that one goes to another worker.
        `first_only`: the process is killed for its first item, and only that one can be at fault (one sent
        ahead that it read as it was being killed was not)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        taken = self.taken.value
        items, self.held = self.held, deque()
        for k, item in enumerate(items):
            if not item.future.done():
                read = taken >= item.seq and not (first_only and k)
                item.future.set_exception((died if read else _Unread)(f"worker {self.pid} {why}"))

    def hung(self, seq: int) -> None:
        """The watchdog: the item ran past its time; the process is killed (`_read` then replaces it). An
        item it never read (a process stopped, SIGSTOP, before it did) did not run past anything: it goes to
        another worker, as does the item sent ahead."""
        if not self.held or seq != self.held[0].seq:
            return
        log.warning("worker %d held its work past the watchdog: killed", self.pid)
        self.give_up(WorkTimedOut, "ran past the watchdog", first_only=True)
        self.kill()

    def cancel_item(self, seq: int) -> None:
        """Asks the worker to stop the item `seq` (a message on its cancel pipe; nothing if the pipe is full
        of such messages already, or the worker is gone)."""
        with contextlib.suppress(OSError):
            os.write(self.cancel.fileno(), _SEQ.pack(seq))

    def kill(self) -> None:
        self.killed = True  # no more items for it, from now, before its end is seen
        with contextlib.suppress(OSError, ValueError):  # ended already, or its handle closed
            self.process.kill()


class WorkerPool(Executor):
    """The local executor: `size` worker processes, each grading one work item at a time with at most one more
    sent ahead (see the module docstring).

    A process that dies or hangs is replaced alone; `restarts` counts the replacements. Its threads post
    what they see to the event loop the pool runs on (the loop of the first `ready` or `submit`), so all of
    the pool's state changes on that loop."""

    def __init__(self, size: int, initializer: Callable[[], None] | None = None, role: str = "worker") -> None:
        """`size` processes. Grading's pool loads and warms every grader in each; a pool for other work (the
        HTTP face's JSON parsing) gives an `initializer` (a module-level function) to run instead, and a
        `role` that names its processes."""
        self.size = size
        self.initializer, self.role = initializer, role
        self.restarts = 0
        self.closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._early: list[tuple[Callable[..., None], tuple[Any, ...]]] = []  # posted before a loop was known
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._free: deque[_Worker] = deque()  # idle workers
        self._ahead: deque[_Worker] = deque()  # workers grading an item, with room for one sent ahead
        self._waiting: deque[asyncio.Future[_Worker]] = deque()
        self._starts = StartFailures()
        self._last_exit: int | None = None  # the exit code of the last process that ended
        self._first: list[_Worker] = [_Worker(self, slot) for slot in range(size)]
        self._workers: list[_Worker] = list(self._first)
        atexit.register(self.close, 0.0)

    # -- the event loop's side --------------------------------------------------------------------

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        with self._lock:
            self._loop, early, self._early = loop, self._early, []
        for fn, args in early:
            fn(*args)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """From a worker's thread: run `fn(*args)` on the pool's event loop (later, if none is known yet)."""
        with self._lock:
            loop = self._loop
            if loop is None:
                self._early.append((fn, args))
                return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the pool is past its use
            loop.call_soon_threadsafe(fn, *args)

    async def ready(self) -> None:
        """Returns once every first worker is up, has loaded the plugins and warmed the graders; raises if
        one died before it was."""
        self._bind()
        while not all(w.up for w in self._first):
            dead = [w for w in self._first if w.exited and not w.up]
            if dead:
                code = dead[0].process.exitcode
                raise RuntimeError(f"a worker process ended while starting (exit code {code})")
            await asyncio.sleep(0.02)

    def alive(self) -> int:
        """Worker processes running now (started, not ended), as health and metrics report them: one that
        has ended is not counted, even before its reader has noticed (`_Worker.running`)."""
        return sum(1 for w in self._workers if w.running())

    def trouble(self) -> str | None:
        """Why the pool cannot grade, once every worker has died `UNHEALTHY_STARTS` times in a row before it
        was ready (a plugin that kills its process, a missing module), whatever else is up; None before."""
        if self._starts.healthy(w.slot for w in self._workers):
            return None
        return f"every {self.role} process started dies before it is ready (the last: exit code {self._last_exit})"

    def _idle(self, worker: _Worker) -> None:
        """`worker` has room for an item (it is up, or answered one): to the first call waiting for one, else
        to the free list (`_free` when it holds none, `_ahead` when it grades one)."""
        if worker.exited or worker not in self._workers:
            return
        self._starts.up(worker.slot)
        if worker in self._ahead:
            self._ahead.remove(worker)
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(worker)
                return
        (self._ahead if worker.held else self._free).append(worker)

    def _died(self, worker: _Worker) -> None:
        """On the event loop: `worker`'s process ended. The item it was grading is answered `WorkerDied`
        (unless its watchdog answered first), one sent ahead goes to another worker, and a new process takes
        its place."""
        worker.give_up(WorkerDied, f"ended (exit code {worker.process.exitcode})")
        for free in (self._free, self._ahead):
            if worker in free:
                free.remove(worker)
        worker.cancel.close()  # only this loop writes to it (its pipe is closed by its threads: `_let_go`)
        if self.closing or worker not in self._workers:
            return
        self.restarts += 1
        self._last_exit = worker.process.exitcode
        delay = self._starts.ended(worker.slot, worker.up)
        log.warning("worker %d ended (exit code %s): replacing it", worker.pid, worker.process.exitcode)
        trouble = self.trouble()
        if trouble is not None:  # nothing waiting for a worker would get one before its deadline
            while self._waiting:
                waiter = self._waiting.popleft()
                if not waiter.done():
                    waiter.set_exception(NoProcess(trouble))
        assert self._loop is not None
        self._loop.call_later(delay, self._respawn, worker)

    def _respawn(self, worker: _Worker) -> None:
        if self.closing or worker not in self._workers:
            return
        self._workers[self._workers.index(worker)] = _Worker(self, worker.slot)

    async def _take(self) -> _Worker:
        """An idle worker; else one grading an item, to send this one ahead to; else waits in line for one
        (NoProcess while none can be kept up)."""
        for free in (self._free, self._ahead):
            while free:
                worker = free.popleft()
                if worker.room():
                    return worker
        trouble = self.trouble()
        if trouble is not None:
            raise NoProcess(trouble)
        waiter: asyncio.Future[_Worker] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._idle(waiter.result())  # given a worker as this call went away: the next one takes it
            raise

    async def submit(self, work: Item) -> Any:
        """Runs `work` in the next free worker; its watchdog starts as the worker takes it. Cancelled, the
        worker is told to stop the item, and is free again once it has (or its watchdog kills it)."""
        self._bind()
        while True:
            if self.closing:
                raise RuntimeError("the worker pool is closed")
            worker = await self._take()
            seq = next(self._seq)
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieved)
            worker.assign(seq, work.task(), future, watchdog(work))
            if worker.room():
                self._ahead.append(worker)  # the next item, while no worker is idle, is sent ahead to it
            try:
                return await asyncio.shield(future)
            except _Unread:
                continue  # its worker died before it read the item: the next one takes it
            except asyncio.CancelledError:
                if not future.done():
                    worker.cancel_item(seq)
                raise

    def close(self, patience: float = 3.0) -> None:
        """At exit, after the drain: workers get `patience` seconds to finish what they hold (nobody waits
        for it any more), then they are killed."""
        if self.closing:
            return
        self.closing = True
        workers = list(self._workers)
        for w in workers:
            w.outbox.put(_STOP)
        deadline = time.monotonic() + patience
        for w in workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in workers:
            if w.process.is_alive():
                w.kill()
                w.process.join(5)


def _framed(seq: int, task: Task) -> memoryview:
    """A task as its worker reads it: its sequence number first, which the worker stores before it unpickles
    the task (`_Worker.taken`), then the pickle (written after it, not copied onto it)."""
    out = io.BytesIO()
    out.write(_SEQ.pack(seq))
    pickle.dump(task, out, protocol=pickle.HIGHEST_PROTOCOL)
    return out.getbuffer()


def _retrieved(future: asyncio.Future[Any]) -> None:
    """An item's answer nobody awaits any more (its call was cancelled) is still looked at: no warning."""
    if not future.cancelled():
        future.exception()
