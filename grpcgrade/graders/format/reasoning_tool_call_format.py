"""Strict think + answer / think + tool-call layout (OpenJudge `ReasoningToolCallFormatGrader`, D3)."""

from __future__ import annotations

import json
import re
from typing import Any

from grpcgrade.grader import BaseGrader, GraderScore

from .reasoning_format import TagPair

_THINK = TagPair("think")
_ANSWER = TagPair("answer")
_TOOL_CALL = TagPair("tool_call")
_DOUBLED_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*<tool_call>|</tool_call>\s*</tool_call>")
_BAD_COMBINATION = "Invalid combination: should have either <answer> or <tool_call> tags, not both or neither"


def _framed(text: str, tail: TagPair) -> bool:
    """Whether `text` is `\\s* <think> ... </think> \\s* <tail> ... </tail> \\s*`.

    This is the language of the reference's anchored regexes: `(?:<tool_call>.*?</tool_call>\\s*)+`
    accepts exactly what one `<tool_call>.*</tool_call>\\s*` accepts, since `.*` may span the inner
    tags. The callers have already required a single `</think>`, so the first one found is the one the
    regex would use. Checked with string operations because the reference's repeated lazy group
    backtracks exponentially (20 tool calls followed by junk take 0.2 s, 40 would take days).
    `str.strip` and the regex's `\\s` agree on what whitespace is.
    """
    body = text.strip()
    if not body.startswith(_THINK.open):
        return False
    think_end = body.find(_THINK.close, len(_THINK.open))
    if think_end < 0:
        return False
    rest = body[think_end + len(_THINK.close) :].lstrip()
    long_enough = len(rest) >= len(tail.open) + len(tail.close)
    return long_enough and rest.startswith(tail.open) and rest.endswith(tail.close)


def _is_tool_call(content: str) -> bool:
    """A tool call is a JSON object with `name` and `arguments`. Decision D3: any other JSON value is
    invalid JSON for a tool call (the reference raises TypeError on lists, strings and numbers). Only a
    JSONDecodeError is invalid JSON, as in the reference; other refusals of `json.loads` (RecursionError when
    nested too deeply, ValueError for an integer over 4,300 digits) raise: an error result (D7)."""
    try:
        call = json.loads(content.strip())
    except json.JSONDecodeError:
        return False
    return isinstance(call, dict) and "name" in call and "arguments" in call


def _single(text: str, tags: TagPair) -> bool:
    return text.count(tags.open) == 1 and text.count(tags.close) == 1


class ReasoningToolCallFormatGrader(BaseGrader):
    """1.0 for exactly `<think>...</think>` followed by either one `<answer>...</answer>` or one or more
    `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, with only whitespace around the tags.

    The checks are the reference's, evaluated cheapest first (they are all required, so the order does
    not change the result), and in linear time; `valid_tool_call_json` is True in the tool-call branch
    until a payload is found invalid, as in the reference.
    """

    def __init__(self) -> None:
        super().__init__()

    def evaluate(self, response: str = "", **kwargs: Any) -> GraderScore:
        has_think_tag = _THINK.present(response)
        has_answer_tag = _ANSWER.present(response)
        tool_calls = _TOOL_CALL.contents(response)
        has_tool_call_tag = bool(tool_calls)

        valid_format = False
        valid_tool_call_json = False
        if not has_think_tag:
            reason = "Missing <think></think> tags"
        elif has_answer_tag and not has_tool_call_tag:
            valid_format = _single(response, _THINK) and _single(response, _ANSWER) and _framed(response, _ANSWER)
            reason = f"{'Valid' if valid_format else 'Invalid'} <think></think> + <answer></answer> format"
        elif has_tool_call_tag and not has_answer_tag:
            valid_format = (
                _single(response, _THINK)
                and response.count(_TOOL_CALL.open) == response.count(_TOOL_CALL.close)
                and _DOUBLED_TOOL_CALL_TAG.search(response) is None
                and _framed(response, _TOOL_CALL)
            )
            valid_tool_call_json = not valid_format or all(map(_is_tool_call, tool_calls))
            valid_format = valid_format and valid_tool_call_json
            if valid_format:
                reason = "Valid <think></think> + <tool_call></tool_call> format with valid JSON"
            elif not valid_tool_call_json:
                reason = "Invalid JSON format in <tool_call> tags"
            else:
                reason = "Invalid <think></think> + <tool_call></tool_call> format"
        else:
            reason = _BAD_COMBINATION

        reward = 1.0 if valid_format else 0.0
        return GraderScore(
            name=self.name,
            score=reward,
            reason=reason,
            metadata={
                "has_think_tag": has_think_tag,
                "has_answer_tag": has_answer_tag,
                "has_tool_call_tag": has_tool_call_tag,
                "valid_format": valid_format,
                "valid_tool_call_json": valid_tool_call_json,
                "tool_call_count": len(tool_calls),
                "reward": reward,
            },
        )
