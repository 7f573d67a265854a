"""A crowd of per-sample callers (issue 35): thousands of concurrent one-sample calls over gRPC and HTTP
against a real server; every call is answered with its own sample's score, or refused at once for load
(RESOURCE_EXHAUSTED / 503 with a retry hint) and answered when sent again. None is lost or CANCELLED.

The server's admission limit is set low (`max_concurrent_calls: 200`), so the crowd is refused in part and
the refusal path runs: the Python client's retry for gRPC, a trainer's retry after Retry-After for HTTP.
The expected scores come from `json.loads` itself (json_validator: 1 for valid JSON, else 0). Beside it,
the test plugin's `sleepy` (2 ms of a worker's CPU, then 1.0; a gate of the HTTP reward) makes each call
wait for a worker, as real grading does, so calls overlap and pass the limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import subprocess
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp
import grpc
import pytest
from expected import json_score

from grpcgrade.client import AsyncGradingClient
from grpcgrade.core.admission import PUSHBACK_KEY
from grpcgrade.core.config import HttpConfig
from grpcgrade.service.convert import sample_to_pb, specs_to_pb
from grpcgrade.testing import eventually
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

CROWD = 4000
GRADERS = ["json_validator", {"name": "sleepy", "params": {"seconds": 0.002, "heavy": False}}]
CONFIG = """
default_reward: valid_json
limits: {max_concurrent_calls: 200, retry_after_seconds: 0.05}
cache: {enabled: false}
rewards:
  valid_json:
    - {name: json_validator}
    - {name: sleepy, params: {seconds: 0.002, heavy: false}, gate: true}
"""


def responses(n: int) -> list[str]:
    """Distinct responses, about a third of them not JSON."""
    return [f'{{"n": {i}}}' if i % 3 else f"{{n: {i}" for i in range(n)]


@pytest.fixture(scope="module")
def crowd_server(face_server):
    return face_server(CONFIG, workers=2)


def test_a_grpc_crowd_is_answered_every_call(crowd_server):
    texts = responses(CROWD)
    outcomes: Counter[str] = Counter()
    refused_before = crowd_server.metric("grpcgrade_calls_refused_total")

    async def crowd() -> list[float | None]:
        async with AsyncGradingClient(crowd_server.target, timeout=300) as client:
            # The limit's 200 calls held first (napper stalls on "hang" until its 5 s limit: answered, not
            # cancelled), so the crowd is refused in part whatever the machine's speed; before, a slow host's
            # server sometimes kept up with the one client and nothing was refused.
            hang = [{"name": "napper"}]
            held = [
                asyncio.ensure_future(client.evaluate({"response": "hang"}, hang, grader_timeout=5)) for _ in range(200)
            ]
            await asyncio.to_thread(
                eventually, lambda: crowd_server.metric("grpcgrade_calls_admitted") == 200, "the limit held"
            )

            async def one(text: str) -> float | None:
                try:
                    response = await client.evaluate({"response": text}, GRADERS)
                except grpc.RpcError as exc:
                    outcomes[exc.code().name] += 1
                    return None
                outcomes["OK"] += 1
                assert response.results[1].score == 1.0  # sleepy's, always
                return response.results[0].score

            scores = await asyncio.gather(*(one(t) for t in texts))
            assert {r.results[0].error.code for r in await asyncio.gather(*held)} == {"TIMEOUT"}
            return scores

    scores = asyncio.run(crowd())
    assert outcomes == {"OK": CROWD}
    assert scores == [json_score(t) for t in texts]
    refused = crowd_server.metric("grpcgrade_calls_refused_total", limit="max_concurrent_calls") - refused_before
    handled = crowd_server.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="RESOURCE_EXHAUSTED")
    assert refused > 0  # the crowd passed the limit: the refusal and the client's retry were exercised
    assert handled == refused
    assert crowd_server.metric("grpc_server_handled_total", grpc_method="Evaluate", grpc_code="CANCELLED") == 0
    assert crowd_server.metric("grpcgrade_calls_admitted") == 0
    assert crowd_server.metric("grpcgrade_samples_queued") == 0
    # concurrent calls of the same graders were graded together: fewer chunks than calls
    assert crowd_server.metric("grpcgrade_coalesced_samples_total") >= CROWD
    assert crowd_server.metric("grpcgrade_coalesced_chunks_total") < crowd_server.metric(
        "grpcgrade_coalesced_samples_total"
    )


def test_an_http_crowd_is_answered_or_refused_with_a_retry_hint(crowd_server):
    texts = responses(CROWD // 2)
    refusals: list[str] = []
    coalesced_before = crowd_server.metric("grpcgrade_coalesced_samples_total")

    async def crowd() -> list[float]:
        connector = aiohttp.TCPConnector(limit=0)  # every caller on its own connection, as separate workers
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:

            async def one(text: str) -> float:
                while True:  # a trainer's retry: 503 means "later", after Retry-After
                    async with session.post(f"{crowd_server.http}/get_reward", json={"query": [text]}) as r:
                        if r.status == 503:
                            refusals.append(r.headers["Retry-After"])
                            await asyncio.sleep(float(r.headers["Retry-After"]))
                            continue
                        assert r.status == 200, await r.text()
                        body = await r.json()
                        assert body["extra_logs"]["grpcgrade_failed"] == [0.0]
                        return body["rewards"][0]

            return await asyncio.gather(*(one(t) for t in texts))

    assert asyncio.run(crowd()) == [json_score(t) for t in texts]
    assert refusals and all(int(after) >= 1 for after in refusals)
    assert crowd_server.metric("grpcgrade_http_requests_total", code="503") == len(refusals)
    # every one-sample request went through the server's coalescer (graded with the others of its reward)
    assert crowd_server.metric("grpcgrade_coalesced_samples_total") - coalesced_before == len(texts)
    assert crowd_server.metric("grpcgrade_calls_admitted") == 0


def test_the_http_face_listens_with_a_backlog_for_a_crowd(crowd_server):
    """A crowd connects at once, faster than one event loop accepts: the kernel holds the connections not yet
    accepted, as many as the listening socket's backlog. With asyncio's default of 100, the kernel dropped the
    rest's SYNs and their callers resent them only after 1, 3, 7 s (4,000 callers: the slowest answered after
    55 s). The backlog asked for is the connection cap (`http.max_connections`, 4,096), capped by the kernel's
    somaxconn; `ss` reports a listening socket's backlog as its Send-Q."""
    port = crowd_server.http_port
    listing = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    (line,) = listing.splitlines()
    backlog = int(line.split()[2])
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert backlog == min(HttpConfig().max_connections, somaxconn)


