"""The native gRPC face (`grpc.face: native`, native/grpc-face/, `service/native_face.py`): the Go face owns
the public gRPC port; a crowd of unary calls over two plans is coalesced into BatchEvaluate calls to the
engine and every call gets its own sample's answer; every other method is relayed to the engine as it is
(the same answers as the engine's own port, errors included); a SIGKILLed face is replaced; a bad token is
refused at the face; an engine that is away is UNAVAILABLE, never a score; deadlines and cancellation
reach the engine's workers; past `limits.max_pending_calls` a call is refused at once with the retry hint,
and counted as refused on the server's /metrics; an answer made to fit the message limit, and a call too
large to share a chunk, are answered as the engine's own port answers them.
Expected scores come from `json.loads` (`expected.json_score`) and from a server without a gRPC face
answering the same requests.

Those that run the Go face are marked `native`: they need it built (`make native-face`); `make test-native`
builds it and runs them (.ci/run does), and `make test` runs without Go."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from expected import json_score
from faces import (
    AUTH,
    CONFIG,
    LIMIT,
    LIMITED,
    SAMPLES,
    TOKEN,
    check_answers_around_the_limit,
    check_deadlines_and_cancellation_reach_the_engine,
    concurrently,
    listeners,
    outcome,
    relayed_answers,
    responses,
    stub,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpcgrade.core.admission import PENDING_CALLS
from grpcgrade.core.config import parse_config
from grpcgrade.core.errors import ConfigError
from grpcgrade.service.native_face import BINARY, BINARY_ENV, binary
from grpcgrade.service.overload import PUSHBACK_KEY
from grpcgrade.testing import (
    ServerProcess,
    children,
    eventually,
    health_status,
)
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

#: The tests that run the Go face (the last two do not: `make test` runs them).
needs_go = pytest.mark.native

NATIVE = ["--grpc-face", "native", "--grpc-processes", "2"]
CROWD = 4000


def native_pids(server_pid: int) -> list[int]:
    """The server's native gRPC face processes (by their program's name)."""
    out = []
    for pid in children(server_pid):
        try:
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == BINARY:
                out.append(pid)
        except OSError:  # ended meanwhile
            continue
    return out


@pytest.fixture(scope="module")
def native(face_server) -> ServerProcess:
    return face_server(CONFIG, token=TOKEN, workers=2, more=NATIVE)


@pytest.fixture(scope="module")
def direct(face_server) -> ServerProcess:
    """The same configuration served by the engine's process itself (no gRPC face)."""
    return face_server(CONFIG, token=TOKEN, workers=2)


@needs_go
def test_the_go_face_listens_on_the_grpc_port_beside_the_http_face(native):
    pids = native_pids(native.proc.pid)
    assert len(pids) == 1
    # The socket is the server's, inherited: both hold it, only the face accepts (the server never does).
    assert pids[0] in listeners(native.port)
    assert health_status(native.target) == health_pb2.HealthCheckResponse.SERVING  # the engine's, relayed
    # the HTTP face's processes beside it, grading through the same engine
    texts = ['{"a": 1}', "nope"]
    request = urllib.request.Request(
        f"{native.http}/get_reward",
        data=json.dumps({"query": texts}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert json.loads(answer.read())["rewards"] == [json_score(t) for t in texts]


@needs_go
def test_a_crowd_of_unary_calls_over_two_plans_is_answered_every_call(native):
    texts = responses(CROWD)
    outcomes: Counter[str] = Counter()
    samples_before = native.metric("grpcgrade_coalesced_samples_total")
    chunks_before = native.metric("grpcgrade_coalesced_chunks_total")
    ok_before = native.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="OK")
    graders = [{"name": "json_validator"}]

    async def crowd() -> list[tuple[str, float, float | None]]:
        async with grpc.aio.insecure_channel(native.target) as channel:
            evaluate = stub(channel).Evaluate

            async def one(i: int, text: str) -> tuple[str, float, float | None]:
                sample = pb.Sample(id=f"s{i}", response=text)
                request = pb.EvaluateRequest(reward="valid_json", sample=sample, view=pb.RESULT_VIEW_SCORES)
                if i % 2:  # half of them name the grader instead of the reward: two plans at once
                    request = pb.EvaluateRequest(sample=sample)
                    request.graders.add(name=graders[0]["name"])
                try:
                    response = await evaluate(request, metadata=AUTH, timeout=300)
                except grpc.aio.AioRpcError as exc:
                    outcomes[exc.code().name] += 1
                    return ("", -1.0, -1.0)
                outcomes["OK"] += 1
                reward = response.reward if response.HasField("reward") else None
                return response.id, response.results[0].score, reward

            return await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))

    answers = asyncio.run(crowd())
    assert outcomes == {"OK": CROWD}
    assert answers == [(f"s{i}", json_score(t), json_score(t)) for i, t in enumerate(texts)]
    eventually(  # the face sends its counts every 50 ms
        lambda: native.metric("grpcgrade_coalesced_samples_total") - samples_before == CROWD,
        "the native face's coalesced samples in the server's metrics",
    )
    chunks = native.metric("grpcgrade_coalesced_chunks_total") - chunks_before
    assert chunks < CROWD  # calls went to the engine with others of their plan
    eventually(
        lambda: native.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="OK") - ok_before == CROWD,
        "the native face's calls in the server's metrics",
    )
    assert native.metric("grpc_server_handling_seconds_count", grpc_method="Evaluate") >= CROWD


