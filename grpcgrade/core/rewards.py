"""Rewards: graders combined into one number per sample.

reward = prod(gate scores) * sum(w_i * s_i) / sum(w_i) over the non-gate pointwise graders. When any
grader of the combination failed on the sample, or the combination is not a finite number, there is no
reward: a trainer masks the sample instead of learning from a wrong number.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from grpcgrade.grader import GraderError, GraderRank, GraderResult

from .errors import InvalidParams
from .histograms import Histogram, histogram

#: The types of a bare score (see `Result`).
NUMBER_TYPES = frozenset((float, int))


@dataclass(frozen=True)
class SpecData:
    """A grader spec as a request or a config file states it, before it is resolved."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    key: str = ""
    weight: float | None = None
    gate: bool = False

    @property
    def label(self) -> str:
        return self.key or self.name


@dataclass(frozen=True)
class Reward:
    """A named combination of graders, configured on the server and picked by a request's `reward`."""

    name: str
    specs: list[SpecData]
    description: str = ""
    #: The reward's own tokenizer for its length gates (`tokenizer:` on the reward), before the server's.
    tokenizer: str = ""


def number_repeats(specs: list[SpecData], keyed_too: bool = False) -> list[SpecData]:
    """One grader listed twice, as Kolibrify allows (say, as a term and as a gate): the first keeps its
    label, the n-th repeat of a label is labelled `label#n` (`similarity`, `similarity#2`, ...), and the
    reward is computed over all of them. A request's explicit keys are left alone (`keyed_too=False`), so
    a key given twice is still refused; a Kolibrify configuration's keys are grader names, so numbered."""
    seen: Counter[str] = Counter()
    out = []
    for spec in specs:
        if spec.key and not keyed_too:
            out.append(spec)
            continue
        seen[spec.label] += 1
        count = seen[spec.label]
        out.append(spec if count == 1 else dataclasses.replace(spec, key=f"{spec.label}#{count}"))
    return out


def check_weights(specs: list[SpecData]) -> None:
    labels = [s.label for s in specs]
    dupes = sorted({k for k in labels if labels.count(k) > 1})
    if dupes:
        raise InvalidParams("key", f"grader key {dupes[0]!r} is used twice; give each spec a distinct key")
    for s in specs:
        w = 1.0 if s.weight is None else s.weight
        if not math.isfinite(w):
            raise InvalidParams("weight", f"weight of {s.label!r} must be a finite number, got {w}")
    # A negative weight is a penalty term (Kolibrify allows them); only the total must stay positive.
    terms = [s for s in specs if not s.gate]
    total = sum(1.0 if s.weight is None else s.weight for s in terms)
    # Finite weights can sum past a double (two of 1e308): every reward would then be inf / inf, masked.
    if terms and not 0 < total < math.inf:
        raise InvalidParams(
            "weight", f"the weights of the non-gate graders sum to {total:g}; the sum must be a finite number > 0"
        )


#: A grader's result for one sample: its object, or (the scores view's column path) the score alone.
Result = GraderResult | float


def combine(specs: list[SpecData], results: Sequence[Result]) -> float | None:
    """The sample's reward, or None when a grader failed or no grader scores pointwise."""
    total = weights = 0.0
    gate = 1.0
    scored = False
    for spec, result in zip(specs, results, strict=True):
        if isinstance(result, GraderError):
            return None
        if isinstance(result, GraderRank):
            continue
        scored = True
        score = result if isinstance(result, (int, float)) else result.score
        if spec.gate:
            gate *= score
        else:
            w = 1.0 if spec.weight is None else spec.weight
            total += w * score
            weights += w
    if not scored:
        return None
    mean = total / weights if weights > 0 else 1.0
    reward = gate * mean
    # Finite scores and weights can still overflow (weights of 1e308 sum to inf, inf / inf is NaN): such a
    # number would poison a trainer's batch statistics, so the sample has no reward, as for a failed grader.
    return reward if math.isfinite(reward) else None


def rewards(specs: list[SpecData], columns: Sequence[Sequence[Result]]) -> list[float | None]:
    """`combine` for a chunk graded column by column (`columns[j][k]`: grader j, sample k)."""
    if len(columns) == 1:  # the common case: a single grader's score is the reward, gate or not
        column = columns[0]
        if {*map(type, column)} <= NUMBER_TYPES:  # a column of scores (the scores view's column path)
            return list(column)  # type: ignore[arg-type]
        return [
            r if isinstance(r, (int, float)) else None if isinstance(r, (GraderError, GraderRank)) else r.score
            for r in column
        ]
    return [combine(specs, list(row)) for row in zip(*columns, strict=True)]


class RewardStats(NamedTuple):
    """A configured reward's values over one chunk, as the metrics count them: their distribution (with
    the sum of squares, for the spread), and how many samples got no reward."""

    reward: str
    values: Histogram
    absent: int = 0


def reward_stats(reward: str, values: list[float | None]) -> RewardStats:
    """Counted once per chunk where the rewards were computed (in a worker for whole chunks)."""
    given = [v for v in values if v is not None]
    return RewardStats(reward, histogram(given, squares=True), len(values) - len(given))
