"""Step-budget tests on a loaded machine. A budget is a duration, and such a test's premise is that the
quick samples ahead of the hanging ones are graded within it: on a loaded machine 1.5 s can pass before a
worker has graded them. `doubling` tries again with the budget doubled (up to 24 s) while that premise
failed; every try is asserted alike, so a server that cuts samples graded in time, or keeps a hanging one,
still fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

BUDGET = 1.5  # seconds: long enough for the quick samples on a quiet machine, short for a test
BUDGETS = [BUDGET * 2**k for k in range(5)]  # what `doubling` tries: 1.5 s to 24 s


def doubling(attempt: Callable[[float], T], cut_early: Callable[[T], bool]) -> T:
    """`attempt(budget)` in the first of BUDGETS after which `cut_early` (a quick sample was cut) is false;
    the last try's when it never is."""
    for budget in BUDGETS:
        out = attempt(budget)
        if not cut_early(out):
            break
    return out