@needs_go
def test_calls_through_the_native_face_answer_as_the_engine_itself_does(native, direct):
    """Evaluate in every view (the coalesced path), bad samples and bad plans (refused by the engine, then
    relayed: the engine's own words), a field the face does not know (relayed as it is), BatchEvaluate in
    both views, ListGraders, the admin service and reflection: the same from both ports."""
    answers = {}
    for name, srv in (("native", native), ("direct", direct)):
        with grpc.insecure_channel(srv.target) as channel:
            grading = stub(channel)
            got: dict[str, object] = {}
            views = (pb.RESULT_VIEW_UNSPECIFIED, pb.RESULT_VIEW_FULL, pb.RESULT_VIEW_SCORES, pb.RESULT_VIEW_COLUMNS)
            for view in views:
                got[f"evaluate-{view}"] = [
                    grading.Evaluate(
                        pb.EvaluateRequest(reward="valid_json", sample=pb.Sample(**s), view=view),
                        metadata=AUTH,
                        timeout=60,
                    )
                    for s in SAMPLES
                ]
            bad = {
                "unknown-reward": pb.EvaluateRequest(reward="nope", sample=pb.Sample(response="1")),
                "unknown-grader": pb.EvaluateRequest(graders=[pb.GraderSpec(name="nope")], sample=pb.Sample()),
                "no-sample": pb.EvaluateRequest(reward="valid_json"),
                "empty-sample": pb.EvaluateRequest(reward="valid_json", sample=pb.Sample(id="e")),
                "timeout": pb.EvaluateRequest(reward="valid_json", sample=pb.Sample(response="[]"),
                                              grader_timeout_seconds=-1),
                "cache-off": pb.EvaluateRequest(reward="valid_json", sample=pb.Sample(response="{}"),
                                                cache=pb.CACHE_MODE_OFF),
            }  # fmt: skip
            for what, request in bad.items():
                got[what] = outcome(lambda r=request, g=grading: g.Evaluate(r, metadata=AUTH, timeout=60))
            # a field EvaluateRequest does not define (99, a varint): the face relays the call as it came
            unknown = pb.EvaluateRequest(reward="valid_json", sample=pb.Sample(response="[1]")).SerializeToString()
            raw = channel.unary_unary("/grpcgrade.v1.GradingService/Evaluate")
            got["unknown-field"] = pb.EvaluateResponse.FromString(raw(unknown + b"\x98\x06\x01", metadata=AUTH))
            got.update(relayed_answers(channel))
            answers[name] = got
    for key, value in answers["direct"].items():
        assert answers["native"][key] == value, key
    assert answers["native"]["unknown-reward"][0] == grpc.StatusCode.NOT_FOUND  # type: ignore[index]
    scores = [item.result.results[0].score for item in answers["native"]["batch-full"]]  # type: ignore[attr-defined]
    assert scores == [json_score(s["response"]) for s in SAMPLES * 50]


