"""Reliability against real servers: one call, hostile or merely unlucky, costs only its own samples.

Each test stands for an item of the reliability review (issue 15): the event loop never grades, a killed
worker loses no other call's chunks, a timeout is never a score and never escapes, params and time
limits are bounded, a cancelled call stops its work, and oversized answers are split, not failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import textwrap
import threading
import time
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2

from grpcgrade.core.budget import OutputBudget
from grpcgrade.core.config import parse_config
from grpcgrade.core.engine import ChunkResult, _pipelined
from grpcgrade.core.errors import ConfigError
from grpcgrade.core.samples import Limits
from grpcgrade.service.convert import sample_to_pb, specs_to_pb
from grpcgrade.service.metrics_http import MAX_CONNECTIONS as MAX_METRICS_CONNECTIONS
from grpcgrade.testing import (
    CpuSince,
    cpu_seconds,
    cpu_when_idle,
    eventually,
    health_status,
    memory_kib,
    start_server,
    worker_pids,
)
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
FIELD_LIMIT = 100_000


@pytest.fixture(scope="module")
def srv(tmp_path_factory, plugin_env):
    tmp = tmp_path_factory.mktemp("reliability")
    config = tmp / "limits.yaml"
    config.write_text(f"limits: {{max_field_chars: {FIELD_LIMIT}, max_message_bytes: 200000}}\n")
    server = start_server(tmp, "--workers", "2", "--grader-timeout", "2", "--config", str(config), env=plugin_env)
    yield server
    server.stop()


def stub_of(channel: grpc.Channel) -> pb_grpc.GradingServiceStub:
    return pb_grpc.GradingServiceStub(channel)


def evaluate(target: str, sample: dict, graders: list, timeout: float = 60, **fields) -> pb.EvaluateResponse:
    request = pb.EvaluateRequest(graders=specs_to_pb(graders), sample=sample_to_pb(sample), **fields)
    with grpc.insecure_channel(target) as channel:
        return stub_of(channel).Evaluate(request, timeout=timeout)


def batch(target: str, samples: list[dict], graders: list, timeout: float = 60, **fields) -> list[pb.EvaluateResponse]:
    """Every sample's result, in request order (each must come back exactly once)."""
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb(graders), samples=[sample_to_pb(s) for s in samples], **fields
    )
    with grpc.insecure_channel(target) as channel:
        items = [item for message in stub_of(channel).BatchEvaluate(request, timeout=timeout) for item in message.items]
    assert sorted(i.index for i in items) == list(range(len(samples)))
    return [i.result for i in sorted(items, key=lambda i: i.index)]


def outcome(result: pb.EvaluateResponse, j: int = 0) -> object:
    r = result.results[j]
    return r.error.code if r.HasField("error") else r.score


