"""Text out of chat messages, as trainers hold prompts and completions (OpenAI's message shape): the one rule
the HTTP faces and the trainer integrations share for a sample's `query` and `response`."""

from __future__ import annotations

from typing import Any


def message_text(content: Any) -> str:
    """A chat message's text: its content string, or its text parts joined (OpenAI's content-part lists:
    `{"type": "text" | "input_text" | "output_text", "text": ...}`); anything else is no text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def last_text(chat: Any, role: str) -> str:
    """A prompt's or completion's text: itself when a string, else the last `role` message's text ("" when
    there is none)."""
    if isinstance(chat, str):
        return chat
    if not isinstance(chat, list | tuple):
        return ""
    for message in reversed(chat):
        if isinstance(message, dict) and message.get("role") == role:
            return message_text(message.get("content"))
    return ""
