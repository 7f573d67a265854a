"""The execution layer against real processes: worker deaths and stops with real signals to real worker PIDs.

The wedge of issue 32: with one result pipe shared by every worker, a worker killed halfway through
writing an answer larger than a pipe holds left half a message in the pipe and its lock held, and the
service stopped grading while health said SERVING. Made deterministic here: the server is stopped
(SIGSTOP) while its workers write such answers, so each worker blocks mid-write; one is killed there, and
the server resumed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import grpc
import pytest
from grpc_health.v1 import health_pb2
from plain_work import PlainWork, announce_then_sleep, announce_then_wait, append_pid

from grpcgrade.core.errors import GraderCancelled
from grpcgrade.core.executors import InProcess, WorkerDied, WorkTimedOut
from grpcgrade.core.grading import cancellable, grade_sync
from grpcgrade.core.workers import WorkerPool, _Worker, grader_work
from grpcgrade.errors import ServerUnavailable
from grpcgrade.grader import BaseGrader, GraderError, GraderScore
from grpcgrade.service.convert import sample_to_pb, specs_to_pb
from grpcgrade.service.http.openai_graders import MOUNT_PATH
from grpcgrade.testing import (
    cpu_seconds,
    eventually,
    health_status,
    process_state,
    start_server,
    worker_pids,
    writing,
)
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

#: An answer this long (a reason of 3 MB) is far more than a pipe or a socket buffer holds.
LONG = 3_000_000
JSON = {"Content-Type": "application/json"}
WAIT = 60  # seconds a condition may take to come true on a loaded machine before the test fails


def blocked(pid: int) -> bool:
    """Whether `pid` is asleep in the kernel (state S or D: waiting, not running Python code)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("S", "D")
    except OSError:
        return False


def until(condition, what: str) -> None:
    eventually(condition, what, WAIT, every=0.02)


@pytest.fixture
def srv(tmp_path, plugin_env):
    config = tmp_path / "grpcgrade.yaml"  # each test meets its fault afresh: no quarantine
    config.write_text("quarantine: {enabled: false}\n")
    server = start_server(tmp_path, "--workers", "2", "--grader-timeout", "10", "--config", str(config), env=plugin_env)
    yield server
    os.kill(server.proc.pid, signal.SIGCONT)  # never leave it stopped
    server.stop()


def call_in_thread(target: str, samples: list[str], graders: list, out: list) -> threading.Thread:
    """A BatchEvaluate call (chunks of one sample) on a thread: `out` gets each result by index, or the error."""
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb(graders), samples=[sample_to_pb({"response": r}) for r in samples], chunk_size=1
    )

    def run() -> None:
        try:
            with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
                stream = pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=WAIT)
                out.extend(item for message in stream for item in message.items)
        except grpc.RpcError as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def outcomes(items: list) -> list[list[object]]:
    assert not [i for i in items if isinstance(i, grpc.RpcError)], items
    assert sorted(i.index for i in items) == list(range(len(items)))  # each sample answered exactly once
    ordered = sorted(items, key=lambda i: i.index)
    return [[r.error.code if r.HasField("error") else r.score for r in i.result.results] for i in ordered]


def busy(pids: list[int], since: dict[int, float]) -> bool:
    return all(cpu_seconds(p) - since[p] > 0.05 for p in pids)