def refusal(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


# -- 1. nothing a request supplies runs on the event loop ------------------------------------------------


def test_health_answers_while_a_unary_call_grades_a_slow_sample(server):
    """A cheap grader's sample that hangs (here a Python loop, as a catastrophic regex would) runs in a
    worker: the loop keeps answering health checks. Shown by order, not by time: once a worker spins on the
    sample (up to the call's 5 s limit), health answers three times while the call still runs; the call then
    ends TIMEOUT. Graded on the loop, no worker would spin and health would wait for the sample. (Params of
    this test's own: the sample is quarantined as a TIMEOUT on the suite's server.)"""
    request = pb.EvaluateRequest(
        graders=specs_to_pb([{"name": "misbehave", "params": {"heavy": False, "column": False}}]),
        sample=sample_to_pb({"response": "hang"}),
        grader_timeout_seconds=5,
    )
    workers = CpuSince(worker_pids(server.proc.pid))
    with grpc.insecure_channel(server.target) as channel:
        slow = stub_of(channel).Evaluate.future(request, timeout=120)
        eventually(lambda: workers.busy(0.1), "a worker on the sample")
        answers = [health_status(server.target, timeout=60) for _ in range(3)]
        still_running = not slow.done()
        result = slow.result()
    assert answers == [SERVING] * 3
    assert still_running
    assert outcome(result) == "TIMEOUT"


def test_extra_counts_against_the_field_limit(srv):
    """`string_match contains_all` with a huge `extra.substrings`: the sample is refused, not graded."""
    substrings = ["needle-" + "x" * 90] * (FIELD_LIMIT // 90)
    graders = [{"name": "string_match", "params": {"algorithm": "contains_all"}}]
    result = evaluate(srv.target, {"response": "haystack", "extra": {"substrings": substrings}}, graders)
    assert outcome(result) == "INVALID_SAMPLE"
    assert (
        "'extra'" in result.results[0].error.message
        and f"max_field_chars={FIELD_LIMIT}" in result.results[0].error.message
    )
    small = evaluate(srv.target, {"response": "a needle", "extra": {"substrings": ["needle"]}}, graders)
    assert outcome(small) == 1.0


# -- 2. a worker killed for one call's sample loses no other call's chunks --------------------------------


def test_a_stuck_worker_killed_loses_no_other_calls_samples(srv):
    """Three other calls keep chunks queued while a sample hangs in C code: when the watchdog kills its
    worker, their chunks (queued, or running beside it) are graded again, each sample answered once."""
    others: list[list] = [[], [], []]
    errors: list = []

    def other_call(out: list) -> None:
        try:
            graders = [{"name": "sleepy", "params": {"seconds": 0.02}}]
            out.extend(batch(srv.target, [{"response": "x"}] * 160, graders, chunk_size=4))
        except grpc.RpcError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=other_call, args=(out,)) for out in others]
    workers = CpuSince(worker_pids(srv.proc.pid))
    for thread in threads:
        thread.start()
    eventually(lambda: len(workers.busy()) == 2, "the other calls' chunks in both workers")
    stuck = batch(
        srv.target,
        [{"response": r} for r in ("ok", "hang_in_c", "ok")],
        ["misbehave"],
        grader_timeout_seconds=0.5,
        chunk_size=1,  # one kill: the stuck sample's chunk is the sample
    )
    for thread in threads:
        thread.join(90)
    assert [outcome(r) for r in stuck] == [1.0, "TIMEOUT", 1.0]
    assert not errors, errors
    assert [[outcome(r) for r in out] for out in others] == [[1.0] * 160] * 3


# -- 3. the time-limit signal never fires outside the sample it bounds -----------------------------------


@pytest.mark.parametrize("heavy", [True, False], ids=["whole-chunks", "unary-path-graders"])
def test_a_slow_error_report_does_not_become_a_timeout_escape(srv, heavy):
    """The grader fails at once with an error whose message takes 0.5 s to build, under a 0.2 s limit: the
    sample is GRADER_FAILED and the samples after it are graded (before, the next tick of the timer
    fired inside the error handling and the whole call failed UNKNOWN)."""
    samples = [{"response": r} for r in ("ok", "slow_error", "ok", "slow_error", "ok")]
    graders = [{"name": "misbehave", "params": {"heavy": heavy}}]
    results = batch(srv.target, samples, graders, grader_timeout_seconds=0.2)
    assert [outcome(r) for r in results] == [1.0, "GRADER_FAILED", 1.0, "GRADER_FAILED", 1.0]


# -- 4. memory per sample and per param is bounded -------------------------------------------------------


def worker_peaks(server) -> dict[int, int]:
    """Each of the server's workers' peak resident memory so far (VmHWM, KiB); a worker gone meanwhile is left out."""
    out = {}
    for pid in worker_pids(server.proc.pid):
        with contextlib.suppress(OSError):
            out[pid] = memory_kib(pid, "VmHWM")
    return out


