"""Prometheus metrics of a real server after real traffic: the series operators chart, with exact values.

Expected values come from the traffic the test sends and from go-grpc-prometheus's definitions (one
`started` and one `handled` per call, `msg_sent` per response message, the gRPC status code name as
`grpc_code`), never from an earlier scrape.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import grpcgrade
from grpcgrade.service.convert import sample_to_pb, specs_to_pb
from grpcgrade.testing import ServerProcess, start_server
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

SERVICE = "grpcgrade.v1.GradingService"
N_OK = 3  # Evaluate calls that succeed
M, CHUNK = 10, 3  # one BatchEvaluate: ceil(10 / 3) = 4 streamed messages
MESSAGES = math.ceil(M / CHUNK)
BAD = (0, 4, 8)  # samples whose `extra` asks fuzzy_match for a method that does not exist
CANCELLED_SAMPLES = 20

CHRF = {"name": "similarity", "params": {"algorithm": "chrf"}}  # heavy: graded in the worker processes
FUZZY = {"name": "similarity", "params": {"algorithm": "fuzzy_match"}}


def scrape(server: ServerProcess) -> list[Sample]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    return [s for family in text_string_to_metric_families(body) for s in family.samples]


def matching(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum over the series that carry `labels` (0 when none does, as for a counter never incremented)."""
    return sum(s.value for s in matching(samples, name, **labels))


def rpc(method: str, **labels: str) -> dict[str, str]:
    return {"grpc_service": SERVICE, "grpc_method": method, **labels}


def wait_for(server: ServerProcess, name: str, expected: float, **labels: str) -> list[Sample]:
    """Scrapes until a series reaches its value: the server records a cancellation after the client sees it
    (60 s only bounds the wait: on a loaded machine that can be seconds later)."""
    deadline = time.monotonic() + 60
    while True:
        samples = scrape(server)
        if value(samples, name, **labels) == expected or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


@dataclass
class Scrapes:
    traffic: list[Sample]  # after the known traffic, before the cancellations
    during: list[Sample]  # while a batch was being graded
    cancelled: list[Sample]  # after a cancelled batch and a call past its deadline
    exposition: bytes


def send_traffic(stub: pb_grpc.GradingServiceStub) -> None:
    for i in range(N_OK):
        sample = {"response": json.dumps({"answer": i}), "reference": '{"answer": 1}'}
        stub.Evaluate(
            pb.EvaluateRequest(graders=specs_to_pb(["json_validator", CHRF]), sample=sample_to_pb(sample)), timeout=30
        )
    for graders, code in (
        (["no_such_grader"], grpc.StatusCode.NOT_FOUND),
        ([], grpc.StatusCode.INVALID_ARGUMENT),  # names neither a grader nor a reward
    ):
        with pytest.raises(grpc.RpcError) as err:
            stub.Evaluate(pb.EvaluateRequest(graders=specs_to_pb(graders), sample=pb.Sample(response="1")), timeout=30)
        assert err.value.code() == code
    samples = [
        {"response": json.dumps({"a": i}), "reference": '{"a": 1}', "extra": {"method": "nope"} if i in BAD else {}}
        for i in range(M)
    ]
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb(["json_validator", FUZZY]), samples=[sample_to_pb(s) for s in samples], chunk_size=CHUNK
    )
    messages = list(stub.BatchEvaluate(request, timeout=30))
    assert len(messages) == MESSAGES
    errors = sorted(i.index for m in messages for i in m.items if i.result.results[1].HasField("error"))
    assert errors == list(BAD)


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory, plugin_env: dict[str, str]) -> Iterator[Scrapes]:
    server = start_server(tmp_path_factory.mktemp("metrics"), "--workers", "2", env=plugin_env)
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.GradingServiceStub(channel)
            send_traffic(stub)
            traffic = scrape(server)
            exposition = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read()

            slow = pb.BatchEvaluateRequest(
                graders=specs_to_pb([{"name": "sleepy", "params": {"seconds": 0.1}}]),
                samples=[pb.Sample(response="x")] * CANCELLED_SAMPLES,
                chunk_size=1,
            )
            stream = stub.BatchEvaluate(slow, timeout=60)
            next(stream)  # the call is accepted and its first chunk answered
            # The server counts a chunk answered once its write returns, which can be just after the client
            # has read it: the gauge is read again until it moves (20 x 0.1 s of work leave time to see it).
            during = scrape(server)
            deadline = time.monotonic() + 15
            while value(during, "grpcgrade_samples_in_flight") >= CANCELLED_SAMPLES and time.monotonic() < deadline:
                during = scrape(server)
            stream.cancel()
            wait_for(server, "grpc_server_handled_total", 1, **rpc("BatchEvaluate", grpc_code="CANCELLED"))

            # A call that outlives its deadline. The deadline is long enough for the server to start the
            # call on a busy machine (one that expires first is refused by gRPC before any handler runs, and
            # nothing counts it): the test waits until the call has started, then for its deadline.
            late = pb.EvaluateRequest(
                graders=specs_to_pb([{"name": "sleepy", "params": {"seconds": 10}}]), sample=pb.Sample(response="x")
            )
            future = stub.Evaluate.future(late, timeout=3)
            wait_for(server, "grpc_server_started_total", N_OK + 3, **rpc("Evaluate"))
            assert future.exception(30).code() == grpc.StatusCode.DEADLINE_EXCEEDED
            cancelled = wait_for(
                server, "grpc_server_handled_total", 1, **rpc("Evaluate", grpc_code="DEADLINE_EXCEEDED")
            )
        yield Scrapes(traffic, during, cancelled, exposition)
    finally:
        server.stop()


