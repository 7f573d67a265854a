"""The reward guard's step budget and failure budget (issue 17), against real servers on loopback.

Step budget: samples that would hold the step are answered BUDGET_EXCEEDED once `budget_seconds` runs
out, every sample exactly once, the stream OK, and the workers free for the next call, on every path
(whole chunks, a grader in a worker beside an async one, inline with `--workers 0`).
Failure budget: a call whose failures pass `max_failure_ratio` ends FAILED_PRECONDITION naming the grader
and its most frequent code; one that stays within is answered in full.

The quick samples must be graded within the budget: on a loaded machine the budget is doubled until they
were (tests/budgets.py), each try asserted alike.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import grpc
import pytest
from budgets import BUDGET, doubling

from grpcgrade import FunctionGrader, GraderError
from grpcgrade.core.grading import grade_async
from grpcgrade.core.guard import MAX_BUDGET_SECONDS, failure_limit
from grpcgrade.service.convert import sample_to_pb, specs_to_pb
from grpcgrade.testing import start_server
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

HANG = {"response": "hang"}  # misbehave: a Python loop that never ends; napper: an await of an hour
OK = {"response": "ok"}
CHEAP = [{"name": "misbehave", "params": {"heavy": False}}]  # every grader in a worker: whole chunks
BESIDE_ASYNC = [{"name": "misbehave", "params": {"heavy": False}}, "napper"]  # per grader, beside an async one
WAIT = 60  # the call's own deadline: only a bound on how long a broken server could hold the test


@pytest.fixture(scope="module")
def srv(tmp_path_factory, plugin_env):
    server = start_server(tmp_path_factory.mktemp("guard"), "--workers", "2", env=plugin_env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def inline_srv(tmp_path_factory, plugin_env):
    server = start_server(tmp_path_factory.mktemp("guard-inline"), "--workers", "0", env=plugin_env)
    yield server
    server.stop()


def stream(target: str, samples: list[dict], graders: list, **fields) -> tuple[list[pb.BatchItem], grpc.Call]:
    """Every streamed item, and the finished call (its status)."""
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb(graders), samples=[sample_to_pb(s) for s in samples], **fields
    )
    with grpc.insecure_channel(target) as channel:
        call = pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=WAIT)
        items = [item for message in call for item in message.items]
        return items, call


Tried = TypeVar("Tried", bound=tuple)


def within_budget(attempt: Callable[[float], Tried], quick: Iterable[int]) -> Tried:
    """`attempt(budget)` (its first two values the streamed items and the call), the budget doubled while
    one of the `quick` samples, those the test expects graded in time, was cut."""
    quick = set(quick)

    def cut_early(out: Tried) -> bool:
        items, call = out[0], out[1]
        cut = {i.index for i in items if any(r.error.code == "BUDGET_EXCEEDED" for r in i.result.results)}
        return call.code() == grpc.StatusCode.OK and bool(cut & quick)

    return doubling(attempt, cut_early)


def answered_once(items: list[pb.BatchItem], n: int) -> list[pb.EvaluateResponse]:
    assert sorted(i.index for i in items) == list(range(n)), "each sample answered exactly once"
    return [i.result for i in sorted(items, key=lambda i: i.index)]


def outcomes(result: pb.EvaluateResponse) -> list[object]:
    return [r.error.code if r.HasField("error") else r.score for r in result.results]


def refusal(target: str, samples: list[dict], graders: list, **fields) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        stream(target, samples, graders, **fields)
    return err.value


def assert_cut(results: list[pb.EvaluateResponse], slow: set[int], graders: int) -> None:
    """The slow samples have BUDGET_EXCEEDED from every grader and no reward; the others are scored."""
    for k, result in enumerate(results):
        if k in slow:
            assert outcomes(result) == ["BUDGET_EXCEEDED"] * graders, k
            assert not result.HasField("reward")
        else:
            assert outcomes(result) == [1.0] * graders, k
            assert result.reward == 1.0


def assert_free(target: str, graders: list) -> None:
    """The next call is answered normally: no worker is left busy with the cut samples."""
    items, call = stream(target, [OK] * 4, graders, budget_seconds=30)
    assert call.code() == grpc.StatusCode.OK
    assert [outcomes(r) for r in answered_once(items, 4)] == [[1.0] * len(graders)] * 4


# -- the step budget, path by path ----------------------------------------------------------------------


def test_whole_chunks_cut_the_slow_samples_and_keep_the_graded_ones(srv):
    """One whole chunk in a worker: the quick samples before the hanging ones keep their scores."""
    samples = [OK] * 6 + [HANG] * 2

    def attempt(budget: float) -> tuple[list[pb.BatchItem], grpc.Call, float]:
        before = srv.metric("grpcgrade_budget_exceeded_samples_total", grader="misbehave")
        items, call = stream(srv.target, samples, CHEAP, budget_seconds=budget)
        return items, call, srv.metric("grpcgrade_budget_exceeded_samples_total", grader="misbehave") - before

    items, call, counted = within_budget(attempt, quick=range(6))
    assert call.code() == grpc.StatusCode.OK
    assert_cut(answered_once(items, 8), {6, 7}, 1)
    assert counted == 2
    assert_free(srv.target, CHEAP)


def test_whole_chunks_of_two_graders_keep_every_sample_graded_in_time(srv):
    """The graders of a whole chunk run one after the other: the samples the first graded before the
    deadline still get the second's result; the hanging one gets BUDGET_EXCEEDED from both."""
    graders = [*CHEAP, "shout"]
    loud = {"response": "OK", "reference": "ok"}  # misbehave 1.0, shout 1.0
    hang = {**HANG, "reference": "hang"}  # shout compares with a reference: a sample without one is INVALID_SAMPLE
    samples = [loud] * 5 + [hang]
    items, call = within_budget(lambda b: stream(srv.target, samples, graders, budget_seconds=b), quick=range(5))
    assert call.code() == grpc.StatusCode.OK
    assert_cut(answered_once(items, 6), {5}, 2)