def test_a_refusal_carries_the_limit_and_the_hint(crowd_server):
    """What a caller without our client sees: RESOURCE_EXHAUSTED naming the limit, the pushback trailer.
    300 calls whose grading stalls (the test plugin's async `napper` on "hang"): the limit's 200 are held,
    so the other 100 are refused whatever the machine's speed, and then the held ones are cancelled. (A
    burst of quick calls only sometimes overlapped 200 deep: on a slow host the server kept up with the
    one client sending them, and none was refused.)"""
    limit, extra = 200, 100

    async def burst() -> list[grpc.aio.AioRpcError]:
        async with grpc.aio.insecure_channel(crowd_server.target) as channel:
            evaluate = channel.unary_unary(
                "/grpcgrade.v1.GradingService/Evaluate",
                request_serializer=pb.EvaluateRequest.SerializeToString,
                response_deserializer=pb.EvaluateResponse.FromString,
            )
            request = pb.EvaluateRequest(graders=[pb.GraderSpec(name="napper")], sample=pb.Sample(response="hang"))
            calls = [evaluate(request, timeout=120) for _ in range(limit + extra)]
            refused: list[grpc.aio.AioRpcError] = []
            try:
                for ended in asyncio.as_completed(calls):
                    try:
                        await ended
                    except grpc.aio.AioRpcError as exc:
                        refused.append(exc)
                    if len(refused) == extra:
                        break
            finally:
                for call in calls:
                    call.cancel()
        return refused

    errors = asyncio.run(burst())
    assert len(errors) == extra
    for exc in errors:
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.max_concurrent_calls" in exc.details()
        assert dict(exc.trailing_metadata())["grpc-retry-pushback-ms"] == "50"
    # counted, not logged one by one: a crowd refused by the thousand would flood the log
    assert crowd_server.metric("grpcgrade_calls_refused_total") >= len(errors)
    assert "code=RESOURCE_EXHAUSTED" not in crowd_server.log()
    eventually(lambda: crowd_server.metric("grpcgrade_calls_admitted") == 0, "the held calls cancelled")


