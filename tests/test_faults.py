"""Faults: hanging and dying graders, killed workers, deadlines, limits and SIGTERM, against real servers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from grpcgrade.client import SERVICE_CONFIG
from grpcgrade.testing import (
    CpuSince,
    children,
    cpu_seconds,
    cpu_when_idle,
    eventually,
    face_pids,
    health_status,
    start_server,
    worker_pids,
)
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory, plugin_env):
    tmp = tmp_path_factory.mktemp("faults")
    config = tmp / "grpcgrade.yaml"  # each test here goes through the fault again: no quarantine (test_quarantine)
    config.write_text("quarantine: {enabled: false}\n")
    srv = start_server(tmp, "--workers", "2", "--grader-timeout", "0.5", "--config", str(config), env=plugin_env)
    yield srv
    srv.stop()


def scores(replies) -> list[object]:
    return [r.results[0].error.code if r.results[0].HasField("error") else r.results[0].score for r in replies]


#: How a sync grader runs: whole chunks in workers (every grader of the call can), a chunk per grader in
#: workers (beside an async grader, which runs in the server's loop), or inline in the server's loop.
#: The scores view of a grader with a `score_column`: whole chunks graded as columns, sample by sample
#: where the column call fails. A small batch of graders of bounded cost: whole chunks graded inline.
PATHS = {
    "whole-chunks-in-workers": [{"name": "misbehave"}],
    "score-column-in-workers": [{"name": "misbehave", "params": {"column": True}}],
    "per-grader-in-workers": [{"name": "misbehave"}, "attentive"],
    "inline": [{"name": "misbehave", "params": {"heavy": False}}, "attentive"],
    "inline-small-bounded": [{"name": "misbehave", "params": {"bounded": True}}],
    "inline-small-bounded-column": [{"name": "misbehave", "params": {"bounded": True, "column": True}}],
}
VIEWS = {"score-column-in-workers": pb.RESULT_VIEW_SCORES, "inline-small-bounded-column": pb.RESULT_VIEW_SCORES}


@pytest.mark.parametrize("path", PATHS)
def test_a_hanging_grader_times_out_and_the_others_go_on(fault_server, path):
    graders = PATHS[path]
    with fault_server.client(timeout=60) as c:
        view = VIEWS.get(path, pb.RESULT_VIEW_FULL)
        replies = c.batch_evaluate([{"response": r} for r in ("ok", "hang", "ok", "nan")], graders, view=view)
        assert scores(replies) == [1.0, "TIMEOUT", 1.0, "INVALID_RESULT"]
        assert "0.5 s" in replies[1].results[0].error.message
        assert not replies[1].HasField("reward") and replies[0].reward == 1.0
        assert scores([c.evaluate({"response": "ok"}, graders)]) == [1.0]  # the server is fine


IN_WORKERS = {k: v for k, v in PATHS.items() if not k.startswith("inline")}


@pytest.mark.parametrize("path", IN_WORKERS)
def test_a_grader_stuck_in_c_gets_its_worker_killed_and_replaced(fault_server, path):
    graders, view = PATHS[path], VIEWS.get(path, pb.RESULT_VIEW_FULL)
    before = fault_server.metric("grpcgrade_worker_pool_restarts_total")
    with fault_server.client(timeout=60) as c:
        replies = c.batch_evaluate([{"response": r} for r in ("ok", "hang_in_c", "ok")], graders, view=view)
        assert scores(replies) == [1.0, "TIMEOUT", 1.0]
        assert scores(c.batch_evaluate([{"response": "ok"}] * 40, graders)) == [1.0] * 40
    assert fault_server.metric("grpcgrade_worker_pool_restarts_total") > before
    # The replacement starts as the hung worker is killed and is alive once warmed: maybe after the answers.
    eventually(lambda: fault_server.metric("grpcgrade_workers_alive") == 2, "the pool whole again")


@pytest.mark.parametrize("path", IN_WORKERS)
def test_a_sample_that_kills_its_worker_costs_no_other_sample(fault_server, path):
    graders, view = PATHS[path], VIEWS.get(path, pb.RESULT_VIEW_FULL)
    with fault_server.client(timeout=60) as c:
        replies = c.batch_evaluate([{"response": r} for r in ("ok", "die", "ok", "ok")], graders, view=view)
        assert scores(replies) == [1.0, "WORKER_LOST", 1.0, 1.0]
        assert [r.HasField("reward") for r in replies] == [True, False, True, True]
        assert scores([c.evaluate({"response": "ok"}, ["misbehave"])]) == [1.0]


def test_a_worker_killed_from_outside_loses_no_sample(fault_server):
    graders = [{"name": "sleepy", "params": {"seconds": 0.01}}]
    results: list = []
    with fault_server.client(timeout=120, chunk_size=400) as c:
        workers = CpuSince(worker_pids(fault_server.proc.pid))
        worker = threading.Thread(target=lambda: results.extend(c.batch_evaluate([{"response": "x"}] * 400, graders)))
        worker.start()
        eventually(workers.busy, "the batch going in a worker")
        os.kill(workers.busy()[0], signal.SIGKILL)  # as the OOM killer would, with its chunk
        worker.join(120)
    assert len(results) == 400
    assert scores(results) == [1.0] * 400


def test_a_passed_deadline_stops_the_work(fault_server):
    request = pb.BatchEvaluateRequest(
        graders=[pb.GraderSpec(name="sleepy")], chunk_size=8, samples=[pb.Sample(response="x")] * 3000
    )
    request.graders[0].params.update({"seconds": 0.01})
    with grpc.insecure_channel(fault_server.target) as channel, pytest.raises(grpc.RpcError) as err:
        list(pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=0.5))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Counted in CPU, not timed: after the deadline the workers finish the chunks they had taken (a few x 8
    # samples x 10 ms) and go idle; the 3,000 samples' 30 s of spinning would have gone on past it.
    workers = worker_pids(fault_server.proc.pid)
    at_deadline = sum(cpu_seconds(p) for p in workers)
    after = cpu_when_idle(workers) - at_deadline
    assert workers and after < 3.0, f"the workers spent {after:.1f} s of CPU after the deadline"


@pytest.fixture
def limited_server(tmp_path, plugin_env):
    config = tmp_path / "limits.yaml"
    config.write_text("limits: {max_samples_per_batch: 100, max_field_chars: 50, max_message_bytes: 100000}\n")
    srv = start_server(tmp_path, "--workers", "0", "--config", str(config), env=plugin_env)
    yield srv
    srv.stop()


def test_limits_are_enforced_and_named(limited_server):
    with grpc.insecure_channel(limited_server.target) as channel:
        stub = pb_grpc.GradingServiceStub(channel)
        too_many = pb.BatchEvaluateRequest(
            graders=[pb.GraderSpec(name="json_validator")], samples=[pb.Sample(response="1")] * 101
        )
        with pytest.raises(grpc.RpcError) as err:
            list(stub.BatchEvaluate(too_many, timeout=10))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_samples_per_batch=100" in err.value.details()
        too_big = pb.EvaluateRequest(
            graders=[pb.GraderSpec(name="json_validator")], sample=pb.Sample(response="x" * 200_000)
        )
        with pytest.raises(grpc.RpcError) as err:
            stub.Evaluate(too_big, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        long_field = pb.BatchEvaluateRequest(
            graders=[pb.GraderSpec(name="json_validator")],
            samples=[pb.Sample(response="1"), pb.Sample(response="1" * 51)],
        )
        items = sorted((i for m in stub.BatchEvaluate(long_field, timeout=10) for i in m.items), key=lambda i: i.index)
    assert items[0].result.results[0].score == 1.0
    error = items[1].result.results[0].error
    assert error.code == "INVALID_SAMPLE" and "max_field_chars=50" in error.message


def sleepy_batch() -> pb.BatchEvaluateRequest:
    """200 samples of 10 ms each in chunks of 10: a drain has work in flight on every worker for a while."""
    request = pb.BatchEvaluateRequest(
        graders=[pb.GraderSpec(name="sleepy")],
        chunk_size=10,
        samples=[pb.Sample(id=str(i), response="x") for i in range(200)],
    )
    request.graders[0].params.update({"seconds": 0.01})
    return request


def test_sigterm_drains_in_flight_work_then_exits_zero(tmp_path, plugin_env):
    srv = start_server(tmp_path, "--workers", "2", "--grace", "30", env=plugin_env)
    request = sleepy_batch()
    with grpc.insecure_channel(srv.target) as channel:
        stream = pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=60)
        seen = [item.index for item in next(stream).items]
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while health_status(srv.target) == health_pb2.HealthCheckResponse.SERVING and time.monotonic() < deadline:
            time.sleep(0.02)
        assert health_status(srv.target) in (health_pb2.HealthCheckResponse.NOT_SERVING, None)
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.GradingServiceStub(channel).Evaluate(
                pb.EvaluateRequest(graders=[pb.GraderSpec(name="json_validator")], sample=pb.Sample(response="1")),
                timeout=5,
            )
        # Refused, never run, and with a code the Python client retries (on another replica): UNAVAILABLE,
        # or CANCELLED when the call reached the server in the instant the drain began (grpc/grpc#41785).
        retried = SERVICE_CONFIG["methodConfig"][0]["retryPolicy"]["retryableStatusCodes"]
        assert refused.value.code().name in {"UNAVAILABLE", "CANCELLED"} & set(retried)
        seen += [item.index for message in stream for item in message.items]
    assert sorted(seen) == list(range(200))
    assert srv.proc.wait(30) == 0


def test_sigterm_to_the_whole_process_group_drains_with_the_workers_it_has(tmp_path, plugin_env):
    """systemd's default stop (KillMode=control-group), `kill -TERM -PGID`, a supervisor that signals the
    group: every process gets SIGTERM at once. The workers leave stopping to the server (they ignore it, as
    they ignore a terminal's SIGINT), so the drain finishes the work in flight with them: no worker dies or
    is replaced, and every sample is graded. (Before, each worker died at once and the drain re-ran its
    chunk sample by sample in a replacement started mid-shutdown.)"""
    srv = start_server(tmp_path, "--workers", "2", "--grace", "30", env=plugin_env)
    request = sleepy_batch()
    assert len(worker_pids(srv.proc.pid)) == 2
    with grpc.insecure_channel(srv.target) as channel:
        stream = pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=60)
        items = list(next(stream).items)
        for pid in (srv.proc.pid, *children(srv.proc.pid)):  # the group, as one kill(-pgid) reaches it
            os.kill(pid, signal.SIGTERM)
        items += [item for message in stream for item in message.items]
    assert srv.proc.wait(30) == 0
    assert sorted(item.index for item in items) == list(range(200))
    assert {(r.score, r.error.code) for item in items for r in item.result.results} == {(1.0, "")}
    assert "replacing it" not in srv.log(), srv.log()


def test_a_server_killed_takes_a_worker_stuck_in_c_code_with_it(tmp_path, plugin_env):
    """The server SIGKILLed (the OOM killer, `kill -9`) while its worker sleeps in C code with the time-limit
    signal blocked: the worker ends with it. (Before, it noticed the server gone only between tasks, when
    its pipe had closed, and this one would have slept on for an hour, holding its memory.)"""
    srv = start_server(tmp_path, "--workers", "1", "--grader-timeout", "3600", env=plugin_env)
    (worker,) = worker_pids(srv.proc.pid)
    request = pb.BatchEvaluateRequest(
        graders=[pb.GraderSpec(name="misbehave")], samples=[pb.Sample(response="hang_in_c")]
    )
    with grpc.insecure_channel(srv.target) as channel:
        call = pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=60)  # started, not read
        try:
            eventually(lambda: "nanosleep" in Path(f"/proc/{worker}/wchan").read_text(), "the worker asleep in C")
            srv.proc.kill()
            srv.proc.wait(10)
            eventually(lambda: not Path(f"/proc/{worker}").exists(), "the worker gone with its server", bound=10)
        finally:
            call.cancel()
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)  # only if the test failed: not left asleep for an hour


def test_a_server_killed_leaves_no_process_and_no_port_behind(tmp_path, plugin_env):
    """`kill -9` of a server with workers and two HTTP face processes (each with its parsing processes):
    every process it started ends, and its gRPC and HTTP ports are free for the server started in its
    place (systemd's Restart=on-failure, a container restarted in the same network namespace)."""
    srv = start_server(tmp_path, "--workers", "2", "--http-processes", "2", env=plugin_env, http=True)
    assert srv.http_port is not None
    ours = children(srv.proc.pid)
    ours += [pid for face in face_pids(srv.proc.pid) for pid in children(face)]
    assert len(worker_pids(srv.proc.pid)) == 2 and len(face_pids(srv.proc.pid)) == 2
    srv.proc.kill()
    srv.proc.wait(10)
    try:
        eventually(lambda: not [pid for pid in ours if Path(f"/proc/{pid}").exists()], "every process gone")
    finally:
        for pid in ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for port in (srv.port, srv.http_port):
        with socket.socket() as sock:  # a port another process still listens on refuses this bind
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))