def test_chunks_that_never_started_are_cut_too(srv):
    """One sample per chunk and both workers held by hanging samples: the chunks still queued or never
    started are answered too, each once, and the queue drains."""
    samples = [HANG, HANG] + [OK] * 20
    items, call = stream(srv.target, samples, CHEAP, budget_seconds=BUDGET, chunk_size=1)
    assert call.code() == grpc.StatusCode.OK
    results = answered_once(items, len(samples))
    assert [outcomes(r) for r in results[:2]] == [["BUDGET_EXCEEDED"]] * 2
    assert all(outcomes(r) in (["BUDGET_EXCEEDED"], [1.0]) for r in results)
    assert_free(srv.target, CHEAP)


def test_a_grader_in_a_worker_beside_an_async_grader(srv):
    samples = [OK] * 5 + [HANG] * 2 + [OK]

    def attempt(budget: float) -> tuple[list[pb.BatchItem], grpc.Call, float]:
        before = srv.metric("grpcgrade_budget_exceeded_samples_total", grader="napper")
        items, call = stream(srv.target, samples, BESIDE_ASYNC, budget_seconds=budget, chunk_size=4)
        return items, call, srv.metric("grpcgrade_budget_exceeded_samples_total", grader="napper") - before

    items, call, counted = within_budget(attempt, quick=range(5))
    assert call.code() == grpc.StatusCode.OK
    results = answered_once(items, 8)
    assert_cut(results[:7], {5, 6}, 2)
    # the sample after the hanging ones, in their chunk: the worker cut it, the async grader had graded it
    assert outcomes(results[7]) == ["BUDGET_EXCEEDED", 1.0] and not results[7].HasField("reward")
    assert counted == 2
    assert_free(srv.target, BESIDE_ASYNC)


