"""Kolibrify's grader interface (`kolibrify.rl_dataserver.graders` at 1695107), for graders written for it.

A Kolibrify grader file starts with `from kolibrify.rl_dataserver.graders import Grader, GraderInput,
GradeResult`. Kolibrify itself pulls in unsloth, trl and vllm, which a grading server has no use for, so
when the real package is not installed these three classes stand in for it: `kolibrify_namespace()`
makes them importable under Kolibrify's module name while a configuration's `import:`/`path:` graders
load, and removes the name again afterwards so nothing else in the process mistakes them for Kolibrify.
A module that imports Kolibrify lazily (inside a function) therefore fails; import at the top instead.
When the real package is installed it is used as is: the adapter only relies on the attribute names.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

MODULE = "kolibrify.rl_dataserver.graders"


@dataclass
class GraderInput:
    """One completion to grade, with the dataset record it answers and Kolibrify's parse of it."""

    sample_id: str
    record: Mapping[str, object]
    completion: str
    reasoning: str | None
    answer: str | None
    completion_tokens: int | None = None
    completion_index: int | None = None


@dataclass
class GradeResult:
    sample_id: str
    reward: float
    completion_index: int | None = None


class Grader:
    """A batched async grader: one result per input, which Kolibrify pairs with the inputs by position."""

    async def grade_batch(self, inputs: Sequence[GraderInput]) -> list[GradeResult]:
        raise NotImplementedError


@contextlib.contextmanager
def kolibrify_namespace() -> Iterator[None]:
    """`MODULE` resolves to this module for the duration of the block, unless Kolibrify is installed."""
    try:  # the module itself, not just a `kolibrify` package: a directory of that name would do for that
        installed = importlib.util.find_spec(MODULE) is not None
    except (ImportError, ValueError):
        installed = False
    if installed:
        yield
        return
    package = types.ModuleType("kolibrify")
    package.__path__ = []
    subpackage = types.ModuleType("kolibrify.rl_dataserver")
    subpackage.__path__ = []
    package.rl_dataserver = subpackage  # type: ignore[attr-defined]
    subpackage.graders = sys.modules[__name__]  # type: ignore[attr-defined]
    names = {"kolibrify": package, "kolibrify.rl_dataserver": subpackage, MODULE: sys.modules[__name__]}
    sys.modules.update(names)
    try:
        yield
    finally:
        for name in names:
            sys.modules.pop(name, None)
