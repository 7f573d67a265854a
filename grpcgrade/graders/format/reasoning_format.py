"""Reasoning tags present? (OpenJudge `ReasoningFormatGrader`, registered name `format_reward` upstream)."""

from __future__ import annotations

import re
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.grader import BaseGrader, GraderMode, GraderScore

# Characters that make a tag name a regular expression rather than literal text.
_REGEX_META = frozenset(".^$*+?{}[]\\|()")


class TagPair:
    """Finds `<token>...</token>` as the reference's `re.search("<token>.*?</token>", DOTALL)` does.

    The reference interpolates the token without escaping it, so a token with regex syntax stays a
    pattern here too. A plain token (the normal case) is searched with `str.find` instead: same answer,
    but linear time, where the lazy regex rescans the rest of the text for every unclosed opening tag
    and a 30 MB response of `<think>` repeated would never finish.
    """

    def __init__(self, token: str, param: str = "token") -> None:
        self.open = f"<{token}>"
        self.close = f"</{token}>"
        self._pattern: re.Pattern[str] | None = None
        if _REGEX_META.intersection(token):
            try:
                self._pattern = re.compile(f"{self.open}.*?{self.close}", re.DOTALL)
            except re.error as e:
                raise InvalidParams(param, f"{token!r} does not form a valid tag pattern: {e}") from e

    def present(self, text: str) -> bool:
        if self._pattern is not None:
            return self._pattern.search(text) is not None
        start = text.find(self.open)
        return start >= 0 and text.find(self.close, start + len(self.open)) >= 0

    def contents(self, text: str) -> list[str]:
        """What `re.findall("<token>(.*?)</token>", text, DOTALL)` returns, for a plain token."""
        found = []
        position = 0
        while (start := text.find(self.open, position)) >= 0:
            body = start + len(self.open)
            end = text.find(self.close, body)
            if end < 0:
                break
            found.append(text[body:end])
            position = end + len(self.close)
        return found


class ReasoningFormatGrader(BaseGrader):
    """1.0 when both a think pair and an answer pair occur anywhere in the response, else 0.0.

    As in the reference there is deliberately no constraint on order, count, emptiness or text around
    the tags: this is the lenient shape check; `reasoning_tool_call_format` is the strict one.
    """

    def __init__(self, think_token: str = "think", answer_token: str = "answer") -> None:
        super().__init__(
            name="reasoning_format",
            mode=GraderMode.POINTWISE,
            description="Check format reward for thinking format and answer format with proper tags.",
        )
        self.think_token = think_token
        self.answer_token = answer_token
        self._think = TagPair(think_token, "think_token")
        self._answer = TagPair(answer_token, "answer_token")

    def evaluate(self, response: str = "", **kwargs: Any) -> GraderScore:
        has_think_tag = self._think.present(response)
        has_answer_tag = self._answer.present(response)
        reward = 1.0 if has_think_tag and has_answer_tag else 0.0
        reasons = []
        if not has_think_tag:
            reasons.append(f"Missing {self._think.open}{self._think.close} tags")
        if not has_answer_tag:
            reasons.append(f"Missing {self._answer.open}{self._answer.close} tags")
        if reward == 1.0:
            reasons.append("All format requirements met")
        return GraderScore(
            name=self.name,
            score=reward,
            reason="; ".join(reasons),
            metadata={
                "has_think_tag": has_think_tag,
                "has_answer_tag": has_answer_tag,
                "total_reward": reward,
                "think_token": self.think_token,
                "answer_token": self.answer_token,
            },
        )
