"""A graded chunk's items written as bytes (`service.items`) parse to exactly the message protobuf's own API
builds (`convert.fill_items`), for every shape of result: the ones written directly and the ones handed to
protobuf (ranks, nested metadata, texts UTF-8 cannot encode, types of their own)."""

from __future__ import annotations

import enum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpcgrade.core.errors import ErrorCode
from grpcgrade.grader import GraderError, GraderRank, GraderScore
from grpcgrade.service import items
from grpcgrade.service.convert import fill_items
from grpcgrade.service.items import items_bytes
from grpcgrade.v1 import grading_pb2 as pb


class Colour(enum.Enum):
    RED = "red"


def by_protobuf(indices, ids, labels, columns, rewards, full) -> bytes:
    message = pb.BatchEvaluateResponse()
    fill_items(message.items, indices, ids, labels, columns, rewards, full)
    return message.SerializeToString(deterministic=True)


def by_bytes(indices, ids, labels, columns, rewards, full) -> bytes:
    """The directly written bytes, parsed and written again deterministically (map entries sorted): what
    protobuf gives for the message they hold."""
    data = items_bytes(indices, ids, labels, columns, rewards, full)
    return pb.BatchEvaluateResponse.FromString(data).SerializeToString(deterministic=True)


SCALARS = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0.0, -0.0, 2**1030, -(2**1030), 1e308, "\ud800", "é\x00"]),
)
METADATA = st.dictionaries(st.text(max_size=8), SCALARS, max_size=4) | st.sampled_from(
    [
        {},
        {"nested": {"a": [1, 2.5, None]}},
        {1: "a key of another type"},
        {"\udc00": 1},
        {"enum": Colour.RED},
        {"list": [True, "x"]},
    ]
)
TEXT = st.text(max_size=30) | st.sampled_from(["", "\ud83d", "x" * 200])
SCORES = st.builds(
    GraderScore,
    name=st.just("g"),
    score=st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0, 1.0]),
    reason=TEXT,
    metadata=METADATA,
    cached=st.booleans(),
)
ERRORS = st.builds(
    GraderError,
    name=st.just("g"),
    error=TEXT,
    reason=TEXT,
    code=st.sampled_from([*ErrorCode, "", "CUSTOM"]),
    metadata=METADATA,
)
OTHERS = st.sampled_from([GraderRank("g", [2, 1], "ranked", {"k": 1}), 0.5, 3, GraderScore("g", 1, "an int score")])
RESULTS = st.one_of(SCORES, ERRORS, OTHERS)
REWARDS = st.none() | st.floats(allow_nan=False) | st.just(-0.0)


@settings(max_examples=400, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(min_value=0, max_value=3_000_000), st.text(max_size=10), REWARDS, RESULTS, RESULTS),
        min_size=1,
        max_size=6,
    ),
    graders=st.sampled_from([1, 2]),
    full=st.booleans(),
)
def test_items_written_as_bytes_are_the_message_protobuf_builds(rows, graders, full):
    indices = [r[0] for r in rows]
    ids = [r[1] for r in rows]
    rewards = [r[2] for r in rows]
    columns = [[r[3] for r in rows], [r[4] for r in rows]][:graders]
    labels = [("first", "json_validator"), ("", "similarity")][:graders]
    assert by_bytes(indices, ids, labels, columns, rewards, full) == by_protobuf(
        indices, ids, labels, columns, rewards, full
    )


@pytest.mark.parametrize("full", [True, False])
def test_a_cheap_graders_common_results_are_written_directly_and_equal(full, monkeypatch):
    """The shapes a batch is made of (json_validator's valid and invalid results, the column path's bare
    scores, errors with their codes), many rows, indices past one varint byte: equal messages, and none of
    them left to protobuf's API (the scores view's bare scores once were: 7.9 -> 12.7 us a sample)."""
    valid = GraderScore("json_validator", 1.0, "Valid JSON", {"is_valid": True, "response_length": 412})
    invalid = GraderScore(
        "json_validator",
        0.0,
        "JSON decode error: Expecting value: line 1 column 1 (char 0)",
        {"is_valid": False, "error_message": "Expecting value", "response_length": 300},
    )
    error = GraderError("json_validator", "boom", code=ErrorCode.GRADER_FAILED)
    column = [valid if k % 10 else invalid for k in range(300)]
    bare = [float(k % 2) for k in range(300)]  # `score_column`'s scores
    indices = list(range(100_000, 100_300))
    rewards = [r.score for r in column]
    for graded in (column, bare, [*column[:-1], error]):
        args = (indices, [""] * 300, [("json_validator", "json_validator")], [graded], rewards, full)
        expected = by_protobuf(*args)
        with monkeypatch.context() as patched:
            patched.setattr(items, "_by_protobuf", lambda *a: pytest.fail("a common result left to protobuf"))
            assert by_bytes(*args) == expected


@pytest.mark.parametrize("full", [True, False])
def test_varint_and_kept_reason_boundaries_equal_protobufs_message(full):
    """Indices and lengths on each side of the written varints' table and of their three-byte case, and a
    reason written twice (the second time from the kept records) beside one too long to be kept: the
    message protobuf's API builds, each time."""
    indices = [0, 127, 128, 16_383, 16_384, 2**21 - 1, 2**21, 2**28]
    kept = "short, and repeated"
    reasons = [
        kept,
        kept,
        "y" * (items.REASON_KEPT_CHARS + 1),
        "y" * (items.REASON_KEPT_CHARS + 1),
        "",
        kept,
        "z" * 300,
        kept,
    ]
    column = [GraderScore("g", 0.5, reason, {"n": k}) for k, reason in enumerate(reasons)]
    args = (indices, [""] * 8, [("g", "g")], [column], [0.5] * 8, full)
    for _ in range(2):  # the second pass writes every reason from what the first one kept
        assert by_bytes(*args) == by_protobuf(*args)