def test_a_worker_killed_halfway_through_writing_a_large_answer_wedges_nothing(srv):
    """Both workers answer 3 MB into a stopped server; one is killed blocked mid-write; once the
    server resumes, the call ends with every sample answered once, the pool is whole again, health is
    SERVING and the next call is graded (before: the call hung and every later call with it)."""
    pids = worker_pids(srv.proc.pid)
    assert len(pids) == 2
    before = {p: cpu_seconds(p) for p in pids}
    restarts = srv.metric("grpcgrade_worker_pool_restarts_total")
    # Each sample keeps a worker busy 1.5 s, then answers 3 MB: long enough to stop the server in between.
    graders = [{"name": "sleepy", "params": {"seconds": 1.5}}, {"name": "misbehave"}]
    out: list = []
    thread = call_in_thread(srv.target, [f"long:{LONG}"] * 2, graders, out)
    until(lambda: busy(pids, before), "both workers grading")
    os.kill(srv.proc.pid, signal.SIGSTOP)
    try:
        # Both have graded and wait (the one first to write, blocked mid-write: its answer fills the pipe).
        until(lambda: any(writing(p) for p in pids) and all(blocked(p) for p in pids), "a worker blocked mid-write")
        victim = next(p for p in pids if writing(p))
        os.kill(victim, signal.SIGKILL)
        until(lambda: not Path(f"/proc/{victim}/cmdline").read_bytes(), "the killed worker gone")
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)
    thread.join(WAIT + 10)
    assert not thread.is_alive(), "the call hung"
    assert outcomes(out) == [[1.0, 1.0], [1.0, 1.0]]  # the killed worker's sample was graded again
    assert all(len(i.result.results[1].reason) == len("long:") + LONG for i in out)
    until(lambda: srv.metric("grpcgrade_workers_alive") == 2, "the pool whole again")
    assert srv.metric("grpcgrade_worker_pool_restarts_total") == restarts + 1  # one process replaced, alone
    survivor = next(p for p in pids if p != victim)
    assert survivor in worker_pids(srv.proc.pid) and victim not in worker_pids(srv.proc.pid)
    assert health_status(srv.target) == health_pb2.HealthCheckResponse.SERVING
    with srv.client(timeout=WAIT) as c:
        replies = c.batch_evaluate([{"response": "ok"}] * 20, ["misbehave"])
    assert [r.results[0].score for r in replies] == [1.0] * 20


def test_a_stopped_worker_is_killed_by_its_watchdog_and_replaced_alone(tmp_path, plugin_env):
    """A worker stopped (SIGSTOP) while it holds a sample: its watchdog kills it and a new one takes its
    place; the other worker is untouched, and every sample is answered once (the stopped one TIMEOUT).
    Each sample spins 0.8 s under a 3 s limit: under a 1 s limit, a loaded machine ran one past it (two
    TIMEOUTs, at load 12 with the test at nice 10)."""
    server = start_server(tmp_path, "--workers", "2", "--grader-timeout", "3", env=plugin_env)
    try:
        pids = worker_pids(server.proc.pid)
        before = {p: cpu_seconds(p) for p in pids}
        out: list = []
        graders = [{"name": "sleepy", "params": {"seconds": 0.8}}]
        thread = call_in_thread(server.target, ["x"] * 6, graders, out)
        until(lambda: busy(pids, before), "both workers grading")
        os.kill(pids[0], signal.SIGSTOP)
        thread.join(WAIT + 10)
        assert not thread.is_alive(), "the call hung"
        results = outcomes(out)
        assert results.count(["TIMEOUT"]) == 1 and results.count([1.0]) == 5
        # The watchdog answers TIMEOUT as it kills; the pool counts the death (and replaces the worker) once its
        # reader sees the process end, which may be after the call's answer: until then the killed worker is
        # still counted alive, so "2 alive" alone did not say it had been replaced.
        restarted = lambda: server.metric("grpcgrade_worker_pool_restarts_total") == 1  # noqa: E731
        until(lambda: restarted() and server.metric("grpcgrade_workers_alive") == 2, "the pool whole again")
        now = worker_pids(server.proc.pid)
        assert pids[0] not in now and pids[1] in now
        assert health_status(server.target) == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop()


# -- the executor interface, in the test's own process ---------------------------------------------------


def _work(fn, args, timeout=None, size=1) -> PlainWork:
    return PlainWork(fn, args, size, timeout)


@pytest.fixture
def pool(monkeypatch, plugin_site):
    monkeypatch.syspath_prepend(str(plugin_site))  # spawned workers start with this sys.path: the test plugins
    pool = WorkerPool(1)
    yield pool
    pool.close(patience=0)


def test_worker_death_and_timeout_are_typed_outcomes_and_cost_one_process(pool):
    async def main() -> tuple[object, object, int]:
        await pool.ready()
        first = pool.alive()
        with pytest.raises(WorkerDied):
            await pool.submit(_work(os._exit, (3,)))  # the process ends as the work runs
        with pytest.raises(WorkTimedOut):
            await pool.submit(_work(time.sleep, (3600,), timeout=0.1))
        return first, await pool.submit(_work(os.getpid, ())), pool.restarts

    first, pid, restarts = asyncio.run(main())
    assert first == 1 and isinstance(pid, int) and pid != os.getpid()
    assert restarts == 2