def test_a_chunks_watchdog_starts_when_a_worker_takes_it_not_while_it_waits():
    """One worker: a chunk queued behind a long one waits past its own watchdog, and is not taken for hung.
    (The pool learns that a worker took a chunk by looking at every queued chunk at once, periodically.)"""
    import asyncio

    from plain_work import PlainWork

    from grpcgrade.core.workers import WATCHDOG_GRACE_SECONDS, WorkerPool

    def work(fn, args, timeout):
        return PlainWork(fn, args, timeout=timeout)

    pool = WorkerPool(1)

    async def main():
        await pool.ready()
        long = work(time.sleep, (WATCHDOG_GRACE_SECONDS + 1.0,), WATCHDOG_GRACE_SECONDS + 5.0)
        queued = work(os.getpid, (), 0.1)  # its watchdog: 0.1 s + the grace, less than its wait in the queue
        return await asyncio.gather(pool.run(long), pool.run(queued))

    try:
        slept, pid = asyncio.run(main())
    finally:
        pool.close(patience=0)
    assert slept is None and isinstance(pid, int) and pid != os.getpid()
    assert pool.restarts == 0


@pytest.mark.parametrize("cache", ["off", "on"])
@pytest.mark.parametrize("path", PATHS)
def test_a_result_protobuf_cannot_hold_keeps_its_score_and_costs_no_other_sample(fault_server, path, cache):
    """Results protobuf cannot hold as they are: text with a lone surrogate (UTF-8 cannot encode it), metadata
    numbers past a double's range, metadata nested past what a parser reads or holding itself, an exception
    whose message cannot be read, a score past a double's range and fields of the wrong type (INVALID_RESULT;
    a None reason or metadata is empty; a returned error's fields are made strings). Each sample keeps its score
    (or its error), made representable, and the other samples of the chunk are answered as usual (before,
    the whole call ended UNKNOWN)."""
    graders, view = PATHS[path], VIEWS.get(path, pb.RESULT_VIEW_FULL)
    odd = ("ok", "surrogate", "huge_number", "deep", "cycle", "unsayable", "huge_score", "ok")
    odd += ("reason_none", "reason_int", "metadata_list", "error_odd", "loud:1000000", "fraction", "text_score")
    odd += ("deeper",)
    with fault_server.client(timeout=60) as c:
        replies = c.batch_evaluate([{"response": r} for r in odd], graders, view=view, cache=cache)
        if cache == "on":  # and again, answered from the result cache
            replies = c.batch_evaluate([{"response": r} for r in odd], graders, view=view, cache=cache)
            cached = [True] * 5 + [False, False, True, True, False, False, False, False, True, False, True]
            assert [r.results[0].cached for r in replies] == cached
    failed, invalid = "GRADER_FAILED", "INVALID_RESULT"
    assert scores(replies) == [1.0] * 5 + [
        failed,
        invalid,
        1.0,
        1.0,
        invalid,
        invalid,
        failed,
        failed,
        0.5,
        invalid,
        1.0,
    ]
    assert replies[14].results[0].error.message == "grader returned a score of type str, not a number"
    # an exception echoing a megabyte: its message is cut to 2,000 characters
    assert replies[12].results[0].error.message == "ValueError: " + "e" * 2000 + "\N{HORIZONTAL ELLIPSIS}"
    errors = [r.results[0].error.message for r in replies[9:12]]
    assert errors == [
        "grader returned a reason of type int, not str",
        "grader returned metadata of type list, not a dict",
        "404",
    ]
    assert replies[5].results[0].error.message == "Unsayable: <Unsayable>"
    shown = "1" + "0" * 38 + "\N{HORIZONTAL ELLIPSIS}"  # the first 39 characters of its repr
    assert replies[6].results[0].error.message == f"grader returned a non-finite score {shown}"
    if view != pb.RESULT_VIEW_FULL:
        return
    surrogate, huge, deep, cycle = (r.results[0] for r in replies[1:5])
    assert surrogate.reason == "bad \N{REPLACEMENT CHARACTER} text"
    assert dict(surrogate.metadata) == {"echo": "\N{REPLACEMENT CHARACTER}", "ok": 1}
    assert huge.metadata["digits"] == float("inf") and huge.metadata["nested"]["n"] == float("-inf")
    assert huge.metadata["ok"] == 1
    for result, cut in ((deep, 17), (cycle, 1)):  # deep: where every protobuf parser still reads it
        level, depth = result.metadata, 0
        while not isinstance(level, str):
            level, depth = level["in"], depth + 1
        assert (depth, level) == (cut, "<nested too deeply>")


