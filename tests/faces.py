"""What the gRPC faces' tests share (tests/test_grpc_faces.py: the Python face processes,
tests/test_native_face.py: the Go face): the checks that a face answers as the engine's own port does."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from grpcgrade.testing import ServerProcess, eventually
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

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
