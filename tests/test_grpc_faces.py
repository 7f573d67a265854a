"""The public gRPC port served by face processes (`grpc.processes`, `service/grpc_face.py`): they listen on
it side by side and the engine's process does not; a crowd of unary calls is coalesced into BatchEvaluate
calls to the engine and every call gets its own sample's score; every other method is relayed to the
engine as it is (the same answers as the engine's own port); a killed face is replaced; a bad token is
refused at the face; an engine that is away is UNAVAILABLE, never a score; deadlines and cancellation
reach the engine's workers. Expected scores come from `json.loads` (`expected.json_score`) and from a
server without gRPC face processes answering the same requests."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections import Counter

import grpc
import pytest
from expected import json_score
from faces import (
    AUTH,
    CONFIG,
    LIMITED,
    SAMPLES,
    TOKEN,
    check_answers_around_the_limit,
    check_deadlines_and_cancellation_reach_the_engine,
    listeners,
    relayed_answers,
    responses,
    stub,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpcgrade.core.config import ServerConfig, parse_config
from grpcgrade.core.engine import Engine
from grpcgrade.core.errors import ConfigError
from grpcgrade.core.registry import get_registry
from grpcgrade.service.convert import sample_to_pb, specs_to_pb
from grpcgrade.service.counters import FaceCounters
from grpcgrade.service.grpc_face import build_grpc_face
from grpcgrade.service.link import EngineLink
from grpcgrade.testing import (
    ServerProcess,
    eventually,
    face_pids,
    free_port,
    health_status,
)
from grpcgrade.v1 import grading_pb2 as pb

CROWD = 3000


@pytest.fixture(scope="module")
def faces(face_server) -> ServerProcess:
    return face_server(CONFIG, token=TOKEN, workers=2, more=["--grpc-processes", "2"])


@pytest.fixture(scope="module")
def direct(face_server) -> ServerProcess:
    """The same configuration served by the engine's process itself (no gRPC face process)."""
    return face_server(CONFIG, token=TOKEN, workers=2)


def test_the_faces_listen_on_the_grpc_port_and_the_engine_process_does_not(faces):
    pids = face_pids(faces.proc.pid)
    assert len(pids) == 2
    assert listeners(faces.port) == set(pids)  # the server only holds the port (SO_REUSEPORT)
    assert health_status(faces.target) == health_pb2.HealthCheckResponse.SERVING  # the engine's, relayed


def test_a_crowd_of_unary_calls_through_the_faces_is_answered_every_call(faces):
    texts = responses(CROWD)
    outcomes: Counter[str] = Counter()
    samples_before = faces.metric("grpcgrade_coalesced_samples_total")
    chunks_before = faces.metric("grpcgrade_coalesced_chunks_total")
    ok_before = faces.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="OK")

    async def crowd() -> list[tuple[float, float, float]]:
        async with grpc.aio.insecure_channel(faces.target) as channel:
            evaluate = stub(channel).Evaluate
            graders = specs_to_pb(["json_validator"])

            async def one(text: str) -> tuple[float, float, float]:
                request = pb.EvaluateRequest(reward="valid_json", sample=sample_to_pb({"response": text}))
                if len(text) % 2:  # half of them name the grader instead of the reward: two plans at once
                    request = pb.EvaluateRequest(graders=graders, sample=sample_to_pb({"response": text}))
                try:
                    response = await evaluate(request, metadata=AUTH, timeout=300)
                except grpc.aio.AioRpcError as exc:
                    outcomes[exc.code().name] += 1
                    return (-1.0, -1.0, -1.0)
                outcomes["OK"] += 1
                gate = response.results[1].score if len(response.results) > 1 else 1.0
                return response.results[0].score, gate, response.reward

            return await asyncio.gather(*(one(t) for t in texts))

    answers = asyncio.run(crowd())
    assert outcomes == {"OK": CROWD}
    assert answers == [(json_score(t), 1.0, json_score(t)) for t in texts]
    # every call went to the engine in a face's chunk (the faces send their counts every 50 ms) ...
    eventually(
        lambda: faces.metric("grpcgrade_coalesced_samples_total") - samples_before == CROWD,
        "the faces' coalesced samples in the server's metrics",
    )
    samples = faces.metric("grpcgrade_coalesced_samples_total") - samples_before
    chunks = faces.metric("grpcgrade_coalesced_chunks_total") - chunks_before
    assert samples == CROWD
    assert chunks < samples  # ... with others of its plan
    # each call counted once, by the face that answered it, in the server's /metrics
    eventually(
        lambda: faces.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="OK") - ok_before == CROWD,
        "the faces' counts in the server's metrics",
    )