@pytest.mark.parametrize("grader", ["odd_ranks", "odd_ranks_fn"])
def test_ranks_that_only_equal_a_permutation_are_invalid_and_cost_no_other_sample(fault_server, grader):
    """Ranks must be whole numbers. Floats with no fraction (scipy's rankdata) are taken as ints. Fractional
    ones (1.7, 2.2) and bools are INVALID_RESULT, from a class grader and a function grader alike. Before,
    1.0 == 1 passed the permutation check and then failed the whole call (UNKNOWN), and a function grader's
    ranks were truncated, so 1.7, 2.2 became the permutation 1, 2: a wrong rank, silently."""
    firsts = (["a", "b"], ["floats", "b"], ["fractional", "b"], ["bools", "b"], ["c", "d", "e"])
    with fault_server.client(timeout=60) as c:
        replies = c.batch_evaluate([{"responses": first} for first in firsts], [grader])
    results = [r.results[0] for r in replies]
    assert [list(r.rank) for r in results] == [[1, 2], [1, 2], [], [], [1, 2, 3]]
    assert [r.error.code for r in results] == ["", "", "INVALID_RESULT", "INVALID_RESULT", ""]
    assert results[2].error.message == "rank [1.7, 2.2] is not a permutation of 1..2"


@pytest.fixture(scope="module")
def no_workers_server(tmp_path_factory, plugin_env):
    srv = start_server(tmp_path_factory.mktemp("no-workers"), "--workers", "0", env=plugin_env)
    yield srv
    srv.stop()


