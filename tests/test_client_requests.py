"""How the client fills a request's samples: dicts by `sample_to_pb`'s rules, messages as they are, and
columns (`SampleColumns`), each giving the very messages the Sample's definition says, and the same through
a real server."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from grpcgrade.client import GradingClient
from grpcgrade.integrations.common import json_value
from grpcgrade.service.convert import SampleColumns, add_samples, sample_to_pb
from grpcgrade.testing import ServerProcess
from grpcgrade.v1 import grading_pb2 as pb


def filled(samples: Any) -> list[pb.Sample]:
    request = pb.BatchEvaluateRequest()
    add_samples(request.samples, samples)
    return list(request.samples)


def with_extra(extra: dict[str, Any], **fields: Any) -> pb.Sample:
    out = pb.Sample(**fields)
    out.extra.update(extra)
    return out


# (sample dict, the message its fields define)
DICTS = [
    ({"query": "q", "response": "r", "reference": "a"}, pb.Sample(query="q", response="r", reference="a")),
    ({"response": "r", "reference": None}, pb.Sample(response="r")),  # None: no text
    ({"id": 7, "response": "r"}, pb.Sample(id="7", response="r")),  # a number id as its text
    ({"response": "r", "responses": ["x", "y"]}, pb.Sample(response="r", responses=["x", "y"])),
    ({"response": "r", "lang": "en"}, with_extra({"lang": "en"}, response="r")),  # an unknown key: extra
    ({"response": "r", "extra": {"n": 2}, "lang": "en"}, with_extra({"n": 2, "lang": "en"}, response="r")),
    ({"context": "c", "response": True}, pb.Sample(context="c", response="True")),
]


def test_dicts_fill_the_messages_the_sample_fields_define() -> None:
    samples = [d for d, _ in DICTS]
    assert filled(samples) == [m for _, m in DICTS]
    assert [sample_to_pb(d) for d in samples] == [m for _, m in DICTS]


def test_messages_are_copied_as_they_are() -> None:
    message = with_extra({"k": [1, 2]}, id="x", response="r", responses=["a"])
    assert filled([message, {"response": "s"}]) == [message, pb.Sample(response="s")]


def test_columns_fill_one_message_per_sample() -> None:
    columns = SampleColumns(
        query=["q0", "q1", "q2"],
        response=["r0", "r1", "r2"],
        reference=["a0", None, 3],  # None: no text; anything else as its text
        extra=[{"n": 1}, None, {}],
        responses=[None, ["x", "y"], None],
    )
    expected = [
        with_extra({"n": 1}, query="q0", response="r0", reference="a0"),
        pb.Sample(query="q1", response="r1", responses=["x", "y"]),
        pb.Sample(query="q2", response="r2", reference="3"),
    ]
    assert len(columns) == 3
    assert filled(columns) == expected
    assert filled(columns[1:]) == expected[1:]  # a slice (the client's chunk) is columns too
    assert len(columns[1:]) == 2
    assert columns[0] == {"query": "q0", "response": "r0", "reference": "a0", "extra": {"n": 1}}
    assert filled([columns[1]]) == [expected[1]]


@pytest.mark.parametrize(
    "fields",
    [
        {"query": ["q"], "response": ["r"], "reference": ["a"]},  # TRL's three columns
        {"response": ["r"]},
        {"id": ["i"], "context": ["c"], "response": ["r"]},
    ],
)
def test_columns_of_any_field_set(fields: dict[str, list[str]]) -> None:
    assert filled(SampleColumns(**fields)) == [pb.Sample(**{k: v[0] for k, v in fields.items()})]


def test_checked_columns_fill_as_the_constructor_does() -> None:
    fields = {"query": ["q0", "q1"], "response": ["r0", "r1"], "reference": ["a0", "a1"]}
    extra = [None, {"k": "v"}]
    assert filled(SampleColumns.of_text(fields, extra)) == filled(SampleColumns(extra=extra, **fields))
    assert len(SampleColumns.of_text(fields)) == 2


def test_columns_refuse_unknown_fields_and_uneven_lengths() -> None:
    with pytest.raises(ValueError, match="no Sample field 'answer'"):
        SampleColumns(answer=["a"])
    with pytest.raises(ValueError, match="different lengths"):
        SampleColumns(query=["q", "q"], response=["r"])
    with pytest.raises(ValueError, match="different lengths"):
        SampleColumns(response=["r"], extra=[{}, {}])


def test_a_server_grades_columns_as_it_grades_dicts(server: ServerProcess) -> None:
    n = 2500  # more than one chunk of 1024
    responses = ['{"a": 1}' if i % 3 else "not json" for i in range(n)]
    columns = SampleColumns(response=responses, id=[f"s{i}" for i in range(n)])
    with GradingClient(server.target, timeout=30) as client:
        by_columns = client.batch_evaluate(columns, ["json_validator"], view=pb.RESULT_VIEW_SCORES)
        by_dicts = client.batch_evaluate(
            [{"id": f"s{i}", "response": r} for i, r in enumerate(responses)],
            ["json_validator"],
            view=pb.RESULT_VIEW_SCORES,
        )
    assert by_columns == by_dicts
    assert [r.id for r in by_columns] == [f"s{i}" for i in range(n)]
    assert [r.reward for r in by_columns] == [0.0 if i % 3 == 0 else 1.0 for i in range(n)]


@pytest.mark.parametrize("value", ["text", "\u00e9\u4e2d", 0, -(2**70), True, None, 1.5, (1, "a"), {"k": [None, 2.5]}])
def test_a_trainer_value_travels_as_its_json_form(value: Any) -> None:
    assert json_value(value) == json.loads(json.dumps(value))
    assert type(json_value(value)) is type(json.loads(json.dumps(value)))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, object(), b"bytes", {1.0: math.nan}])
def test_a_value_without_a_json_form_is_refused(value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        json_value(value)