@needs_go
def test_a_bad_token_is_refused_at_the_face(native):
    before = native.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="UNAUTHENTICATED")
    with grpc.insecure_channel(native.target) as channel:
        grading = stub(channel)
        request = pb.EvaluateRequest(reward="valid_json", sample=pb.Sample(response="1"))
        for call in (
            lambda md: grading.Evaluate(request, metadata=md, timeout=30),
            lambda md: list(
                grading.BatchEvaluate(pb.BatchEvaluateRequest(reward="valid_json"), metadata=md, timeout=30)
            ),
        ):
            for metadata in ((("authorization", "Bearer wrong"),), (), (("authorization", f"Basic {TOKEN}"),)):
                with pytest.raises(grpc.RpcError) as refused:
                    call(metadata)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert refused.value.details() == "missing or invalid bearer token"
    eventually(
        lambda: (
            native.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="UNAUTHENTICATED") - before
            == 3
        ),
        "refusals counted as the face's calls",
    )


@needs_go
def test_a_killed_go_face_is_started_again_and_answers(face_server):
    srv = face_server(CONFIG, token=TOKEN, more=NATIVE)
    [victim] = native_pids(srv.proc.pid)
    os.kill(victim, signal.SIGKILL)
    eventually(lambda: len(native_pids(srv.proc.pid)) == 1 and victim not in native_pids(srv.proc.pid), "a new face")

    def answers() -> bool:
        with grpc.insecure_channel(srv.target) as channel:
            request = pb.EvaluateRequest(reward="valid_json", sample=pb.Sample(response="[1]"))
            try:
                return all(stub(channel).Evaluate(request, metadata=AUTH, timeout=30).reward == 1.0 for _ in range(8))
            except grpc.RpcError:  # a connection the killed face held
                return False

    eventually(answers, "the new face answers")
    assert f"the native gRPC face (pid {victim}) exited" in srv.log()
    assert health_status(srv.target) == health_pb2.HealthCheckResponse.SERVING


@needs_go
def test_a_face_whose_restart_fails_is_started_again(face_server, tmp_path, monkeypatch):
    """A face that dies is started again; one whose new start fails too (it exits before saying ready) is
    started again after the next pause, until one starts: the port is never left without a face. Before,
    a failed restart ended the tries. The program is a script that runs the Go face, or exits 1 while the
    file `fail` exists."""
    fail = tmp_path / "fail"
    program = tmp_path / "face"
    program.write_text(f'#!/bin/sh\n[ -e {fail} ] && exit 1\nexec {binary()} "$@"\n')
    program.chmod(0o755)
    monkeypatch.setenv(BINARY_ENV, str(program))
    srv = face_server(CONFIG, token=TOKEN, more=NATIVE)
    [victim] = native_pids(srv.proc.pid)
    fail.touch()
    os.kill(victim, signal.SIGKILL)
    eventually(lambda: srv.log().count("the native gRPC face (pid ") >= 3, "two failed starts after the kill")
    fail.unlink()
    eventually(lambda: len(native_pids(srv.proc.pid)) == 1, "a face started again")
    request = pb.EvaluateRequest(reward="valid_json", sample=pb.Sample(response="[1]"))
    with grpc.insecure_channel(srv.target) as channel:
        assert stub(channel).Evaluate(request, metadata=AUTH, timeout=60).reward == 1.0
    assert "exited with 1; starting another" in srv.log()


@needs_go
def test_on_sigterm_the_face_drains_its_calls_and_ends_with_the_server(face_server):
    """SIGTERM to the server: a call in flight through the Go face is answered, the server exits 0, and
    the face is gone with it."""
    srv = face_server(CONFIG, token=TOKEN, workers=1, more=NATIVE)
    [face] = native_pids(srv.proc.pid)
    slow = [pb.GraderSpec(name="sleepy")]
    slow[0].params.update({"seconds": 1.5, "heavy": False})
    with grpc.insecure_channel(srv.target) as channel:
        request = pb.EvaluateRequest(graders=slow, sample=pb.Sample(response="x"))
        call = stub(channel).Evaluate.future(request, metadata=AUTH, timeout=60)
        eventually(lambda: srv.metric("grpcgrade_coalesced_samples_total") >= 1, "the call at the engine")
        assert srv.stop() == 0
        assert call.result().results[0].score == 1.0  # sleepy's score, once it has slept
    assert not os.path.exists(f"/proc/{face}")


