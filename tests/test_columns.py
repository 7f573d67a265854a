"""Samples and results as columns (SampleColumns in, RESULT_VIEW_COLUMNS out, `batch_scores`), against real
servers: the same rewards as `json.loads` and the test plugins' documented behaviour say, failed rows masked
with their errors, bad requests refused by name, and a server older than columns still answered."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest
from batches import OldServer, serve, texts
from budgets import doubling
from expected import json_score
from google.protobuf.struct_pb2 import Struct

from grpcgrade.batch_scores import MalformedAnswer
from grpcgrade.client import AsyncGradingClient, FailureBudgetExceeded, GradingClient, SampleColumns
from grpcgrade.service.convert import as_columns, join_columns, slice_columns
from grpcgrade.testing import ServerProcess, start_server
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc


def stream(target: str, request: pb.BatchEvaluateRequest) -> list[pb.BatchEvaluateResponse]:
    with grpc.insecure_channel(target) as channel:
        return list(pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=60))


def test_batch_scores_matches_json_loads_over_several_calls(server: ServerProcess):
    responses = texts(2500)
    with server.client(timeout=60, chunk_size=1000) as client:
        table = client.batch_scores([{"response": r} for r in responses], ["json_validator"])
    expected = [json_score(r) for r in responses]
    assert table.rewards == expected
    assert table.scores == {"json_validator": expected}
    assert table.errors == {"json_validator": {}} and table.masked == 0
    assert table.graders == {"json_validator": "json_validator"}


def test_a_columns_request_streams_packed_columns_each_sample_once(server: ServerProcess):
    responses = texts(300)
    request = pb.BatchEvaluateRequest(
        graders=[pb.GraderSpec(name="json_validator"), pb.GraderSpec(name="count_word", key="words")],
        columns=pb.SampleColumns(response=responses),
        view=pb.RESULT_VIEW_COLUMNS,
        chunk_size=64,
    )
    messages = stream(server.target, request)
    assert len(messages) == 5 and all(not m.items for m in messages)
    seen: dict[int, tuple[float, float, float]] = {}
    for m in messages:
        c = m.columns
        assert [col.key for col in c.scores] == ["json_validator", "words"]
        assert [col.grader for col in c.scores] == ["json_validator", "count_word"]
        for row, index in enumerate(c.indices):
            assert index not in seen
            seen[index] = (c.scores[0].scores[row], c.scores[1].scores[row], c.rewards[row])
    assert sorted(seen) == list(range(300))
    for i, text in enumerate(responses):
        words = float(text.split().count("grpc"))
        assert seen[i] == (json_score(text), words, (json_score(text) + words) / 2)


def test_failed_rows_are_masked_with_their_errors_and_cost_no_other_row(server: ServerProcess):
    responses = ["ok", "nan", "ok grpc", "die", "ok"]
    specs = [{"name": "misbehave"}, {"name": "count_word"}]
    with server.client(timeout=120) as client:
        table = client.batch_scores(SampleColumns(response=responses), specs)
    assert table.rewards == [0.5, None, 1.0, None, 0.5]  # the mean of misbehave's 1.0 and count_word's count
    assert table.scores["misbehave"] == [1.0, None, 1.0, None, 1.0]
    # a sample that kills its worker is answered WORKER_LOST by every grader: which one died is unknown
    assert table.scores["count_word"] == [0.0, 0.0, 1.0, None, 0.0]
    errors = table.errors["misbehave"]
    assert sorted(errors) == [1, 3]
    assert errors[1].code == "INVALID_RESULT" and "non-finite" in errors[1].message
    assert errors[3].code == "WORKER_LOST"
    assert {i: e.code for i, e in table.errors["count_word"].items()} == {3: "WORKER_LOST"}
    assert table.masked == 2


def test_a_row_that_timed_out_in_a_columns_answer_is_quarantined(server: ServerProcess):
    """The quarantine learns a whole chunk's TIMEOUT from the failures graded with it (`ChunkResult.failures`),
    not by reading the encoded columns back: the same row in the next call is answered at once, quarantined.
    (Params of this test's own, so no other test's quarantined input is this one.)"""
    specs = [{"name": "misbehave", "params": {"heavy": True, "bounded": False}}]
    rows = SampleColumns(response=["ok", "hang", "ok"])
    with server.client(timeout=120) as client:
        first = client.batch_scores(rows, specs, grader_timeout=0.5)
        again = client.batch_scores(rows, specs, grader_timeout=0.5)
    for table in (first, again):
        assert table.rewards == [1.0, None, 1.0]
        assert {i: e.code for i, e in table.errors["misbehave"].items()} == {1: "TIMEOUT"}
    assert "quarantined" not in first.errors["misbehave"][1].message
    assert again.errors["misbehave"][1].message.startswith("quarantined since ")


def test_the_id_and_extra_columns_reach_the_graders(server: ServerProcess):
    calls = [[{"function": {"name": "search"}}], [{"function": {"name": "open"}}], None]
    with server.client(timeout=60) as client:
        ids = client.batch_scores(SampleColumns(id=["7", "11", "13"], response=["a", "b", "c"]), ["id_number"])
        tools = client.batch_scores(
            SampleColumns(response=["a", "b", "c"], extra=[{"tool_calls": c} if c else None for c in calls]),
            [{"name": "tool_call_names", "params": {"expected": "search"}}],
        )
        clash = client.batch_scores(
            SampleColumns(response=["a", "b"], extra=[None, {"query": "not an extra"}]), ["count_word"]
        )
    assert ids.rewards == [7.0, 11.0, 13.0]
    assert tools.rewards == [1.0, 0.0, 0.0]
    assert clash.rewards == [0.0, None]
    assert (
        clash.errors["count_word"][1].code == "INVALID_SAMPLE" and "collides" in clash.errors["count_word"][1].message
    )


def test_cached_rows_are_marked(server: ServerProcess):
    responses = ["grpc one", "grpc grpc two", "three"]
    with server.client(timeout=60) as client:
        first = client.batch_scores(SampleColumns(response=responses), ["count_word"], cache="on")
        again = client.batch_scores(SampleColumns(response=responses), ["count_word"], cache="on")
    assert first.rewards == again.rewards == [1.0, 2.0, 0.0]
    assert again.cached == {"count_word": [0, 1, 2]}


def test_the_step_budget_answers_the_rest_budget_exceeded(server: ServerProcess):
    rows = SampleColumns(response=["a", "hang", "b"])
    with server.client(timeout=60) as client:
        table = doubling(  # the budget doubled while a quick row was cut (tests/budgets.py)
            lambda b: client.batch_scores(rows, ["napper"], budget_seconds=b),
            lambda t: bool({0, 2} & set(t.errors.get("napper", {}))),
        )
    assert table.rewards == [1.0, None, 1.0]
    assert table.errors["napper"][1].code == "BUDGET_EXCEEDED"


def test_the_failure_budget_ends_the_call(server: ServerProcess):
    with server.client(timeout=60) as client, pytest.raises(FailureBudgetExceeded) as err:
        client.batch_scores(SampleColumns(response=["nan", "nan", "ok"]), ["misbehave"], max_failure_ratio=0.1)
    assert "misbehave" in err.value.details() and "INVALID_RESULT" in err.value.details()


def test_the_async_client_reads_the_same_columns(server: ServerProcess):
    responses = texts(1500)

    async def run() -> list[float | None]:
        async with AsyncGradingClient(server.target, timeout=60, chunk_size=500) as client:
            return (await client.batch_scores([{"response": r} for r in responses], ["json_validator"])).rewards

    assert asyncio.run(run()) == [json_score(r) for r in responses]


def test_listwise_graders_are_refused_by_name(server: ServerProcess):
    request = pb.BatchEvaluateRequest(
        graders=[pb.GraderSpec(name="longest_first")],
        samples=[pb.Sample(responses=["a", "bb"])],
        view=pb.RESULT_VIEW_COLUMNS,
    )
    with pytest.raises(grpc.RpcError) as err:
        stream(server.target, request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "longest_first" in err.value.details() and "RESULT_VIEW_SCORES" in err.value.details()
    with server.client() as client, pytest.raises(ValueError, match="batch_scores"):
        client.batch_evaluate([{"response": "x"}], ["json_validator"], view=pb.RESULT_VIEW_COLUMNS)


@pytest.mark.parametrize(
    ("columns", "samples", "named"),
    [
        (pb.SampleColumns(response=["a", "b"], reference=["a"]), [], "response has 2, reference has 1"),
        (pb.SampleColumns(response=["a"], extra=[Struct(), Struct()]), [], "extra has 2"),
        (pb.SampleColumns(response=["a"]), [pb.Sample(response="b")], "not both"),
    ],
)
def test_bad_columns_are_invalid_argument_naming_what_is_wrong(server: ServerProcess, columns, samples, named):
    request = pb.BatchEvaluateRequest(graders=[pb.GraderSpec(name="json_validator")], columns=columns, samples=samples)
    with pytest.raises(grpc.RpcError) as err:
        stream(server.target, request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in err.value.details()


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, plugin_env: dict[str, str]) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("columns-limits")
    config = tmp / "limits.yaml"
    config.write_text("limits: {max_samples_per_batch: 100, max_field_chars: 50}\n")
    srv = start_server(tmp, "--workers", "2", "--config", str(config), env=plugin_env, metrics=False)
    yield srv
    srv.stop()


def test_limits_hold_for_columns_row_by_row(limited: ServerProcess):
    with limited.client(timeout=60) as client:
        table = client.batch_scores(SampleColumns(response=["1", "1" * 51, "[]"]), ["json_validator"])
        with pytest.raises(grpc.RpcError) as err:
            client.batch_scores(SampleColumns(response=["1"] * 101), ["json_validator"], timeout=10)
    assert table.rewards == [1.0, None, 1.0]
    error = table.errors["json_validator"][1]
    assert error.code == "INVALID_SAMPLE" and "max_field_chars=50" in error.message
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_samples_per_batch=100" in err.value.details()


def test_an_extra_over_the_limit_costs_only_its_row_either_way_it_is_sent(limited: ServerProcess):
    big = {"note": "x" * 60}  # over max_field_chars=50 once encoded
    with limited.client(timeout=60) as client:
        as_columns = client.batch_scores(SampleColumns(response=["1", "2"], extra=[None, big]), ["json_validator"])
        as_samples = client.batch_evaluate([{"response": "1"}, {"response": "2", "extra": big}], ["json_validator"])
    assert as_columns.rewards == [1.0, None]
    assert [r.results[0].score for r in as_samples] == [1.0, 0.0]
    for error in (as_columns.errors["json_validator"][1], as_samples[1].results[0].error):
        assert error.code == "INVALID_SAMPLE" and "field 'extra' takes" in error.message
        assert "max_field_chars=50" in error.message


class Malformed(pb_grpc.GradingServiceServicer):
    """A real gRPC server whose columns do not hold together: two scores for three rows."""

    def BatchEvaluate(self, request, context):
        column = pb.ScoreColumn(key="g", grader="g", scores=[1.0, 1.0])
        yield pb.BatchEvaluateResponse(columns=pb.ResultColumns(indices=[0, 1, 2], scores=[column], rewards=[1, 1, 1]))


def test_a_server_older_than_columns_is_sent_samples_and_read_as_items():
    old = OldServer()
    server, target = serve(old)
    responses = texts(7)
    try:
        with GradingClient(target, timeout=10) as client:
            first = client.batch_scores([{"response": r} for r in responses], ["json_validator"])
            second = client.batch_scores(SampleColumns(response=responses), ["json_validator"])
            items = client.batch_evaluate([{"response": r} for r in responses], ["json_validator"])
    finally:
        server.stop(None)
    expected = [json_score(r) for r in responses]
    assert first.rewards == second.rewards == [r.reward for r in items] == expected
    sent = [("columns" if r.HasField("columns") else "samples", r.view) for r in old.requests]
    columns, full = pb.RESULT_VIEW_COLUMNS, pb.RESULT_VIEW_FULL
    # answered nothing for columns once; from then on the client sends samples
    assert sent == [("columns", columns), ("samples", columns), ("samples", columns), ("samples", full)]


def test_a_malformed_answer_raises_instead_of_scoring():
    server, target = serve(Malformed())
    try:
        with GradingClient(target, timeout=10) as client, pytest.raises(MalformedAnswer, match="2 scores for 3 rows"):
            client.batch_scores(SampleColumns(response=["a", "b", "c"]), ["g"])
    finally:
        server.stop(None)


def test_columns_slice_and_join_are_inverse():
    failed = pb.GraderError(code="TIMEOUT", message="ran past")
    col = pb.ScoreColumn(
        key="k", grader="g", scores=[1, 0, 2, 0, 3], error_rows=[1, 3], errors=[failed, failed], cached_rows=[4]
    )
    whole = pb.ResultColumns(indices=[5, 6, 7, 8, 9], scores=[col], rewards=[1, 0, 2, 0, 3], reward_absent_rows=[1, 3])
    parts = [slice_columns(whole, 0, 2), slice_columns(whole, 2, 4), slice_columns(whole, 4, 5)]
    assert list(parts[1].scores[0].error_rows) == [1] and list(parts[2].scores[0].cached_rows) == [0]
    assert join_columns(parts) == whole


def test_only_dicts_of_the_same_text_fields_travel_as_columns():
    assert as_columns([{"response": "a", "id": "1"}, {"response": "b", "id": "2"}]).fields == {
        "response": ["a", "b"],
        "id": ["1", "2"],
    }
    assert as_columns([{"response": "a"}, {"response": "b", "id": "2"}]) is None  # different keys
    assert as_columns([{"response": "a"}, {"query": "b"}]) is None
    assert as_columns([{"response": "a", "tool_calls": []}]) is None  # an extra
    assert as_columns([{"response": 1}]) is None  # not text
    assert as_columns([pb.Sample(response="a")]) is None
    assert as_columns([{}]) is None  # nothing to count the samples by
    assert as_columns(SampleColumns(responses=[["a", "b"]])) is None  # listwise


CHRF_PAIRS = [
    ("the cat sat on the mat", "the cat sat on a mat"),
    ("", "something"),
    ("completely different", "words here"),
    ("same", "same"),
    ("Größe und Maß", "Grösse und Mass"),
]


def test_chrf_of_one_pair_is_the_references_corpus_score():
    """`evaluate`'s chrF takes sacrebleu's `sentence_score` for two texts: exactly the reference's
    `corpus_score` of the one pair, score and details; anything else goes the reference's way (its check's
    message)."""
    from sacrebleu.metrics import CHRF

    from grpcgrade.graders.text.similarity_metrics import chrf, make_chrf

    reference, scorer = CHRF(), make_chrf(6, 2.0)
    pairs = [*CHRF_PAIRS, ("a", ""), ("", ""), ("x" * 1000, "x" * 999 + "y"), ("日本語の文", "日本語の文章")]
    for response, ref in pairs:
        expected = reference.corpus_score([response], [[ref]]).score
        details = {"char_order": 6, "beta": 2.0, "raw_score": expected}
        assert chrf(scorer, ref, response, 6, 2.0) == (expected / 100.0, details)
    with pytest.raises(TypeError) as refused:
        reference.corpus_score([None], [["a"]])  # type: ignore[list-item]
    assert chrf(scorer, "a", None, 6, 2.0) == (0.0, {"error": str(refused.value)})  # type: ignore[arg-type]


def test_chrf_grades_a_chunk_as_a_column_with_sacrebleus_scores(server: ServerProcess):
    from sacrebleu.metrics import CHRF

    from grpcgrade.core.grading import column_inputs
    from grpcgrade.graders.text.similarity import SimilarityGrader

    chrf = CHRF()
    expected = [chrf.sentence_score(r, [ref]).score / 100 for r, ref in CHRF_PAIRS]
    grader = SimilarityGrader(algorithm="chrf")
    assert column_inputs(grader) == ("reference", "response")
    assert SimilarityGrader(algorithm="bleu").score_column is None  # only chrF has the column path
    responses, references = [r for r, _ in CHRF_PAIRS], [ref for _, ref in CHRF_PAIRS]
    assert grader.score_column(response=responses, reference=references) == pytest.approx(expected, abs=1e-12)
    spec = [{"name": "similarity", "params": {"algorithm": "chrf"}}]
    with server.client(timeout=60) as client:
        table = client.batch_scores(SampleColumns(response=responses, reference=references), spec)
        full = client.batch_evaluate([{"response": r, "reference": ref} for r, ref in CHRF_PAIRS], spec)
    assert table.rewards == pytest.approx(expected, abs=1e-12)
    assert table.rewards == [r.results[0].score for r in full]  # the column and `evaluate` agree exactly