def test_inline_with_no_workers(inline_srv):
    """The event loop grades the chunks itself: the hanging sample is stopped at the deadline, and the
    chunk after it (not started by then) is cut."""
    samples = [OK] * 3 + [HANG, OK]
    attempt = lambda b: stream(inline_srv.target, samples, CHEAP, budget_seconds=b, chunk_size=2)  # noqa: E731
    items, call = within_budget(attempt, quick=range(3))
    assert call.code() == grpc.StatusCode.OK
    assert_cut(answered_once(items, 5), {3, 4}, 1)
    assert_free(inline_srv.target, CHEAP)


def test_inline_async_grader_with_no_workers(inline_srv):
    samples = [OK, HANG, OK]
    items, call = within_budget(
        lambda b: stream(inline_srv.target, samples, ["napper"], budget_seconds=b), quick=[0, 2]
    )
    assert call.code() == grpc.StatusCode.OK
    assert_cut(answered_once(items, 3), {1}, 1)


def test_a_spent_budget_cuts_every_sample_at_once(srv):
    """The smallest positive budget (what the Python client sends for a chunk of a call whose budget ran
    out) is over as soon as the call starts: no sample is graded, each is answered once."""
    items, call = stream(srv.target, [OK] * 5, CHEAP, budget_seconds=math.ulp(0.0), chunk_size=2)
    assert call.code() == grpc.StatusCode.OK
    assert [outcomes(r) for r in answered_once(items, 5)] == [["BUDGET_EXCEEDED"]] * 5


def test_no_budget_is_zero_and_a_generous_one_changes_nothing(srv):
    for budget in (0.0, 30.0):
        items, call = stream(srv.target, [OK] * 3, CHEAP, budget_seconds=budget)
        assert call.code() == grpc.StatusCode.OK
        assert [outcomes(r) for r in answered_once(items, 3)] == [[1.0]] * 3


@pytest.mark.parametrize("budget", [-1.0, math.nan, math.inf, MAX_BUDGET_SECONDS * 2])
def test_a_budget_out_of_range_is_invalid_argument(srv, budget):
    err = refusal(srv.target, [OK], CHEAP, budget_seconds=budget)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "budget_seconds" in err.details()


# -- the failure budget ---------------------------------------------------------------------------------

NAN = {"response": "nan"}  # misbehave scores NaN: INVALID_RESULT


@pytest.mark.parametrize("graders", [CHEAP, BESIDE_ASYNC], ids=["whole-chunks", "per-grader"])
def test_too_many_failures_end_the_call_naming_grader_and_code(srv, graders):
    samples = [NAN] * 6 + [OK] * 4
    before = srv.metric("grpcgrade_failure_budget_exceeded_calls_total")
    err = refusal(srv.target, samples, graders, max_failure_ratio=0.5)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.details()
    assert "max_failure_ratio=0.5" in details and "'misbehave'" in details and "INVALID_RESULT x6" in details
    assert srv.metric("grpcgrade_failure_budget_exceeded_calls_total") - before == 1


@pytest.mark.parametrize("graders", [CHEAP, BESIDE_ASYNC], ids=["whole-chunks", "per-grader"])
def test_failures_within_the_ratio_are_answered_in_full(srv, graders):
    samples = [NAN] * 6 + [OK] * 4  # 6 of 10 failed: exactly the 0.6 allowed
    items, call = stream(srv.target, samples, graders, max_failure_ratio=0.6, chunk_size=3)
    assert call.code() == grpc.StatusCode.OK
    results = answered_once(items, 10)
    assert sum(not r.HasField("reward") for r in results) == 6


def test_a_sample_failed_by_two_graders_counts_once(srv):
    """Both graders of the whole chunk fail on the same 5 samples of 10: 5 failed samples, within 0.5."""
    graders = [{"name": "misbehave", "params": {"heavy": False}}, {"name": "misbehave", "key": "again"}]
    items, call = stream(srv.target, [NAN] * 5 + [OK] * 5, graders, max_failure_ratio=0.5)
    assert call.code() == grpc.StatusCode.OK
    answered_once(items, 10)
    err = refusal(srv.target, [NAN] * 6 + [OK] * 4, graders, max_failure_ratio=0.5)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "6 of 10 samples failed" in err.details()