def test_calls_through_the_faces_answer_as_the_engine_itself_does(faces, direct):
    """Evaluate in both views, BatchEvaluate in both views (a stream, relayed as bytes), ListGraders, the
    admin service and reflection: the same answers from the faces' port as from the engine's own."""
    answers = {}
    for name, srv in (("faces", faces), ("direct", direct)):
        with grpc.insecure_channel(srv.target) as channel:
            grading = stub(channel)
            got: dict[str, object] = {}
            for view in (pb.RESULT_VIEW_FULL, pb.RESULT_VIEW_SCORES):
                got[f"evaluate-{view}"] = [
                    grading.Evaluate(
                        pb.EvaluateRequest(reward="valid_json", sample=sample_to_pb(s), view=view),
                        metadata=AUTH,
                        timeout=60,
                    )
                    for s in SAMPLES
                ]
            got.update(relayed_answers(channel))
            answers[name] = got
    assert answers["faces"] == answers["direct"]
    assert "grpcgrade.v1.GradingService" in answers["faces"]["services"]  # type: ignore[operator]
    scores = [item.result.results[0].score for item in answers["faces"]["batch-full"]]  # type: ignore[attr-defined]
    assert scores == [json_score(s["response"]) for s in SAMPLES * 50]


def test_a_bad_token_is_refused_at_the_face(faces):
    with grpc.insecure_channel(faces.target) as channel:
        grading = stub(channel)
        request = pb.EvaluateRequest(reward="valid_json", sample=sample_to_pb({"response": "1"}))
        for call in (
            lambda md: grading.Evaluate(request, metadata=md, timeout=30),
            lambda md: list(
                grading.BatchEvaluate(pb.BatchEvaluateRequest(reward="valid_json"), metadata=md, timeout=30)
            ),
        ):
            for metadata in ((("authorization", "Bearer wrong"),), ()):
                with pytest.raises(grpc.RpcError) as refused:
                    call(metadata)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    eventually(
        lambda: faces.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="UNAUTHENTICATED") >= 2,
        "refusals counted as the faces' calls",
    )


def test_a_killed_grpc_face_is_started_again_and_answers(face_server):
    srv = face_server(CONFIG, token=TOKEN, more=["--grpc-processes", "2"])
    victim = face_pids(srv.proc.pid)[-1]
    os.kill(victim, signal.SIGKILL)
    eventually(lambda: len(face_pids(srv.proc.pid)) == 2 and victim not in face_pids(srv.proc.pid), "a new face")

    def answers() -> bool:
        with grpc.insecure_channel(srv.target) as channel:  # a new channel: new connections, spread anew
            request = pb.EvaluateRequest(reward="valid_json", sample=sample_to_pb({"response": "[1]"}))
            try:
                return all(stub(channel).Evaluate(request, metadata=AUTH, timeout=30).reward == 1.0 for _ in range(8))
            except grpc.RpcError:  # still starting, or a connection the killed face held
                return False

    eventually(answers, "the faces answer")
    assert f"face process 1 (pid {victim}) exited" in srv.log() or f"face process 0 (pid {victim}) exited" in srv.log()
    assert health_status(srv.target) == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("method", ["Evaluate", "BatchEvaluate"])
def test_deadlines_and_cancellation_reach_the_engine(faces, method):
    check_deadlines_and_cancellation_reach_the_engine(faces, method)


@pytest.fixture(scope="module")
def limited(face_server) -> dict[str, ServerProcess]:
    """A server with a 100,000-byte message limit through two face processes, and the same served by the
    engine's own port."""
    return {
        "faces": face_server(LIMITED, workers=1, more=["--grpc-processes", "2"]),
        "direct": face_server(LIMITED, workers=1),
    }


