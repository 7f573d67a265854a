"""The `python` grader type: OpenAI's `grade(sample, item) -> float`, which runs request-supplied code.

Such code runs only inside the code sandbox (the `grpcgrade-code` plugin: a fresh unprivileged process tree
without network, secrets or a writable host), never in the server's process. This module is the seam: it
looks the sandbox up, and until a server has one it refuses python graders when they are built, with an
error that says why, rather than running the code anywhere else.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .schema import GraderConfigError, Python

#: The sandbox's entry point for OpenAI python graders (`module`, `attribute`): the grpcgrade-code plugin's
#: `async run_python_grade(source, sample, item) -> float`, which raises `GradeFailed` (the code failed; its
#: `outcome` says how) or `SandboxUnavailable` (the sandbox could not run it). Wiring it in means one node
#: like the others here: `arun(ns)` awaits it with the source, `ns.sample()` and `ns.item`, and maps
#: GradeFailed to `python_grader_runtime_error` (`unresponsive_reward_error` for a time limit) and
#: SandboxUnavailable to `python_grader_server_error`, with `pass_threshold` reported as the other types do.
SANDBOX_ENTRY = ("grpcgrade_code", "run_python_grade")


def find_sandbox() -> Callable[..., Any] | None:
    """The sandbox's entry point, or None when no sandbox is installed."""
    module_name, attribute = SANDBOX_ENTRY
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    entry = getattr(module, attribute, None)
    return entry if callable(entry) else None


def python_node(config: Python, path: str) -> Any:
    """The runnable python grader; refused (GraderConfigError at `path.type`) while there is no sandbox."""
    if find_sandbox() is None:
        raise GraderConfigError(
            f"{path}.type",
            "the python grader type runs only inside the code sandbox (the grpcgrade-code plugin), which this "
            "server does not have; grpcgrade never runs a request's code in its own process",
        )
    raise GraderConfigError(  # the sandbox exists, but its API is not wired in yet: see SANDBOX_ENTRY
        f"{path}.type", "the python grader type is not wired to this server's code sandbox yet"
    )