def test_admission_refuses_past_each_limit_and_frees_what_ends():
    from grpcgrade.core.admission import Admission
    from grpcgrade.core.errors import Overloaded
    from grpcgrade.core.samples import Limits

    rss, now = [100], [0.0]
    limits = Limits(max_concurrent_calls=2, max_queued_samples=10, max_memory_bytes=1000)
    admission = Admission(limits, memory=lambda: rss[0], clock=lambda: now[0])
    admission.enter(8)
    with pytest.raises(Overloaded, match="max_queued_samples"):
        admission.enter(3)  # 8 queued + 3 > 10
    admission.enter(2)
    with pytest.raises(Overloaded, match="max_concurrent_calls"):
        admission.enter(0)
    admission.leave(8)
    admission.leave(2)
    admission.enter(50)  # nothing queued: a call larger than the limit is admitted alone
    admission.leave(50)
    rss[0] = 5000
    admission.enter(1)  # the figure read a moment ago still stands (read at most every MEMORY_READ_SECONDS)
    admission.leave(1)
    now[0] += 1.0
    with pytest.raises(Overloaded, match="max_memory_bytes") as refused:
        admission.enter(1)
    assert refused.value.retry_after == Limits().retry_after_seconds
    assert (admission.calls, admission.samples) == (0, 0)
    assert admission.refused == {"max_queued_samples": 1, "max_concurrent_calls": 1, "max_memory_bytes": 1}


def test_requests_are_admitted_up_to_the_bytes_a_process_may_hold():
    """`limits.max_pending_request_bytes`: like queued samples, a request that finds none held is admitted
    whatever its size; past the limit the call is refused; leaving gives the bytes back; 0 is no limit."""
    from grpcgrade.core.admission import REQUEST_BYTES, Admission
    from grpcgrade.core.errors import Overloaded
    from grpcgrade.core.samples import Limits

    admission = Admission(Limits(max_pending_request_bytes=100))
    admission.enter(request_bytes=150)  # alone: admitted
    with pytest.raises(Overloaded, match=r"150 bytes of requests held, 1 more would pass 100 \(limits"):
        admission.enter(request_bytes=1)
    admission.enter()  # a call without a body is not held back by them
    admission.leave(request_bytes=150)
    admission.leave()
    admission.enter(request_bytes=60)
    admission.enter(request_bytes=40)  # 100: at the limit, not past it
    with pytest.raises(Overloaded):
        admission.enter(request_bytes=1)
    assert (admission.calls, admission.request_bytes, admission.refused[REQUEST_BYTES]) == (2, 100, 2)
    unlimited = Admission(Limits(max_pending_request_bytes=0))
    unlimited.enter(request_bytes=10**9)
    unlimited.enter(request_bytes=10**9)


def test_the_coalescer_grades_at_once_what_the_engine_grades_inline():
    """A one-sample call the engine would grade inline (cheap graders, a small sample) gains nothing from
    waiting for others: it is graded at once (calls that hop to the workers are gathered: the crowd tests
    above count them)."""
    from grpcgrade.core.coalesce import ServerCoalescer
    from grpcgrade.core.engine import Engine
    from grpcgrade.core.registry import get_registry
    from grpcgrade.core.rewards import SpecData

    engine = Engine(get_registry())
    # as a server with workers resolves it (worker-capable: it may run inline or hop)
    jobs = [dataclasses.replace(job, worker_capable=True) for job in engine.resolve([SpecData(name="json_validator")])]
    coalescer = ServerCoalescer(engine)
    texts = responses(50)

    async def crowd() -> list[float | None]:
        answers = await asyncio.gather(*(coalescer.grade(jobs, {"response": t}, None, nbytes=len(t)) for t in texts))
        return [results[0].score for results, _ in answers]

    assert asyncio.run(crowd()) == [json_score(t) for t in texts]
    assert (coalescer.chunks, coalescer.samples) == (0, 0)


