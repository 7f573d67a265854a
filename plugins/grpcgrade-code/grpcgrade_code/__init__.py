"""grpcgrade-code: code rewards. Programs from completions run on test cases in a sandbox.

The grader is `code_tests` (see docs/code-rewards.md). The sandbox is also an API for other graders
(OpenAI's `python` grader type uses it when this package is installed):

```python
from grpcgrade_code import GradeFailed, Limits, Outcome, SandboxUnavailable, get_backend, run, run_python_grade

# Any program, once: a RunResult with outcome (ok, runtime_error, time_limit, memory_limit, output_limit,
# compile_error), stdout, stderr, exit_code, signal and seconds.
result = await run(get_backend(), "python", "print(input()[::-1])", stdin="abc", limits=Limits(time_seconds=2))

# OpenAI's python grader: grade(sample, item) -> float, called in the sandbox.
score = await run_python_grade(source, sample={"output_text": "42"}, item={"answer": "42"})
```

`get_backend()` is the process's backend (bubblewrap here, or a remote SandboxFusion service, chosen by
environment variables: see `grpcgrade_code.settings`); it holds the concurrency limit, so every caller
should share it. To run one program on many inputs, `program = await backend.prepare(language, source)`
once (it compiles where needed) and `await backend.execute(program, stdin, limits)` per input.
`SandboxUnavailable` means the sandbox could not run the program at all: report an error (for a grader, a
`SANDBOX_UNAVAILABLE` error result), never a score. `GradeFailed` means the grade function failed.
"""

from .grader import CodeTestsGrader, Verdict
from .python_grade import GradeFailed, run_python_grade
from .sandbox import Backend, Limits, Outcome, Program, RunResult, SandboxUnavailable, run
from .settings import get_backend, set_backend

__all__ = [
    "Backend",
    "CodeTestsGrader",
    "GradeFailed",
    "Limits",
    "Outcome",
    "Program",
    "RunResult",
    "SandboxUnavailable",
    "Verdict",
    "get_backend",
    "run",
    "run_python_grade",
    "set_backend",
]