@needs_go
@pytest.mark.parametrize("method", ["Evaluate", "BatchEvaluate"])
def test_deadlines_and_cancellation_reach_the_engine(native, method):
    check_deadlines_and_cancellation_reach_the_engine(native, method)


def _face_alone(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], str, socket.socket]:
    """The Go face started by hand on a port of its own, with `args`; once it says ready."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    (tmp_path / "tokens").write_text(f"# the test's\n{TOKEN}\n")
    proc = subprocess.Popen(
        [binary(), f"--listen-fd={listener.fileno()}", f"--token-file={tmp_path / 'tokens'}",
         '--methods={"/grpcgrade.v1.GradingService/Evaluate": "unary", '
         '"/grpcgrade.v1.GradingService/BatchEvaluate": "server_stream", "/grpc.health.v1.Health/Check": "unary"}',
         *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(listener.fileno(),),
    )  # fmt: skip
    assert proc.stdout is not None
    assert b'"ready"' in proc.stdout.readline()
    return proc, f"127.0.0.1:{listener.getsockname()[1]}", listener


@needs_go
def test_an_engine_that_is_away_is_unavailable_never_a_score(tmp_path):
    proc, target, listener = _face_alone(tmp_path, f"--engine=unix:{tmp_path / 'no-engine.sock'}")
    try:
        with grpc.insecure_channel(target) as channel:
            grading = stub(channel)
            evaluate = pb.EvaluateRequest(
                graders=[pb.GraderSpec(name="json_validator")], sample=pb.Sample(response="1")
            )
            calls = {
                "evaluate": lambda md: grading.Evaluate(evaluate, metadata=md, timeout=30),
                "batch": lambda md: list(grading.BatchEvaluate(pb.BatchEvaluateRequest(reward="r"), metadata=md)),
                "health": lambda md: health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[no-untyped-call]
                    health_pb2.HealthCheckRequest(), timeout=30
                ),
            }
            outcomes = {}
            for name, call in calls.items():
                for who, metadata in (("", AUTH), ("-bad-token", (("authorization", "Bearer no"),))):
                    outcomes[name + who] = outcome(lambda c=call, m=metadata: c(m))
    finally:
        proc.stdin.close()  # type: ignore[union-attr]  # as when the server's process ends: the face ends too
        assert proc.wait(30) == 0
        listener.close()
    for name in ("evaluate", "batch", "health", "health-bad-token"):  # health needs no token
        code, details = outcomes[name]  # type: ignore[misc]
        assert code == grpc.StatusCode.UNAVAILABLE, (name, code, details)
        assert "the grading engine is not reachable now" in details
    for name in ("evaluate-bad-token", "batch-bad-token"):
        assert outcomes[name][0] == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[index]


class CountingEngine(pb_grpc.GradingServiceServicer):
    """A real gRPC server in the engine's place, counting its calls per method and scoring each sample by
    `json.loads`. BatchEvaluateUnary refuses a chunk holding "over" as the engine refuses an answer over one
    message (RESOURCE_EXHAUSTED, no retry hint), and one holding "busy" as it refuses for load (with the
    hint): the first is to be asked again as BatchEvaluate, the second is its calls' answer."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()

    def _counted(self, method: str, request: pb.BatchEvaluateRequest) -> list[pb.BatchItem]:
        with self.lock:
            self.calls[method] += 1
        items = []
        for index, sample in enumerate(request.samples):
            result = pb.EvaluateResponse(id=sample.id, results=[pb.GraderResult(score=json_score(sample.response))])
            items.append(pb.BatchItem(index=index, result=result))
        return items

    def BatchEvaluateUnary(self, request, context):  # type: ignore[no-untyped-def]
        items = self._counted("BatchEvaluateUnary", request.batch)
        texts = {sample.response for sample in request.batch.samples}
        if "busy" in texts:
            context.set_trailing_metadata(((PUSHBACK_KEY, "250"),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "server busy")
        if "over" in texts:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "the answer is over one message")
        return pb.BatchEvaluateUnaryResponse(answer=pb.BatchEvaluateResponse(items=items))

    def BatchEvaluate(self, request, context):  # type: ignore[no-untyped-def]
        for item in self._counted("BatchEvaluate", request):
            yield pb.BatchEvaluateResponse(items=[item])


