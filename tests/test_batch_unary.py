"""BatchEvaluateUnary: BatchEvaluate answered in one message, against real servers. Its answers are every
sample's, as `json.loads` says (tests/expected.py) and as BatchEvaluate streams them; it refuses what
BatchEvaluate refuses with the same status; an answer over one message is refused naming BatchEvaluate;
and the Python client asks a one-chunk call in one message, and BatchEvaluate otherwise or when refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest
from batches import TEXTS, OldServer, serve, texts
from expected import json_score
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from grpcgrade.client import PUSHBACK_KEY, AsyncGradingClient, GradingClient, SampleColumns
from grpcgrade.core.engine import Engine
from grpcgrade.core.registry import get_registry
from grpcgrade.core.rewards import SpecData
from grpcgrade.service.convert import join_columns
from grpcgrade.service.link import EngineLink
from grpcgrade.testing import ServerProcess, start_server
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

VIEWS = [pb.RESULT_VIEW_COLUMNS, pb.RESULT_VIEW_SCORES, pb.RESULT_VIEW_FULL]
JSON = [pb.GraderSpec(name="json_validator")]


def request(responses: list[str], view: int, chunk_size: int = 0, **fields: object) -> pb.BatchEvaluateRequest:
    out = pb.BatchEvaluateRequest(graders=JSON, view=view, chunk_size=chunk_size, **fields)  # type: ignore[arg-type]
    if view == pb.RESULT_VIEW_COLUMNS:
        out.columns.response.extend(responses)
    else:
        out.samples.extend(pb.Sample(response=r) for r in responses)
    return out


def both(target: str, req: pb.BatchEvaluateRequest) -> tuple[pb.BatchEvaluateResponse, list[pb.BatchEvaluateResponse]]:
    """The one message BatchEvaluateUnary answers, and the messages BatchEvaluate streams, for `req`."""
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GradingServiceStub(channel)
        unary = stub.BatchEvaluateUnary(pb.BatchEvaluateUnaryRequest(batch=req), timeout=60).answer
        return unary, list(stub.BatchEvaluate(req, timeout=60))


def refusal(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value


def by_index(messages: list[pb.BatchEvaluateResponse]) -> dict[int, pb.EvaluateResponse]:
    return {item.index: item.result for message in messages for item in message.items}


@pytest.mark.parametrize("chunk_size", [0, 64], ids=["one chunk", "several chunks"])
@pytest.mark.parametrize("view", VIEWS, ids=pb.ResultView.Name)
def test_every_sample_is_answered_once_as_json_loads_and_batch_evaluate_say(server: ServerProcess, view, chunk_size):
    responses = texts(300)
    expected = [json_score(r) for r in responses]
    unary, streamed = both(server.target, request(responses, view, chunk_size))
    if view == pb.RESULT_VIEW_COLUMNS:
        assert not unary.items
        order = list(unary.columns.indices)
        assert sorted(order) == list(range(300))
        assert [unary.columns.rewards[order.index(i)] for i in range(300)] == expected
        joined = join_columns([m.columns for m in streamed])
        rows = list(joined.indices)
        assert [joined.rewards[rows.index(i)] for i in range(300)] == expected
        return
    items = by_index([unary])
    assert len(unary.items) == len(items) == 300  # each sample once
    assert [items[i].reward for i in range(300)] == expected
    assert items == by_index(streamed)  # the same results, reasons and metadata included in the full view


def test_bad_requests_are_refused_with_batch_evaluates_status(server: ServerProcess):
    both_fields = request(["a"], pb.RESULT_VIEW_SCORES)
    both_fields.columns.response.append("b")
    bad = {
        "an unknown grader": pb.BatchEvaluateRequest(graders=[pb.GraderSpec(name="no_such_grader")]),
        "samples and columns": both_fields,
        "a listwise grader in columns": pb.BatchEvaluateRequest(
            graders=[pb.GraderSpec(name="odd_ranks")], view=pb.RESULT_VIEW_COLUMNS, columns=pb.SampleColumns()
        ),
        "a failure ratio over 1": request(["{}"], pb.RESULT_VIEW_SCORES, max_failure_ratio=1.5),
    }
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.GradingServiceStub(channel)
        for name, req in bad.items():
            unary = refusal(lambda r=req: stub.BatchEvaluateUnary(pb.BatchEvaluateUnaryRequest(batch=r), timeout=60))
            streamed = refusal(lambda r=req: list(stub.BatchEvaluate(r, timeout=60)))
            assert (unary.code(), unary.details()) == (streamed.code(), streamed.details()), name
            assert unary.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), name
        raw = channel.unary_unary("/grpcgrade.v1.GradingService/BatchEvaluateUnary")
        unparsable = refusal(lambda: raw(b"\x0a\x05\xff\xff\xff", timeout=60))
    assert unparsable.code() == grpc.StatusCode.INVALID_ARGUMENT and "unparsable" in unparsable.details()


#: A grader failing two samples of three with INVALID_RESULT (the test plugin's `misbehave`: NaN for "nan"),
#: graded in a worker, and claiming a bounded cost: graded here and now, as a trainer's small step is.
FAILING = {
    "in a worker": pb.GraderSpec(name="misbehave"),
    "inline": pb.GraderSpec(
        name="misbehave", params=json_format.ParseDict({"heavy": False, "bounded": True}, Struct())
    ),
}


@pytest.mark.parametrize("where", list(FAILING))
def test_past_the_failure_budget_the_call_ends_failed_precondition(server: ServerProcess, where: str):
    req = pb.BatchEvaluateRequest(
        graders=[FAILING[where]],
        view=pb.RESULT_VIEW_COLUMNS,
        columns=pb.SampleColumns(response=["nan", "nan", "ok"]),
        max_failure_ratio=0.1,
    )
    before = server.metric("grpcgrade_failure_budget_exceeded_calls_total")
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.GradingServiceStub(channel)
        unary = refusal(lambda: stub.BatchEvaluateUnary(pb.BatchEvaluateUnaryRequest(batch=req), timeout=60))
        streamed = refusal(lambda: list(stub.BatchEvaluate(req, timeout=60)))
    assert unary.code() == streamed.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert unary.details() == streamed.details() and "INVALID_RESULT" in unary.details()
    assert server.metric("grpcgrade_failure_budget_exceeded_calls_total") == before + 2


@pytest.fixture(scope="module")
def small_messages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose messages hold 100,000 bytes: 4,000 short samples fit in a request, not in one answer."""
    tmp = tmp_path_factory.mktemp("unary-small-messages")
    config = tmp / "limits.yaml"
    config.write_text("limits: {max_message_bytes: 100000}\n")
    srv = start_server(tmp, "--workers", "1", "--config", str(config))
    yield srv
    srv.stop()


