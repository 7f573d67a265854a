"""The `code_tests` grader: the completion's program run on the sample's test cases, in the sandbox.

Every case is its own sandboxed run (a fresh process tree), through the process's backend and within its
concurrency limit; the cases of one sample run side by side. The score is the fraction of cases passed
(`all_or_nothing`: 1.0 only when all pass; the cases still running after the first failure are then
stopped and reported as skipped). Only the program's behaviour makes a score: when the sandbox cannot run
it, the sample gets a SANDBOX_UNAVAILABLE error result and its reward is absent.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from grpcgrade import BaseGrader, ErrorCode, GraderError, GraderMode, GraderScore, InvalidParams

from .cases import COMPARE_MODES, MAX_CASES, BadTests, Case, TestSet, parse_tests, result_matches, stdout_matches
from .extraction import extract_code
from .harness import VERL_PREAMBLE, call_program, read_result
from .languages import LANGUAGE_NAMES, TAGS
from .sandbox import MAX_MEMORY_MB, MAX_TIME_SECONDS, Backend, Limits, Outcome, Program, SandboxUnavailable
from .settings import get_backend

#: How many failed cases get their input, expected and actual output in the metadata.
FAILURE_DETAILS = 5
#: Characters kept of each text in the metadata (half from the start, half from the end).
EXCERPT_CHARS = 200
_FUTURE_IMPORT = re.compile(r"^from __future__ import [^\n]*\n?", re.MULTILINE)


class Verdict(StrEnum):
    """One test case's verdict, as the metadata lists it."""

    PASSED = "passed"
    WRONG_ANSWER = "wrong_answer"
    RUNTIME_ERROR = "runtime_error"
    TIME_LIMIT = "time_limit"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    COMPILE_ERROR = "compile_error"
    SKIPPED = "skipped"  #: all_or_nothing: not run (or stopped) once another case had failed


