"""The `python` grader type: OpenAI's `grade(sample, item) -> float`, which runs request-supplied code.

Such code runs only inside the code sandbox (the `grpcgrade-code` plugin: a fresh unprivileged process tree
without network, secrets or a writable host), never in the server's process. This module is the seam: it
looks the sandbox up, and a server without one refuses python graders when they are built, with an error
that says why, rather than running the code anywhere else.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from .outcome import Outcome
from .schema import GraderConfigError, Python
from .templating import Namespaces

#: The sandbox's module: grpcgrade-code's `async run_python_grade(source, sample, item) -> float`, which
#: raises `GradeFailed` (the code failed; its `outcome` says how) or `SandboxUnavailable` (the sandbox
#: could not run it).
SANDBOX_MODULE = "grpcgrade_code"
#: GradeFailed outcomes that OpenAI reports as an unresponsive grader rather than a runtime error.
_UNRESPONSIVE = frozenset({"time_limit"})


@dataclass(frozen=True)
class Sandbox:
    """The plugin's entry point and the two exceptions it raises."""

    run_python_grade: Any
    grade_failed: type[Exception]
    unavailable: type[Exception]


def find_sandbox() -> Sandbox | None:
    """The installed code sandbox, or None."""
    try:
        module = importlib.import_module(SANDBOX_MODULE)
        return Sandbox(module.run_python_grade, module.GradeFailed, module.SandboxUnavailable)
    except (ImportError, AttributeError):
        return None


class PythonNode:
    """`grade(sample, item)` in the sandbox: the whole `sample` namespace and the item, as JSON.

    Its failures carry OpenAI's flags: `python_grader_runtime_error` when the code raised, ran out of
    memory or returned something other than a number, `unresponsive_reward_error` when it ran past its time
    limit, `python_grader_server_error` (a SANDBOX_UNAVAILABLE result) when the sandbox could not run it.
    """

    is_sync = False
    heavy = False

    def __init__(self, config: Python, sandbox: Sandbox) -> None:
        self.config = config
        self.sandbox = sandbox

    async def arun(self, ns: Namespaces) -> Outcome:
        try:
            score = await self.sandbox.run_python_grade(self.config.source, ns.sample(), ns.item)
        except self.sandbox.grade_failed as exc:
            how = getattr(exc, "outcome", "runtime_error")
            flag = "unresponsive_reward_error" if how in _UNRESPONSIVE else "python_grader_runtime_error"
            return Outcome.fail(flag, f"grade failed ({how}): {exc}")
        except self.sandbox.unavailable as exc:
            return Outcome.fail("python_grader_server_error", f"the code sandbox could not run grade: {exc}")
        threshold = self.config.pass_threshold
        details = {} if threshold is None else {"pass_threshold": threshold, "passed": score >= threshold}
        return Outcome(score, reason=f"grade returned {score:g}", details=details)


def python_node(config: Python, path: str) -> PythonNode:
    """The runnable python grader; refused (GraderConfigError at `path.type`) when there is no sandbox."""
    sandbox = find_sandbox()
    if sandbox is None:
        raise GraderConfigError(
            f"{path}.type",
            "the python grader type runs only inside the code sandbox (the grpcgrade-code plugin), which this "
            "server does not have; grpcgrade never runs a request's code in its own process",
        )
    return PythonNode(config, sandbox)