def test_a_worker_leaves_its_start_up_objects_out_of_every_later_collection(pool):
    """A worker's start-up objects (every plugin's modules, the warmed graders' tables) are frozen once it is
    ready, as the server's are: a full collection of them cost a worker 45-60 ms each, every few chunks."""

    async def main() -> object:
        await pool.ready()
        return await pool.submit(_work(gc.get_freeze_count, ()))

    assert asyncio.run(main()) > 1000


def test_a_dead_workers_pipe_is_never_a_replacements_pipe():
    """A dead worker's pipe was closed on the event loop while its writer thread could be about to write its
    stop message (a task of no bytes) to it; the replacement's new pipe took the same descriptor, got the
    message and exited 0 (the flake of the death-and-timeout test above, under load). Made deterministic
    here by profile hooks on the pool's threads, which hold them as a busy machine may: the dead worker's
    writer just before its write system call until the replacement is up, and the death's report until that
    writer is there or done. Now the last of a worker's own threads closes its pipe, and a writer whose
    process has ended sends nothing."""
    held: dict[str, threading.Event] = {"writing": threading.Event(), "done": threading.Event()}
    pool: WorkerPool | None = None

    def owner(frame: Any) -> _Worker | None:
        while frame is not None and not isinstance(frame.f_locals.get("self"), _Worker):
            frame = frame.f_back
        return None if frame is None else frame.f_locals["self"]

    def hold(frame: Any, event: str, arg: Any) -> None:
        if pool is None or not pool._workers:
            return
        if event == "c_call" and arg is os.write and (dead := owner(frame)) is not None and dead.exited:
            held["writing"].set()
            eventually(lambda: pool._workers[0] is not dead and pool._workers[0].up, "the replacement up", WAIT)
        elif event == "return" and frame.f_code.co_name == "_write" and (dead := owner(frame)) is not None:
            held["done"].set()
        elif event == "call" and frame.f_code.co_name == "_post" and frame.f_locals["fn"] == pool._died:
            eventually(lambda: held["writing"].is_set() or held["done"].is_set(), "the writer at its end", WAIT)

    threading.setprofile(hold)  # for the threads started from now on: the pool's
    try:
        pool = WorkerPool(1, initializer=os.getpid)  # any module-level function: one that warms no grader

        async def main() -> list[int]:
            await pool.ready()
            with pytest.raises(WorkerDied):
                await pool.submit(_work(os._exit, (3,)))
            while not held["done"].is_set():  # the dead worker's writer has left
                await asyncio.sleep(0.01)
            return [await pool.submit(_work(os.getpid, ())) for _ in range(3)]

        pids = asyncio.run(main())
    finally:
        threading.setprofile(None)
        if pool is not None:
            pool.close(patience=0)
    assert len(set(pids)) == 1 and pool.restarts == 1


def test_a_killed_worker_is_not_counted_alive_before_its_reader_notices():
    """A worker killed (SIGKILL to its PID) is not alive from the moment its process has ended, whether or
    not its reader thread has noticed yet: on a busy machine that thread waits for a core and the GIL,
    and `alive()` (the metrics' grpcgrade_workers_alive, which tests wait on to know every death has been
    counted) said 2 for a pool with one process dead. Made deterministic by a profile hook that holds the
    dead worker's reader as it wakes, so it neither reports the death nor reaps the process (a zombie
    until then)."""
    armed, release = threading.Event(), threading.Event()
    pool: WorkerPool | None = None

    def hold(frame: Any, event: str, arg: Any) -> None:
        caller = frame.f_back
        woken = armed.is_set() and event == "return" and frame.f_code.co_name == "wait" and caller is not None
        if woken and caller.f_code.co_name == "_read" and caller.f_locals.get("self") is victim:
            release.wait(WAIT)

    threading.setprofile(hold)  # for the threads started from now on: the pool's
    try:
        pool = WorkerPool(2, initializer=os.getpid)  # any module-level function: one that warms no grader

        async def main() -> tuple[int, int]:
            nonlocal victim
            await pool.ready()
            before = pool.alive()
            victim = pool._workers[0]
            armed.set()
            os.kill(victim.pid, signal.SIGKILL)
            until(lambda: process_state(victim.pid) == "Z", "the killed worker ended (a zombie: unreaped)")
            try:
                return before, pool.alive()
            finally:
                release.set()

        victim: _Worker | None = None
        before, after = asyncio.run(main())
    finally:
        threading.setprofile(None)
        release.set()
        if pool is not None:
            pool.close(patience=0)
    assert (before, after) == (2, 1)


