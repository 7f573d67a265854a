"""OpenAI's `python` grader type, run in the sandbox: `grade(sample, item) -> float` from its `source`.

The grader JSON's source is untrusted code like any other: it runs in the same sandbox as `code_tests`,
with the same limits, and only the float it returns leaves it. Two kinds of failure stay apart:
`SandboxUnavailable` (the sandbox could not run it: a server error) and `GradeFailed` (the source itself
failed: it raised, ran past a limit, or returned something other than a finite number).
"""

from __future__ import annotations

import math
from typing import Any

from .harness import call_program, call_request, read_result
from .sandbox import Backend, Limits, Outcome
from .settings import get_backend

#: Characters of the program's stderr kept in a GradeFailed message (its end: the traceback's last lines).
DETAIL_CHARS = 2000


class GradeFailed(Exception):
    """`grade` itself failed; `outcome` says how (runtime_error, time_limit, memory_limit, output_limit,
    compile_error, or invalid_result for a return value that is not a finite number)."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


async def run_python_grade(
    source: str,
    sample: dict[str, Any],
    item: dict[str, Any],
    limits: Limits | None = None,
    backend: Backend | None = None,
) -> float:
    """Call `grade(sample, item)` defined by `source` in the sandbox and return its score.

    `sample` and `item` must be JSON values. Raises GradeFailed or SandboxUnavailable.
    """
    backend = backend or get_backend()
    program = await backend.prepare("python", call_program(source))
    stdin = call_request("grade", [sample, item], solution_class=False, int_keys=False)
    run = await backend.execute(program, stdin, limits or Limits())
    if run.outcome is not Outcome.OK:
        raise GradeFailed(run.outcome.value, run.stderr[-DETAIL_CHARS:].strip() or run.outcome.value)
    found, value = read_result(run.stdout)
    if not found or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        shown = repr(value) if found else "nothing"
        raise GradeFailed("invalid_result", f"grade returned {shown}, not a finite number")
    return float(value)
