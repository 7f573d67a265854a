"""What counts as the program, the test-case format, and how answers are compared: no sandbox needed.

Expected values come from the definitions: veRL's prime_code rules as docs/code-rewards.md states them
(each case names the rule it exercises), numpy.allclose for the numeric rule, and the APPS/TACO format.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from grpcgrade_code.cases import (
    MAX_CASES,
    BadTests,
    parse_tests,
    prime_code_matches,
    result_matches,
    sandbox_fusion_matches,
)
from grpcgrade_code.extraction import extract_code
from grpcgrade_code.grader import excerpt, with_preamble
from grpcgrade_code.harness import read_result
from grpcgrade_code.languages import TAGS

PY = TAGS["python"]

# -- extraction --------------------------------------------------------------------------------------


def test_the_last_block_in_the_language_is_the_program() -> None:
    text = "First try:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```\nDone."
    assert extract_code(text, PY) == "print(2)\n"


def test_a_tagged_block_wins_over_a_later_untagged_one() -> None:
    text = "```python\nprint(1)\n```\nOutput:\n```\n1\n```"
    assert extract_code(text, PY) == "print(1)\n"


def test_an_untagged_block_when_none_is_tagged() -> None:
    assert extract_code("Code:\n```\nprint(3)\n```\n", PY) == "print(3)\n"


def test_no_fence_means_the_whole_response() -> None:
    assert extract_code("print(4)", PY) == "print(4)"


def test_blocks_only_in_other_languages_mean_no_program() -> None:
    assert extract_code("```cpp\nint main() {}\n```", PY) is None
    assert extract_code("```cpp\nint main() {}\n```", TAGS["cpp"]) == "int main() {}\n"


def test_a_block_cut_off_by_the_token_budget_runs_to_the_end() -> None:
    assert extract_code("```python\nprint(5)\nprint(6", PY) == "print(5)\nprint(6"


def test_backticks_inside_a_line_do_not_close_the_block() -> None:
    assert extract_code('```python\ns = "```"\nprint(s)\n```', PY) == 's = "```"\nprint(s)\n'


def test_a_longer_fence_holds_a_shorter_one() -> None:
    assert extract_code("````python\nprint('```')\n```\n````\n", PY) == "print('```')\n```\n"


def test_future_imports_stay_first_before_the_preamble() -> None:
    source = with_preamble("from __future__ import annotations\nx: int = 1\nprint(x)\n")
    assert source.startswith("from __future__ import annotations\n")
    assert source.count("from __future__") == 1
    compile(source, "solution.py", "exec")  # a __future__ import after other code would not compile


# -- the test-case format -----------------------------------------------------------------------------


def test_stdin_cases_from_a_mapping_and_from_its_json() -> None:
    tests = {"inputs": ["1 2\n", ["3 4", "5"]], "outputs": ["3\n", ["7", "5"]]}
    for raw in (tests, json.dumps(tests)):
        parsed = parse_tests(raw)
        assert parsed.fn_name is None and parsed.total == 2
        assert [(c.stdin, c.expected) for c in parsed.cases] == [("1 2\n", "3\n"), ("3 4\n5", "7\n5")]


def test_call_cases_in_both_verl_spellings() -> None:
    """prime_code: inputs are JSON lines, outputs JSON strings; APPS: argument lists and values."""
    json_lines = parse_tests({"fn_name": "f", "inputs": ['[1, 2]\n"x"'], "outputs": ["[3]"]})
    lists = parse_tests({"fn_name": "f", "inputs": [[[1, 2], "x"]], "outputs": [[3]]})
    for parsed in (json_lines, lists):
        (case,) = parsed.cases
        assert json.loads(case.stdin)["args"] == [[1, 2], "x"]
        assert json.loads(case.stdin)["function"] == "f"
        assert case.expected == [3]


def test_a_non_json_expected_string_stays_a_string() -> None:
    (case,) = parse_tests({"fn_name": "f", "inputs": [["a"]], "outputs": ["plain text"]}).cases
    assert case.expected == "plain text"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "no `tests`"),
        ("{not json", "not valid JSON"),
        ([1, 2], "must be a mapping"),
        ({"inputs": ["1"]}, '"outputs" list'),
        ({"inputs": ["1", "2"], "outputs": ["1"]}, "2 inputs but 1 outputs"),
        ({"inputs": [], "outputs": []}, "no test case"),
        ({"inputs": [1], "outputs": ["1"]}, "input 0 must be a string"),
        ({"fn_name": "f", "inputs": ["[1"], "outputs": ["1"]}, "one JSON value per line"),
        ({"fn_name": "not an identifier", "inputs": [[1]], "outputs": [1]}, "fn_name must be"),
    ],
)
def test_unusable_tests_say_what_is_wrong(raw: object, message: str) -> None:
    with pytest.raises(BadTests, match=message):
        parse_tests(raw)


def test_case_count_is_bounded_and_max_cases_takes_the_first() -> None:
    many = {"inputs": ["x"] * (MAX_CASES + 1), "outputs": ["x"] * (MAX_CASES + 1)}
    with pytest.raises(BadTests, match="max_cases"):
        parse_tests(many)
    first = parse_tests(many, max_cases=3)
    assert (len(first.cases), first.total) == (3, MAX_CASES + 1)


# -- prime_code's stdout comparison ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("3\n", "3"),  # rule 1: both stripped
        ("  3  \n\n", "3\n"),  # rule 1
        ("1 \n2\t\n", "1\n2"),  # rule 2: each line stripped
        ("1\r\n2\r\n", "1\n2\n"),  # lines, whatever the line ends
        ("1\n2\n", "1\n\n2\n"),  # rule 3: empty expected lines dropped
        ("1\n\n2\n", "  1\n2  \n"),  # rule 4: the program's empty lines dropped too
        ("0.333333\n", "0.3333333"),  # rule 5: within numpy.allclose's tolerance
        ("1e3\n-2.5\n", "1000\n-2.50"),  # rule 5, line for line
        ("inf\n", "inf"),  # equal infinities
    ],
)
def test_prime_code_accepts(stdout: str, expected: str) -> None:
    assert prime_code_matches(stdout, expected)


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("4\n", "3"),
        ("1 2\n", "1  2"),  # spaces inside a line count
        ("1\n2\n", "2\n1"),
        ("0.3334\n", "0.3333333"),  # outside the tolerance
        ("007\n", "7"),  # both integers: no numeric comparison, and the text differs
        ("1.0 2.0\n", "1 2"),  # a line of several numbers is not a number
        ("nan\n", "NaN"),  # NaN never matches as a number (and the text differs)
        ("1\n2\n", "1\n2\n3"),  # a different number of lines
        ("", "0"),
    ],
)
def test_prime_code_refuses(stdout: str, expected: str) -> None:
    assert not prime_code_matches(stdout, expected)


@pytest.mark.parametrize(
    ("out", "want"),
    [("0.1000001", "0.1"), ("1e-9", "0"), ("100.0009", "100"), ("100.0011", "100"), ("-5", "-5.0000001")],
)
def test_the_numeric_rule_is_numpy_allclose(out: str, want: str) -> None:
    """prime_code calls np.allclose(output, expected) on the lines: the same verdict, number for number."""
    assert prime_code_matches(out, want) == bool(np.allclose([float(out)], [float(want)]))


def test_sandbox_fusion_comparison_ignores_only_trailing_newlines() -> None:
    assert sandbox_fusion_matches("3\n\n", "3")
    assert not sandbox_fusion_matches("3 \n", "3")
    assert not sandbox_fusion_matches("0.333333\n", "0.3333333")


def test_return_values_equal_or_wrapped_in_a_list() -> None:
    assert result_matches([1, 2], [1, 2])
    assert result_matches(5, [5])  # APPS wraps return values in a list
    assert result_matches(1, 1.0)
    assert not result_matches([1, 2], [[2, 1]])
    assert not result_matches(None, [])


def test_the_harness_result_is_the_last_line() -> None:
    assert read_result("debug print\n[1, 2]\n") == (True, [1, 2])
    assert read_result("") == (False, None)
    assert read_result("no json here\n") == (False, None)


def test_excerpts_keep_both_ends() -> None:
    text = "a" * 150 + "b" * 150
    cut = excerpt(text)
    assert cut.startswith("a" * 100) and cut.endswith("b" * 100) and "truncated" in cut
    assert excerpt("short") == "short"
