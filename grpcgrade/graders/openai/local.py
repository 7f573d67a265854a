"""`string_check` and `text_similarity`: the OpenAI grader types computed in this process.

`text_similarity` runs on the service's own metric implementations (`grpcgrade.graders.text`), so a score
here equals the `similarity` grader's score for the same texts. OpenAI does not publish its exact metric
settings; `docs/openai-graders.md` lists ours. `cosine` is a similarity of embeddings, as at OpenAI: the
embedding comes from a model the operator configured (by default the one named `embedding`), and a grader
asking for cosine on a server without one is refused when it is built.
"""

from __future__ import annotations

import math
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.graders.text.similarity import SimilarityGrader
from grpcgrade.llm.models import get_model

from .outcome import RENDER_ERRORS, Outcome, add_usage, render_failure
from .schema import GraderConfigError, StringCheck, TextSimilarity
from .templating import Namespaces

DEFAULT_EMBEDDING_MODEL = "embedding"

# OpenAI's metric names -> the `similarity` grader's algorithms (ROUGE scores are F-measures).
SIMILARITY_ALGORITHMS = {
    "fuzzy_match": "fuzzy_match",
    "bleu": "bleu",
    "gleu": "gleu",
    "meteor": "meteor",
    "rouge_1": "rouge1",
    "rouge_2": "rouge2",
    "rouge_3": "rouge3",
    "rouge_4": "rouge4",
    "rouge_5": "rouge5",
    "rouge_l": "rougeL",
}


def _passed(score: float, threshold: float | None) -> dict[str, Any]:
    return {} if threshold is None else {"pass_threshold": threshold, "passed": score >= threshold}


class StringCheckNode:
    """1.0 when the check holds, else 0.0: `eq`, `ne`, `like` (contains), `ilike` (contains, ignoring case)."""

    is_sync = True
    heavy = False

    def __init__(self, config: StringCheck) -> None:
        self.config = config

    def run(self, ns: Namespaces) -> Outcome:
        try:
            text, reference = self.config.input.render(ns), self.config.reference.render(ns)
        except RENDER_ERRORS as exc:
            return render_failure(exc)
        op = self.config.operation
        if op == "eq":
            holds = text == reference
        elif op == "ne":
            holds = text != reference
        elif op == "like":
            holds = reference in text
        else:
            holds = reference.lower() in text.lower()
        return Outcome(1.0 if holds else 0.0, reason=f"{op}: {'holds' if holds else 'does not hold'}")

    async def arun(self, ns: Namespaces) -> Outcome:
        return self.run(ns)


class TextSimilarityNode:
    """The chosen metric of the rendered input against the rendered reference."""

    is_sync = True
    heavy = True  # the metrics cost milliseconds: worth a worker process

    def __init__(self, config: TextSimilarity, path: str, embedding_model: str) -> None:
        self.config = config
        metric = config.evaluation_metric
        if metric == "cosine":
            self.is_sync = self.heavy = False
            try:
                self.embedder = get_model(embedding_model)
            except InvalidParams as exc:
                raise GraderConfigError(
                    f"{path}.evaluation_metric",
                    f"'cosine' compares embeddings, and this server has no embedding model: {exc.args[0]}. "
                    f"Configure one under `models:` (named {DEFAULT_EMBEDDING_MODEL!r}, or name it in the "
                    "grader param `embedding_model`)",
                ) from None
        else:
            self.similarity = SimilarityGrader(algorithm=SIMILARITY_ALGORITHMS[metric])

    def _texts(self, ns: Namespaces) -> tuple[str, str]:
        return self.config.input.render(ns), self.config.reference.render(ns)

    def run(self, ns: Namespaces) -> Outcome:
        try:
            text, reference = self._texts(ns)
        except RENDER_ERRORS as exc:
            return render_failure(exc)
        result = self.similarity.evaluate(response=text, reference_response=reference)
        if "error" in result.metadata:  # the metric library failed: not a score of 0
            return Outcome.fail("other_error", f"{self.config.evaluation_metric}: {result.metadata['error']}")
        details = {"metric": self.config.evaluation_metric, **_passed(result.score, self.config.pass_threshold)}
        return Outcome(result.score, reason=result.reason, details=details)

    async def arun(self, ns: Namespaces) -> Outcome:
        if self.is_sync:
            return self.run(ns)
        try:
            text, reference = self._texts(ns)
        except RENDER_ERRORS as exc:
            return render_failure(exc)
        from grpcgrade.llm.chat import ChatError  # httpx only in processes that call models

        try:
            reply = await self.embedder.aembed([text, reference])
        except ChatError as exc:
            return Outcome.fail("model_grader_server_error", str(exc))
        score = cosine(*reply.vectors)
        if score is None:
            return Outcome.fail("other_error", "cosine: an embedding is all zeros")
        usage: dict[str, dict[str, int]] = {}
        add_usage(usage, self.embedder.config.name, reply.usage)
        details = {"metric": "cosine", **_passed(score, self.config.pass_threshold)}
        return Outcome(score, reason=f"cosine similarity: {score:.4f}", details=details, usage=usage)


def cosine(a: list[float], b: list[float]) -> float | None:
    """The cosine of two vectors, not clipped (it may be negative); None when one is all zeros."""
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    if norm == 0:
        return None
    return sum(x * y for x, y in zip(a, b, strict=True)) / norm