def test_rougeL_of_long_texts_is_the_lcs_definition(server):
    """rougeL on 12,000-word texts: before, a 12k x 12k table of Python ints (gigabytes). The response is
    the reference with every third word dropped, so by definition the LCS is the whole response; and no
    worker's peak memory grows by 256 MiB grading it. On the suite's server, whose time limit is the default
    30 s: this module's 2 s (for the hanging samples) timed out NLTK's first import and this LCS on a loaded
    machine. The memory is what this test guards, so it asserts the memory."""
    words = [f"w{i % 997}" for i in range(12_000)]
    response = [w for i, w in enumerate(words) if i % 3]
    sample = {"response": " ".join(response), "reference": " ".join(words)}
    graders = [{"name": "similarity", "params": {"algorithm": "rougeL", "use_stemmer": False}}]
    before = worker_peaks(server)
    result = evaluate(server.target, sample, graders)
    precision, recall = 1.0, len(response) / len(words)
    assert outcome(result) == pytest.approx(2 * precision * recall / (precision + recall))
    grown_mib = max(kib - before.get(pid, 0) for pid, kib in worker_peaks(server).items()) / 1024
    assert grown_mib < 256, f"a worker's peak grew by {grown_mib:.0f} MiB"


def test_rougeL_matches_the_rouge_score_library(server):
    from rouge_score.rouge_scorer import _score_lcs

    from grpcgrade.graders.text.similarity_metrics import _RougeTokenizer

    tokenizer = _RougeTokenizer(use_stemmer=True)
    pairs = [
        ("the cat sat on the mat today", "a cat was sitting on the mat"),
        ("one two three four five six seven", "seven six five four three two one"),
        ("grading rewards for training", "rewards graded while training models"),
    ]
    graders = [{"name": "similarity", "params": {"algorithm": "rougeL"}}]
    for reference, response in pairs:
        expected = _score_lcs(tokenizer.tokenize(reference), tokenizer.tokenize(response)).fmeasure
        result = evaluate(server.target, {"response": response, "reference": reference}, graders)
        assert outcome(result) == pytest.approx(expected)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "similarity", "params": {"algorithm": "bleu", "max_ngram_order": 1e7}},
        {"name": "similarity", "params": {"algorithm": "chrf", "char_order": 1000}},
        {"name": "ngram_repetition_penalty", "params": {"n": 10_000_000}},
        {"name": "number_accuracy", "params": {"tolerance": 1e300}},
    ],
    ids=["max_ngram_order", "char_order", "default-int-range", "default-float-range"],
)
def test_numeric_params_outside_their_range_are_invalid_argument(srv, spec):
    err = refusal(lambda: evaluate(srv.target, {"response": "a b c", "reference": "a b c"}, [spec]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    (param,) = (k for k in spec["params"] if k != "algorithm")
    assert param in err.details()


# -- 5. a cancelled call's work stops in the workers -----------------------------------------------------


def test_a_call_past_its_deadline_stops_its_running_chunks(server):
    """Two samples that would each keep a worker busy up to the suite server's 30 s limit, and a 0.8 s
    deadline: the workers stop once the cancellation reaches them (the flag, then the next 0.1 s tick);
    before, they went on to the limit. Counted in CPU, not timed: what the workers spend after the deadline
    until they are idle is a moment's, far under the limit's (30 s each, or a share of it on a loaded core)."""
    graders = [{"name": "sleepy", "params": {"seconds": 3600}}]
    batch(server.target, [{"response": "x"}] * 4, [{"name": "sleepy", "params": {"seconds": 0}}], chunk_size=1)
    workers = worker_pids(server.proc.pid)
    err = refusal(lambda: batch(server.target, [{"response": "x"}] * 2, graders, timeout=0.8, chunk_size=1))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    at_deadline = sum(cpu_seconds(p) for p in workers)
    after = cpu_when_idle(workers) - at_deadline
    assert after < 3.0, f"the workers spent {after:.1f} s of CPU after the deadline"


@pytest.mark.parametrize("callers", [1, 3], ids=["one-call", "coalesced-calls"])
def test_unary_calls_past_their_deadline_stop_their_sample(server, callers):
    """Unary `Evaluate` calls of a sample that would keep a worker busy up to the suite server's 30 s limit,
    each with a 0.8 s deadline: once every call gathered into the server's chunk has gone, the chunk is
    cancelled and the worker stops. Before, the coalescer graded a chunk whose callers had all left to its
    time limit (a worker lost for 30 s per abandoned call, and the sample quarantined as a TIMEOUT nobody
    asked about). Counted in CPU, as the batch case above."""
    request = pb.EvaluateRequest(
        graders=specs_to_pb([{"name": "sleepy", "params": {"seconds": 3600, "heavy": False}}]),
        sample=sample_to_pb({"response": f"unary-deadline-{callers}"}),
    )
    batch(server.target, [{"response": "x"}] * 4, [{"name": "sleepy", "params": {"seconds": 0}}], chunk_size=1)
    workers = worker_pids(server.proc.pid)
    with grpc.insecure_channel(server.target) as channel:
        calls = [stub_of(channel).Evaluate.future(request, timeout=0.8) for _ in range(callers)]
        codes = [refusal(call.result).code() for call in calls]
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * callers
    at_deadline = sum(cpu_seconds(p) for p in workers)
    after = cpu_when_idle(workers) - at_deadline
    assert after < 3.0, f"the workers spent {after:.1f} s of CPU after the deadline"


# -- 6. a timeout is never a score -----------------------------------------------------------------------


def test_a_grader_that_catches_exception_still_times_out(srv):
    """The grader's own `except Exception` (a fallback score) does not turn the time limit into a score."""
    results = batch(
        srv.target, [{"response": "swallow"}, {"response": "ok"}], ["misbehave"], grader_timeout_seconds=0.3
    )
    assert [outcome(r) for r in results] == ["TIMEOUT", 1.0]
    assert not results[0].HasField("reward")


def test_similarity_past_its_time_limit_is_a_timeout_not_zero(srv):
    """chrF of two 90,000-character texts takes longer than 0.05 s inside sacrebleu, where similarity
    turns a library's exception into the reference's "score 0 with an error"; a timeout is not one."""
    text = " ".join(f"word{i % 50} other{i % 7}" for i in range(6000))[:90_000]
    graders = [{"name": "similarity", "params": {"algorithm": "chrf"}}]
    result = evaluate(srv.target, {"response": text, "reference": text[::-1]}, graders, grader_timeout_seconds=0.05)
    assert outcome(result) == "TIMEOUT"
    assert not result.HasField("reward")


# -- 7. the per-call time limit is validated and capped ---------------------------------------------------


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf, -math.inf])
def test_grader_timeout_seconds_must_be_a_positive_number(srv, value):
    for call in (
        lambda: evaluate(srv.target, {"response": "1"}, ["json_validator"], grader_timeout_seconds=value),
        lambda: batch(srv.target, [{"response": "1"}], ["json_validator"], grader_timeout_seconds=value),
    ):
        err = refusal(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "grader_timeout_seconds" in err.details()


def test_a_call_cannot_raise_the_servers_time_limit(srv):
    result = evaluate(srv.target, {"response": "hang"}, ["misbehave"], grader_timeout_seconds=1e6)
    assert outcome(result) == "TIMEOUT"
    assert "2 s" in result.results[0].error.message  # the server's --grader-timeout


# -- 8. a non-finite reward is absent -------------------------------------------------------------------


def test_a_reward_that_overflows_is_absent(srv):
    """Weights a request may give (their sum is finite) can still make a sample's weighted sum overflow: that
    sample has no reward (inf is no reward), and its scores are kept."""
    graders = [
        {"name": "json_validator", "key": "a", "weight": 1e308},
        {"name": "count_word", "key": "b", "weight": -1e308},  # no "grpc" in the response: scores 0
        {"name": "json_validator", "key": "c", "weight": 1e308},
    ]
    result = evaluate(srv.target, {"response": "[1]"}, graders)
    assert [outcome(result, 0), outcome(result, 1), outcome(result, 2)] == [1.0, 0.0, 1.0]
    assert not result.HasField("reward")  # (w*1 - w*0 + w*1) / (w - w + w) is inf / w


def test_weights_whose_sum_overflows_are_refused(srv):
    """Finite weights whose sum no double holds (two of 1e308). They were accepted: a sample scoring 1 and 1
    had no reward (inf / inf), and one scoring 1 and 0 got 0.0 (1e308 / inf) where its weighted mean is 0.5:
    a wrong reward, silently. The request is now refused, naming the sum."""
    graders = [
        {"name": "json_validator", "key": "a", "weight": 1e308},
        {"name": "count_word", "key": "b", "weight": 1e308},
    ]
    err = refusal(lambda: evaluate(srv.target, {"response": "[1]"}, graders))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "weights of the non-gate graders sum to inf" in err.details()


# -- 9. params that would fill the caches are refused ----------------------------------------------------


def test_huge_params_are_refused(srv):
    spec = {"name": "similarity", "params": {"algorithm": "bleu", "tokenize": "x" * 100_000}}
    err = refusal(lambda: evaluate(srv.target, {"response": "a", "reference": "a"}, [spec]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(err.details()) < 1000  # and the detail does not echo the value


# -- 11. an answer over the message limit is split, not failed ------------------------------------------


def test_a_chunk_over_the_message_limit_is_split(srv):
    """60 results with 5,000-character reasons (300 kB) in one chunk, on a server whose messages are
    capped at 200 kB: the stream answers every sample over several messages."""
    samples = [{"id": str(i), "response": "long:5000"} for i in range(60)]
    for graders in (["misbehave"], [{"name": "misbehave", "params": {"heavy": False}}, "attentive"]):
        request = pb.BatchEvaluateRequest(
            graders=specs_to_pb(graders), samples=[sample_to_pb(s) for s in samples], chunk_size=60
        )
        with grpc.insecure_channel(srv.target, options=[("grpc.max_receive_message_length", 1 << 24)]) as channel:
            messages = list(stub_of(channel).BatchEvaluate(request, timeout=60))
        assert len(messages) > 1 and all(m.ByteSize() <= 200_000 for m in messages)
        assert sorted(i.index for m in messages for i in m.items) == list(range(60))
        assert all(i.result.results[0].reason == "long:" + "r" * 5000 for m in messages for i in m.items)


def test_a_tiny_chunk_size_is_raised(srv):
    """chunk_size 1 on 3,000 samples would be 3,000 messages and hops; no call is cut into more than 1,024."""
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb(["json_validator"]), samples=[pb.Sample(response="1")] * 3000, chunk_size=1
    )
    with grpc.insecure_channel(srv.target) as channel:
        messages = list(stub_of(channel).BatchEvaluate(request, timeout=60))
    assert len(messages) <= 1024
    assert sorted(i.index for m in messages for i in m.items) == list(range(3000))


# -- 12. smaller ones --------------------------------------------------------------------------------------


def test_json_schema_scores_a_4300_digit_number(srv):
    """Valid JSON past CPython's 4,300-digit `int` limit: scored (the other JSON graders score it too)."""
    sample = {
        "response": '{"answer": ' + "7" * 5000 + "}",
        "extra": {"metadata": {"schema": '{"required": ["answer"]}'}},
    }
    assert outcome(evaluate(srv.target, sample, ["json_schema"])) == 1.0
    assert isinstance(outcome(evaluate(srv.target, sample, ["json_validator"])), float)


@pytest.fixture(scope="module")
def inline_srv(tmp_path_factory, plugin_env):
    server = start_server(tmp_path_factory.mktemp("inline"), "--workers", "0", env=plugin_env)
    yield server
    server.stop()


def handled(server, method: str) -> dict[str, float]:
    """`grpc_server_handled_total` of a GradingService method, by code, once it has counted a call."""
    deadline = time.monotonic() + 15
    while True:
        codes = {
            dict(tags)["grpc_code"]: v
            for (name, tags), v in server.metrics().items()
            if name == "grpc_server_handled_total" and dict(tags).get("grpc_method") == method
        }
        if codes or time.monotonic() > deadline:
            return codes
        time.sleep(0.05)


def test_a_call_answered_after_its_deadline_is_counted_as_deadline_exceeded(inline_srv):
    """With no workers the grading holds the handler past the deadline; the caller saw DEADLINE_EXCEEDED,
    and so must the metrics (before: OK). The deadline leaves a loaded machine time to start the call: one
    that expires before its handler runs is refused by gRPC itself and counted nowhere (as test_metrics found)."""
    graders = [{"name": "sleepy", "params": {"seconds": 3.0, "heavy": False}}]
    err = refusal(lambda: evaluate(inline_srv.target, {"response": "x"}, graders, timeout=2.0))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert handled(inline_srv, "Evaluate") == {"DEADLINE_EXCEEDED": 1}


def test_a_cancelled_stream_is_counted_as_cancelled(inline_srv):
    graders = [{"name": "sleepy", "params": {"seconds": 0.1, "heavy": False}}]
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb(graders), samples=[pb.Sample(response="x")] * 20, chunk_size=1
    )
    with grpc.insecure_channel(inline_srv.target) as channel:
        stream = stub_of(channel).BatchEvaluate(request, timeout=60)
        next(stream)
        stream.cancel()
    assert handled(inline_srv, "BatchEvaluate") == {"CANCELLED": 1}


def test_idle_metrics_connections_are_closed(inline_srv):
    """Prometheus' exposition server keeps a thread per open connection; one idle for 3 s is closed (the
    server's end: a read then sees end-of-file instead of waiting forever)."""
    idle = [socket.create_connection(("127.0.0.1", inline_srv.metrics_port)) for _ in range(3)]
    try:
        for s in idle:
            s.settimeout(60)  # only a bound: a server that keeps them open fails here (a timeout raises)
            assert s.recv(1) == b""
    finally:
        for s in idle:
            s.close()


def _closed_unanswered(sock: socket.socket) -> bytes:
    """What the server sent before it closed the connection (b"" when it answered nothing)."""
    sock.settimeout(30)  # only a bound: a server that keeps it open fails here (a timeout raises)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:  # closed with our request unread
        pass
    return received


def test_a_trickling_metrics_client_is_closed_at_its_request_deadline(inline_srv):
    """A byte every half second never lets a read wait its 3 s: the whole request must still arrive within
    `metrics_http.REQUEST_SECONDS` of the connection's start, else the connection (and its thread) ends."""
    sock = socket.create_connection(("127.0.0.1", inline_srv.metrics_port))
    try:
        sock.sendall(b"G")
        sock.settimeout(0.5)
        deadline = time.monotonic() + 60  # only a bound
        while time.monotonic() < deadline:
            try:
                sock.sendall(b"E")
                if sock.recv(1) == b"":
                    break
            except TimeoutError:
                continue
            except OSError:  # reset: closed
                break
        else:
            pytest.fail("a trickling metrics connection was kept open for 60 s")
    finally:
        sock.close()
    assert "Traceback" not in inline_srv.log()  # a connection that ends so is no error of the server's


def test_metrics_connections_past_the_cap_are_closed_unanswered(inline_srv):
    """At most `metrics_http.MAX_CONNECTIONS` are handled at once (each a thread of the engine's process): a
    scrape past them is closed unanswered, and answered once they have ended."""
    held = []
    try:
        for _ in range(MAX_METRICS_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", inline_srv.metrics_port)))
            held[-1].sendall(b"G")  # a request begun: the connection is held until its deadline
            time.sleep(0.005)  # each taken up before the next: the listen backlog is 5
        extra = socket.create_connection(("127.0.0.1", inline_srv.metrics_port))
        extra.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert _closed_unanswered(extra) == b""
        extra.close()
    finally:
        for sock in held:
            sock.close()
    assert inline_srv.metrics()  # a scrape, answered


# -- 11. a reader that never reads holds nothing for long ---------------------------------------------------

SEND_TIMEOUT = 2.0
BUDGET = 8_000_000
STALLED_MESSAGE = 10_000_000  # 100 results with 100,000-character reasons


@pytest.fixture(scope="module")
def stall_srv(tmp_path_factory, plugin_env):
    tmp = tmp_path_factory.mktemp("stall")
    config = tmp / "limits.yaml"
    config.write_text(
        f"limits: {{send_timeout_seconds: {SEND_TIMEOUT}, max_buffered_output_bytes: {BUDGET}, "
        f"max_message_bytes: {2 * STALLED_MESSAGE}}}\n"
    )
    server = start_server(tmp, "--workers", "2", "--config", str(config), env=plugin_env)
    yield server
    server.stop()


def test_stalled_readers_are_ended_and_release_what_they_held(stall_srv):
    """Four clients ask for 60 MB of answers each (600 results with 100,000-character reasons, 10 MB
    messages) and never read. Without a bound each would hold its window of graded chunks (5 with two
    workers: 50 MB) for as long as it stays connected, 200 MB for the four. Each is ended with
    RESOURCE_EXHAUSTED once it has taken no message for `send_timeout_seconds`, which drops what it held:
    the server keeps at most each call's one unsent message and the transport's window (~4 MB a stream,
    measured with grpcio 1.85; measured here: 77 MB for the four, against 270 MB before the fix). A normal
    client is answered in full on the same server meanwhile."""
    target = stall_srv.target
    ok = {"name": "misbehave", "params": {"heavy": False}}
    batch(target, [{"response": "long:10"}] * 10, [ok])  # warm: the baseline includes a served call
    before = memory_kib(stall_srv.proc.pid)
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb([ok]), samples=[pb.Sample(response="long:100000")] * 600, chunk_size=100
    )
    options = [("grpc.max_receive_message_length", 4 * STALLED_MESSAGE)]
    channels = [grpc.insecure_channel(target, options=options) for _ in range(4)]
    try:
        streams = [stub_of(channel).BatchEvaluate(request, timeout=60) for channel in channels]
        normal = batch(target, [{"id": str(i), "response": "long:10"} for i in range(50)], [ok], timeout=30)
        assert [outcome(r) for r in normal] == [1.0] * 50
        ended = lambda: handled(stall_srv, "BatchEvaluate").get("RESOURCE_EXHAUSTED", 0) >= 4  # noqa: E731
        eventually(ended, "the four stalled calls ended RESOURCE_EXHAUSTED")
        # per stalled call: its unsent message, twice (Python's bytes and gRPC core's copy), and the window
        bound_mb = 4 * (2 * STALLED_MESSAGE / 1e6 + 4) + 30
        grown_mb = lambda: (memory_kib(stall_srv.proc.pid) - before) / 1024  # noqa: E731
        eventually(lambda: grown_mb() < bound_mb, f"the server's memory back under {bound_mb:.0f} MB grown")
        for stream in streams:  # reading again, each client gets what was sent, then the status
            error = refusal(lambda stream=stream: list(stream))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "stopped reading" in error.details() and "send_timeout_seconds" in error.details()
    finally:
        for channel in channels:
            channel.close()


def test_a_stalled_reader_of_a_large_first_message_still_gets_its_status(stall_srv):
    """A stream's headers go with its first message when that message is small (one batch of gRPC operations
    less per call), but before a large one: grpc aio never sends the status of a stream whose first write,
    carrying the headers, was cancelled by the send timeout, so a reader that never read would only ever see
    its own deadline. Here the first message is 10 MB, which no stream's flow-control window holds."""
    ok = {"name": "misbehave", "params": {"heavy": False}}
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb([ok]), samples=[pb.Sample(response="long:100000")] * 100, chunk_size=100
    )
    options = [("grpc.max_receive_message_length", 4 * STALLED_MESSAGE)]

    def exhausted() -> float:
        return sum(
            v
            for (name, tags), v in stall_srv.metrics().items()
            if name == "grpc_server_handled_total"
            and dict(tags).get("grpc_method") == "BatchEvaluate"
            and dict(tags).get("grpc_code") == "RESOURCE_EXHAUSTED"
        )

    before = exhausted()
    with grpc.insecure_channel(stall_srv.target, options=options) as channel:
        stream = stub_of(channel).BatchEvaluate(request, timeout=SEND_TIMEOUT + 120)
        # The call's one message is not taken: read only once the server has given up on it (its handler
        # ended RESOURCE_EXHAUSTED). Before, a fixed 5 s sleep: at load 15 the 100 samples were not yet
        # graded and sent by then, and the reader took the message instead.
        eventually(
            lambda: exhausted() > before,
            "the server's send timeout on the unread message",
        )
        error = refusal(lambda: list(stream))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert "stopped reading" in error.details()