def test_an_item_a_dead_worker_never_read_goes_to_a_replacement(tmp_path):
    """Every worker killed at once (SIGKILL to each PID), before the pool has noticed: the item one of them
    was running is answered WorkerDied (its death may be that item's doing: the quarantine's rule), but an
    item still unread in the other's pipe (that worker stopped first, SIGSTOP, so it cannot have read it)
    goes to a replacement and is answered. It was WorkerDied too: a result lost to a death not its own."""
    pool = WorkerPool(2, initializer=os.getpid)  # any module-level function: one that warms no grader
    marker = tmp_path / "running"

    async def main() -> tuple[int, int, object]:
        await pool.ready()
        running = asyncio.ensure_future(pool.submit(_work(announce_then_sleep, (str(marker), 3600))))
        deadline = time.monotonic() + WAIT
        while not marker.exists():
            assert time.monotonic() < deadline, "the first item never started"
            await asyncio.sleep(0.01)
        busy = int(marker.read_text())
        (idle,) = {w.pid for w in pool._workers} - {busy}
        os.kill(idle, signal.SIGSTOP)
        until(lambda: Path(f"/proc/{idle}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T", "stopped")
        unread = asyncio.ensure_future(pool.submit(_work(os.getpid, ())))
        await asyncio.sleep(0)  # its submit has handed the item to the one free worker: the stopped one
        for pid in (busy, idle):
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDied):
            await running
        return busy, idle, await asyncio.wait_for(unread, WAIT)

    try:
        busy, idle, answer = asyncio.run(main())
    finally:
        pool.close(patience=0)
    assert isinstance(answer, int) and answer not in (busy, idle, os.getpid())


def test_an_item_a_stopped_worker_never_read_is_no_timeout():
    """A worker stopped (SIGSTOP) before it read its item: the watchdog kills it, and the item, which never
    ran, goes to the replacement and is answered; it was WorkTimedOut (a TIMEOUT, and a quarantined input,
    for a sample that had not been graded)."""
    pool = WorkerPool(1, initializer=os.getpid)  # any module-level function: one that warms no grader

    async def main() -> tuple[int, object]:
        await pool.ready()
        (stopped,) = [w.pid for w in pool._workers]
        os.kill(stopped, signal.SIGSTOP)
        return stopped, await asyncio.wait_for(pool.submit(_work(os.getpid, (), timeout=0.1)), WAIT)

    try:
        stopped, answer = asyncio.run(main())
    finally:
        pool.close(patience=0)
    assert isinstance(answer, int) and answer != stopped and pool.restarts == 1


def started(marker: Path) -> int:
    """The PID of the worker that started the work announcing itself at `marker` (waits for it)."""
    until(marker.exists, f"the work of {marker.name} started")
    return int(marker.read_text())


def test_a_worker_finishing_an_item_starts_the_one_sent_ahead_without_the_event_loop(tmp_path):
    """While every worker is busy, the next item is sent ahead into a worker's pipe: the worker starts it as
    it answers the one before, even while the server's event loop is busy (here: held by this test) and
    could not hand it one. Before, the item waited on the event loop for the answer, then for its turn to
    be sent: 1-5 ms of a busy server's loop each hand-off, the idle cores of issue 35's chrF figure."""
    pool = WorkerPool(1, initializer=os.getpid)  # any module-level function: one that warms no grader
    first, second, release = tmp_path / "first", tmp_path / "second", tmp_path / "release"

    async def main() -> tuple[int, int, object, object]:
        await pool.ready()
        a = asyncio.ensure_future(pool.submit(_work(announce_then_wait, (str(first), str(release)))))
        b = asyncio.ensure_future(pool.submit(_work(announce_then_sleep, (str(second), 0))))
        await asyncio.sleep(0)  # both submitted
        pid = started(first)
        release.touch()
        until(second.exists, "the item sent ahead started while the event loop was held")  # blocks the loop
        return pid, int(second.read_text()), await a, await b

    try:
        pid_a, pid_b, a, b = asyncio.run(main())
    finally:
        pool.close(patience=0)
    assert pid_a == pid_b and a is None and b is None


