"""OpenJudge's deterministic tool-call graders (py-openjudge 0.2.4, `openjudge/graders/agent/tool/`), score for
score: `tool_call_sequence_simple` (precision/recall of calls), `tool_call_sequence` (Jaccard or step by step
against reference steps) and `tool_usage_efficiency` (information gain, redundancy, diversity).

Their quirks are kept on purpose (docs/graders.md lists them): a trainer comparing rewards with OpenJudge's
must see the same numbers. Input that the reference cannot read (a call that is not an object, arguments of a
type it cannot parse) is an INVALID_SAMPLE result here where the reference returned its GraderError.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from grpcgrade.core.errors import ErrorCode
from grpcgrade.grader import BaseGrader, GraderError, GraderScore, InvalidParams

from .trajectory import action_observation_pairs, function_of, unwrapped_messages, word_jaccard

METRICS = ("recall", "precision")
#: What a malformed input raises inside these graders' reading of it.
INPUT_ERRORS = (TypeError, ValueError, AttributeError, KeyError)


def invalid(name: str, exc: BaseException) -> GraderError:
    return GraderError(name, f"Evaluation failed: {type(exc).__name__}: {exc}", code=ErrorCode.INVALID_SAMPLE)


def check_metric(metric_type: str) -> str:
    if metric_type not in METRICS:
        raise InvalidParams("metric_type", f"must be 'recall' or 'precision', got {metric_type!r}")
    return metric_type


def parsed_call(call: Any, default_arguments: Any) -> dict[str, Any]:
    """`{"name", "arguments"}` of a call given flat, OpenAI-style (`function`), or wrapped in `tool_call`;
    JSON-text arguments decoded, undecodable text as `{}`."""
    call = call.get("tool_call", call)
    function = call.get("function", call)
    raw = function.get("arguments", default_arguments)
    if isinstance(raw, dict):
        arguments = raw
    else:
        try:
            arguments = json.loads(raw)
        except json.JSONDecodeError:
            arguments = {}
    return {"name": function.get("name", ""), "arguments": arguments}


class ToolCallSequenceSimpleGrader(BaseGrader):
    """Precision or recall of the predicted tool calls against the reference's, as multisets: keyed by name,
    or with `match_arguments` by name and arguments (JSON with sorted keys, so key order does not matter but
    `1` and `1.0` differ). Both empty: 1.0; one empty: 0.0."""

    bounded_cost = True  # linear in the calls

    def __init__(self, metric_type: str = "recall", match_arguments: bool = False) -> None:
        super().__init__()
        self.metric_type = check_metric(metric_type)
        self.match_arguments = match_arguments

    def _key(self, call: dict[str, Any]) -> Any:
        if self.match_arguments:
            return f"{call['name']}:{json.dumps(call['arguments'], sort_keys=True)}"
        return call["name"]

    def evaluate(self, tool_calls: Any, reference_tool_calls: Any) -> GraderScore | GraderError:  # type: ignore[override]
        try:
            predicted = [parsed_call(c, {}) for c in tool_calls or []]
            reference = [parsed_call(c, {}) for c in reference_tool_calls or []]
            pred_keys = Counter(self._key(c) for c in predicted)
            ref_keys = Counter(self._key(c) for c in reference)
        except INPUT_ERRORS as exc:
            return invalid(self.name, exc)
        matched = pred_keys & ref_keys
        true_positives = sum(matched.values())
        n_pred, n_ref = len(predicted), len(reference)
        precision = (1.0 if n_ref == 0 else 0.0) if n_pred == 0 else true_positives / n_pred
        recall = (1.0 if n_pred == 0 else 0.0) if n_ref == 0 else true_positives / n_ref
        score = recall if self.metric_type == "recall" else precision
        denominator = n_ref if self.metric_type == "recall" else n_pred
        matching = "strict (name + arguments)" if self.match_arguments else "loose (name only)"
        return GraderScore(
            name=self.name,
            score=score,
            reason=(
                f"Tool call {self.metric_type}: {score:.3f} ({true_positives}/{denominator}) using {matching} matching"
            ),
            metadata={
                "metric_type": self.metric_type,
                "match_arguments": self.match_arguments,
                "precision": precision,
                "recall": recall,
                "true_positives": true_positives,
                "total_predicted": n_pred,
                "total_reference": n_ref,
                "matched_keys": list(matched),
                "predicted_tools": predicted,
                "reference_tools": reference,
            },
        )


def _elements(call: dict[str, Any]) -> set[str]:
    """Keys and values of a call's arguments pooled into one set of strings (the reference's param F1)."""
    out: set[str] = set()
    for key, value in call["arguments"].items():
        out.add(str(key))
        out.add(str(value))
    return out


def _param_f1(ref: dict[str, Any], pred: dict[str, Any]) -> float:
    ref_set, pred_set = _elements(ref), _elements(pred)
    if not ref_set and not pred_set:
        return 1.0
    if not ref_set or not pred_set:
        return 0.0
    hits = len(ref_set & pred_set)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(pred_set), hits / len(ref_set)
    return 2 * precision * recall / (precision + recall)


class ToolCallSequenceGrader(BaseGrader):
    """The tool calls of an agent's `messages` (one step per assistant turn with tool calls) against
    `reference_tool_calls`, a list of steps each a list of calls.

    Jaccard mode (the default): |P∩R|/|P∪R| of the calls as sets, keyed `"name: <str(arguments)>"` in strict
    mode (Python's repr of the dict: key order and `1` vs `1.0` matter) or by name. Step mode: the mean over
    reference steps; strict compares each reference call with the first predicted call of its name by the F1
    of their pooled argument keys and values, loose counts matched names (recall or precision).
    """

    def __init__(
        self, strict_mode: bool = True, use_jaccard_similarity: bool = True, metric_type: str = "recall"
    ) -> None:
        super().__init__()
        self.strict_mode = strict_mode
        self.use_jaccard_similarity = use_jaccard_similarity
        self.metric_type = check_metric(metric_type)

    def evaluate(self, messages: Any, reference_tool_calls: Any) -> GraderScore | GraderError:  # type: ignore[override]
        try:
            messages = unwrapped_messages(messages)
            predicted: dict[int, list[dict[str, Any]]] = {}
            for message in messages:
                calls = message.get("tool_calls", [])
                if message.get("role", "") == "assistant" and calls:
                    predicted[len(predicted)] = [parsed_call(c, "{}") for c in calls]
            reference = {i: [parsed_call(c, "{}") for c in step] for i, step in enumerate(reference_tool_calls)}
        except INPUT_ERRORS as exc:
            return invalid(self.name, exc)
        if not predicted and not reference:
            return GraderScore(
                name=self.name,
                score=1.0,
                reason="Both predicted and reference have no tool calls",
                metadata={"predicted_tool_count": 0, "reference_tool_count": 0},
            )
        metadata: dict[str, Any] = {
            "strict_mode": self.strict_mode,
            "use_jaccard_similarity": self.use_jaccard_similarity,
            "predicted_tool_count": sum(map(len, predicted.values())),
            "reference_tool_count": sum(map(len, reference.values())),
            "predicted_tool_steps": predicted,
            "reference_tool_steps": reference,
        }
        try:
            if self.use_jaccard_similarity:
                score, both, either = self._jaccard(predicted, reference)
                kind = "jaccard_similarity"
                metadata.update(jaccard_similarity_score=score, intersection_set=list(both), union_set=list(either))
            else:
                score = self._steps(predicted, reference)
                kind = "step_matching"
                metadata["step_matching_score"] = score
        except INPUT_ERRORS as exc:  # arguments that are not an object, read as one
            return invalid(self.name, exc)
        mode = "strict" if self.strict_mode else "loose"
        method = "jaccard" if self.use_jaccard_similarity else f"step-by-step/{self.metric_type}"
        return GraderScore(
            name=self.name,
            score=score,
            reason=f"Tool call sequence evaluation ({mode} mode, {method}): {kind}={score:.3f}",
            metadata=metadata,
        )

    def _jaccard(
        self, predicted: dict[int, list[dict[str, Any]]], reference: dict[int, list[dict[str, Any]]]
    ) -> tuple[float, set[Any], set[Any]]:
        def keys(steps: dict[int, list[dict[str, Any]]]) -> set[Any]:
            if self.strict_mode:
                return {f"{c['name']}: {c['arguments']}" for calls in steps.values() for c in calls}
            return {c["name"] for calls in steps.values() for c in calls}

        pred, ref = keys(predicted), keys(reference)
        if not pred and not ref:
            return 1.0, set(), set()
        if not pred or not ref:
            return 0.0, set(), set()
        both, either = pred & ref, pred | ref
        return len(both) / len(either), both, either

    def _steps(self, predicted: dict[int, list[dict[str, Any]]], reference: dict[int, list[dict[str, Any]]]) -> float:
        if not reference:
            return 0.0  # predictions exist (both empty was answered before)
        total = 0.0
        for index, ref_calls in reference.items():
            pred_calls = predicted.get(index)
            if pred_calls is None:
                continue
            gt_names = [c["name"] for c in ref_calls]
            pred_names = [c["name"] for c in pred_calls]
            missing = sum((Counter(gt_names) - Counter(pred_names)).values())
            if self.strict_mode:
                if missing or not ref_calls:
                    continue
                first_of: dict[Any, dict[str, Any]] = {}
                for call in pred_calls:
                    first_of.setdefault(call["name"], call)
                f1s = [_param_f1(c, first_of[c["name"]]) for c in ref_calls]
                total += sum(f1s) / len(f1s)
            else:
                matched = len(gt_names) - missing
                if self.metric_type == "recall":
                    total += matched / len(gt_names) if gt_names else 1.0
                else:
                    total += matched / len(pred_names)  # a predicted step always has a call
        return total / len(reference)


def usage_signature(call: dict[str, Any]) -> str:
    function = function_of(call)
    name = function.get("name", "")
    raw = function.get("arguments", "{}")
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
        return f"{name}(" + ",".join(f"{k}={v}" for k, v in sorted(args.items())) + ")"
    except (json.JSONDecodeError, AttributeError):
        return f"{name}({raw})"


class ToolUsageEfficiencyGrader(BaseGrader):
    """0.4·information gain + 0.4·(1 − duplicate calls/N) + 0.2·min(1, distinct tools/N + 0.3) over the
    (tool call, result) pairs of `messages`; 0.0 without any. As in the reference, neither threshold changes
    the score (`information_gain_threshold` only counts `low_gain_calls` in the metadata)."""

    def __init__(self, redundancy_threshold: float = 0.8, information_gain_threshold: float = 0.3) -> None:
        super().__init__()
        self.redundancy_threshold = redundancy_threshold
        self.information_gain_threshold = information_gain_threshold

    def evaluate(self, messages: Any) -> GraderScore | GraderError:  # type: ignore[override]
        try:
            return self._graded(action_observation_pairs(unwrapped_messages(messages)))
        except INPUT_ERRORS as exc:
            return invalid(self.name, exc)

    def _graded(self, pairs: list[tuple[dict[str, Any], Any]]) -> GraderScore:
        if not pairs:
            return GraderScore(
                name=self.name,
                score=0.0,
                reason="No action-observation pairs found — unable to evaluate tool usage efficiency",
                metadata={"tool_call_count": 0, "evaluable": False},
            )
        n = len(pairs)
        signatures = Counter(usage_signature(call) for call, _ in pairs)
        duplicates = sum(count - 1 for count in signatures.values() if count > 1)
        gains: list[float] = []
        seen: list[Any] = []
        for _, observation in pairs:
            gains.append(1.0 - max(word_jaccard(observation, prev) for prev in seen) if seen else 1.0)
            seen.append(observation)
        low_gain = sum(1 for g in gains if g < self.information_gain_threshold)
        avg_gain = sum(gains) / n
        names = [function_of(call).get("name", "unknown") for call, _ in pairs]
        unique_tools = len(set(names))
        diversity = unique_tools / n
        redundancy = duplicates / n
        score = max(0.0, min(1.0, 0.4 * avg_gain + 0.4 * (1.0 - redundancy) + 0.2 * min(1.0, diversity + 0.3)))
        return GraderScore(
            name=self.name,
            score=score,
            reason=(
                f"Tool usage efficiency: {score:.3f} (info_gain={avg_gain:.3f}, redundancy={duplicates}/{n}, "
                f"diversity={unique_tools}/{n})"
            ),
            metadata={
                "total_tool_calls": n,
                "unique_tool_calls": len(signatures),
                "duplicate_calls": duplicates,
                "redundancy_penalty": redundancy,
                "avg_info_gain": avg_gain,
                "low_gain_calls": low_gain,
                "info_gains": gains,
                "unique_tools": unique_tools,
                "diversity_ratio": diversity,
                "redundancy_threshold": self.redundancy_threshold,
                "information_gain_threshold": self.information_gain_threshold,
            },
        )
