"""What the gRPC faces' tests share (tests/test_grpc_faces.py: the Python face processes,
tests/test_native_face.py: the Go face): their servers' configuration and token, the checks that a face
answers as the engine's own port does, and that deadlines and cancellation reach the engine through it."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from grpcgrade.service.convert import sample_to_pb, specs_to_pb
from grpcgrade.testing import ServerProcess, cpu_seconds, cpu_when_idle, eventually, worker_pids
from grpcgrade.v1 import admin_pb2, admin_pb2_grpc
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

CONFIG = """
default_reward: valid_json
cache: {enabled: false}
rewards:
  valid_json:
    - {name: json_validator}
    - {name: sleepy, params: {seconds: 0.001, heavy: false}, gate: true}
"""
TOKEN = "grpc-face-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)

SAMPLES = [
    {"id": "a", "response": '{"ok": 1}'},
    {"id": "b", "response": "{nope"},
    {"id": "c", "response": "[1, 2]", "reference": "x"},
]


#: The message size limit of the `LIMITED` servers: small, so answers around it are quick to make.
LIMIT = 100_000
#: A server with that limit; the longest linger (0.1 s) gathers the calls that arrive while a chunk of their
#: plan is graded.
LIMITED = f"""
cache: {{enabled: false}}
coalesce_linger_seconds: 0.1
limits: {{max_message_bytes: {LIMIT}}}
"""


def stub(channel: grpc.Channel) -> pb_grpc.GradingServiceStub:
    return pb_grpc.GradingServiceStub(channel)  # type: ignore[no-untyped-call]


def responses(n: int) -> list[str]:
    """Distinct responses, about a third of them not JSON."""
    return [f'{{"n": {i}}}' if i % 3 else f"{{n: {i}" for i in range(n)]


def listeners(port: int) -> set[int]:
    """The PIDs listening on `port`, IPv4 or IPv6 (grpc listens on 127.0.0.1 with an IPv6 socket), per `ss`."""
    listing = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return {int(pid) for pid in re.findall(r"pid=(\d+)", listing)}


class _WithToken(grpc.StreamStreamClientInterceptor):
    """Adds the token to a bidi stream's call (reflection's client takes no metadata of its own)."""

    def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(details._replace(metadata=AUTH), requests)


def items_of(messages: list[pb.BatchEvaluateResponse]) -> list[pb.BatchItem]:
    return sorted((item for m in messages for item in m.items), key=lambda item: item.index)


def columns_of(messages: list[pb.BatchEvaluateResponse]) -> list[tuple[int, list[float], float]]:
    rows = []
    for m in messages:
        c = m.columns
        for r, index in enumerate(c.indices):
            rows.append((index, [column.scores[r] for column in c.scores], c.rewards[r]))
    return sorted(rows)


def relayed_answers(channel: grpc.Channel) -> dict[str, object]:
    """What a face relays as it came, asked through `channel`: BatchEvaluate in the full and columns views,
    BatchEvaluateUnary, ListGraders, the admin service and reflection; compared between a face and the
    engine's own port."""
    grading = stub(channel)
    got: dict[str, object] = {}
    batch = pb.BatchEvaluateRequest(reward="valid_json", samples=[sample_to_pb(s) for s in SAMPLES * 50])
    got["batch-full"] = items_of(list(grading.BatchEvaluate(batch, metadata=AUTH, timeout=60)))
    batch.view = pb.RESULT_VIEW_COLUMNS
    batch.chunk_size = 16
    got["batch-columns"] = columns_of(list(grading.BatchEvaluate(batch, metadata=AUTH, timeout=60)))
    unary = grading.BatchEvaluateUnary(pb.BatchEvaluateUnaryRequest(batch=batch), metadata=AUTH, timeout=60)
    got["batch-unary"] = columns_of([unary.answer])
    got["graders"] = grading.ListGraders(pb.ListGradersRequest(), metadata=AUTH, timeout=60)
    admin = admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
    got["quarantine"] = admin.ListQuarantine(admin_pb2.ListQuarantineRequest(), metadata=AUTH, timeout=60)
    reflection = ProtoReflectionDescriptorDatabase(grpc.intercept_channel(channel, _WithToken()))
    got["services"] = sorted(reflection.get_services())
    return got


