"""OpenJudge's deterministic trajectory graders (py-openjudge 0.2.4): `action_loop_detection`,
`observation_information_gain` and `trajectory_step_efficiency`, score for score.

Each reads the (tool call, tool result) pairs of an agent's `messages` (`trajectory.action_observation_pairs`)
and compares actions or observations by word-Jaccard similarity. Kept from the reference on purpose: a call
whose `arguments` is an object rather than JSON text cannot be read by the loop and step graders (here an
INVALID_SAMPLE result), and a negative reference step count fails `trajectory_step_efficiency`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from grpcgrade.grader import BaseGrader, GraderError, GraderScore

from .tool_calls import INPUT_ERRORS, invalid
from .trajectory import action_observation_pairs, function_of, unwrapped_messages, word_jaccard


def _pairs(messages: Any) -> list[tuple[dict[str, Any], Any]]:
    return action_observation_pairs(unwrapped_messages(messages))


def _require_text_arguments(raw: Any) -> None:
    """The reference hands `arguments` to `json.loads` unguarded: only JSON text can be read."""
    if not isinstance(raw, str | bytes | bytearray):
        raise TypeError(f"tool call arguments must be JSON text, not {type(raw).__name__}")


def loop_signature(call: dict[str, Any]) -> str:
    function = function_of(call)
    signature = function.get("name", "")
    raw = function.get("arguments", "")
    _require_text_arguments(raw)
    try:
        items = sorted(json.loads(raw).items())
        return signature + ": " + ", ".join(f"{k}: {v}" for k, v in items)
    except (json.JSONDecodeError, AttributeError):
        return signature + ": " + str(raw) if raw else signature


class ActionLoopDetectionGrader(BaseGrader):
    """1 − (similar pairs / all pairs) over the agent's actions, a pair being similar when the word-Jaccard
    of their signatures (name and sorted arguments) reaches `similarity_threshold`; 1.0 under two actions."""

    def __init__(self, similarity_threshold: float = 1.0) -> None:
        super().__init__()
        self.similarity_threshold = similarity_threshold

    def evaluate(self, messages: Any) -> GraderScore | GraderError:  # type: ignore[override]
        try:
            signatures = [loop_signature(call) for call, _ in _pairs(messages)]
        except INPUT_ERRORS as exc:
            return invalid(self.name, exc)
        n = len(signatures)
        similar: list[tuple[str, str, float]] = []
        total = n * (n - 1) // 2
        for i in range(n):
            for j in range(i + 1, n):
                similarity = word_jaccard(signatures[i], signatures[j])
                if similarity >= self.similarity_threshold:
                    similar.append((signatures[i], signatures[j], similarity))
        score = 1.0 - len(similar) / total if total else 1.0
        return GraderScore(
            name=self.name,
            score=score,
            reason=(
                f"Loop detection: {len(similar)}/{total} pairs are similar (threshold={self.similarity_threshold})"
            ),
            metadata={
                "action_count": n,
                "similar_pair_count": len(similar),
                "total_pair_count": total,
                "similar_pairs": similar,
                "similarity_threshold": self.similarity_threshold,
                "signatures": signatures,
            },
        )


class ObservationInformationGainGrader(BaseGrader):
    """The mean over tool results (those of 10 characters or more) of (1 − s)·exp(−2·max(0, s − threshold)),
    s being the result's highest word-Jaccard similarity with an earlier kept result; 0.0 without any."""

    def __init__(self, similarity_threshold: float = 0.5) -> None:
        super().__init__()
        self.similarity_threshold = similarity_threshold

    def evaluate(self, messages: Any) -> GraderScore | GraderError:  # type: ignore[override]
        try:
            pairs = _pairs(messages)
            if not pairs:
                reason = "No action-observation pairs found - unable to evaluate information gain"
                return GraderScore(
                    name=self.name, score=0.0, reason=reason, metadata={"action_count": 0, "evaluable": False}
                )
            rewards: list[float] = []
            similarities: list[float] = []
            kept: list[Any] = []
            for _, observation in pairs:
                if not observation or len(observation.strip()) < 10:
                    continue
                best = max(word_jaccard(observation, prev) for prev in kept) if kept else 0.0
                similarities.append(best)
                rewards.append((1.0 - best) * math.exp(-2 * max(0, best - self.similarity_threshold)))
                kept.append(observation)
        except INPUT_ERRORS as exc:
            return invalid(self.name, exc)
        average = sum(rewards) / len(rewards) if rewards else 0.0
        return GraderScore(
            name=self.name,
            score=max(0.0, min(1.0, average)),
            reason=f"Average info gain score across {len(rewards)} observation steps: {average:.3f}",
            metadata={
                "raw_average": average,
                "observation_count": len(pairs),
                "each_turn_rewards": rewards,
                "each_turn_similarity": similarities,
                "similarity_threshold": self.similarity_threshold,
            },
        )


