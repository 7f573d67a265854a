"""Fidelity to the references through a real server: request patterns with Python's meaning and bounded cost,
a grader listed twice, and the decisions D8, D10, D12 and the Struct-doubles rule (decisions.md).

Expected values come from Python's `re`, from the rules of decisions.md, or from hand calculation.
"""

from __future__ import annotations

import re
import threading

import grpc
import pytest
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from regex_cases import PATTERNS, TEXTS, check_against_python

from grpcgrade.testing import CpuSince, eventually, health_status, worker_pids


def regex_spec(case_sensitive: bool = True) -> dict:
    return {"name": "string_match", "params": {"algorithm": "regex_match", "case_sensitive": case_sensitive}}


def as_dict(result) -> dict:
    return {
        "score": result.score,
        "reason": result.reason,
        "metadata": MessageToDict(result.metadata),
        "error": result.error.code if result.HasField("error") else None,
    }


# -- regex_match: Python's results over the wire -------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "text"),
    [("foo(?=bar)", "foobar"), (r"(\w)\1", "hello"), (r"\b北京\b", "北京"), (r"\bcaf\b", "café"), (r"\B", ""),
     (r"a$\n", "a\n"), (r"[^\Wa]", "ab"), (r"(?a)k", "\u212a"), ("a{1001}", "a" * 1001)],
)  # fmt: skip
def test_regex_match_over_the_wire_gives_pythons_result(client, pattern, text):
    reply = client.evaluate({"response": text, "extra": {"pattern": pattern}}, [regex_spec()])
    check_against_python(pattern, text, True, as_dict(reply.results[0]))


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(PATTERNS, TEXTS), min_size=1, max_size=8), st.booleans())
def test_regex_match_over_the_wire_agrees_with_python_re_on_generated_patterns(client, cases, case_sensitive):
    samples = [{"response": text, "extra": {"pattern": pattern}} for pattern, text in cases]
    replies = client.batch_evaluate(samples, [regex_spec(case_sensitive)])
    for (pattern, text), reply in zip(cases, replies, strict=True):
        check_against_python(pattern, text, case_sensitive, as_dict(reply.results[0]))


# A backreference keeps it off RE2; Python's engine backtracks 2^n ways before failing.
CATASTROPHIC = r"(a+)+\1b"
CATASTROPHIC_TEXT = "a" * 60


def test_a_catastrophic_pattern_is_a_timeout_and_the_server_keeps_answering(server, client):
    """The event loop never runs the pattern. Shown by order, not by time: once a worker spins on it (up to
    the call's 3 s limit, twice), health and another call answer while the batch is still being graded."""
    outcome: dict[str, object] = {}
    workers = CpuSince(worker_pids(server.proc.pid))

    def grade() -> None:
        samples = [
            {"response": CATASTROPHIC_TEXT, "extra": {"pattern": CATASTROPHIC}},
            {"response": "xaab", "extra": {"pattern": r"(a)\1b"}},
            {"response": CATASTROPHIC_TEXT, "extra": {"pattern": CATASTROPHIC}},
        ]
        outcome["replies"] = client.batch_evaluate(samples, [regex_spec()], grader_timeout=3.0, timeout=60)

    worker = threading.Thread(target=grade)
    worker.start()
    try:
        eventually(lambda: workers.busy(0.1), "a worker on the pattern")
        answers = [
            health_status(server.target, timeout=60),
            client.evaluate({"response": "ok", "reference": "ok"}, ["string_match"], timeout=60).reward,
        ]
        still_grading = worker.is_alive()
    finally:
        worker.join(120)
    assert answers == [health_pb2.HealthCheckResponse.SERVING, 1.0]
    assert still_grading
    replies = outcome["replies"]
    assert [r.results[0].error.code or r.results[0].score for r in replies] == ["TIMEOUT", 1.0, "TIMEOUT"]
    assert not replies[0].HasField("reward") and replies[1].reward == 1.0


def test_a_catastrophic_think_token_is_a_timeout(client):
    token = r"(a+)+\1"  # the reference builds <token>.*?</token> from it, unescaped
    spec = {"name": "reasoning_format", "params": {"think_token": token}}
    replies = client.batch_evaluate(
        [{"response": "<" + "a" * 60}, {"response": "<aa>x</aa><answer>y</answer>"}], [spec], grader_timeout=1.0
    )
    expected = re.search(f"<{token}>.*?</{token}>", "<aa>x</aa><answer>y</answer>", re.DOTALL) is not None
    assert replies[0].results[0].error.code == "TIMEOUT"
    assert replies[1].results[0].score == float(expected) == 1.0