NAPPING = """
default_reward: napping
limits: {max_concurrent_calls: 1}
cache: {enabled: false}
rewards:
  napping: [{name: napper}]
"""


def test_a_face_process_refusing_a_call_for_load_counts_it_as_refused(face_server):
    """A face process's own admission control refuses a call (503 at the HTTP face, RESOURCE_EXHAUSTED at the
    gRPC face) before the engine's process sees it: `grpcgrade_calls_refused_total` counts it as it counts the
    engine's own. Before, it showed only in the faces' request counters. One call at a time (the limit): an
    async grader that never answers (`napper` of "hang") holds the face's one call while the next is sent."""
    srv = face_server(NAPPING, more=["--grpc-processes", "1"])

    def refused() -> float:
        return srv.metric("grpcgrade_calls_refused_total", limit="max_concurrent_calls")

    def admitted() -> float:  # by the engine's process: the face has taken the held call and passed it on
        return srv.metric("grpcgrade_calls_admitted")

    body = json.dumps({"query": ["hang"]})
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=30) as held:
        head = f"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        held.sendall(f"{head}\r\n\r\n{body}".encode())
        eventually(lambda: admitted() == 1, "the held request in the engine")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{srv.http}/get_reward", data=json.dumps({"query": ["x"]}).encode(), timeout=30)
        assert info.value.code == 503
        assert refused() == 1  # a scrape asks each face for its counts first
    eventually(lambda: admitted() == 0, "the held request cancelled with its connection")

    request = pb.EvaluateRequest(graders=specs_to_pb(["napper"]), sample=sample_to_pb({"response": "hang"}))
    with grpc.insecure_channel(srv.target) as channel:
        stub = pb_grpc.GradingServiceStub(channel)
        held_call = stub.Evaluate.future(request, timeout=120)
        eventually(lambda: admitted() == 1, "the held call in the engine")
        with pytest.raises(grpc.RpcError) as refusal:
            stub.Evaluate(request, timeout=30)
        assert refusal.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        eventually(lambda: refused() == 2, "the gRPC face's refusal counted")  # its counts go every 50 ms
        held_call.cancel()
    eventually(lambda: admitted() == 0, "the held call cancelled")


HOLDING = """
limits: {max_pending_request_bytes: 300000}
cache: {enabled: false}
"""


def test_grpc_requests_past_the_bytes_held_are_refused_and_taken_once_they_end(face_server):
    """`limits.max_pending_request_bytes` counts a gRPC call's message from its arrival to its answer: with a
    200 kB call held (an async grader that never answers), a second of 200 kB is refused RESOURCE_EXHAUSTED
    naming the limit, with the retry hint, while a small one is answered; once the held call ends, the large
    one is answered too."""
    srv = face_server(HOLDING)
    padding = "p" * 200_000

    def call(response: str, reference: str) -> pb.EvaluateRequest:
        return pb.EvaluateRequest(
            graders=specs_to_pb(["napper"]), sample=sample_to_pb({"response": response, "reference": reference})
        )

    with grpc.insecure_channel(srv.target) as channel:
        stub = pb_grpc.GradingServiceStub(channel)
        held = stub.Evaluate.future(call("hang", padding), timeout=120)
        eventually(lambda: srv.metric("grpcgrade_calls_admitted") == 1, "the held call admitted")
        with pytest.raises(grpc.RpcError) as refusal:
            stub.Evaluate(call("x", padding), timeout=30)
        assert refusal.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.max_pending_request_bytes" in refusal.value.details()
        assert dict(refusal.value.trailing_metadata())[PUSHBACK_KEY]
        assert stub.Evaluate(call("x", "small"), timeout=30).results[0].score == 1.0
        held.cancel()
        eventually(lambda: srv.metric("grpcgrade_calls_admitted") == 0, "the held call ended")
        assert stub.Evaluate(call("x", padding), timeout=30).results[0].score == 1.0
    assert srv.metric("grpcgrade_calls_refused_total", limit="max_pending_request_bytes") == 1