@pytest.mark.parametrize("where", ["fault_server", "no_workers_server"], ids=["2-workers", "0-workers"])
@pytest.mark.parametrize("beside", [[], ["attentive"]], ids=["whole-chunks", "per-grader"])
def test_a_grader_that_changes_its_input_changes_no_other_graders_input(request, where, beside):
    """`tidy` sorts its `responses` and clears its `extra` lists in place, and grades first: the graders after
    it, in the same process, still see the sample as it was sent (before, they ranked the sorted responses
    and found no tool calls: wrong rewards, silently)."""
    server = request.getfixturevalue(where)
    sample = {"responses": ["a", "ccc", "bb"], "response": "x", "extra": {"tool_calls": [{"function": {"name": "s"}}]}}
    graders = ["tidy", "longest_first", {"name": "tool_call_names", "params": {"expected": "s"}}, *beside]
    with server.client(timeout=60) as c:
        (reply,) = c.batch_evaluate([sample], graders)
    by_key = {r.key: r for r in reply.results}
    assert list(by_key["longest_first"].rank) == [3, 1, 2]
    assert by_key["tool_call_names"].score == 1.0


@pytest.mark.parametrize("graders", [[{"name": "misbehave"}], [{"name": "misbehave", "params": {"heavy": False}}]])
def test_a_result_over_the_message_limit_keeps_its_score_and_costs_no_other_sample(limited_server, graders):
    """One sample's answer alone over `max_message_bytes` (a 200,000-character reason against 100,000 bytes):
    that sample keeps its score, without its reason and metadata (the reason says why), and the others
    are answered; before, the stream failed with that message and every sample not yet sent was lost."""
    samples = [{"response": r} for r in ("ok", "long:200000", "ok", "long:10")]
    with limited_server.client(timeout=60, max_message_bytes=10_000_000) as c:
        replies = c.batch_evaluate(samples, graders)
        alone = c.evaluate(samples[1], graders)  # the unary call's answer is made to fit the same way
    assert scores(replies) == [1.0, 1.0, 1.0, 1.0]
    assert scores([alone]) == [1.0] and alone.results[0].reason.startswith("reason and metadata left out")
    assert replies[3].results[0].reason == "long:" + "r" * 10
    big = replies[1].results[0]
    assert big.reason.startswith("reason and metadata left out: this sample's answer") and "100000" in big.reason
    assert replies[1].reward == 1.0