@needs_go
def test_a_chunk_goes_to_the_engine_as_batch_evaluate_unary_and_as_batch_evaluate_when_over_one_message(tmp_path):
    """The face's chunks are BatchEvaluateUnary calls (one message each way: less of the engine's CPU than a
    stream); a chunk whose answer the engine says is over one message is asked again as BatchEvaluate; a
    refusal for load is the calls' answer, with its retry hint, and is not asked again. The engine's calls
    counted per method at a real gRPC server in its place."""
    engine = CountingEngine()
    server = grpc.server(futures.ThreadPoolExecutor(8))
    pb_grpc.add_GradingServiceServicer_to_server(engine, server)
    server.add_insecure_port(f"unix:{tmp_path / 'engine.sock'}")
    server.start()
    proc, target, listener = _face_alone(tmp_path, f"--engine=unix:{tmp_path / 'engine.sock'}")
    texts = responses(300)
    try:
        with grpc.insecure_channel(target) as channel:
            evaluate = stub(channel).Evaluate.with_call

            def call(i: int, text: str) -> object:
                request = pb.EvaluateRequest(graders=[pb.GraderSpec(name="json_validator")])
                request.sample.CopyFrom(pb.Sample(id=f"s{i}", response=text))
                try:
                    answer, _ = evaluate(request, metadata=AUTH, timeout=60)
                except grpc.RpcError as exc:
                    return exc.code(), exc.details(), dict(exc.trailing_metadata() or ()).get(PUSHBACK_KEY)
                return answer.id, answer.results[0].score

            alone = [call(0, "[1]")]
            counted = [+engine.calls]
            alone.append(call(1, "over"))
            counted.append(+engine.calls)
            alone.append(call(2, "busy"))
            counted.append(+engine.calls)
            with futures.ThreadPoolExecutor(32) as pool:
                crowd = list(pool.map(call, range(len(texts)), texts))
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        assert proc.wait(30) == 0
        listener.close()
        server.stop(None)
    assert alone == [
        ("s0", json_score("[1]")),
        ("s1", json_score("over")),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "server busy", "250"),
    ]
    assert counted == [
        {"BatchEvaluateUnary": 1},
        {"BatchEvaluateUnary": 2, "BatchEvaluate": 1},  # refused for its size: asked again, streamed
        {"BatchEvaluateUnary": 3, "BatchEvaluate": 1},  # refused for load: answered so
    ]
    assert crowd == [(f"s{i}", json_score(t)) for i, t in enumerate(texts)]
    assert engine.calls["BatchEvaluate"] == 1  # the crowd's chunks: every one a BatchEvaluateUnary
    assert 3 < engine.calls["BatchEvaluateUnary"] <= 3 + len(texts)


@needs_go
def test_the_face_serves_mutual_tls_with_the_servers_files(tmp_path, pki):
    """--tls-cert/--tls-key/--tls-client-ca: a client with a certificate of the CA gets through TLS to the
    face (here: to its relay, the engine being away); a client whose certificate another CA signed does not."""
    files = [f"--tls-cert={pki.path('server.crt')}", f"--tls-key={pki.path('server.key')}"]
    files.append(f"--tls-client-ca={pki.path('ca.crt')}")
    proc, target, listener = _face_alone(tmp_path, f"--engine=unix:{tmp_path / 'absent.sock'}", *files)
    outcomes = {}
    try:
        for who in ("client", "stranger"):
            with grpc.secure_channel(target, pki.credentials(client=who)) as channel:
                check = health_pb2_grpc.HealthStub(channel).Check  # type: ignore[no-untyped-call]
                outcomes[who] = outcome(lambda c=check: c(health_pb2.HealthCheckRequest(), timeout=10))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        listener.close()
    assert outcomes["client"][0] == grpc.StatusCode.UNAVAILABLE  # type: ignore[index]
    assert "the grading engine is not reachable now" in outcomes["client"][1]  # type: ignore[index]
    assert "the grading engine" not in str(outcomes["stranger"])


