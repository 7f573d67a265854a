"""The plugin's entry point: registers `code_tests` with grpcgrade.

The backend is built from the environment here, at load, so a wrong setting stops the plugin from loading
with a message (`grpcgrade graders` lists it as failed) instead of failing every sample later.
"""

from __future__ import annotations

from collections.abc import Callable

from grpcgrade import hookimpl

from .grader import CodeTestsGrader
from .settings import get_backend


@hookimpl
def register_graders(register: Callable[..., None]) -> None:
    get_backend()
    register(CodeTestsGrader, name="code_tests", aliases=("code-tests",))
