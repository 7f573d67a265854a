"""Reasoning tags present? (OpenJudge `ReasoningFormatGrader`, registered name `format_reward` upstream).

The reference builds `<token>.*?</token>` from the request's `think_token` / `answer_token` without escaping
them, so a token with regex syntax is a pattern in Python's syntax. Such tokens run as `graders.patterns`
arranges (Python's exact result; RE2 where provably the same, else Python's engine), and the grader then
runs in a worker, where the per-sample time limit stops a slow compilation or search. A token over
`MAX_PATTERN_CHARS` is refused with the request, before anything is parsed.
"""

from __future__ import annotations

import re
from re import _parser as sre_parse  # type: ignore[attr-defined]  # CPython's regex parser; typeshed omits it
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.grader import BaseGrader, GraderScore

from ..patterns import MAX_PATTERN_CHARS, compile_pattern
from ..patterns import warm_up as warm_patterns

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
        if not isinstance(token, str):
            raise InvalidParams(param, f"must be a string, got {type(token).__name__}")
        if len(token) > MAX_PATTERN_CHARS:
            raise InvalidParams(param, f"{len(token)} characters exceeds the limit of {MAX_PATTERN_CHARS}")
        self.open = f"<{token}>"
        self.close = f"</{token}>"
        self._source: str | None = None
        #: A token with regex syntax is a pattern: compiling it (Python's compiler can itself take seconds on
        #: a hostile class) and searching with it run where the per-sample time limit stops them, in a
        #: worker. Only its syntax is checked here, with Python's parser, which the request waits for.
        self.is_pattern = bool(_REGEX_META.intersection(token))
        if self.is_pattern:
            self._source = f"{self.open}.*?{self.close}"
            try:
                sre_parse.parse(self._source, re.DOTALL)
            except (re.error, RecursionError) as e:
                raise InvalidParams(param, f"{self._source!r} does not form a valid tag pattern: {e}") from e

    def present(self, text: str) -> bool:
        if self._source is not None:
            # From the shared cache (bounded in bytes): built graders keep their token only. Errors only
            # Python's compiler finds (a variable-width lookbehind) raise here, as in the reference.
            return compile_pattern(self._source, re.DOTALL).search(text) is not None
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
        super().__init__()
        self.think_token = think_token
        self.answer_token = answer_token
        self._think = TagPair(think_token, "think_token")
        self._answer = TagPair(answer_token, "answer_token")
        self.heavy = self._think.is_pattern or self._answer.is_pattern

    def warm_up(self) -> None:
        """The code-point table a pattern token's character classes are computed from (~0.3 s)."""
        warm_patterns()

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