@needs_go
def test_calls_past_the_bound_are_refused_at_once_with_the_retry_hint(tmp_path):
    """--max-calls (the server's limits.max_pending_calls): a call past it is RESOURCE_EXHAUSTED at once
    with gRPC's retry pushback trailer, never CANCELLED; the calls within it wait for the engine."""
    engine = tmp_path / "slow-engine.sock"
    slow = socket.socket(socket.AF_UNIX)  # an engine that accepts and never answers: calls stay in flight
    slow.bind(str(engine))
    slow.listen(16)
    proc, target, listener = _face_alone(tmp_path, f"--engine=unix:{engine}", "--max-calls=3", "--retry-after=0.25")
    try:

        async def crowd() -> list[tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]]:
            async with grpc.aio.insecure_channel(target) as channel:
                evaluate = stub(channel).Evaluate
                request = pb.EvaluateRequest(reward="r", sample=pb.Sample(response="1"))

                async def one() -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
                    call = evaluate(request, metadata=AUTH, timeout=3)
                    try:
                        await call
                    except grpc.aio.AioRpcError as exc:
                        return exc.code(), exc.details() or "", tuple(exc.trailing_metadata() or ())
                    return grpc.StatusCode.OK, "", ()

                return await asyncio.gather(*(one() for _ in range(10)))

        outcomes = asyncio.run(crowd())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        listener.close()
        slow.close()
    codes = Counter(code for code, _, _ in outcomes)
    assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED: 7, grpc.StatusCode.DEADLINE_EXCEEDED: 3}
    refused = [
        (details, trailers) for code, details, trailers in outcomes if code == grpc.StatusCode.RESOURCE_EXHAUSTED
    ]
    for details, trailers in refused:
        assert details.startswith("server busy:") and "limits.max_pending_calls" in details
        assert (PUSHBACK_KEY, "250") in trailers


BOUND = 3
PENDING = f"""
default_reward: napping
limits: {{max_pending_calls: {BOUND}, retry_after_seconds: 0.25}}
cache: {{enabled: false}}
rewards:
  napping: [{{name: napper}}]
"""


@needs_go
def test_the_faces_refusals_past_its_bound_are_counted_as_refused(face_server):
    """A crowd past `limits.max_pending_calls` at a real server's Go face: the calls within the bound are
    held (napper never answers "hang"), the rest are refused at once, and the server's /metrics counts
    every refusal the callers saw in `grpcgrade_calls_refused_total{limit="max_pending_calls"}`, as the
    engine's own refusals are counted (before, they showed only in grpc_server_handled_total)."""
    srv = face_server(PENDING, token=TOKEN, more=NATIVE)

    def refused() -> float:
        return srv.metric("grpcgrade_calls_refused_total", limit=PENDING_CALLS)

    def exhausted() -> float:
        return srv.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="RESOURCE_EXHAUSTED")

    before, exhausted_before = refused(), exhausted()
    request = pb.EvaluateRequest(reward="napping", sample=pb.Sample(response="hang"))
    with grpc.insecure_channel(srv.target) as channel:
        evaluate = stub(channel).Evaluate
        calls = [evaluate.future(request, metadata=AUTH, timeout=300) for _ in range(40)]
        eventually(lambda: sum(call.done() for call in calls) >= len(calls) - BOUND, "the calls past the bound ended")
        ended = [call for call in calls if call.done()]
        seen = Counter(call.code() for call in ended)
        assert seen == {grpc.StatusCode.RESOURCE_EXHAUSTED: len(calls) - BOUND}
        assert all((PUSHBACK_KEY, "250") in call.trailing_metadata() for call in ended)
        eventually(lambda: refused() - before == len(ended), "the face's refusals in grpcgrade_calls_refused_total")
        assert exhausted() - exhausted_before == len(ended)
        assert srv.metric("grpcgrade_admission_limit", limit=PENDING_CALLS) == BOUND
        for call in calls:
            call.cancel()
    assert refused() - before == len(ended)  # the held calls, cancelled, are not refusals


@pytest.fixture(scope="module")
def limited(face_server) -> dict[str, ServerProcess]:
    """A server with a 100,000-byte message limit through the Go face, and the same served by the engine's
    own port. The longest linger (0.1 s) gathers the calls that arrive while a chunk of their plan is graded."""
    return {
        "native": face_server(LIMITED, workers=1, more=NATIVE),
        "direct": face_server(LIMITED, workers=1),
    }


@needs_go
def test_an_answer_made_to_fit_the_limit_is_the_engines_own(limited):
    """Through the Go face, answers around the message limit are the engine's own port's: an answer the
    engine left out the details of as a batch item, which fits the call's message, the face asks again of
    the engine's Evaluate (`faces.check_answers_around_the_limit` says how)."""
    check_answers_around_the_limit(limited["native"], limited["direct"])


