"""`samples.as_text` and `samples.plain`: a trainer's dataset values as a field's text, with real numpy values.

The expected texts are what the values hold in Python (numpy's own `.item()` / `.tolist()`) written as JSON
by the json module, not this module's output."""

from __future__ import annotations

import json

import numpy as np
import pytest

from grpcgrade.core.errors import SampleProblem
from grpcgrade.core.samples import Limits, as_text, is_missing, plain
from grpcgrade.v1 import grading_pb2 as pb


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("72", "72"),
        (None, ""),
        (72, "72"),
        (72.0, "72"),  # a parquet float column's whole number is the integer the answer is written as
        (72.5, "72.5"),
        (-3.0, "-3"),
        (True, "true"),
        (np.int64(72), "72"),
        (np.int32(-5), "-5"),
        (np.float64(72.0), "72"),
        (np.float32(0.5), "0.5"),
        (np.bool_(True), "true"),
        (np.str_("seventy-two"), "seventy-two"),
        (np.array(["72", "seventy-two"]), json.dumps(["72", "seventy-two"])),
        (np.array([72.0, 72.5]), json.dumps([72, 72.5])),
        (np.array([[1, 2], [3, 4]]), json.dumps([[1, 2], [3, 4]])),
        ([72.0, "x"], json.dumps([72, "x"])),
        ({"answer": np.int64(3), "alts": (1.0, 2.5)}, json.dumps({"answer": 3, "alts": [1, 2.5]})),
        (["é"], '["é"]'),  # the text as the dataset held it, not escaped
    ],
)
def test_as_text(value, text):
    assert as_text(value) == text


def test_missing_values_are_none_nan_and_pandas_na_and_nothing_else():
    missing = [None, float("nan"), np.float64("nan"), np.float32("nan"), np.nan]
    present = ["", "NaN", "None", 0, 0.0, np.float64(1.5), np.int64(0), float("inf"), [], [float("nan")], {}]
    assert [is_missing(v) for v in missing] == [True] * len(missing)
    assert [is_missing(v) for v in present] == [False] * len(present)


def test_plain_gives_python_values_numpy_itself_gives():
    arr = np.array([1.5, 2.0])
    assert plain(arr) == arr.tolist() and type(plain(arr)[0]) is float
    assert type(plain(np.int64(3))) is int
    assert plain({"a": [np.int8(1), (np.float16(0.5),)]}) == {"a": [1, [0.5]]}
    marker = object()
    assert plain(marker) is marker  # anything else as it is


def test_a_sample_problem_kept_as_a_value_carries_no_traceback():
    """A rejected sample's problem is kept as a value (in the chunk's list, a column's rows): its traceback
    would hold the frames it passed through, their texts and the list itself, a cycle only a full
    collection frees (the HTTP face grew by every rejected text: tests/test_http_hostile.py)."""
    from grpcgrade.service.convert import column_rows, sample_kwargs

    limits = Limits(max_field_chars=10)
    problem = sample_kwargs(pb.Sample(response="x" * 11), limits)
    assert isinstance(problem, SampleProblem) and problem.__traceback__ is None
    columns = pb.SampleColumns(response=["ok", "x" * 11])
    rows = column_rows(columns, {"response": list(columns.response)}, 0, 2, limits)
    assert isinstance(rows[1], SampleProblem) and rows[1].__traceback__ is None
