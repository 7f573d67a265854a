"""NumberAccuracyGrader beyond the conformance cases: the number syntax of decision D4, positional
comparison, tolerance, reasons and metadata."""

from __future__ import annotations

import json

import pytest

from grpcgrade.core.errors import InvalidParams
from grpcgrade.graders.text.number_accuracy import NumberAccuracyGrader, extract_numbers


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("1,000", [1000.0]),
        ("costs 1,234,567.89 dollars", [1234567.89]),
        ("-1,234.5", [-1234.5]),
        ("1,2345", [1234.0, 5.0]),  # D4 as worded: the group takes three digits, the fourth starts a number
        ("1,00", [1.0, 0.0]),
        ("1, 2, 3", [1.0, 2.0, 3.0]),
        ("1e5 and 2.5E-3 and 7e+2", [100000.0, 0.0025, 700.0]),
        ("2e", [2.0]),
        (".5", [5.0]),
        ("12.", [12.0]),
        ("3.14.15", [3.14, 15.0]),
        ("2024-01-05", [2024.0, -1.0, -5.0]),
        ("no numbers", []),
    ],
)
def test_number_syntax(text, numbers):
    assert extract_numbers(text) == numbers


def test_metadata_and_reason():
    result = NumberAccuracyGrader().evaluate(response="got 1,000 and 3 and 9", reference_response="1000 then 4")
    assert result.score == 0.5
    assert result.reason == "Number accuracy: 1/2 numbers correct"
    assert result.metadata == {
        "accuracy": 0.5,
        "correct_numbers": 1,
        "total_reference_response_numbers": 2,
        "response_numbers": [1000.0, 3.0, 9.0],
        "reference_response_numbers": [1000.0, 4.0],
        "tolerance": 1e-6,
    }
    json.dumps(result.metadata)


def test_no_reference_numbers_comes_before_no_response_numbers():
    result = NumberAccuracyGrader().evaluate(response="none", reference_response="none either")
    assert (result.score, result.reason) == (0.0, "No reference_response numbers to compare")
    assert result.metadata == {"response_numbers": [], "reference_response_numbers": []}
    result = NumberAccuracyGrader().evaluate(response="none", reference_response="7")
    assert (result.score, result.reason) == (0.0, "No numbers found in response content")
    assert result.metadata == {"response_numbers": [], "reference_response_numbers": [7.0]}


def test_tolerance_is_inclusive():
    assert NumberAccuracyGrader(tolerance=0.5).evaluate(response="1.5", reference_response="1").score == 1.0
    assert NumberAccuracyGrader(tolerance=0.25).evaluate(response="1.5", reference_response="1").score == 0.0


def test_extra_sample_fields_are_accepted():
    grader = NumberAccuracyGrader()
    assert grader.evaluate(response="2", reference_response="2", query="q", context="c", substrings=[]).score == 1.0


@pytest.mark.parametrize("tolerance", [-0.1, float("nan"), float("inf"), "0.1"])
def test_invalid_tolerance_is_refused(tolerance):
    with pytest.raises(InvalidParams) as err:
        NumberAccuracyGrader(tolerance=tolerance)
    assert err.value.param == "tolerance"


def test_the_fast_number_pattern_reads_what_the_d4_pattern_reads():
    """The scan is optimised; the numbers it finds are exactly those of D4's two plain alternatives."""
    import random
    import re

    d4 = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?|-?\d+(\.\d+)?([eE][-+]?\d+)?")  # decisions.md, verbatim
    rng = random.Random(4)
    for _ in range(3000):
        text = "".join(rng.choice("0123456789,.-eE+ x") for _ in range(rng.randint(0, 40)))
        assert extract_numbers(text) == [float(m.group().replace(",", "")) for m in d4.finditer(text)], text


def test_comma_groups_are_read_as_d4_words_them():
    """D4's pattern reads `12,3456` as 12,345 then 6 (the issue's case: the reference 1,000 and 12,3456)."""
    import re

    d4 = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?|-?\d+(\.\d+)?([eE][-+]?\d+)?")
    reference, response = "1,000 and 12,3456", "1000 12 3456"
    expected_ref = [float(m.group().replace(",", "")) for m in d4.finditer(reference)]
    expected_resp = [float(m.group()) for m in d4.finditer(response)]
    correct = sum(a == b for a, b in zip(expected_resp, expected_ref, strict=False))
    result = NumberAccuracyGrader().evaluate(response=response, reference_response=reference)
    assert result.metadata["reference_response_numbers"] == expected_ref == [1000.0, 12345.0, 6.0]
    assert result.score == pytest.approx(correct / len(expected_ref)) == pytest.approx(1 / 3)
