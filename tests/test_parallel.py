"""The worker-pool path gives exactly the results of the inline path."""

from __future__ import annotations

import json
import random
import time

import grpc
import pytest
from expected import json_score
from google.protobuf.json_format import MessageToDict

from grpcgrade.testing import children, start_server
from grpcgrade.v1 import grading_pb2 as pb

WORDS = "the a cat dog sat on mat rug reward policy 机器 学习 是 人工 智能 , . ! 3.14 42".split()
HEAVY = [
    {"name": "similarity", "key": "chrf", "params": {"algorithm": "chrf"}},
    {"name": "similarity", "key": "rougeL", "params": {"algorithm": "rougeL"}},
    {"name": "similarity", "key": "bleu", "params": {"algorithm": "bleu"}},
    {"name": "similarity", "key": "meteor", "params": {"algorithm": "meteor"}},
    {"name": "similarity", "key": "cosine", "params": {"algorithm": "cosine"}},
    {"name": "ngram_repetition_penalty", "key": "ngram", "params": {"tokenizer_type": "jieba"}},
    {"name": "string_match", "key": "overlap", "params": {"algorithm": "word_overlap"}},
]


@pytest.fixture(scope="module")
def inline_server(tmp_path_factory, plugin_env):
    srv = start_server(tmp_path_factory.mktemp("inline"), "--workers", "0", env=plugin_env)
    yield srv
    srv.stop()


def test_worker_pool_and_inline_grading_agree(server, inline_server):
    rng = random.Random(11)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 30)))

    samples = [{"id": str(i), "response": text(), "reference": text()} for i in range(300)]
    with server.client(timeout=120, chunk_size=70) as pooled, inline_server.client(timeout=120) as inline:
        by_pool = pooled.batch_evaluate(samples, HEAVY)
        by_inline = inline.batch_evaluate(samples, HEAVY)
    assert [MessageToDict(r) for r in by_pool] == [MessageToDict(r) for r in by_inline]
    assert all(not res.HasField("error") for r in by_pool for res in r.results)


CHEAP = [
    "json_validator",
    {"name": "string_match", "key": "regex", "params": {"algorithm": "regex_match"}},
    {"name": "length_penalty", "params": {"min_length": 5, "max_length": 40}, "weight": 0.5},
    {"name": "reasoning_format", "gate": True},
]


@pytest.mark.parametrize("view", [pb.RESULT_VIEW_FULL, pb.RESULT_VIEW_SCORES], ids=["full", "scores"])
@pytest.mark.parametrize("extra", [[], ["attentive"]], ids=["whole-chunks", "per-grader"])
def test_cheap_graders_and_bad_samples_agree_on_every_path(server, inline_server, view, extra):
    rng = random.Random(5)
    samples = []
    for i in range(500):
        response = rng.choice(['{"a": 1}', "<think>x</think> 42", "[1, 2", " ".join(rng.sample(WORDS, 6))])
        sample = {"id": f"s{i}", "response": response, "reference": "[0-9]+"}
        if i % 97 == 3:
            sample["extra"] = {"response": "collides"}  # a bad sample: INVALID_SAMPLE for every grader
        samples.append(sample)
    graders = CHEAP + extra
    with server.client(timeout=120, chunk_size=150) as pooled, inline_server.client(timeout=120) as inline:
        by_pool = pooled.batch_evaluate(samples, graders, view=view)
        by_inline = inline.batch_evaluate(samples, graders, view=view)
    assert [MessageToDict(r) for r in by_pool] == [MessageToDict(r) for r in by_inline]
    assert [r.id for r in by_pool] == [s["id"] for s in samples]
    bad = [r for r, s in zip(by_pool, samples, strict=True) if "extra" in s]
    assert bad and all(res.error.code == "INVALID_SAMPLE" for r in bad for res in r.results)
    assert sum(r.HasField("reward") for r in by_pool) == len(samples) - len(bad)


# -- whole chunks cut from the request's bytes -------------------------------------------------------------


def _record(field: int, payload: bytes) -> bytes:
    """A length-delimited field (number < 16) written by hand: its tag, the varint length, the payload."""
    length, out = len(payload), bytearray([field << 3 | 2])
    while length >= 0x80:
        out.append(length & 0x7F | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out) + payload