def test_an_item_sent_ahead_to_a_killed_worker_is_graded_by_another_once(tmp_path):
    """A worker killed (SIGKILL) while it grades one item and holds the next, sent ahead, unread in its pipe:
    the item it was grading is answered WorkerDied (its death may be that item's doing: the quarantine's
    rule), the one sent ahead goes to the replacement and is answered there, once."""
    pool = WorkerPool(1, initializer=os.getpid)  # any module-level function: one that warms no grader
    marker = tmp_path / "running"
    runs = tmp_path / "runs"

    async def main() -> tuple[int, int, object]:
        await pool.ready()
        running = asyncio.ensure_future(pool.submit(_work(announce_then_sleep, (str(marker), 3600))))
        await asyncio.sleep(0)  # submitted
        busy = started(marker)
        ahead = asyncio.ensure_future(pool.submit(_work(append_pid, (str(runs),))))
        await asyncio.sleep(0)  # its submit has run: sent ahead to the busy worker
        assert [len(w.held) for w in pool._workers] == [2]
        os.kill(busy, signal.SIGKILL)
        with pytest.raises(WorkerDied):
            await running
        return busy, int(await asyncio.wait_for(ahead, WAIT)), pool.restarts

    try:
        busy, answer, restarts = asyncio.run(main())
    finally:
        pool.close(patience=0)
    assert answer != busy and restarts == 1
    assert runs.read_text().split() == [str(answer)]  # run once, by the replacement


def test_an_item_sent_ahead_to_a_worker_its_watchdog_kills_is_graded_by_another_once(tmp_path):
    """The worker's item runs past its watchdog (a sleep the time-limit signal does not reach here: no per
    sample limit in a plain function) while the next item waits in its pipe: the first is WorkTimedOut, the
    worker is killed, and the item sent ahead, which did not run past anything, is graded by the replacement,
    once (a TIMEOUT for it would have been a sample at fault for another's hang)."""
    pool = WorkerPool(1, initializer=os.getpid)  # any module-level function: one that warms no grader
    marker, runs = tmp_path / "running", tmp_path / "runs"

    async def main() -> tuple[int, int]:
        await pool.ready()
        hung = asyncio.ensure_future(pool.submit(_work(announce_then_sleep, (str(marker), 3600), timeout=0.1)))
        await asyncio.sleep(0)  # submitted
        busy = started(marker)
        ahead = asyncio.ensure_future(pool.submit(_work(append_pid, (str(runs),))))
        await asyncio.sleep(0)  # sent ahead
        assert [len(w.held) for w in pool._workers] == [2]
        with pytest.raises(WorkTimedOut):
            await asyncio.wait_for(hung, WAIT)
        return busy, int(await asyncio.wait_for(ahead, WAIT))

    try:
        busy, answer = asyncio.run(main())
    finally:
        pool.close(patience=0)
    assert answer != busy and pool.restarts == 1
    assert runs.read_text().split() == [str(answer)]


