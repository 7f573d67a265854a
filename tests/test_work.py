"""The one work type and result type: a work item split sample by sample (how a sample that kills its
process is isolated) answers what the whole item answers, whatever its samples travel in, and its failures
name the sample and grader at fault."""

from __future__ import annotations

import pickle

import pytest

from grpcgrade.core.errors import ErrorCode
from grpcgrade.core.registry import get_registry
from grpcgrade.core.rewards import SpecData
from grpcgrade.core.samples import Limits
from grpcgrade.core.work import ChunkResult, Encoded, WorkItem
from grpcgrade.grader import GraderError, GraderScore
from grpcgrade.service import rows, wire
from grpcgrade.v1 import grading_pb2 as pb

RESPONSES = ['{"a": 1}', "not json", "[1, 2]", "{"]
SPECS = (SpecData("json_validator"), SpecData("length_penalty", {"min_length": 2, "max_length": 5}))


def item(samples: list | Encoded) -> WorkItem:
    registry = get_registry()
    graders = tuple(registry.build(spec.name, spec.params) for spec in SPECS)
    names = tuple(g.name for g in graders)
    return WorkItem(SPECS, names, samples, 10, len(RESPONSES), 5.0, whole=True, graders=graders)


def wire_samples(view: int) -> Encoded:
    request = pb.BatchEvaluateRequest(samples=[pb.Sample(id=f"s{i}", response=r) for i, r in enumerate(RESPONSES)])
    return wire.encoded(wire.ReceivedBatch(request.SerializeToString()), 0, len(RESPONSES), view, Limits())


def answer_of(result: ChunkResult) -> object:
    """What a client would read of a result: the wire's message, the rows' results, or the columns."""
    if result.codec == wire.WIRE.name:
        return pb.BatchEvaluateResponse.FromString(result.encoded or b"")
    if result.codec == rows.ROWS.name:
        return rows.ROWS.answer(result.encoded or b"")
    return result.columns, result.rewards


@pytest.mark.parametrize(
    "samples",
    [
        lambda: [{"response": r} for r in RESPONSES],
        lambda: wire_samples(pb.RESULT_VIEW_FULL),
        lambda: wire_samples(pb.RESULT_VIEW_COLUMNS),
        lambda: rows.encoded([{"response": r} for r in RESPONSES]),
    ],
    ids=["kwargs", "wire-items", "wire-columns", "rows"],
)
def test_an_item_split_and_joined_answers_what_the_whole_item_answers(samples) -> None:
    whole = item(samples())
    parts = whole.split()
    assert [(p.start, p.size) for p in parts] == [(10 + k, 1) for k in range(len(RESPONSES))]
    joined = whole.join([part.run_here() for part in parts])
    graded = whole.run_here()
    assert answer_of(joined) == answer_of(graded)
    assert list(joined.indices) == list(graded.indices) == list(range(10, 10 + len(RESPONSES)))


def test_a_sample_no_process_could_grade_is_every_graders_error_and_a_failure_the_quarantine_keeps() -> None:
    parts = item(rows.encoded([{"response": r} for r in RESPONSES])).split()
    results = [parts[0].run_here(), parts[1].failed(ErrorCode.WORKER_LOST, "died twice"), parts[2].run_here()]
    joined = parts[0].join(results)
    columns, rewards = rows.ROWS.answer(joined.encoded or b"")
    assert [type(column[1]) for column in columns] == [GraderError, GraderError]
    assert [column[1].code for column in columns] == ["WORKER_LOST", "WORKER_LOST"]  # type: ignore[union-attr]
    assert rewards[1] is None and isinstance(columns[0][0], GraderScore)
    assert [(index, position, error.code) for index, position, error in joined.failures] == [
        (11, 0, "WORKER_LOST"),
        (11, 1, "WORKER_LOST"),
    ]
    assert parts[1].failed(ErrorCode.GRADER_FAILED, "no").failures == []  # only what the quarantine keeps


def test_what_crosses_to_another_process_holds_no_grader_and_no_clock_reading() -> None:
    task = item([{"response": r} for r in RESPONSES]).task()
    crossed = pickle.loads(pickle.dumps(task))
    assert crossed.args[0].graders is None and crossed.args[0].deadline is None and crossed.seconds_left is None