def test_started_and_handled_count_every_call_by_method_and_code(scrapes):
    s = scrapes.traffic
    assert value(s, "grpc_server_started_total", **rpc("Evaluate", grpc_type="unary")) == N_OK + 2
    assert value(s, "grpc_server_started_total", **rpc("BatchEvaluate", grpc_type="server_stream")) == 1
    expected = {
        ("Evaluate", "OK"): N_OK,
        ("Evaluate", "NOT_FOUND"): 1,
        ("Evaluate", "INVALID_ARGUMENT"): 1,
        ("BatchEvaluate", "OK"): 1,
    }
    handled = {
        (x.labels["grpc_method"], x.labels["grpc_code"]): x.value
        for x in matching(s, "grpc_server_handled_total", grpc_service=SERVICE)
    }
    assert handled == expected
    # the health checks that found the server SERVING went through the same interceptor
    assert value(s, "grpc_server_handled_total", grpc_service="grpc.health.v1.Health", grpc_code="OK") >= 1


def test_messages_count_requests_and_streamed_responses(scrapes):
    s = scrapes.traffic
    assert value(s, "grpc_server_msg_received_total", **rpc("Evaluate")) == N_OK + 2  # one per unary request
    assert value(s, "grpc_server_msg_received_total", **rpc("BatchEvaluate")) == 1
    assert value(s, "grpc_server_msg_sent_total", **rpc("Evaluate")) == N_OK  # failed calls send no message
    assert value(s, "grpc_server_msg_sent_total", **rpc("BatchEvaluate")) == MESSAGES


def test_latency_histogram_has_one_observation_per_handled_call(scrapes):
    s = scrapes.traffic
    for method in ("Evaluate", "BatchEvaluate"):
        handled = value(s, "grpc_server_handled_total", **rpc(method))
        assert value(s, "grpc_server_handling_seconds_count", **rpc(method)) == handled
        assert value(s, "grpc_server_handling_seconds_sum", **rpc(method)) > 0
        buckets = matching(s, "grpc_server_handling_seconds_bucket", **rpc(method))
        counts = [b.value for b in sorted(buckets, key=lambda b: float(b.labels["le"]))]
        assert counts == sorted(counts) and counts[-1] == handled  # cumulative, +Inf holds every call