def test_calls_wait_for_the_output_budget_and_a_closed_call_frees_it():
    """With the budget spent by a call whose answers are not taken, another call starts no chunk; once the
    first call ends, the second runs to its end and nothing stays charged."""

    async def scenario() -> tuple[int, int, int]:
        budget = OutputBudget(1000)
        started = {"b": 0}

        async def answer(call: str) -> ChunkResult:
            started[call] = started.get(call, 0) + 1
            return ChunkResult(range(1), encoded=b"x" * 600)

        a = _pipelined((answer("a") for _ in range(10)), 3, budget)
        await anext(a)  # a's window is graded (1,800 bytes charged) and its reader takes no more
        b = _pipelined((answer("b") for _ in range(4)), 3, budget)
        b_first = asyncio.ensure_future(anext(b))
        await asyncio.sleep(0.05)
        started_while_spent = started["b"]
        await a.aclose()  # the stalled call is ended
        taken = [await b_first] + [item async for item in b]
        return started_while_spent, len(taken), budget.held

    started_while_spent, answered, held = asyncio.run(scenario())
    assert (started_while_spent, answered, held) == (0, 4, 0)


def test_the_output_limits_example_in_the_docs_is_the_servers_defaults():
    page = (Path(__file__).resolve().parent.parent / "docs" / "security.md").read_text()
    example = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    limits = parse_config(yaml.safe_load(textwrap.dedent(example)), "docs/security.md").limits
    assert limits == Limits()
    assert (limits.send_timeout_seconds, limits.max_buffered_output_bytes) == (30, 256 * 1024 * 1024)
    with pytest.raises(ConfigError, match="send_timeout_seconds: must be at least"):
        parse_config({"limits": {"send_timeout_seconds": 0}})