def test_a_huge_think_token_is_refused_before_compiling(client):
    # 20,000 characters: the pattern limit (10,000); 4 MB: the request's limit on params comes first
    for size, says in [(20_000, "think_token"), (4_000_000, "params")]:
        spec = {"name": "reasoning_format", "params": {"think_token": "(" + "t" * size + ")"}}
        with pytest.raises(grpc.RpcError) as err:
            client.evaluate({"response": "x"}, [spec])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in err.value.details()
        if size == 20_000:
            assert "limit of 10000" in err.value.details()


# -- one grader twice ----------------------------------------------------------------------------------------


def test_one_grader_listed_twice_without_keys_is_graded_twice(client):
    specs = [
        {"name": "string_match", "params": {"algorithm": "exact_match"}},
        {"name": "string_match", "params": {"algorithm": "substring_match"}, "weight": 3},
    ]
    reply = client.evaluate({"response": "the answer is 42", "reference": "42"}, specs)
    assert [(r.key, r.score) for r in reply.results] == [("string_match", 0.0), ("string_match#2", 1.0)]
    assert reply.reward == pytest.approx((1 * 0.0 + 3 * 1.0) / 4)


def test_an_explicit_key_given_twice_is_still_refused(client):
    specs = [{"name": "string_match", "key": "k"}, {"name": "number_accuracy", "key": "k"}]
    with pytest.raises(grpc.RpcError) as err:
        client.evaluate({"response": "1", "reference": "1"}, specs)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'k' is used twice" in err.value.details()


# -- decisions D8, D10, D12 and Struct doubles ---------------------------------------------------------------


def test_d8_extras_serve_every_grader_and_each_ignores_what_it_does_not_read(client):
    extra = {"pattern": "4.", "completion_tokens": 3, "expected_category": "x", "anything": [1, {"a": None}]}
    specs = ["number_accuracy", {"name": "string_match", "params": {"algorithm": "regex_match"}}, "json_validator"]
    reply = client.evaluate({"response": "42", "reference": "42", "extra": extra}, specs)
    assert [r.score for r in reply.results] == [1.0, 1.0, 1.0]
    assert not any(r.HasField("error") for r in reply.results)


def test_d10_a_reward_of_only_gates_is_the_product_of_its_gates(client):
    specs = [
        {"name": "string_match", "params": {"algorithm": "substring_match"}, "gate": True},
        {"name": "number_accuracy", "gate": True},
    ]
    reply = client.evaluate({"response": "1 and 5", "reference": "1 and 2"}, specs)
    assert [r.score for r in reply.results] == [0.0, 0.5]
    assert reply.reward == 0.0
    reply = client.evaluate({"response": "x 1 and 5", "reference": "1 and 2"}, specs[1:])
    assert reply.reward == 0.5


def test_d12_completion_tokens_must_be_a_whole_number(client):
    spec = {"name": "completion_length_cap", "params": {"max_completion_tokens": 10}}
    counts = [True, "12", 9.5, 10.0, 3, 11, -1]
    replies = client.batch_evaluate([{"response": "x", "extra": {"completion_tokens": n}} for n in counts], [spec])
    got = [r.results[0].error.code or r.results[0].score for r in replies]
    assert got == ["INVALID_SAMPLE", "INVALID_SAMPLE", "INVALID_SAMPLE", 1.0, 1.0, 0.0, "INVALID_SAMPLE"]


def test_struct_numbers_are_doubles_so_2_and_2_0_are_one_value(client):
    spec = {"name": "category_match", "params": {"allowed_categories": ["1", "2"]}}
    samples = [{"response": "2", "extra": {"expected_category": value}} for value in (2, 2.0)]
    replies = client.batch_evaluate(samples, [spec])
    assert [r.results[0].score for r in replies] == [1.0, 1.0]
    assert [MessageToDict(r.results[0].metadata)["expected"] for r in replies] == ["2", "2"]
    # params too: `ngram_range`-style ints arrive as doubles and mean the int
    reply = client.evaluate({"response": "1,000", "reference": "1000"}, [{"name": "number_accuracy"}])
    assert reply.results[0].score == 1.0


@pytest.mark.parametrize("param", ["parsing_timeout", "verification_timeout"])
def test_d11_math_verify_timeouts_under_one_second_are_refused(client, param):
    with pytest.raises(grpc.RpcError) as err:
        client.evaluate({"response": "$5$", "reference": "$5$"}, [{"name": "math_verify", "params": {param: 0.5}}])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert param in err.value.details()
    sample = {"response": "<think>\nr\n</think>\n$5$", "reference": "$5$"}  # Kolibrify's public case kbp-mv-same
    reply = client.evaluate(sample, [{"name": "math_verify", "params": {param: 1}}])
    assert reply.results[0].score == 1.0
