"""What OpenJudge's agent graders share (py-openjudge 0.2.4, `openjudge/graders/agent/utils.py`): word-Jaccard
similarity and the pairing of an agent's tool calls with the tool results that answer them.

Both are reproduced with the reference's edge cases, since the graders' scores depend on them: two empty
texts have similarity 0, not 1; a tool result whose `tool_call_id` is unknown (or answered already) and an
id-less tool result with no id-less call pending make the trajectory unreadable (`ValueError`).
"""

from __future__ import annotations

from typing import Any


def word_jaccard(a: Any, b: Any) -> float:
    """|A∩B| / |A∪B| over the lower-cased whitespace-separated words; 0.0 when either text is empty."""
    if not a or not b:
        return 0.0
    words_a = set(a.lower().split())
    words_b = set(b.lower().split())
    if not words_a or not words_b:
        return 0.0
    return len(words_a & words_b) / len(words_a | words_b)


def unwrapped_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenJudge accepts each message bare or as `{"message": {...}}`."""
    return [m.get("message", m) for m in messages]


def action_observation_pairs(messages: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Any]]:
    """(tool call, tool result content) in the order of the results: by `tool_call_id`, else first in first
    out among the calls that have no id. Calls never answered are left out; user and system turns ignored."""
    pairs: list[tuple[dict[str, Any], Any]] = []
    by_id: dict[Any, dict[str, Any]] = {}
    without_id: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role", "")
        calls = message.get("tool_calls", [])
        content = message.get("content", "")
        if role == "assistant" and calls:
            for call in calls:
                call = call.get("tool_call", call)
                call_id = call.get("id")
                if call_id:
                    by_id[call_id] = call
                else:
                    without_id.append(call)
        elif role in ("function", "tool"):
            call_id = message.get("tool_call_id")
            if call_id:
                if call_id not in by_id:
                    raise ValueError(f"tool result for call id {call_id!r}, which no pending tool call has")
                pairs.append((by_id.pop(call_id), content or ""))
            elif without_id:
                pairs.append((without_id.pop(0), content or ""))
            else:
                raise ValueError("tool result without a tool_call_id, and no pending tool call without an id")
    return pairs


def function_of(call: dict[str, Any]) -> Any:
    """The `function` object of an OpenAI tool call (`{}` when absent, as the trajectory graders read it)."""
    return call.get("function", {})