@pytest.mark.parametrize(
    ("graders", "view"),
    [
        ([{"name": "misbehave"}], pb.RESULT_VIEW_FULL),  # whole chunks in the workers
        ([{"name": "misbehave", "params": {"bounded": True}}], pb.RESULT_VIEW_FULL),  # small: inline
        ([{"name": "misbehave", "params": {"column": True}}], pb.RESULT_VIEW_SCORES),  # the column, then per sample
        ([{"name": "misbehave"}, {"name": "attentive"}], pb.RESULT_VIEW_FULL),  # per grader, beside an async one
    ],
    ids=["whole-chunks", "inline", "score-column", "beside-async"],
)
def test_a_library_base_exception_costs_only_its_sample(server, graders, view):
    """A grader whose library raises a BaseException that is not an Exception (math-verify's
    TimeoutException is one) fails that sample, GRADER_FAILED; before, it ended the whole call UNKNOWN, or
    left the client waiting for a status that never came."""
    samples = [{"response": r} for r in ("ok", "base_exception", "ok")]
    with server.client(timeout=60) as client:
        replies = client.batch_evaluate(samples, graders, view=view)
        unary = client.evaluate(samples[1], graders, view=view)
    errors = [r.results[0].error for r in replies]
    assert [r.results[0].score for r in replies] == [1.0, 0.0, 1.0]
    assert [e.code for e in errors] == ["", "GRADER_FAILED", ""]
    assert "LibraryTimeout" in errors[1].message and unary.results[0].error.code == "GRADER_FAILED"
    assert not replies[1].HasField("reward") and replies[0].reward == 1.0


def test_a_base_exception_building_a_grader_ends_the_call_with_a_status(server):
    """grpc leaves a call without a status when its handler raises a BaseException that is not an
    Exception: the client waited until its deadline (DEADLINE_EXCEEDED). It now gets UNKNOWN, naming it."""
    graders = [{"name": "misbehave", "params": {"build": "base_exception"}}]
    with server.client(timeout=30) as client:
        for call in (
            lambda: client.batch_evaluate([{"response": "ok"}], graders),
            lambda: client.evaluate({}, graders),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNKNOWN
            assert "LibraryTimeout" in err.value.details()