@needs_go
def test_a_call_too_large_to_share_a_chunk_is_answered_as_the_engine_does(limited):
    """The pass-through: a call whose sample and plan take half the message limit or more goes to the engine
    as it came. Samples of 60-99% of the limit; and a plan of 60% of it (count_word's `word`) with samples
    of 20% each, sent while a call of that plan is held (napper's "hang"), so they gather: in one chunk
    (two samples and the plan are over the limit) the engine could not take them, and the callers got
    RESOURCE_EXHAUSTED where the engine's own port answers each."""
    big = [
        pb.EvaluateRequest(graders=[pb.GraderSpec(name="json_validator")], sample=pb.Sample(id=f"b{i}", response=text))
        for i, text in enumerate([json.dumps("x" * int(LIMIT * 0.6)), "{" * int(LIMIT * 0.99) + "}"])
    ]
    word = pb.GraderSpec(name="count_word")
    word.params.update({"word": "w" * int(LIMIT * 0.6)})
    plan = [pb.GraderSpec(name="json_validator"), word, pb.GraderSpec(name="napper")]
    texts = [json.dumps({"n": i, "pad": "p" * int(LIMIT * 0.2)}) for i in range(6)]
    gathered = [pb.EvaluateRequest(graders=plan, sample=pb.Sample(id=f"g{i}", response=t)) for i, t in enumerate(texts)]
    held = pb.EvaluateRequest(graders=plan, sample=pb.Sample(response="hang"))
    answers = {}
    for name, srv in limited.items():
        answers[name] = concurrently(srv, big) + concurrently(srv, gathered, held)
    assert answers["native"] == answers["direct"]
    for answer, request in zip(answers["native"], big + gathered, strict=True):
        assert isinstance(answer, pb.EvaluateResponse), answer
        assert answer.id == request.sample.id
        assert answer.results[0].score == json_score(request.sample.response)


def test_a_missing_program_fails_the_start_naming_make_native_face(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "grpcgrade.cli", "serve", "--workers", "0", "--port", "0", "--metrics-port", "0",
         "--grpc-face", "native"],
        capture_output=True, text=True, timeout=120, env={**os.environ, BINARY_ENV: str(tmp_path / "absent")},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr  # a configuration error's
    assert "make native-face" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_grpc_face_setting_is_checked():
    with pytest.raises(ConfigError) as refused:
        parse_config({"grpc": {"face": "rust"}}, "c.yaml")
    assert "grpc: face must be one of python, native, not 'rust'" in str(refused.value)
    assert parse_config({"grpc": {"face": "native"}}, "c.yaml").grpc.face == "native"
    assert parse_config({}, "c.yaml").grpc.face == "python"
    out = subprocess.run(
        [sys.executable, "-m", "grpcgrade.cli", "serve", "--grpc-face", "rust"], capture_output=True, text=True
    )
    assert out.returncode != 0 and "--grpc-face rust: one of python, native" in out.stderr
    assert re.search(r"Traceback", out.stderr) is None


@needs_go
def test_the_per_sample_bench_drives_the_native_face_and_its_floor(tmp_path):
    """`bench --per-sample` with the Go face built: its rows (the face, and its `--floor`) beside the others,
    every call answered (the face's answers counted by the server from the face's counts), and the gRPC goal
    read from the best of the default, a face process per core and the native face."""
    cmd = [sys.executable, "-m", "grpcgrade.cli", "bench", "--per-sample", "--samples", "300", "--callers", "60"]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    for name in ("grpc_native", "floor_grpc_native"):
        assert report[f"{name}_failed"] == 0
        assert report[f"{name}_server_cpu_us"] >= 0  # read in clock ticks: 300 calls of ~30 us may show none
        ratio = report[f"{name}_per_second"] / report["fastapi_per_second"]
        assert report[f"{name}_x_fastapi"] == pytest.approx(ratio, abs=0.01)
    names = ("grpc", "grpc_cores", "grpc_native")
    best = max((n for n in names if f"{n}_x_fastapi" in report), key=lambda n: report[f"{n}_x_fastapi"])
    assert report["goals"]["grpc_x_fastapi"]["by"] == best