#: Where a sync grader that is not heavy runs: alone, whole chunks in workers; heavy beside an async grader,
#: a chunk per grader in workers; not heavy beside one, inline; bounded, small batches inline.
MENTIONS_PATHS = {
    "whole-chunks-in-workers": ({}, []),
    "per-grader-in-workers": ({"heavy": True}, ["attentive"]),
    "inline": ({}, ["attentive"]),
    "inline-small-bounded": ({"bounded": True}, []),
}


@pytest.mark.parametrize("cache", ["off", "on"])
@pytest.mark.parametrize("path", MENTIONS_PATHS)
def test_a_grader_written_as_a_dataclass_is_graded_and_its_params_kept_apart(fault_server, path, cache):
    """`mentions` is a `@dataclass`: its instances have no hash. Every call naming it ended UNKNOWN
    ("unhashable type"), because what is worked out once per built grader was kept in a WeakKeyDictionary,
    which hashes its keys. Two specs of it with other params, in one call, get their own results, also
    from the result cache (each built grader has its own cache scope)."""
    extra, beside = MENTIONS_PATHS[path]
    graders = [
        {"name": "mentions", "key": "grpc", "params": extra},
        {"name": "mentions", "key": "no", "params": {**extra, "word": "no"}},
        *beside,
    ]
    texts = [f"{text} {path}-{cache}" for text in ("grpc or no grpc", "no", "nothing here")]  # this test's own
    with fault_server.client(timeout=60) as c:
        for again in range(2 if cache == "on" else 1):  # with the cache on, the second call is answered from it
            replies = c.batch_evaluate([{"response": t} for t in texts], graders, cache=cache)
            unary = c.evaluate({"response": texts[0]}, graders, cache=cache)
            for reply in [*replies, unary]:
                assert [r.error.code for r in reply.results] == [""] * len(graders)
            by_key = [{r.key: r for r in reply.results} for reply in replies]
            for word in ("grpc", "no"):
                assert [b[word].score for b in by_key] == [t.split().count(word) / len(t.split()) for t in texts]
                assert by_key[0][word].reason == f"counted {word!r}"
                assert by_key[0][word].cached == bool(again)
            assert [r.score for r in unary.results[:2]] == [2 / 5, 1 / 5]