def step_signature(call: dict[str, Any]) -> str:
    function = function_of(call)
    signature = function.get("name", "")
    raw = function.get("arguments", "{}")
    _require_text_arguments(raw)
    try:
        items = sorted(json.loads(raw).items())
        return signature + ": " + ",".join(f"{k}={v}" for k, v in items)
    except (json.JSONDecodeError, AttributeError):
        return signature


class TrajectoryStepEfficiencyGrader(BaseGrader):
    """Productive steps / all steps, a step being redundant when both its action repeats an earlier one and
    its result is at least `redundancy_threshold` word-Jaccard-similar to an earlier result; with a reference
    step count (the sample's `reference_step_count`, else the param), 0.6·that + 0.4·min(1, reference/N)."""

    def __init__(self, redundancy_threshold: float = 0.8, reference_step_count: float | None = None) -> None:
        super().__init__()
        self.redundancy_threshold = redundancy_threshold
        self.reference_step_count = reference_step_count

    def evaluate(  # type: ignore[override]
        self, messages: Any, reference_step_count: float | None = None
    ) -> GraderScore | GraderError:
        reference = reference_step_count or self.reference_step_count
        try:
            pairs = _pairs(messages)
            if not pairs:
                return GraderScore(
                    name=self.name,
                    score=0.0,
                    reason="No action-observation pairs found — unable to evaluate step efficiency",
                    metadata={"action_count": 0, "productive_steps": 0, "redundant_steps": 0, "evaluable": False},
                )
            return self._graded(pairs, reference)
        except INPUT_ERRORS as exc:
            return invalid(self.name, exc)

    def _graded(self, pairs: list[tuple[dict[str, Any], Any]], reference: Any) -> GraderScore:
        n = len(pairs)
        redundant: list[dict[str, Any]] = []
        observations: list[Any] = []
        signatures: set[str] = set()
        for i, (call, observation) in enumerate(pairs):
            seen_result = bool(observations) and (
                max(word_jaccard(observation, prev) for prev in observations) >= self.redundancy_threshold
            )
            signature = step_signature(call)
            if seen_result and signature in signatures:
                redundant.append(
                    {"step": i, "signature": signature, "reason": "Both action and observation are redundant"}
                )
            observations.append(observation)
            signatures.add(signature)
        productive = n - len(redundant)
        efficiency = productive / n
        ref_efficiency = None
        score = efficiency
        if reference and reference > 0:
            ref_efficiency = 1.0 if n <= reference else reference / n
            score = 0.6 * efficiency + 0.4 * ref_efficiency
        elif reference:  # the reference formats the missing reference efficiency and fails
            raise ValueError(f"reference_step_count must be positive, got {reference!r}")
        parts = [f"Step efficiency: {productive}/{n} steps are productive (ratio={efficiency:.3f})"]
        if ref_efficiency is not None:
            parts.append(
                f"Reference-based efficiency: {ref_efficiency:.3f} (reference={reference} steps, actual={n} steps)"
            )
        if redundant:
            parts.append(f"Redundant steps: {len(redundant)}")
        return GraderScore(
            name=self.name,
            score=max(0.0, min(1.0, score)),
            reason="; ".join(parts),
            metadata={
                "total_steps": n,
                "productive_steps": productive,
                "redundant_steps": len(redundant),
                "efficiency_ratio": efficiency,
                "reference_step_count": reference,
                "reference_efficiency": ref_efficiency,
                "redundant_details": redundant,
                "redundancy_threshold": self.redundancy_threshold,
            },
        )
