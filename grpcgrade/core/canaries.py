"""Canaries: samples with the reward they must get, graded by the server at start and periodically.

A drifting judge, a broken verifier or a plugin upgrade that changes a score shows up as a failing canary
before a training run learns from it. Canaries are graded through the engine as a call is (`grade_chunk`,
one chunk per reward), but not counted in the grading metrics: those describe the training traffic.
Nothing here knows gRPC or Prometheus; the service reports the results (`service.server`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger("grpcgrade.core.canaries")

DEFAULT_TOLERANCE = 1e-9
DEFAULT_INTERVAL_SECONDS = 300.0
MIN_INTERVAL_SECONDS = 0.5
MAX_INTERVAL_SECONDS = 86_400.0
MAX_CANARIES_PER_REWARD = 100


@dataclass(frozen=True)
class CanarySettings:
    """How often canaries run, and whether a failing one makes the health service say NOT_SERVING."""

    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    fail_health: bool = False


@dataclass(frozen=True)
class Canary:
    """A sample of a configured reward and the reward it must get, within `tolerance`."""

    reward: str
    name: str
    kwargs: dict[str, Any]
    expect: float
    tolerance: float = DEFAULT_TOLERANCE


@dataclass(frozen=True)
class CanaryResult:
    canary: Canary
    value: float | None  # None: no reward (a grader failed on the sample, or the run failed)
    passing: bool
    at: float  # Unix time of the run


def passes(canary: Canary, value: float | None) -> bool:
    return value is not None and abs(value - canary.expect) <= canary.tolerance


async def run_canaries(engine: Engine, canaries: list[Canary]) -> list[CanaryResult]:
    """Every canary graded once, each reward's as one chunk; a failed run fails its reward's canaries.
    The engine's time limits bound the run, as they bound a call."""
    quiet = copy.copy(engine)
    quiet.observer = None  # canaries are not training traffic: the grading metrics leave them out
    quiet.cached = None  # and they are graded for real: a drifting judge must not be answered from the cache
    by_reward: dict[str, list[Canary]] = {}
    for canary in canaries:
        by_reward.setdefault(canary.reward, []).append(canary)
    results: list[CanaryResult] = []
    for reward, group in by_reward.items():
        values: list[float | None]
        try:
            jobs = quiet.resolve([], reward)
            graded = await quiet.grade_chunk(jobs, [(i, c.kwargs) for i, c in enumerate(group)])
            values = list(graded.rewards)
        except Exception:
            log.exception("canaries of reward %r could not be graded", reward)
            values = [None] * len(group)
        at = time.time()
        results.extend(CanaryResult(c, v, passes(c, v), at) for c, v in zip(group, values, strict=True))
    for r in results:
        if not r.passing:
            log.warning(
                "canary %r of reward %r is failing: expected %g, got %s",
                r.canary.name,
                r.canary.reward,
                r.canary.expect,
                "no reward" if r.value is None else f"{r.value:g}",
            )
    return results


async def watch(
    engine: Engine,
    canaries: list[Canary],
    interval: float,
    report: Callable[[list[CanaryResult]], Awaitable[None]],
) -> None:
    """Grade the canaries every `interval` seconds (the first run is the caller's, at start), reporting each
    run's results; runs until cancelled."""
    while True:
        await asyncio.sleep(interval)
        try:
            await report(await run_canaries(engine, canaries))
        except Exception:  # the next run tries again; a stale last-run timestamp shows the gap
            log.exception("canary run failed")