def test_shutdown_exits_within_the_grace_period_and_its_margin(tmp_path, plugin_env):
    """A gRPC stream and an HTTP request both stuck in graders past the grace period: the faces drained one
    after the other (HTTP for up to twice the grace, as aiohttp waits again for handlers it cancelled), then
    the workers got their patience: with --grace 10 the process took 36 s. Now the faces drain at once
    and the process is gone within grace + SHUTDOWN_MARGIN_SECONDS (the bound below leaves 10 s of slack
    for a loaded machine, far under the old 30 s). The stream keeps what was streamed before the grace ran
    out and ends UNAVAILABLE; the HTTP client's connection is closed without an answer."""
    import json
    import urllib.request

    from grpcgrade.service.server import SHUTDOWN_MARGIN_SECONDS

    grace = 10.0
    (tmp_path / "config.yaml").write_text("grader_timeout_seconds: 300\nrewards:\n  nap:\n    graders: [napper]\n")
    srv = start_server(
        tmp_path, "--workers", "2", "--grace", str(grace), "--config", "config.yaml", env=plugin_env, http=True
    )  # fmt: skip
    fast = 4
    request = pb.BatchEvaluateRequest(
        graders=[pb.GraderSpec(name="misbehave")],
        chunk_size=1,
        samples=[pb.Sample(response="x") for _ in range(fast)] + [pb.Sample(response="hang_in_c")] * 2,
    )
    outcome: dict[str, object] = {}

    def post() -> None:
        body = json.dumps({"query": ["hang"]}).encode()
        url = f"{srv.http}/rewards/nap/get_reward"
        try:
            urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=120)
            outcome["http"] = "answered"
        except Exception as exc:  # noqa: BLE001 - what the client sees is the point
            outcome["http"] = type(exc).__name__

    poster = threading.Thread(target=post)
    poster.start()
    with grpc.insecure_channel(srv.target) as channel:
        stream = pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=120)
        seen = [item.index for _ in range(fast) for item in next(stream).items]
        # the HTTP request reaches its grader: the engine holds both calls (a sleep raced it under load)
        eventually(lambda: srv.metric("grpcgrade_calls_admitted") == 2, "the stream and the HTTP request admitted")
        srv.proc.send_signal(signal.SIGTERM)
        bound = time.monotonic() + grace + SHUTDOWN_MARGIN_SECONDS + 10
        with pytest.raises(grpc.RpcError) as ended:
            seen += [item.index for message in stream for item in message.items]
        try:
            assert srv.proc.wait(max(0.0, bound - time.monotonic())) == 0
        finally:
            if srv.proc.poll() is None:
                srv.proc.kill()
    poster.join(30)
    assert sorted(seen) == list(range(fast))
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert outcome["http"] in {"RemoteDisconnected", "ConnectionResetError", "URLError"}, outcome