@dataclass(frozen=True)
class CaseResult:
    verdict: Verdict
    output: str = ""
    stderr: str = ""
    seconds: float = 0.0


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """veRL's truncatefn: the start and the end of a long text."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...(truncated) ...{text[-limit // 2 :]}"


def with_preamble(code: str) -> str:
    """veRL's imports before the code; the code's `from __future__` imports must stay first."""
    futures = "".join(line if line.endswith("\n") else line + "\n" for line in _FUTURE_IMPORT.findall(code))
    return futures + VERL_PREAMBLE + _FUTURE_IMPORT.sub("", code)


class CodeTestsGrader(BaseGrader):
    """Runs the code in the response on the sample's test cases (extra.tests) in a sandbox: the fraction passed.

    `extra.tests` is `{"inputs": [...], "outputs": [...]}` (or its JSON string), stdin/stdout pairs, or with
    `fn_name` argument lists and return values. Params: `language` (python, cpp, javascript),
    `time_limit_seconds` and `memory_limit_mb` per case, `all_or_nothing`, `max_cases` (grade only the
    first N), `compare` (prime_code or sandbox_fusion, veRL's two ways to compare stdout), `code_block`
    (false: the whole response is the program), `preamble` (Python: veRL's imports first).
    """

    bounds_own_time = True  # each run is bounded; the wait for a sandbox slot must not count as its time
    cache_by_default = True  # a sandbox run per test case; SANDBOX_UNAVAILABLE (an error) is never cached

    def __init__(
        self,
        language: str = "python",
        time_limit_seconds: float = 5.0,
        memory_limit_mb: int = 512,
        all_or_nothing: bool = False,
        max_cases: int | None = None,
        compare: str = "prime_code",
        code_block: bool = True,
        preamble: bool = True,
    ) -> None:
        super().__init__(name="code_tests", mode=GraderMode.POINTWISE)
        self.backend = get_backend()
        if language not in LANGUAGE_NAMES:
            raise InvalidParams("language", f"must be one of {', '.join(LANGUAGE_NAMES)}, got {language!r}")
        if language not in self.backend.languages():
            runs = ", ".join(sorted(self.backend.languages())) or "none"
            raise InvalidParams("language", f"this server cannot run {language} programs (it runs: {runs})")
        try:
            self.limits = Limits(time_seconds=time_limit_seconds, memory_mb=memory_limit_mb)
        except ValueError as exc:
            param = "time_limit_seconds" if "time_seconds" in str(exc) else "memory_limit_mb"
            raise InvalidParams(param, f"must be in (0, {MAX_TIME_SECONDS:g}] s and [16, {MAX_MEMORY_MB}] MB") from exc
        if max_cases is not None and not 1 <= max_cases <= MAX_CASES:
            raise InvalidParams("max_cases", f"must be between 1 and {MAX_CASES}, got {max_cases}")
        if compare not in COMPARE_MODES:
            raise InvalidParams("compare", f"must be one of {', '.join(COMPARE_MODES)}, got {compare!r}")
        self.language = language
        self.all_or_nothing = all_or_nothing
        self.max_cases = max_cases
        self.compare = compare
        self.code_block = code_block
        self.preamble = preamble

    async def aevaluate(self, response: str = "", tests: Any = None) -> GraderScore | GraderError:
        try:
            test_set = parse_tests(tests, self.max_cases)
        except BadTests as exc:
            return GraderError(self.name, str(exc), code=ErrorCode.INVALID_SAMPLE)
        if test_set.fn_name is not None and self.language != "python":
            message = "call-based tests (fn_name) need language python"
            return GraderError(self.name, message, code=ErrorCode.INVALID_SAMPLE)
        code = self._code(response or "")
        if code is None:
            where = "in a code block of the response" if self.code_block else "in the response"
            return GraderScore(self.name, 0.0, f"no {self.language} code {where}", {"code_found": False})
        try:
            program = await self.backend.prepare(self.language, self._source(code, test_set))
            results = await self._run_cases(self.backend, program, test_set.cases, test_set.fn_name)
        except SandboxUnavailable as exc:
            return GraderError(self.name, str(exc), code=ErrorCode.SANDBOX_UNAVAILABLE)
        return self._score(test_set, results)

    def _code(self, response: str) -> str | None:
        code = extract_code(response, TAGS[self.language]) if self.code_block else response
        return code if code and code.strip() else None

    def _source(self, code: str, test_set: TestSet) -> str:
        if self.language != "python":
            return code
        module = with_preamble(code) if self.preamble else code
        return call_program(module) if test_set.fn_name else module

    async def _run_cases(
        self, backend: Backend, program: Program, cases: list[Case], fn_name: str | None
    ) -> list[CaseResult]:
        tasks = {asyncio.create_task(self._case(backend, program, case, fn_name)): i for i, case in enumerate(cases)}
        results = [CaseResult(Verdict.SKIPPED)] * len(cases)
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    results[tasks[task]] = task.result()  # SandboxUnavailable propagates
                if self.all_or_nothing and any(r.verdict is not Verdict.PASSED for r in map(_result, done)):
                    break
        finally:
            for task in pending:
                task.cancel()  # a cancelled run kills its sandbox
            await asyncio.gather(*pending, return_exceptions=True)
        return results

    async def _case(self, backend: Backend, program: Program, case: Case, fn_name: str | None) -> CaseResult:
        run = await backend.execute(program, case.stdin, self.limits)
        if run.outcome is not Outcome.OK:
            return CaseResult(Verdict(run.outcome.value), run.stdout, run.stderr, run.seconds)
        if fn_name is None:
            passed = stdout_matches(run.stdout, case.expected, self.compare)
            return CaseResult(Verdict.PASSED if passed else Verdict.WRONG_ANSWER, run.stdout, run.stderr, run.seconds)
        found, value = read_result(run.stdout)
        passed = found and result_matches(value, case.expected)
        shown = json.dumps(value) if found else run.stdout
        return CaseResult(Verdict.PASSED if passed else Verdict.WRONG_ANSWER, shown, run.stderr, run.seconds)

    def _score(self, test_set: TestSet, results: list[CaseResult]) -> GraderScore:
        passed = sum(r.verdict is Verdict.PASSED for r in results)
        total = len(results)
        score = float(passed == total) if self.all_or_nothing else passed / total
        failures: list[dict[str, Any]] = []
        for i, (case, result) in enumerate(zip(test_set.cases, results, strict=True)):
            if result.verdict in (Verdict.PASSED, Verdict.SKIPPED) or len(failures) == FAILURE_DETAILS:
                continue
            expected = case.expected if isinstance(case.expected, str) else json.dumps(case.expected)
            failures.append(
                {
                    "case": i,
                    "verdict": result.verdict.value,
                    "input": excerpt(case.shown_input),
                    "expected": excerpt(expected),
                    "output": excerpt(result.output),
                    "stderr": excerpt(result.stderr),
                }
            )
        reason = f"{passed}/{total} test cases passed"
        if failures:
            reason += f"; first failure: case {failures[0]['case']}, {failures[0]['verdict']}"
        metadata = {
            "code_found": True,
            "language": self.language,
            "backend": self.backend.name,
            "mode": "function" if test_set.fn_name else "stdin",
            "cases": total,
            "cases_in_tests": test_set.total,
            "passed": passed,
            "verdicts": [r.verdict.value for r in results],
            "seconds": round(max(r.seconds for r in results), 3),
            "failures": failures,
        }
        return GraderScore(self.name, score, reason, metadata)


def _result(task: asyncio.Task[CaseResult]) -> CaseResult:
    return task.result()