def test_an_answer_over_one_message_is_refused_naming_batch_evaluate(small_messages: ServerProcess):
    req = request(texts(4000), pb.RESULT_VIEW_FULL)
    assert req.ByteSize() < 100_000
    with grpc.insecure_channel(small_messages.target) as channel:
        stub = pb_grpc.GradingServiceStub(channel)
        call = stub.BatchEvaluateUnary.with_call
        err = refusal(lambda: call(pb.BatchEvaluateUnaryRequest(batch=req), timeout=60))
        streamed = list(stub.BatchEvaluate(req, timeout=60))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "BatchEvaluate" in err.details() and "max_message_bytes=100000" in err.details()
    assert not any(key == PUSHBACK_KEY for key, _ in err.trailing_metadata())  # not a refusal for load
    assert len(streamed) > 1 and len(by_index(streamed)) == 4000  # the stream carries it in parts


def test_the_client_sends_an_answer_over_one_message_again_as_batch_evaluate(small_messages: ServerProcess):
    responses = texts(4000)
    handled = lambda method, code: small_messages.metric(  # noqa: E731
        "grpc_server_handled_total", grpc_method=method, grpc_code=code
    )
    before = handled("BatchEvaluateUnary", "RESOURCE_EXHAUSTED"), handled("BatchEvaluate", "OK")
    with small_messages.client(timeout=60, chunk_size=5000) as client:
        results = client.batch_evaluate(
            [{"response": r} for r in responses], ["json_validator"], view=pb.RESULT_VIEW_SCORES
        )
    assert [r.reward for r in results] == [json_score(r) for r in responses]
    after = handled("BatchEvaluateUnary", "RESOURCE_EXHAUSTED"), handled("BatchEvaluate", "OK")
    assert after == (before[0] + 1, before[1] + 1)


