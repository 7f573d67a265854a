"""Test cases in the APPS/TACO format veRL's code scorers read, and how a program's answer is compared.

`{"inputs": [...], "outputs": [...]}` (a mapping, or the same as a JSON string) is a list of stdin/stdout
pairs; with `"fn_name"` the inputs are argument lists and the outputs return values. Both veRL spellings
are read: an input of the call-based form may be a list of arguments or a string of one JSON value per
line (`prime_code`), an output a JSON value or a JSON string of one.

Comparison follows veRL's `prime_code` (its default scorer, `testing_util.run_test`), rule for rule:

* stdin/stdout: the program's stdout, split into lines, passes when any of these holds against the
  expected text (a list of lines is joined with "\\n" first):
  1. the lines joined with "\\n", stripped, equal the expected text stripped;
  2. the same with every line stripped first;
  3. the lines equal the expected lines (each stripped, empty ones dropped);
  4. the same with the program's empty lines dropped too;
  5. line for line as numbers: the same number of non-empty lines, not all of them integers on both
     sides, every line a float, each within |a - b| <= 1e-8 + 1e-5 * |b| (numpy.allclose's defaults,
     b the expected value; NaN never matches, equal infinities do).
* `sandbox_fusion` (param `compare`): the stdout and the expected text equal once trailing newlines are
  removed, as veRL's SandboxFusion scorer compares them.
* function calls: the return value (through JSON, so tuples are lists and dict keys strings) equals the
  expected value, or its first element when the expected value is a non-empty list (APPS wraps return
  values in a list).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .harness import call_request

#: The most test cases one sample may carry (each is a sandboxed run); `max_cases` grades fewer.
MAX_CASES = 1000
#: A number's relative and absolute tolerance, numpy.allclose's defaults as prime_code calls it.
RTOL, ATOL = 1e-5, 1e-8
COMPARE_MODES = ("prime_code", "sandbox_fusion")


class BadTests(ValueError):
    """The sample's test cases cannot be used; the sample gets INVALID_SAMPLE."""


@dataclass(frozen=True)
class Case:
    stdin: str  #: what the program reads (call-based: the harness's request, the arguments as JSON)
    expected: Any  #: stdout text, or the return value
    shown_input: str  #: the input as the data gave it, for the result's metadata


@dataclass(frozen=True)
class TestSet:
    fn_name: str | None
    cases: list[Case]
    total: int  #: cases in the data, before `max_cases`


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    raise BadTests(f"{what} must be a string or a list of lines, got {type(value).__name__}")


def _arguments(value: Any, what: str) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        try:
            return [json.loads(line) for line in value.split("\n")]
        except ValueError as exc:
            raise BadTests(f"{what} is not one JSON value per line: {exc}") from exc
    raise BadTests(f"{what} must be a list of arguments or JSON lines, got {type(value).__name__}")


def _return_value(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def parse_tests(raw: Any, max_cases: int | None = None) -> TestSet:
    """The sample's `tests`, checked; raises BadTests naming what is wrong."""
    if raw is None:
        raise BadTests("the sample has no `tests` (put the test cases in the sample's extra.tests)")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise BadTests(f"tests is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise BadTests(f'tests must be a mapping {{"inputs": [...], "outputs": [...]}}, got {type(raw).__name__}')
    inputs, outputs = raw.get("inputs"), raw.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise BadTests('tests needs an "inputs" list and an "outputs" list')
    if len(inputs) != len(outputs):
        raise BadTests(f"tests has {len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        raise BadTests("tests has no test case")
    fn_name = raw.get("fn_name") or None
    if fn_name is not None and not (isinstance(fn_name, str) and fn_name.isidentifier()):
        raise BadTests(f"fn_name must be a Python identifier, got {fn_name!r}")
    total = len(inputs)
    if max_cases is None and total > MAX_CASES:
        raise BadTests(f"tests has {total} cases, over the limit of {MAX_CASES}; set max_cases to grade the first N")
    count = total if max_cases is None else min(total, max_cases)
    cases = []
    for i in range(count):
        if fn_name is None:
            shown = _text(inputs[i], f"input {i}")
            cases.append(Case(shown, _text(outputs[i], f"output {i}"), shown))
        else:
            args = _arguments(inputs[i], f"input {i}")
            shown = inputs[i] if isinstance(inputs[i], str) else json.dumps(inputs[i])
            cases.append(Case(call_request(fn_name, args), _return_value(outputs[i]), shown))
    return TestSet(fn_name, cases, total)


# -- comparison --------------------------------------------------------------------------------------


def _is_int(text: str) -> bool:
    return text.isdigit()  # prime_code's string_int_check: "-3" is not an integer there


def _close(output: list[str], expected: list[str]) -> bool:
    """Rule 5: line for line as floats (numpy.allclose(output, expected) with its default tolerances)."""
    if len(output) != len(expected):
        return False
    if all(_is_int(a) and _is_int(b) for a, b in zip(output, expected, strict=True)):
        return False
    try:
        pairs = [(float(a), float(b)) for a, b in zip(output, expected, strict=True)]
    except ValueError:
        return False
    return all(a == b if math.isinf(b) else abs(a - b) <= ATOL + RTOL * abs(b) for a, b in pairs)


def prime_code_matches(stdout: str, expected: str) -> bool:
    """veRL prime_code's stdin/stdout comparison (rules 1-5 above)."""
    lines = stdout.splitlines()
    want = expected.strip()
    if "\n".join(lines).strip() == want or "\n".join(line.strip() for line in lines).strip() == want:
        return True
    expected_lines = [line.strip() for line in expected.split("\n") if line]
    if lines == expected_lines:
        return True
    non_empty = [line for line in lines if line]
    return non_empty == expected_lines or _close(non_empty, expected_lines)


def sandbox_fusion_matches(stdout: str, expected: str) -> bool:
    """veRL's SandboxFusion scorer: equal once trailing newlines are removed."""
    return stdout.rstrip("\n") == expected.rstrip("\n")


def stdout_matches(stdout: str, expected: str, mode: str = "prime_code") -> bool:
    return (
        sandbox_fusion_matches(stdout, expected) if mode == "sandbox_fusion" else prime_code_matches(stdout, expected)
    )


def result_matches(result: Any, expected: Any) -> bool:
    """A call's return value against the expected one (prime_code's call-based rule)."""
    if result == expected:
        return True
    return isinstance(expected, list) and bool(expected) and result == expected[0]