JSONISH = ['{"a": 1}', "[1, 2", "42", "", "x" * 300, '{"k": "' + "y" * 200 + '"}', "[[[]]]", "nul"]


def _json_samples(n: int) -> list[pb.Sample]:
    return [pb.Sample(id=f"j{i}", response=JSONISH[i % len(JSONISH)]) for i in range(n)]


def test_sample_offsets_cut_a_request_into_valid_chunks():
    from grpcgrade.service.wire import ReceivedBatch, sample_offsets

    samples = _json_samples(40)
    data = pb.BatchEvaluateRequest(graders=[pb.GraderSpec(name="json_validator")], samples=samples, view=2)
    raw = data.SerializeToString()
    offsets = sample_offsets(raw)
    assert offsets is not None and len(offsets) == 41
    received = ReceivedBatch(raw)
    assert received.view == pb.RESULT_VIEW_SCORES and received.graders[0].name == "json_validator"
    for a, b in [(0, 40), (0, 1), (3, 17), (39, 40), (10, 10)]:
        chunk = pb.BatchEvaluateRequest.FromString(received.samples_bytes(a, b))
        assert list(chunk.samples) == samples[a:b]
    interleaved = _record(2, samples[0].SerializeToString()) + _record(3, b"r") + _record(2, b"")
    assert sample_offsets(interleaved) is None  # two runs of samples: the caller re-serializes
    assert sample_offsets(raw[:-1]) is None  # cut short


def _graded_raw(target: str, raw: bytes) -> dict[int, pb.EvaluateResponse]:
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_stream(
            "/grpcgrade.v1.GradingService/BatchEvaluate",
            request_serializer=lambda b: b,
            response_deserializer=pb.BatchEvaluateResponse.FromString,
        )
        return {item.index: item.result for message in call(raw, timeout=60) for item in message.items}


@pytest.mark.parametrize("order", ["canonical", "interleaved", "unknown-fields", "unknown-group"])
def test_whole_chunks_from_any_field_order_grade_every_sample_once(server, order):
    """The server cuts whole chunks from the bytes that arrived; fields in another order than protobuf
    writes them (samples between other fields, fields it does not know) are graded all the same."""
    samples = _json_samples(50)
    records = [_record(2, s.SerializeToString()) for s in samples]
    head = pb.BatchEvaluateRequest(graders=[pb.GraderSpec(name="json_validator")], chunk_size=7).SerializeToString()
    if order == "canonical":
        raw = head + b"".join(records)
    elif order == "interleaved":
        raw = b"".join(records[:20]) + head + b"".join(records[20:])
    elif order == "unknown-fields":  # field 100 as a varint (tag a0 06), field 101 as bytes (tag aa 06)
        raw = head + b"".join(records[:9]) + b"\xa0\x06\x01" + b"\xaa\x06\x01?" + b"".join(records[9:])
    else:  # field 100 as an (empty) group, which protobuf keeps as an unknown field
        raw = head + b"".join(records[:30]) + b"\xa3\x06\xa4\x06" + b"".join(records[30:])
    got = _graded_raw(server.target, raw)
    assert sorted(got) == list(range(50))
    for i, sample in enumerate(samples):
        try:
            json.loads(sample.response)
            expected = 1.0
        except ValueError:
            expected = 0.0
        assert got[i].id == sample.id and got[i].results[0].score == expected and got[i].reward == expected


def test_an_over_long_field_in_a_cut_chunk_is_that_samples_error(server):
    """Chunks under `max_field_chars` skip the per-field check; a larger one still checks each sample."""
    samples = [pb.Sample(response="[1]"), pb.Sample(response="[" * 1_000_001), pb.Sample(response="{}")]
    raw = pb.BatchEvaluateRequest(graders=[pb.GraderSpec(name="json_validator")], samples=samples).SerializeToString()
    got = _graded_raw(server.target, raw)
    assert got[1].results[0].error.code == "INVALID_SAMPLE" and not got[1].HasField("reward")
    assert got[0].reward == 1.0 and got[2].reward == 1.0


# -- the scores view's column path ---------------------------------------------------------------------------

