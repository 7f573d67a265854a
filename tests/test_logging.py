"""Logs and drain of a real server: JSON lines, one debug line per request carrying its `x-request-id`, a
warning per failed call, and on SIGTERM NOT_SERVING while in-flight work finishes, then exit status 0."""

from __future__ import annotations

import json
import re
import signal
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpcgrade.service.convert import sample_to_pb, specs_to_pb
from grpcgrade.testing import health_status, start_server
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
GRADING = "grpcgrade.v1.GradingService"
OK_CALLS = {"req-cheap": "Evaluate", "req-heavy": "Evaluate", "req-batch": "BatchEvaluate"}


def entries(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON lines (the first test checks that there is no other kind)."""
    parsed = [json.loads(line) for line in lines if line.startswith("{")]
    assert all(isinstance(e, dict) and {"ts", "level", "logger", "message"} <= e.keys() for e in parsed)
    return parsed


def request_lines(log: list[dict[str, Any]], request_id: str) -> list[dict[str, Any]]:
    return [e for e in log if e["logger"] == "grpcgrade.requests" and f"request_id={request_id} " in e["message"]]


def evaluate(stub: pb_grpc.GradingServiceStub, graders: list[Any], request_id: str | None) -> pb.EvaluateResponse:
    sample = sample_to_pb({"response": "{}", "reference": "{}"})
    request = pb.EvaluateRequest(graders=specs_to_pb(graders), sample=sample)
    metadata = (("x-request-id", request_id),) if request_id else ()
    return stub.Evaluate(request, timeout=30, metadata=metadata)


@pytest.fixture(scope="module")
def debug_log(tmp_path_factory: pytest.TempPathFactory, plugin_env: dict[str, str]) -> list[str]:
    """The whole output of a server run at debug level in JSON, after known traffic and a SIGTERM."""
    server = start_server(
        tmp_path_factory.mktemp("logs"),
        "--workers",
        "2",
        "--log-format",
        "json",
        "--log-level",
        "debug",
        env=plugin_env,
    )
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.GradingServiceStub(channel)
            evaluate(stub, ["json_validator"], "req-cheap")
            evaluate(stub, [{"name": "similarity", "params": {"algorithm": "chrf"}}], "req-heavy")  # in a worker
            batch = pb.BatchEvaluateRequest(
                graders=specs_to_pb(["json_validator"]), chunk_size=2, samples=[pb.Sample(response="1")] * 5
            )
            assert len(list(stub.BatchEvaluate(batch, timeout=30, metadata=(("x-request-id", "req-batch"),)))) == 3
            evaluate(stub, ["json_validator"], None)
            with pytest.raises(grpc.RpcError) as err:
                evaluate(stub, ["no_such_grader"], "req-missing")
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        assert server.stop() == 0
    return server.log().splitlines()


def test_json_format_writes_one_object_per_line_from_every_process(debug_log):
    """Worker processes log too (e.g. a plugin that fails to load in each of them): as JSON, not as text."""
    assert [line for line in debug_log if not line.startswith("{")] == []
    log = entries(debug_log)
    assert [e["message"] for e in log if e["logger"] == "grpcgrade.service.server"][-1] == "stopped"
    # the broken test plugin fails to load in the server and in each worker; every report is a JSON line
    assert len([e for e in log if e["logger"] == "grpcgrade.core.plugins" and "plugin broken" in e["message"]]) == 3


def test_debug_level_logs_one_line_per_request_with_its_request_id(debug_log):
    log = entries(debug_log)
    for request_id, method in OK_CALLS.items():
        (line,) = request_lines(log, request_id)
        assert line["level"] == "debug"
        assert line["message"].startswith(f"rpc {GRADING}/{method} request_id={request_id} code=OK ")
    grading = [e for e in log if e["logger"] == "grpcgrade.requests" and f" {GRADING}/" in e["message"]]
    assert len(grading) == len(OK_CALLS) + 2  # and one each for the call without an id and the failed one
    generated = [re.search(r"request_id=(\S+)", e["message"]).group(1) for e in grading]  # type: ignore[union-attr]
    (own,) = set(generated) - set(OK_CALLS) - {"req-missing"}
    assert re.fullmatch(r"[0-9a-f]{16}", own)  # a call without `x-request-id` gets one


def test_a_failed_call_logs_a_warning_with_its_request_id_and_code(debug_log):
    (line,) = request_lines(entries(debug_log), "req-missing")
    assert line["level"] == "warning"
    assert f"{GRADING}/Evaluate request_id=req-missing code=NOT_FOUND " in line["message"]
    assert "no_such_grader" in line["message"]  # the details the client got


def test_sigterm_says_not_serving_finishes_the_call_in_flight_and_exits_zero(tmp_path, plugin_env):
    server = start_server(tmp_path, "--workers", "2", "--log-format", "json", "--grace", "60", env=plugin_env)
    n = 40  # 40 x 50 ms of grading on 2 workers: still in flight when the signal arrives
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb([{"name": "sleepy", "params": {"seconds": 0.05}}]),
        chunk_size=2,
        samples=[pb.Sample(id=str(i), response="x") for i in range(n)],
    )
    with grpc.insecure_channel(server.target) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
        assert next(watch).status == SERVING
        stream = pb_grpc.GradingServiceStub(channel).BatchEvaluate(
            request, timeout=60, metadata=(("x-request-id", "req-drain"),)
        )
        items = list(next(stream).items)
        server.proc.send_signal(signal.SIGTERM)
        assert next(watch).status == NOT_SERVING
        assert list(watch) == []  # the watch ends, so it does not hold the drain open for the grace period
        assert health_status(server.target) in (NOT_SERVING, None)  # None: new calls are refused
        items += [item for message in stream for item in message.items]
    assert sorted(item.index for item in items) == list(range(n))
    assert all(item.result.results[0].score == 1.0 for item in items)
    assert server.proc.wait(30) == 0
    log = entries(server.log().splitlines())
    messages = [e["message"] for e in log if e["logger"] == "grpcgrade.service.server"]
    assert messages[-2].startswith("draining: NOT_SERVING") and messages[-1] == "stopped"
    assert request_lines(log, "req-drain") == []  # at the default level a successful call is not logged


def test_workers_take_grpcgrade_s_formats_and_leave_a_host_s_own_behind():
    """A host embedding the server may log through a formatter that holds a stream (pytest's does); it
    cannot cross to a spawned worker, and trying failed the pool's start."""
    import io
    import logging
    import pickle

    from grpcgrade import logs

    class Streaming(logging.Formatter):
        def __init__(self) -> None:
            super().__init__()
            self.stream = io.TextIOWrapper(io.BytesIO())

    root = logging.getLogger()
    kept = root.handlers[:]
    try:
        for formatter, travels in (
            (logs.JsonFormatter(), True),
            (logging.Formatter(logs.TEXT_FORMAT), True),
            (Streaming(), False),
        ):
            handler = logging.StreamHandler()
            handler.setFormatter(formatter)
            root.handlers[:] = [handler]
            _, sent = logs.current()
            assert (sent is formatter) is travels
            pickle.dumps(sent)  # what the pool hands its workers
    finally:
        root.handlers[:] = kept