def test_an_item_sent_ahead_and_cancelled_is_never_run(tmp_path):
    """An item cancelled while it waits in its worker's pipe (sent ahead) is answered cancelled when the
    worker comes to it, not run: its cancel message, read while the item before it ran, was dropped as
    one for another item, and the worker then ran the whole item for nobody."""
    pool = WorkerPool(1, initializer=os.getpid)  # any module-level function: one that warms no grader
    marker, release, runs = tmp_path / "running", tmp_path / "release", tmp_path / "runs"

    async def main() -> object:
        await pool.ready()
        running = asyncio.ensure_future(pool.submit(_work(announce_then_wait, (str(marker), str(release)))))
        await asyncio.sleep(0)  # submitted
        started(marker)
        ahead = asyncio.ensure_future(pool.submit(_work(append_pid, (str(runs),))))
        await asyncio.sleep(0)  # sent ahead
        ahead.cancel()
        with pytest.raises(asyncio.CancelledError):
            await ahead
        await asyncio.sleep(0.1)  # the worker reads the cancel message while it still runs the first item
        release.touch()
        await running
        return await asyncio.wait_for(pool.submit(_work(os.getpid, ())), WAIT)

    try:
        pid = asyncio.run(main())
    finally:
        pool.close(patience=0)
    assert isinstance(pid, int) and not runs.exists() and pool.restarts == 0


def test_a_cancelled_item_is_stopped_by_a_message_and_frees_its_worker(pool):
    """Cancelling the awaiting task stops the grading loop in the worker (1,000 samples of 1 s each would
    hold it for a quarter of an hour), with no process killed."""

    async def main() -> tuple[object, int]:
        await pool.ready()
        endless = grader_work("sleepy", {"seconds": 1.0}, [{"response": "x"}] * 1000, None)
        task = asyncio.ensure_future(pool.submit(endless))
        await asyncio.sleep(0.5)  # the worker has it now (or soon: a cancel before it starts stops it too)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        pid = await asyncio.wait_for(pool.submit(_work(os.getpid, ())), WAIT)
        return pid, pool.restarts

    pid, restarts = asyncio.run(main())
    assert isinstance(pid, int) and restarts == 0


def test_work_crosses_as_seconds_left_and_in_process_runs_it_here():
    """A call's deadline travels as the seconds it has left, never as a clock reading of this process."""
    seen: list = []
    deadline = time.monotonic() + 100.0
    work = PlainWork(lambda **kw: seen.append(kw), deadline=deadline)
    task = work.task()
    assert 99.0 < task.seconds_left <= 100.0  # type: ignore[operator]
    asyncio.run(InProcess().submit(work))
    assert abs(seen[0]["deadline"] - deadline) < 1.0


# -- async graders, sample by sample ---------------------------------------------------------------------


def stream_items(target: str, samples: list[dict], graders: list, **fields) -> tuple[list, grpc.RpcError | None]:
    """The items a BatchEvaluate call streams back, read until the call ends (or fails: its error)."""
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb(graders), samples=[sample_to_pb(s) for s in samples], **fields
    )
    items: list = []
    with grpc.insecure_channel(target) as channel:
        try:
            for message in pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=20):
                items.extend(message.items)
        except grpc.RpcError as exc:
            return items, exc
    return items, None


def test_a_judgment_that_never_comes_holds_back_no_other_sample(server):
    """`napper` answers at once, except "hang" (an hour): a judge that never answers. The other 399
    samples, in its chunk too, are all answered while it is still waiting (before, its chunk's 99 others
    waited with it: the call ended at its deadline without them)."""
    samples = [{"response": "hang" if i == 0 else "x"} for i in range(400)]
    items, error = stream_items(server.target, samples, ["napper"], chunk_size=100)
    assert error is not None and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # the hang is still waiting
    assert sorted(i.index for i in items) == list(range(1, 400))
    assert {i.result.results[0].score for i in items} == {1.0}


def test_a_step_budget_cuts_only_the_judgments_still_waiting(server):
    """Two samples that never get their judgment, in the first two chunks of four: with a step budget,
    they alone are BUDGET_EXCEEDED (before, their chunks held every slot, and the two chunks behind them
    were cut whole)."""
    samples = [{"response": "hang" if i in (0, 100) else "x"} for i in range(400)]
    items, error = stream_items(server.target, samples, ["napper"], chunk_size=100, budget_seconds=2.0)
    assert error is None
    assert sorted(i.index for i in items) == list(range(400))  # each sample answered exactly once
    codes = {i.index: i.result.results[0].error.code for i in items if i.result.results[0].HasField("error")}
    assert codes == {0: "BUDGET_EXCEEDED", 100: "BUDGET_EXCEEDED"}


# -- time limits on any thread ---------------------------------------------------------------------------