COLUMNS = [
    "json_validator",
    {"name": "length_penalty", "params": {"min_length": 3, "max_length": 12}, "weight": 2},
    {"name": "json_validator", "key": "valid", "gate": True},
]


def _without_reasons(reply: pb.EvaluateResponse) -> dict:
    out = pb.EvaluateResponse()
    out.CopyFrom(reply)
    for result in out.results:
        result.ClearField("reason")
        result.ClearField("metadata")
    return MessageToDict(out)


def test_a_bounded_graders_call_expected_to_hold_the_loop_long_goes_to_the_workers(server):
    """The plan learns its grading time per byte: after a call that took 0.5 s inline ("slow_error" builds
    its message that long), a small call of the same graders is expected to take far more than
    INLINE_MAX_SECONDS (20 ms), and is graded by a worker. Params of its own: a plan of its own. The
    wait lets the event loop's inline share, which the slow call spent, come back (a window is 1 s), so
    the share is not what sends the call away."""
    graders = [{"name": "misbehave", "params": {"bounded": True, "column": False}}]
    with server.client(timeout=60) as c:
        first = c.batch_evaluate([{"response": "pid"}], graders)
        c.batch_evaluate([{"response": "slow_error"}], graders)
        time.sleep(INLINE_WINDOW_SECONDS + 0.2)
        after = c.batch_evaluate([{"response": "pid"}], graders)
    assert first[0].results[0].score == float(server.proc.pid)
    assert after[0].results[0].score in {float(pid) for pid in children(server.proc.pid)}


def test_scores_as_columns_are_graded_inline_up_to_the_larger_bound(server):
    """A call answered as columns makes no result object per sample: past the bound of a result per sample,
    under INLINE_MAX_BYTES, it is still graded where it arrives."""
    samples = [{"response": "pid"}, {"response": "pid" + " " * INLINE_RESULTS_MAX_BYTES}]
    with server.client(timeout=60) as c:
        table = c.batch_scores(samples, [{"name": "misbehave", "params": {"bounded": True}}])
    assert set(table.rewards) == {float(server.proc.pid)}


@pytest.mark.parametrize("padding", [0, 1000], ids=["small-inline", "large-in-workers"])
def test_score_columns_give_what_evaluate_gives(server, inline_server, padding):
    """json_validator and length_penalty grade the scores view's whole chunks as columns (inline for a small
    batch, in workers for a large one); the scores equal the full view's (each sample through `evaluate`)
    and the inline server's, and follow their definitions."""
    pad = " " * padding  # 300 x 1 KB: over the inline bound
    samples = [{"id": f"c{i}", "response": JSONISH[i % len(JSONISH)] + pad + " " * (i % 5)} for i in range(300)]
    with server.client(timeout=120, chunk_size=64) as pooled, inline_server.client(timeout=120) as inline:
        columns = pooled.batch_evaluate(samples, COLUMNS, view=pb.RESULT_VIEW_SCORES)
        full = pooled.batch_evaluate(samples, COLUMNS)
        by_inline = inline.batch_evaluate(samples, COLUMNS, view=pb.RESULT_VIEW_SCORES)
    assert [MessageToDict(r) for r in columns] == [_without_reasons(r) for r in full]
    assert [MessageToDict(r) for r in columns] == [MessageToDict(r) for r in by_inline]
    for sample, reply in zip(samples, columns, strict=True):
        try:
            json.loads(sample["response"])
            valid = 1.0
        except ValueError:
            valid = 0.0
        n = len(sample["response"])
        penalty = -(3 - n) * 0.01 if n < 3 else -(n - 12) * 0.01 if n > 12 else 0.0
        assert [r.score for r in reply.results] == [valid, penalty, valid]
        assert reply.reward == valid * (valid + 2 * penalty) / 3


@pytest.mark.parametrize(
    ("view", "graders", "expected"),
    [
        (pb.RESULT_VIEW_SCORES, [{"name": "misbehave", "params": {"column": True}}], 2.0),
        (pb.RESULT_VIEW_FULL, [{"name": "misbehave", "params": {"column": True}}], 1.0),
        (pb.RESULT_VIEW_SCORES, [{"name": "misbehave", "params": {"column": True}}, "attentive"], 1.0),
    ],
    ids=["scores-view-whole-chunks", "full-view", "scores-view-per-grader"],
)
def test_score_column_answers_the_scores_view_of_whole_chunks_only(server, view, graders, expected):
    """The test grader's column scores "which" 2.0 and its `evaluate` 1.0: which one answered shows."""
    with server.client(timeout=60) as c:
        replies = c.batch_evaluate([{"response": "which"}, {"response": "ok"}], graders, view=view)
    assert [r.results[0].score for r in replies] == [expected, 1.0]


