"""Whatever a trainer sends, every sample gets one well-formed answer, and hostile input costs no process.

The property test throws random batches (unicode, NUL bytes, long strings, random `extra` values, random
grader mixes across the families) at the suite's real server and checks the contract of grading.proto.
The tests after it send known-hostile inputs one by one and check that the server keeps answering.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpcgrade.service.convert import sample_to_pb, spec_to_pb
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

# Codes a well-formed input may legitimately earn; TIMEOUT or WORKER_LOST here would mean a hung or dead
# process, which no input of this size should cause.
INPUT_ERRORS = {"GRADER_FAILED", "INVALID_SAMPLE", "INVALID_RESULT"}
LISTWISE = {"longest_first"}

# -- strategies --------------------------------------------------------------------------------------

SNIPPETS = [
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "\n",
    " ",
    "{",
    "}",
    "[",
    "]",
    '"a"',
    ":",
    ",",
    "42",
    "-3.5",
    "1,000",
    "1e308",
    "#### 7",
    "\\boxed{3}",
    "null",
    "true",
    "\x00",
    "é",
    "e\u0301",
    "漢字",
    "🙂",
    "\u202e",
    "\ufeff",
    "(a+)+$",
    "GRPC",
    "grpc",
    "x",
]
short_text = st.text(max_size=40)
texts = st.one_of(
    short_text,
    st.lists(st.sampled_from(SNIPPETS), max_size=16).map("".join),
    st.tuples(st.text(min_size=1, max_size=6), st.integers(1_000, 20_000)).map(lambda t: (t[0] * t[1])[: t[1]]),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | short_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(short_text, children, max_size=3),
    max_leaves=8,
)
# Per-sample parameter names the graders read from `extra`, and a standard field's name (which must collide).
EXTRA_KEYS = [
    "pattern",
    "substrings",
    "case_sensitive",
    "bidirectional",
    "ignore_whitespace",
    "metadata",
    "completion_tokens",
    "method",
    "threshold",
    "n",
    "expected_type",
    "query",
]
extras = st.dictionaries(st.sampled_from(EXTRA_KEYS) | short_text, json_values, max_size=4)

STRING_ALGORITHMS = [
    "exact_match",
    "prefix_match",
    "suffix_match",
    "regex_match",
    "substring_match",
    "contains_all",
    "contains_any",
    "word_overlap",
    "char_overlap",
]
# Cheap similarity metrics, and chrf/rougeL/bleu, which cost milliseconds per sample.
SIMILARITY_ALGORITHMS = ["fuzzy_match", "edit_distance", "f1_score", "jaccard", "chrf", "rougeL", "bleu"]
flags = st.booleans()

GRADER_PARAMS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "json_validator": st.just({}),
    "json_match": st.fixed_dictionaries({}, optional={"strict_order": flags, "ignore_extra_keys": flags}),
    "string_match": st.fixed_dictionaries(
        {"algorithm": st.sampled_from(STRING_ALGORITHMS)},
        optional={"case_sensitive": flags, "ignore_whitespace": flags},
    ),
    "similarity": st.fixed_dictionaries({"algorithm": st.sampled_from(SIMILARITY_ALGORITHMS)}),
    "number_accuracy": st.fixed_dictionaries({}, optional={"tolerance": st.floats(0, 10)}),
    "length_penalty": st.fixed_dictionaries(
        {},
        optional={
            "min_length": st.integers(0, 50),
            "max_length": st.integers(0, 5000),
            "penalty_rate": st.floats(0, 1),
        },
    ),
    "think_format": st.just({}),
    "math_exact": st.just({}),
    "shout": st.just({}),
    "count_word": st.fixed_dictionaries({}, optional={"word": short_text}),
    "longest_first": st.just({}),
}


@st.composite
def grader_specs(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(st.sampled_from(sorted(GRADER_PARAMS)), min_size=1, max_size=5))
    specs = []
    for i, name in enumerate(names):
        spec = {"name": name, "key": f"{name}-{i}", "params": draw(GRADER_PARAMS[name])}
        spec["weight"] = draw(st.none() | st.floats(0.1, 5))
        spec["gate"] = draw(st.booleans()) if name not in LISTWISE else False
        specs.append(spec)
    return specs


samples = st.fixed_dictionaries(
    {"id": short_text, "query": texts, "response": texts, "reference": texts, "context": short_text},
    optional={"responses": st.lists(texts, max_size=4), "extra": extras},
)


# -- the property ------------------------------------------------------------------------------------


def expected_reward(specs: list[dict[str, Any]], results: list[pb.GraderResult]) -> float | None:
    """grading.proto's definition: prod(gate scores) * sum(w_i * s_i) / sum(w_i) over the non-gate pointwise
    graders; absent when a grader failed or no grader scores pointwise."""
    if any(r.HasField("error") for r in results):
        return None
    pointwise = [(s, r) for s, r in zip(specs, results, strict=True) if s["name"] not in LISTWISE]
    if not pointwise:
        return None
    gate = math.prod(r.score for s, r in pointwise if s["gate"])
    terms = [(1.0 if s["weight"] is None else s["weight"], r.score) for s, r in pointwise if not s["gate"]]
    weights = sum(w for w, _ in terms)
    return gate * (sum(w * x for w, x in terms) / weights if terms else 1.0)


def check_result(spec: dict[str, Any], sample: dict[str, Any], result: pb.GraderResult) -> None:
    assert (result.key, result.grader) == (spec["key"], spec["name"])
    if result.HasField("error"):
        assert result.error.code in INPUT_ERRORS, result.error
        assert result.error.message
    elif spec["name"] in LISTWISE:
        assert sorted(result.rank) == list(range(1, len(sample.get("responses", [])) + 1))
    else:
        assert math.isfinite(result.score), result


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(specs=grader_specs(), batch=st.lists(samples, min_size=1, max_size=6), chunk_size=st.sampled_from([0, 1, 2, 4]))
def test_every_sample_gets_one_well_formed_answer(server, specs, batch, chunk_size):
    request = pb.BatchEvaluateRequest(
        graders=[spec_to_pb(s) for s in specs], samples=[sample_to_pb(s) for s in batch], chunk_size=chunk_size
    )
    items: dict[int, pb.EvaluateResponse] = {}
    with grpc.insecure_channel(server.target) as channel:
        for message in pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=120):
            for item in message.items:
                assert item.index not in items, f"index {item.index} answered twice"
                items[item.index] = item.result
    assert sorted(items) == list(range(len(batch)))
    for index, sample in enumerate(batch):
        reply = items[index]
        assert reply.id == sample["id"]
        assert len(reply.results) == len(specs)
        for spec, result in zip(specs, reply.results, strict=True):
            check_result(spec, sample, result)
        expected = expected_reward(specs, list(reply.results))
        if expected is None:
            assert not reply.HasField("reward")
        else:
            assert reply.HasField("reward") and math.isfinite(reply.reward)
            assert reply.reward == pytest.approx(expected, rel=1e-9, abs=1e-12)


# -- hostile inputs, one by one ----------------------------------------------------------------------


@pytest.fixture
def still_serving(client) -> Iterator[None]:
    """After the test, the server still grades a plain sample correctly: no process died on the way."""
    yield
    reply = client.evaluate({"response": '{"ok": true}'}, ["json_validator"], timeout=30)
    assert reply.results[0].score == 1.0 and not reply.results[0].HasField("error")


DEEP_JSON = "[" * 200_000 + "]" * 200_000
SCHEMA = {"metadata": {"schema": json.dumps({"required": ["a"]})}}


@pytest.mark.parametrize(
    ("grader", "extra"),
    [("json_validator", {}), ("json_match", {}), ("json_schema", SCHEMA), ("custom_response", {})],
)
def test_json_nested_200000_deep_gets_a_result(client, still_serving, grader, extra):
    samples = [
        {"response": DEEP_JSON, "reference": DEEP_JSON, "extra": extra},
        {"response": '{"a": [1]}', "reference": '{"a": [1]}', "extra": extra},
    ]
    hostile, plain = client.batch_evaluate(samples, [grader], timeout=60)
    (result,) = hostile.results
    assert result.HasField("error") or math.isfinite(result.score)
    if result.HasField("error"):
        assert result.error.code in INPUT_ERRORS
    # The hostile sample spoils nothing for its neighbour: `{"a": [1]}` is a JSON object holding "a".
    assert plain.results[0].score == 1.0 and not plain.results[0].HasField("error")


def test_response_over_the_field_limit_is_an_invalid_sample(client, still_serving):
    reply = client.evaluate({"response": "x" * 30_000_000}, ["json_validator", "think_format"], timeout=60)
    for result in reply.results:
        assert result.error.code == "INVALID_SAMPLE"
        assert "max_field_chars=1000000" in result.error.message
    assert not reply.HasField("reward")


@pytest.mark.parametrize(
    ("response", "reference"),
    [("a\x00b", "a\x00b"), ("a\x00b", "a\x00c"), ("\x00" * 1000, "\x00" * 1000), ("\x00", "")],
)
def test_nul_bytes_reach_the_grader_intact(client, still_serving, response, reference):
    spec = {"name": "string_match", "params": {"algorithm": "exact_match", "case_sensitive": True}}
    reply = client.evaluate({"response": response, "reference": reference, "extra": {"k\x00": "v\x00"}}, [spec])
    assert reply.results[0].score == float(response == reference)
    json_reply = client.evaluate({"response": '{"a": "\x00"}'}, ["json_validator"])
    assert json_reply.results[0].score == 0.0  # JSON forbids raw control characters in strings (RFC 8259 §7)


def test_catastrophic_regex_is_answered_not_timed_out(client, still_serving):
    """Python's backtracking engine would take 2^40 steps: the grader's answer, not its time limit's TIMEOUT
    (the call's deadline only bounds a broken server's hold on the test)."""
    pattern, text = "(a+)+$", "a" * 40 + "!"
    assert re.search(pattern, "a" * 12 + "!") is None  # what Python's own engine says, on a size it finishes
    spec = {"name": "string_match", "params": {"algorithm": "regex_match"}}
    reply = client.evaluate({"response": text, "extra": {"pattern": pattern}}, [spec], timeout=120)
    (result,) = reply.results
    assert not result.HasField("error")
    assert result.score == 0.0 and result.metadata["matched"] is False


XML_SCHEMA = {"metadata": {"schema": json.dumps({"root_tag": "answer"})}}
XXE = '<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><answer>&x;</answer>'
BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol0 "lol">'
    + "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10))
    + "]><answer>&lol9;</answer>"
)


def _expat_accepts(text: str) -> bool:
    """Whether xml.etree (expat), the parser of the reference, Kolibrify, accepts `text`."""
    try:
        ET.fromstring(text)
    except ET.ParseError:
        return False
    return True


def test_xxe_payload_reads_no_file(client, still_serving):
    assert "root:" in Path("/etc/passwd").read_text()  # else the check below would prove nothing
    reply = client.evaluate({"response": XXE, "extra": XML_SCHEMA}, ["xml_schema"], timeout=10)
    assert "root:" not in text_format.MessageToString(reply)
    (result,) = reply.results
    assert not result.HasField("error")
    assert result.score == (1.0 if _expat_accepts(XXE) else 0.0)


def test_billion_laughs_payload_answers(client, still_serving):
    reply = client.evaluate({"response": BILLION_LAUGHS, "extra": XML_SCHEMA}, ["xml_schema"], timeout=10)
    (result,) = reply.results
    assert not result.HasField("error")
    assert result.score == 0.0  # refused, as expat refuses it (its input amplification limit)
    assert len(reply.SerializeToString()) < 10_000  # and nothing was expanded into the answer


# -- bytes the Python protobuf API refuses to build ----------------------------------------------------

MARKER = "MARKER-STRING"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _deep_struct_sample(depth: int) -> bytes:
    """A Sample whose `extra` nests `depth` Structs, written by hand (protobuf refuses past depth 100)."""
    value = _field(3, b"x")  # Value.string_value
    for _ in range(depth):
        entry = _field(1, b"a") + _field(2, value)  # Struct.fields map entry: key, value
        value = _field(5, _field(1, entry))  # Value.struct_value
    return _field(7, _field(1, _field(1, b"a") + _field(2, value)))  # Sample.extra


def _patched(raw: bytes, bad: bytes) -> bytes:
    """`raw` with the start of MARKER overwritten by `bad` (same length: every length prefix stays right)."""
    assert raw.count(MARKER.encode()) == 1
    return raw.replace(MARKER.encode(), bad + MARKER.encode()[len(bad) :])


def _hostile_request(method: str, where: str) -> bytes:
    spec = pb.GraderSpec(name="json_validator")
    if where == "deep-extra":
        head = pb.EvaluateRequest(graders=[spec]) if method == "Evaluate" else pb.BatchEvaluateRequest(graders=[spec])
        return head.SerializeToString() + _field(2, _deep_struct_sample(150))  # sample / samples: field 2
    sample = pb.Sample(response=MARKER) if where.startswith("response") else pb.Sample(extra={"k": MARKER})
    if method == "Evaluate":
        raw = pb.EvaluateRequest(graders=[spec], sample=sample).SerializeToString()
    else:
        raw = pb.BatchEvaluateRequest(graders=[spec], samples=[pb.Sample(response="1"), sample]).SerializeToString()
    return _patched(raw, b"\xff" if where.endswith("0xff") else "\ud800".encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("method", ["Evaluate", "BatchEvaluate"])
@pytest.mark.parametrize(
    "where", ["response-0xff", "response-surrogate", "extra-0xff", "extra-surrogate", "deep-extra"]
)
def test_unparsable_request_bytes_get_a_clean_error(server, client, method, where):
    with grpc.insecure_channel(server.target) as channel:
        path = f"/grpcgrade.v1.GradingService/{method}"
        call = (channel.unary_unary if method == "Evaluate" else channel.unary_stream)(
            path, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as err:
            reply = call(_hostile_request(method, where), timeout=10)
            if method == "BatchEvaluate":
                list(reply)
    assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), err.value
    assert client.evaluate({"response": "[1]"}, ["json_validator"]).results[0].score == 1.0