class Spin(BaseGrader):
    """Runs Python code for up to 20 s on "spin" (what a per-sample limit must interrupt); else 1.0."""

    def evaluate(self, response: str) -> GraderScore:
        if response == "spin":
            end = time.perf_counter() + 20
            while time.perf_counter() < end:
                pass
        return GraderScore(self.name, 1.0)


def on_a_thread(fn) -> object:
    """`fn()` on a thread of its own (as a Ray actor or a caller's thread pool runs grading): its result."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive()
    return out[0]


def codes(results) -> list[object]:
    return [r.code if isinstance(r, GraderError) else r.score for r in results]


def test_the_time_limit_holds_off_the_main_thread():
    """Before, `_alarm` silently turned the limit off away from the main thread: the sample ran 20 s and
    scored 1.0."""
    samples = [{"response": "spin"}, {"response": "x"}]
    assert codes(on_a_thread(lambda: grade_sync(Spin(), samples, 0.2))) == ["TIMEOUT", 1.0]


def test_the_time_limit_holds_on_the_main_thread_after_a_grader_replaced_its_signal_handler():
    """A grader (or a library it calls) that sets its own SIGALRM handler does not turn the limit off for the
    chunks after it: each chunk looks at the handler and puts the timer's back."""
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: None)
    try:
        assert codes(grade_sync(Spin(), [{"response": "spin"}, {"response": "x"}], 0.2)) == ["TIMEOUT", 1.0]
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_a_deadline_and_a_cancellation_hold_off_the_main_thread():
    samples = [{"response": "x"}, {"response": "spin"}, {"response": "x"}]
    # the deadline and the cancellation are set on the thread, not before it starts (a loaded machine)
    in_budget = lambda: grade_sync(Spin(), samples, None, time.monotonic() + 0.5)  # noqa: E731
    assert codes(on_a_thread(in_budget)) == [1.0] + ["BUDGET_EXCEEDED"] * 2

    def cancelled_midway() -> object:
        asked = time.monotonic() + 0.5
        with cancellable(lambda: time.monotonic() > asked):
            try:
                return grade_sync(Spin(), samples, None)
            except GraderCancelled:
                return "cancelled"

    assert on_a_thread(cancelled_midway) == "cancelled"