def test_grading_counters_include_samples_graded_in_worker_processes(scrapes):
    s = scrapes.traffic
    assert value(s, "grpcgrade_evaluations_total", grader="similarity", outcome="ok") == N_OK + M - len(BAD)
    assert value(s, "grpcgrade_evaluations_total", grader="similarity", outcome="error") == len(BAD)
    assert value(s, "grpcgrade_evaluations_total", grader="json_validator", outcome="ok") == N_OK + M
    assert value(s, "grpcgrade_evaluations_total", grader="json_validator", outcome="error") == 0
    for grader in ("similarity", "json_validator"):
        # observed once per grader and chunk: one chunk per Evaluate, ceil(M / CHUNK) for the batch
        assert value(s, "grpcgrade_grader_chunk_seconds_count", grader=grader) == N_OK + MESSAGES
        seconds = value(s, "grpcgrade_grader_seconds_total", grader=grader)
        assert seconds > 0
        assert value(s, "grpcgrade_grader_chunk_seconds_sum", grader=grader) == pytest.approx(seconds)


def test_batch_sizes_and_samples_in_flight(scrapes):
    s = scrapes.traffic
    assert value(s, "grpcgrade_batch_samples_count") == 1
    assert value(s, "grpcgrade_batch_samples_sum") == M
    assert value(s, "grpcgrade_batch_samples_bucket", le="8.0") == 0
    assert value(s, "grpcgrade_batch_samples_bucket", le="32.0") == 1
    assert value(s, "grpcgrade_samples_in_flight") == 0
    assert 0 < value(scrapes.during, "grpcgrade_samples_in_flight") < CANCELLED_SAMPLES


def test_workers_plugins_and_build_are_exported(scrapes):
    s = scrapes.traffic
    assert value(s, "grpcgrade_workers_alive") == 2
    assert value(s, "grpcgrade_worker_pool_restarts_total") == 0
    plugins = {x.labels["plugin"]: x.labels for x in matching(s, "grpcgrade_plugin_info") if x.value == 1}
    assert plugins["testplugin"] == {
        "plugin": "testplugin",
        "distribution": "grpcgrade-testplugin",
        "version": "0.3.1",
        "status": "loaded",
    }
    assert plugins["broken"]["status"] == "failed"
    (build,) = matching(s, "grpcgrade_build_info")
    assert build.value == 1
    assert build.labels == {
        "version": grpcgrade.__version__,
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
    }


def test_cancelled_and_late_calls_are_counted_with_their_codes(scrapes):
    s = scrapes.cancelled
    assert (
        value(s, "grpc_server_handled_total", **rpc("BatchEvaluate", grpc_type="server_stream", grpc_code="CANCELLED"))
        == 1
    )
    codes = {x.labels["grpc_code"]: x.value for x in matching(s, "grpc_server_handled_total", **rpc("Evaluate"))}
    assert codes.get("DEADLINE_EXCEEDED") == 1, codes
    assert value(s, "grpc_server_started_total", **rpc("BatchEvaluate")) == 2
    assert value(s, "grpc_server_handling_seconds_count", **rpc("BatchEvaluate")) == 2
    # the samples the cancelled call never answered leave the gauge too
    assert value(s, "grpcgrade_samples_in_flight") == 0
    assert value(s, "grpcgrade_batch_samples_sum") == M + CANCELLED_SAMPLES


def test_counters_end_in_total_and_no_created_series(scrapes):
    families = list(text_string_to_metric_families(scrapes.exposition.decode()))
    kinds = {f.name: f.type for f in families}
    assert kinds["grpcgrade_worker_pool_restarts"] == "counter"  # it only ever grows: not a gauge
    counted = [s.name for f in families if f.type == "counter" for s in f.samples]
    assert "grpcgrade_worker_pool_restarts_total" in counted
    assert counted and all(name.endswith("_total") for name in counted), counted
    assert not [s.name for f in families for s in f.samples if s.name.endswith("_created")]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not on PATH (Debian package `prometheus`)")
def test_exposition_passes_promtool_lint(scrapes):
    check = subprocess.run(["promtool", "check", "metrics"], input=scrapes.exposition, capture_output=True, timeout=30)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
