"""`code_tests` and `run_python_grade` in-process, on the real bubblewrap backend.

Expected scores follow from the test cases and the programs written for them: what each program prints
for each input is plain from its source.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from code_helpers import backend_in_use, broken_backend
from grpcgrade_code import (
    CodeTestsGrader,
    GradeFailed,
    Limits,
    SandboxUnavailable,
    run_python_grade,
)
from grpcgrade_code.bubblewrap import BubblewrapBackend
from grpcgrade_code.languages import known_languages

from grpcgrade import ErrorCode, GraderError, GraderScore, InvalidParams

ADD_TESTS = {"inputs": ["1 2\n", "3 4\n", "10 -3\n"], "outputs": ["3\n", "7\n", "7\n"]}
ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def grade(response: str, tests: Any, **params: Any) -> GraderScore | GraderError:
    """Without veRL's import preamble unless a test asks for it: each run starts faster."""
    grader = CodeTestsGrader(**{"preamble": False, **params})
    return asyncio.run(grader.aevaluate(response=response, tests=tests))


def scored(response: str, tests: Any, **params: Any) -> GraderScore:
    result = grade(response, tests, **params)
    assert isinstance(result, GraderScore), result
    return result


@pytest.fixture
def broken_sandbox() -> Iterator[None]:
    with backend_in_use(broken_backend()):
        yield


def test_all_cases_pass() -> None:
    result = asyncio.run(CodeTestsGrader().aevaluate(response=ADD, tests=ADD_TESTS))  # every param at its default
    assert isinstance(result, GraderScore)
    assert (result.score, result.reason) == (1.0, "3/3 test cases passed")
    assert result.metadata["verdicts"] == ["passed"] * 3
    assert result.metadata["mode"] == "stdin" and result.metadata["backend"] == "bubblewrap"


def test_the_score_is_the_fraction_passed_and_failures_are_shown() -> None:
    wrong_on_negatives = "```python\na, b = map(int, input().split())\nprint(abs(a) + abs(b))\n```"
    result = scored(wrong_on_negatives, json.dumps(ADD_TESTS))  # the JSON-string form
    assert result.score == pytest.approx(2 / 3)
    assert result.metadata["verdicts"] == ["passed", "passed", "wrong_answer"]
    (failure,) = result.metadata["failures"]
    assert failure == {
        "case": 2,
        "verdict": "wrong_answer",
        "input": "10 -3\n",
        "expected": "7\n",
        "output": "13\n",
        "stderr": "",
    }


BEHAVIOURS = """```python
import sys, time
case = input().strip()
if case == "ok":
    print("ok")
elif case == "wrong":
    print("nope")
elif case == "raise":
    raise RuntimeError("boom")
elif case == "loop":
    while True:
        pass
elif case == "memory":
    blob = bytearray(10**10)
elif case == "flood":
    while True:
        sys.stdout.write("x" * 65536)
```"""


def test_each_case_gets_its_own_verdict() -> None:
    cases = ["ok", "wrong", "raise", "loop", "memory", "flood"]
    tests = {"inputs": cases, "outputs": ["ok"] * len(cases)}
    # The time limit is the input: short, so "loop" reaches it soon. On a loaded machine a case that only
    # starts Python and raises can reach 0.5 s too; it is doubled while a case other than "loop" did.
    for limit in (0.5, 1.0, 2.0, 4.0, 8.0):
        result = scored(BEHAVIOURS, tests, time_limit_seconds=limit, memory_limit_mb=256)
        others = [v for case, v in zip(cases, result.metadata["verdicts"], strict=True) if case != "loop"]
        if "time_limit" not in others:
            break
    assert result.metadata["verdicts"] == [
        "passed",
        "wrong_answer",
        "runtime_error",
        "time_limit",
        "memory_limit",
        "output_limit",
    ]
    assert result.score == pytest.approx(1 / 6)
    failures = {f["verdict"]: f for f in result.metadata["failures"]}
    assert "RuntimeError: boom" in failures["runtime_error"]["stderr"]
    assert "truncated" in failures["output_limit"]["output"]  # a megabyte of x, cut to its two ends