def check_deadlines_and_cancellation_reach_the_engine(server: ServerProcess, method: str) -> None:
    """A call through a face (Python or Go) whose deadline passes (or whose client cancels) ends the engine's
    work for it: the workers stop, as they do for a call to the engine's own port (test_reliability).
    Counted in CPU."""
    slow = specs_to_pb([{"name": "sleepy", "params": {"seconds": 3600, "heavy": False}}])
    workers = worker_pids(server.proc.pid)
    with grpc.insecure_channel(server.target) as channel:
        grading = stub(channel)
        sample = sample_to_pb({"response": f"deadline-{method}"})
        if method == "Evaluate":
            calls = [
                grading.Evaluate.future(pb.EvaluateRequest(graders=slow, sample=sample), metadata=AUTH, timeout=0.8)
                for _ in range(3)
            ]
            codes = [call.exception().code() for call in calls]  # type: ignore[union-attr]
            assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 3
        else:
            stream = grading.BatchEvaluate(
                pb.BatchEvaluateRequest(graders=slow, samples=[sample] * 2), metadata=AUTH, timeout=30
            )
            eventually(lambda: sum(cpu_seconds(p) for p in workers) > 0.3, "the workers at work")
            stream.cancel()  # the client goes away
            with pytest.raises(grpc.RpcError) as ended:
                list(stream)
            assert ended.value.code() == grpc.StatusCode.CANCELLED
    at_end = sum(cpu_seconds(p) for p in workers)
    after = cpu_when_idle(workers) - at_end
    assert after < 3.0, f"the workers spent {after:.1f} s of CPU after the call ended"


def outcome(call: Callable[[], object]) -> object:
    """A call's answer, or its status and details."""
    try:
        return call()
    except grpc.RpcError as exc:
        return (exc.code(), exc.details())  # type: ignore[attr-defined]


def concurrently(
    srv: ServerProcess, requests: list[pb.EvaluateRequest], held: pb.EvaluateRequest | None = None
) -> list[object]:
    """Each request's answer (or status and details), the calls made at once; with `held` first: a call
    that never ends (cancelled at the end) keeps a chunk of its plan being graded, so the others gather."""
    with grpc.insecure_channel(srv.target) as channel:
        evaluate = stub(channel).Evaluate
        hold = None
        if held is not None:
            hold = evaluate.future(held, timeout=300)
            eventually(lambda: srv.metric("grpcgrade_calls_admitted") == 1, "the held call at the engine")
        calls = [evaluate.future(r, timeout=120) for r in requests]
        out = [outcome(call.result) for call in calls]
        if hold is not None:
            hold.cancel()
    return out


def _summary(answers: list[object]) -> list[object]:
    """Each answer's size and its first reason (the start of a long one), or the call's status: what a
    failure shows."""
    out: list[object] = []
    for a in answers:
        if isinstance(a, pb.EvaluateResponse):
            reason = a.results[0].reason
            out.append((a.ByteSize(), reason[:40] if len(reason) > 500 else reason))
        else:
            out.append(a)
    return out


def check_answers_around_the_limit(face: ServerProcess, direct: ServerProcess) -> None:
    """Answers around the message limit (misbehave's "long:N": a reason of N characters), in the workers
    and inline, several calls at once (coalesced): through `face` (a `LIMITED` server behind a gRPC face)
    they are what `direct` (the same served by the engine's own port) answers. An answer just under the
    limit is sent whole by the engine's Evaluate; as an item of a face's BatchEvaluate, a few bytes larger,
    the engine leaves its details out. Answers over the limit keep their scores without reasons and
    metadata."""

    def request(n: int, i: int, heavy: bool) -> pb.EvaluateRequest:
        spec = pb.GraderSpec(name="misbehave")
        spec.params.update({"heavy": heavy})
        return pb.EvaluateRequest(graders=[spec], sample=pb.Sample(id=f"s{i}", response=f"long:{n}"))

    # The answer's size for a reason of N characters, read from the engine's own answer: N plus the rest.
    probe = 50_000
    [rest] = [a.ByteSize() - probe for a in concurrently(direct, [request(probe, 0, False)])]  # type: ignore[attr-defined]
    sizes = {"under": LIMIT - 1000, "just-under": LIMIT - 2, "at": LIMIT, "over": LIMIT + 1, "far-over": 2 * LIMIT}
    for heavy in (True, False):
        requests = [request(size - rest, i, heavy) for i, size in enumerate(sizes.values())] * 2
        answers = {name: concurrently(srv, requests) for name, srv in (("face", face), ("direct", direct))}
        assert answers["face"] == answers["direct"], (heavy, _summary(answers["face"]), _summary(answers["direct"]))
        whole = dict(zip(sizes, answers["direct"], strict=False))
        for name in ("under", "just-under", "at"):
            assert whole[name].ByteSize() == sizes[name]  # type: ignore[attr-defined]
            assert whole[name].results[0].reason == "long:" + "r" * (sizes[name] - rest)  # type: ignore[attr-defined]
        for name in ("over", "far-over"):
            result = whole[name].results[0]  # type: ignore[attr-defined]
            assert result.score == 1.0 and result.reason.startswith("reason and metadata left out")