def test_an_answer_made_to_fit_the_limit_is_the_engines_own(limited):
    """Through the face processes, answers around the message limit are the engine's own port's: an answer
    the engine left out the details of as an item of the link's BatchEvaluate, which fits the call's own
    message, the face asks again of the engine's Evaluate (`faces.check_answers_around_the_limit`)."""
    check_answers_around_the_limit(limited["faces"], limited["direct"])


def test_an_engine_that_is_away_is_unavailable_never_a_score(tmp_path):
    """A face whose engine's socket answers nobody (restarting, gone): every call ends UNAVAILABLE saying
    so, health included (never SERVING); a bad token is refused at the face before that."""
    config = ServerConfig()
    engine = Engine(get_registry(), None, grader_timeout=5.0)
    port = free_port()

    async def run() -> dict[str, tuple[grpc.StatusCode, str]]:
        link = EngineLink(f"unix:{tmp_path / 'no-engine.sock'}", None, config.limits.max_message_bytes)
        server = build_grpc_face(engine, config.limits, link, 0.002, [TOKEN], FaceCounters(), [])
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        out = {}
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                grading = stub(channel)
                evaluate = pb.EvaluateRequest(graders=specs_to_pb(["json_validator"]), sample=pb.Sample(response="1"))
                calls = {
                    "evaluate": lambda md: grading.Evaluate(evaluate, metadata=md, timeout=30),
                    "batch": lambda md: grading.BatchEvaluate(
                        pb.BatchEvaluateRequest(reward="r", samples=[pb.Sample(response="1")]), metadata=md, timeout=30
                    ),
                    "health": lambda md: health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[no-untyped-call]
                        health_pb2.HealthCheckRequest(), timeout=30
                    ),
                }
                for name, call in calls.items():
                    for who, metadata in (("", AUTH), ("-bad-token", (("authorization", "Bearer no"),))):
                        try:
                            answer = call(metadata)
                            if name == "batch":
                                async for _ in answer:
                                    pass
                            else:
                                await answer
                            out[name + who] = (grpc.StatusCode.OK, "")
                        except grpc.aio.AioRpcError as exc:
                            out[name + who] = (exc.code(), exc.details() or "")
        finally:
            await server.stop(None)
            await link.close()
        return out

    outcomes = asyncio.run(run())
    for name in ("evaluate", "batch", "health", "health-bad-token"):  # health needs no token
        code, details = outcomes[name]
        assert code == grpc.StatusCode.UNAVAILABLE, (name, code, details)
        assert "the grading engine is not reachable now" in details
    for name in ("evaluate-bad-token", "batch-bad-token"):
        assert outcomes[name][0] == grpc.StatusCode.UNAUTHENTICATED


def test_a_port_in_use_fails_the_start_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "grpcgrade.cli", "serve", "--workers", "0", "--port", str(port),
             "--metrics-port", "0", "--grpc-processes", "2"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert out.returncode == 1
    assert f"grpcgrade serve: --port {port}: cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("option", ["--port", "--http-port"])
def test_a_port_another_servers_faces_share_fails_the_start_naming_it(option):
    """Face processes listen with SO_REUSEPORT, which the kernel lets every socket of the same user share:
    a second server given the port of a running server's faces must fail, not split its callers."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as a running server's face holds it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--port": "0", "--http-port": "0", option: str(port)}
        out = subprocess.run(
            [sys.executable, "-m", "grpcgrade.cli", "serve", "--workers", "0", "--metrics-port", "0",
             "--grpc-processes", "1", *(x for item in ports.items() for x in item)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert f"grpcgrade serve: {option} {port}: cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("grpc_section", "message"),
    [
        ({"processes": -1}, "grpc: processes must be a whole number from 0 to 64"),
        ({"processes": 65}, "grpc: processes must be a whole number from 0 to 64"),
        ({"processes": True}, "grpc: processes must be a whole number from 0 to 64"),
        ({"procs": 2}, "grpc: unknown key 'procs' (allowed: processes, face, max_connections, "),
        ([2], "grpc must be a mapping"),
    ],
)
def test_the_grpc_section_is_checked(grpc_section, message):
    with pytest.raises(ConfigError) as refused:
        parse_config({"grpc": grpc_section}, "c.yaml")
    assert message in str(refused.value)
    assert parse_config({"grpc": {"processes": 2}}, "c.yaml").grpc.processes == 2
    assert parse_config({}, "c.yaml").grpc.processes == 0