def test_all_or_nothing_stops_at_the_first_failure() -> None:
    tests = {"inputs": ["wrong", "loop", "loop"], "outputs": ["ok"] * 3}
    result = scored(BEHAVIOURS, tests, all_or_nothing=True, time_limit_seconds=30)
    assert result.score == 0.0
    assert result.metadata["verdicts"] == ["wrong_answer", "skipped", "skipped"]  # stopped, not run for 30 s
    assert scored(ADD, ADD_TESTS, all_or_nothing=True).score == 1.0


def test_max_cases_grades_the_first_cases() -> None:
    result = scored(ADD, ADD_TESTS, max_cases=2)
    assert (result.score, result.metadata["cases"], result.metadata["cases_in_tests"]) == (1.0, 2, 3)


def test_compare_modes() -> None:
    spaced = "```python\nprint(' 3 ')\n```"
    tests = {"inputs": [""], "outputs": ["3"]}
    assert scored(spaced, tests).score == 1.0  # prime_code strips
    assert scored(spaced, tests, compare="sandbox_fusion").score == 0.0  # only trailing newlines go


LEETCODE = """```python
class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen = defaultdict(int)
        for i, n in enumerate(nums):
            if target - n in seen:
                return [seen[target - n], i]
            seen[n] = i
```"""


def test_call_based_cases_in_the_verl_format() -> None:
    tests = {"fn_name": "twoSum", "inputs": ["[2, 7, 11, 15]\n9", "[3, 2, 4]\n6"], "outputs": ["[0, 1]", "[1, 3]"]}
    result = scored(LEETCODE, tests, preamble=True)
    assert result.metadata["mode"] == "function"
    assert result.metadata["verdicts"] == ["passed", "wrong_answer"]
    assert result.metadata["failures"][0]["output"] == "[1, 2]"


def test_call_based_cases_in_the_apps_format() -> None:
    tests = {"fn_name": "area", "inputs": [[2, 3], [0, 5]], "outputs": [[6], [0]]}
    result = scored("def area(w, h):\n    return w * h\n", tests)
    assert result.score == 1.0


def test_the_preamble_supplies_veRL_imports() -> None:
    tests = {"fn_name": "twoSum", "inputs": [[[2, 7], 9]], "outputs": [[0, 1]]}
    assert scored(LEETCODE, tests, preamble=True).score == 1.0
    bare = scored(LEETCODE, tests, preamble=False)  # `List` is not defined without it
    assert bare.metadata["verdicts"] == ["runtime_error"]
    assert "NameError" in bare.metadata["failures"][0]["stderr"]


def test_a_return_value_json_cannot_hold_is_a_runtime_error() -> None:
    tests = {"fn_name": "f", "inputs": [[]], "outputs": [[1]]}
    assert scored("def f():\n    return {1, 2}\n", tests).metadata["verdicts"] == ["runtime_error"]


def test_the_main_block_of_a_call_based_solution_does_not_run() -> None:
    code = "def f(x):\n    return x + 1\nif __name__ == '__main__':\n    print(f(int(input())))\n"
    assert scored(code, {"fn_name": "f", "inputs": [[1]], "outputs": [2]}).score == 1.0


def test_no_code_scores_zero() -> None:
    result = scored("```cpp\nint main() {}\n```", ADD_TESTS)
    assert (result.score, result.metadata) == (0.0, {"code_found": False})


def test_the_whole_response_when_code_block_is_off() -> None:
    assert scored("a, b = map(int, input().split())\nprint(a + b)", ADD_TESTS, code_block=False).score == 1.0


@pytest.mark.parametrize(
    ("tests", "message"),
    [(None, "no `tests`"), ("[", "not valid JSON"), ({"inputs": ["1"], "outputs": []}, "1 inputs but 0 outputs")],
)
def test_unusable_tests_are_an_invalid_sample(tests: Any, message: str) -> None:
    result = grade(ADD, tests)
    assert isinstance(result, GraderError) and result.code == ErrorCode.INVALID_SAMPLE
    assert message in result.error