def test_the_client_asks_a_one_chunk_call_of_scores_in_one_message(server: ServerProcess):
    """A trainer's step (one chunk, scores or columns) is one BatchEvaluateUnary; several chunks, or the full
    view (whose reasons may be long), stream."""
    calls = lambda method: server.metric("grpc_server_handled_total", grpc_method=method, grpc_code="OK")  # noqa: E731
    responses = TEXTS
    expected = [json_score(r) for r in responses]
    counts = []

    def counted() -> tuple[float, float]:
        return calls("BatchEvaluateUnary"), calls("BatchEvaluate")

    with server.client(timeout=60, chunk_size=3) as client, GradingClient(server.target, timeout=60) as whole:
        steps = [
            lambda: whole.batch_scores(SampleColumns(response=responses), ["json_validator"]).rewards,
            lambda: [r.reward for r in whole.batch_evaluate([{"response": r} for r in responses], ["json_validator"])],
            lambda: client.batch_scores(SampleColumns(response=responses), ["json_validator"]).rewards,
            lambda: asyncio.run(async_step(server.target, responses)),
        ]
        for step in steps:
            before = counted()
            assert step() == expected
            after = counted()
            counts.append((after[0] - before[0], after[1] - before[1]))
    # one message; the full view streams; 8 samples in chunks of 3 are 3 calls; the async client's step
    assert counts == [(1, 0), (0, 1), (0, 3), (1, 0)]


async def async_step(target: str, responses: list[str]) -> list[float | None]:
    async with AsyncGradingClient(target, timeout=60) as client:
        return (await client.batch_scores(SampleColumns(response=responses), ["json_validator"])).rewards


class OlderThanUnary(OldServer):
    """`batches.OldServer`, counting the BatchEvaluateUnary calls it answers UNIMPLEMENTED, as a server
    older than the method does."""

    def __init__(self) -> None:
        super().__init__()
        self.unary = 0

    def BatchEvaluateUnary(self, request, context):
        with self.lock:
            self.unary += 1
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")


def test_a_server_without_the_method_is_asked_with_batch_evaluate_from_then_on():
    """UNIMPLEMENTED sends the call again as BatchEvaluate, and the client does not ask again: one
    BatchEvaluateUnary per client, sync and async, however many steps."""
    old = OlderThanUnary()
    srv, target = serve(old)
    responses = TEXTS
    try:
        with GradingClient(target, timeout=10) as client:
            steps = [
                client.batch_scores(SampleColumns(response=responses), ["json_validator"]).rewards for _ in range(3)
            ]
        steps.append(asyncio.run(async_step(target, responses)))
    finally:
        srv.stop(None)
    assert steps == [[json_score(r) for r in responses]] * 4
    assert old.unary == 2
    sent = ["columns" if r.HasField("columns") else "samples" for r in old.requests]
    # a server older than columns too: each client's first step is sent again as samples (test_columns)
    assert sent == ["columns", "samples", "samples", "samples", "columns", "samples"]


def test_a_faces_chunk_whose_answer_is_over_one_message_is_asked_again_as_batch_evaluate(
    small_messages: ServerProcess,
):
    """A face's link asks a coalesced chunk as BatchEvaluateUnary; the columns of 6,000 samples are over one
    message of this server's: the link asks again as BatchEvaluate, which streams them in parts, and every
    sample is answered as `json.loads` says."""
    responses = texts(6000)
    handled = lambda method, code: small_messages.metric(  # noqa: E731
        "grpc_server_handled_total", grpc_method=method, grpc_code=code
    )
    before = handled("BatchEvaluateUnary", "RESOURCE_EXHAUSTED"), handled("BatchEvaluate", "OK")
    jobs = Engine(get_registry(), None).resolve([SpecData("json_validator")])

    async def graded() -> list[float | None]:
        link = EngineLink(small_messages.target, None, 100_000)
        try:
            chunk = [(i, {"response": r}) for i, r in enumerate(responses)]
            return (await link.grade_chunk(jobs, chunk)).rewards
        finally:
            await link.close()

    assert asyncio.run(graded()) == [json_score(r) for r in responses]
    after = handled("BatchEvaluateUnary", "RESOURCE_EXHAUSTED"), handled("BatchEvaluate", "OK")
    assert after == (before[0] + 1, before[1] + 1)