def test_a_pool_whose_workers_cannot_start_says_so_until_they_can(tmp_path, monkeypatch):
    """Workers that die as they start (here: a `grpcgrade` on their path that exits on import) make the pool
    unhealthy, which the health check reports, instead of a pool that looks up and grades nothing; once a
    worker starts again, the pool is healthy and grades."""
    shadow = tmp_path / "shadow"
    (shadow / "grpcgrade").mkdir(parents=True)
    (shadow / "grpcgrade" / "__init__.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(shadow))  # spawned workers start with this path; this process has its own
    pool = WorkerPool(1)

    async def until_async(condition, what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not condition():
            assert time.monotonic() < deadline, f"not within {WAIT} s: {what}"
            await asyncio.sleep(0.05)

    async def main() -> object:
        with pytest.raises(RuntimeError, match="exit code 3"):
            await pool.ready()
        await until_async(lambda: not pool.healthy(), "the pool unhealthy")
        sys.path.remove(str(shadow))  # the next worker finds the real package
        await until_async(pool.healthy, "the pool healthy again")
        return await asyncio.wait_for(pool.submit(_work(os.getpid, ())), WAIT)

    try:
        pid = asyncio.run(main())
    finally:
        pool.close(patience=0)
    assert isinstance(pid, int) and pid != os.getpid()


def test_work_for_a_pool_that_cannot_keep_a_worker_up_is_answered_at_once_not_held(tmp_path, monkeypatch):
    """Work waiting for a worker as the pool becomes unable to keep one up (every one started dies before it
    is ready), and work sent to it after, is answered WORKER_UNAVAILABLE as soon as that is so; before, it
    waited for a worker until its deadline. `trouble()` says why (the workers' exit code)."""
    shadow = tmp_path / "shadow"
    (shadow / "grpcgrade").mkdir(parents=True)
    (shadow / "grpcgrade" / "__init__.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(shadow))
    pool = WorkerPool(1)

    async def main() -> tuple[object, object, str | None]:
        with pytest.raises(RuntimeError, match="exit code 3"):
            await pool.ready()
        assert pool.healthy(), "one death so far: the pool may still keep a worker up"
        waiting = asyncio.ensure_future(pool.run(_work(os.getpid, ())))  # no worker: it waits in line
        first = await asyncio.wait_for(waiting, WAIT)
        assert not pool.healthy()
        later = await asyncio.wait_for(pool.run(_work(os.getpid, ())), WAIT)
        return first, later, pool.trouble()

    try:
        first, later, trouble = asyncio.run(main())
    finally:
        pool.close(patience=0)
    assert first == later == "WORKER_UNAVAILABLE"
    assert trouble == "every worker process started dies before it is ready (the last: exit code 3)"


@pytest.mark.parametrize(
    "faces",
    [
        pytest.param((), id="engine"),
        pytest.param(("--grpc-processes", "1"), id="python-face"),
        pytest.param(("--grpc-face", "native", "--grpc-processes", "1"), id="native-face", marks=pytest.mark.native),
    ],
)
def test_a_server_whose_workers_cannot_start_refuses_calls_at_once_and_grades_again_once_they_can(
    tmp_path, plugin_env, faces
):
    """A server whose workers all die as they start (here: the test plugin's `warmed` grader exits its
    process while a gate file exists) says NOT_SERVING and, meanwhile, refuses every call at once, naming
    why: gRPC UNAVAILABLE (which gRPC's retry policy sends to another replica), HTTP 503 with Retry-After.
    A call already waiting for a worker gets WORKER_UNAVAILABLE for each sample, none of them quarantined:
    once workers start again, the same samples are graded. Before, every call waited for a worker until
    its deadline. The same through every gRPC face: a face process relays the engine's refusal as it is,
    not as an engine that was away."""
    gate = tmp_path / "gate"
    env = {**plugin_env, "GRPCGRADE_TEST_WARM_EXIT": str(gate)}
    server = start_server(tmp_path, "--workers", "1", *faces, env=env, http=True)
    graders = [{"name": "sleepy", "params": {"seconds": 0.01}}]  # heavy: graded in a worker, never inline
    try:
        gate.touch()
        (pid,) = worker_pids(server.proc.pid)
        os.kill(pid, signal.SIGKILL)
        out: list = []
        call_in_thread(server.target, ["a", "b", "c"], graders, out).join(WAIT + 10)
        assert outcomes(out) == [["WORKER_UNAVAILABLE"]] * 3
        until(lambda: health_status(server.target) == health_pb2.HealthCheckResponse.NOT_SERVING, "NOT_SERVING")
        request = pb.EvaluateRequest(graders=specs_to_pb(graders), sample=sample_to_pb({"response": "a"}))
        with grpc.insecure_channel(server.target) as channel, pytest.raises(grpc.RpcError) as refused:
            pb_grpc.GradingServiceStub(channel).Evaluate(request, timeout=WAIT)
        assert server.metric("grpcgrade_workers_can_grade") == 0
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details().startswith("no worker can grade: every worker process started dies")
        with server.client(unavailable_seconds=0.5) as client, pytest.raises(ServerUnavailable, match="exit code 3"):
            client.evaluate({"response": "a"}, graders)
        body = {"grader": {"type": "string_check", "name": "s", "input": "a", "reference": "a", "operation": "eq"},
                "model_sample": "a", "item": {}}  # fmt: skip
        with pytest.raises(HTTPError) as answered:
            urlopen(Request(server.http + MOUNT_PATH + "/run", json.dumps(body).encode(), JSON), timeout=WAIT)
        assert answered.value.code == 503 and answered.value.headers["Retry-After"] == "1"
        assert answered.value.read().decode().startswith("no worker can grade")
        gate.unlink()
        until(lambda: health_status(server.target) == health_pb2.HealthCheckResponse.SERVING, "SERVING again")
        assert server.metric("grpcgrade_workers_can_grade") == 1
        out.clear()
        call_in_thread(server.target, ["a", "b", "c"], graders, out).join(WAIT + 10)
        assert outcomes(out) == [[1.0]] * 3
    finally:
        if gate.exists():
            gate.unlink()
        assert server.stop() == 0