def test_budget_cuts_count_as_failures(srv):
    err = doubling(  # until the quick sample was graded in time (x2, not x3)
        lambda b: refusal(srv.target, [OK, HANG, HANG], CHEAP, budget_seconds=b, max_failure_ratio=0.5),
        lambda err: "BUDGET_EXCEEDED x3" in err.details(),
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "BUDGET_EXCEEDED x2" in err.details()
    assert_free(srv.target, CHEAP)


def test_unusable_samples_count_as_failures(srv):
    """A sample that cannot be graded at all (a reserved `extra` key) is INVALID_SAMPLE: a failure."""
    bad = {"response": "ok", "extra": {"response": "shadowed"}}
    err = refusal(srv.target, [bad, bad, OK], CHEAP, max_failure_ratio=0.5)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "INVALID_SAMPLE x2" in err.details()


@pytest.mark.parametrize("ratio", [-0.1, 1.5, math.nan])
def test_a_ratio_out_of_range_is_invalid_argument(srv, ratio):
    err = refusal(srv.target, [OK], CHEAP, max_failure_ratio=ratio)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_failure_ratio" in err.details()


def test_the_ratio_is_read_as_written():
    """0.29 of 100 allows 29 failures (its binary value is a hair under 0.29); 0 allows none, 1 all."""
    assert failure_limit(0.29, 100) == 29
    assert failure_limit(0.0, 512) == 0
    assert failure_limit(1.0, 512) == 512
    assert failure_limit(None, 512) is None


class LeapingLoop(asyncio.SelectorEventLoop):
    """asyncio's own event loop whose clock can leap ahead of `time.monotonic()` by `lead` seconds: its
    timers then fire that much before the monotonic clock reaches their time, as uvloop's do when the clock
    it reads once a turn was stale as they were set (by as long as the loop was held, 20 ms and more)."""

    lead = 0.0

    def time(self) -> float:
        return super().time() + self.lead


def test_an_async_grader_cut_by_the_budget_is_budget_exceeded_when_the_loops_timer_fires_early():
    """Which bound ended an async grader's wait, its own time limit or the call's budget, is decided when the
    wait starts (`grading._within`): an event loop's timer may fire before `time.monotonic()` reaches its
    time, and a sample the budget cut, told apart by reading the clock after the wait, read as TIMEOUT.
    Here every wait's timer fires for certain ~30 s before the budget's end: the loop's clock leaps ahead
    once all 20 samples' waits are set. Before the fix every sample read TIMEOUT (uvloop's loop, its clock
    cached once a turn, did it 1 run in 3 with the loop held 20 ms)."""
    started = 0
    all_started = asyncio.Event()

    async def sleeps_an_hour(response: str) -> float:
        nonlocal started
        started += 1  # its wait's timer is set: wait_for sets it before the grader runs
        if started == 20:
            all_started.set()
        await asyncio.sleep(3600)
        return 1.0

    grader = FunctionGrader.wrap(sleeps_an_hour)()

    async def graded() -> list[str]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, LeapingLoop)
        deadline = time.monotonic() + 30  # the budget bounds each wait: it ends before the 60 s time limit
        grading = asyncio.ensure_future(grade_async(grader, [{"response": str(i)} for i in range(20)], 60.0, deadline))
        await all_started.wait()
        loop.lead = 30.0  # every timer (due at the budget's end) fires now, ~30 s before the monotonic clock's
        results = await grading
        assert time.monotonic() < deadline - 20  # they did fire early
        return [r.code for r in results if isinstance(r, GraderError)]

    with asyncio.Runner(loop_factory=LeapingLoop) as runner:
        assert runner.run(graded()) == ["BUDGET_EXCEEDED"] * 20