def test_call_based_tests_need_python() -> None:
    result = grade("int main() {}", {"fn_name": "f", "inputs": [[1]], "outputs": [1]}, language="cpp")
    assert isinstance(result, GraderError) and result.code == ErrorCode.INVALID_SAMPLE


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"language": "rust"}, "language"),
        ({"time_limit_seconds": 0}, "time_limit_seconds"),
        ({"time_limit_seconds": 61}, "time_limit_seconds"),
        ({"memory_limit_mb": 8}, "memory_limit_mb"),
        ({"max_cases": 0}, "max_cases"),
        ({"compare": "fuzzy"}, "compare"),
    ],
)
def test_bad_params_are_refused(params: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidParams) as err:
        CodeTestsGrader(**params)
    assert err.value.param == param


def test_a_language_without_its_runtime_here_is_refused_saying_what_runs() -> None:
    python_only = BubblewrapBackend(languages={"python": known_languages()["python"]})
    with (
        backend_in_use(python_only),
        pytest.raises(InvalidParams, match=r"cannot run cpp programs \(it runs: python\)"),
    ):
        CodeTestsGrader(language="cpp")


def test_cpp_compiles_once_and_runs_per_case() -> None:
    cpp = "```cpp\n#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b; }\n```"
    assert scored(cpp, ADD_TESTS, language="cpp").score == 1.0
    broken = scored("```cpp\nint main() { return nope; }\n```", ADD_TESTS, language="cpp")
    assert broken.metadata["verdicts"] == ["compile_error"] * 3 and broken.score == 0.0
    assert "nope" in broken.metadata["failures"][0]["stderr"]


def test_javascript() -> None:
    js = "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(' ').map(Number);\nconsole.log(a + b);"
    assert scored(f"```js\n{js}\n```", ADD_TESTS, language="javascript").score == 1.0


def test_a_sandbox_that_cannot_run_gives_an_error_never_a_score(broken_sandbox: None) -> None:
    result = grade(ADD, ADD_TESTS)
    assert isinstance(result, GraderError) and result.code == ErrorCode.SANDBOX_UNAVAILABLE
    assert "sandbox" in result.error


# -- run_python_grade: OpenAI's python grader -----------------------------------------------------------

EXACT = "def grade(sample, item):\n    return float(sample['output_text'].strip() == item['answer'])\n"


def test_python_grade_returns_the_score() -> None:
    assert asyncio.run(run_python_grade(EXACT, {"output_text": " 42 "}, {"answer": "42"})) == 1.0
    assert asyncio.run(run_python_grade(EXACT, {"output_text": "41"}, {"answer": "42"})) == 0.0


@pytest.mark.parametrize(
    ("source", "outcome"),
    [
        ("def grade(sample, item):\n    raise ValueError('bad item')\n", "runtime_error"),
        ("def grade(sample, item):\n    while True:\n        pass\n", "time_limit"),
        ("def grade(sample, item):\n    return 'high'\n", "invalid_result"),
        ("def grade(sample, item):\n    return True\n", "invalid_result"),
        ("def grade(sample, item):\n    return float('nan')\n", "invalid_result"),
        ("def grade(sample item):\n    return 1\n", "compile_error"),
        ("def score(sample, item):\n    return 1\n", "runtime_error"),
    ],
)
def test_python_grade_failures_are_the_graders(source: str, outcome: str) -> None:
    with pytest.raises(GradeFailed) as err:
        asyncio.run(run_python_grade(source, {"output_text": ""}, {}, limits=Limits(time_seconds=0.5)))
    assert err.value.outcome == outcome


def test_python_grade_without_a_sandbox_is_unavailable(broken_sandbox: None) -> None:
    with pytest.raises(SandboxUnavailable):
        asyncio.run(run_python_grade(EXACT, {"output_text": "42"}, {"answer": "42"}))