def test_a_sample_with_extra_takes_the_sample_by_sample_path(server):
    """`extra` is checked per sample (a key may not replace a field): such a chunk is not graded as columns."""
    samples = [{"response": "which"}, {"response": "which", "extra": {"response": "x"}}, {"response": "which", "n": 1}]
    graders = [{"name": "misbehave", "params": {"column": True}}]
    with server.client(timeout=60) as c:
        replies = c.batch_evaluate(samples, graders, view=pb.RESULT_VIEW_SCORES)
    assert [r.results[0].score for r in replies] == [1.0, 0.0, 1.0]
    assert replies[1].results[0].error.code == "INVALID_SAMPLE"


# -- small batches of graders of bounded cost: inline ---------------------------------------------------------

INLINE_MAX_BYTES = 512 * 1024  # grpcgrade.core.engine's bound, as docs/architecture.md states it
INLINE_RESULTS_MAX_BYTES = 128 * 1024  # its bound for an answer of a result message per sample (the same)
INLINE_WINDOW_SECONDS = 1.0  # the window of the event loop's inline share, as docs/architecture.md states it


@pytest.mark.parametrize(
    ("params", "padding", "where"),
    [
        ({"bounded": True}, 0, "server"),
        ({"bounded": True, "column": True}, 0, "server"),
        ({"bounded": True}, INLINE_MAX_BYTES, "worker"),  # over the bound: workers
        ({"bounded": True}, INLINE_RESULTS_MAX_BYTES, "worker"),  # over the bound of a result per sample
        ({}, 0, "worker"),  # cost not declared bounded: workers, however small
    ],
    ids=["bounded-small", "bounded-small-column", "bounded-large", "bounded-results-large", "unbounded-small"],
)
@pytest.mark.parametrize("view", [pb.RESULT_VIEW_FULL, pb.RESULT_VIEW_SCORES], ids=["full", "scores"])
def test_small_batches_of_bounded_graders_are_graded_where_they_arrive(server, params, padding, where, view):
    """The test grader scores "pid..." with the id of the process that graded it."""
    samples = [{"response": "pid"}, {"response": "pid" + " " * padding}]
    graders = [{"name": "misbehave", "params": params}]
    with server.client(timeout=60) as c:
        batch = c.batch_evaluate(samples, graders, view=view)
        unary = c.evaluate(samples[0], graders, view=view) if not padding else batch[0]
    pids = {r.results[0].score for r in [*batch, unary]}
    workers = {float(pid) for pid in children(server.proc.pid)}
    if where == "server":
        assert pids == {float(server.proc.pid)}
    else:
        assert pids <= workers and pids


@pytest.mark.parametrize("padding", [0, 1000], ids=["small-inline", "large-in-workers"])
def test_score_columns_are_counted_in_the_score_histograms(server, padding):
    """The column path reports each grader's scores as `evaluate`'s path does (count, sum, buckets)."""
    samples = [{"response": JSONISH[i % len(JSONISH)] + " " * padding} for i in range(300)]
    valid = sum(json_score(s["response"]) for s in samples)

    def histogram() -> tuple[float, float, float]:
        labels = {"grader": "json_validator"}
        count = server.metric("grpcgrade_grader_score_count", **labels) or 0.0
        total = server.metric("grpcgrade_grader_score_sum", **labels) or 0.0
        zeros = server.metric("grpcgrade_grader_score_bucket", le="0.0", **labels) or 0.0
        return count, total, zeros

    before = histogram()
    with server.client(timeout=60) as c:
        c.batch_evaluate(samples, ["json_validator"], view=pb.RESULT_VIEW_SCORES)
    after = histogram()
    assert [a - b for a, b in zip(after, before, strict=True)] == [300, valid, 300 - valid]
