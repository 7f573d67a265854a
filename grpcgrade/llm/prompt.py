"""Prompt templates for LLM judges, in the seeds' shape (RM-Gallery / OpenJudge `PromptTemplate`).

A template holds chat messages per language; `{name}` placeholders are filled with `str.format` rules, so a
literal brace in a prompt (a JSON example) is written `{{` / `}}`, exactly as in the seeds' prompts. Values are
inserted as data and never formatted again, so a response that contains braces cannot change the prompt.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

_ROOT_NAME = re.compile(r"[^.\[]*")


class LanguageEnum(StrEnum):
    EN = "en"
    ZH = "zh"


class PromptError(ValueError):
    """A template cannot be filled: a placeholder has no value, or the language has no prompt."""


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str

    def format(self, **variables: Any) -> ChatMessage:
        missing = sorted(placeholders(self.content) - set(variables))
        if missing:
            raise PromptError(f"prompt variable {missing[0]!r} has no value (give it in the sample or the params)")
        return ChatMessage(self.role, self.content.format_map(variables))

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def placeholders(text: str) -> set[str]:
    """The variable names a template text refers to (`{a.b}` and `{a[0]}` need `a`)."""
    names = set()
    for _, field, _, _ in string.Formatter().parse(text):
        if field is not None:
            names.add(_ROOT_NAME.match(field).group())  # type: ignore[union-attr]
    return names


class PromptTemplate:
    """Chat messages per language, or one list of messages used whatever the language."""

    def __init__(self, messages: Mapping[LanguageEnum | str, Sequence[ChatMessage]] | Sequence[ChatMessage]) -> None:
        if isinstance(messages, Mapping):
            self.messages: dict[LanguageEnum, list[ChatMessage]] | list[ChatMessage] = {
                LanguageEnum(lang): list(msgs) for lang, msgs in messages.items()
            }
        else:
            self.messages = list(messages)

    @classmethod
    def from_prompt(cls, prompt: PromptTemplate | str | Sequence[ChatMessage]) -> PromptTemplate:
        """What LLMGrader accepts as `template`: a template, one user prompt, or a list of messages."""
        if isinstance(prompt, PromptTemplate):
            return prompt
        if isinstance(prompt, str):
            return cls([ChatMessage("user", prompt)])
        return cls(prompt)

    @property
    def languages(self) -> list[LanguageEnum] | None:
        """The languages this template has prompts in; None when it has one prompt for every language."""
        return list(self.messages) if isinstance(self.messages, dict) else None

    def to_messages(self, language: LanguageEnum = LanguageEnum.EN) -> list[ChatMessage]:
        if isinstance(self.messages, list):
            return self.messages
        if language not in self.messages:
            have = ", ".join(self.messages) or "none"
            raise PromptError(f"the template has no {language.value!r} prompt (it has: {have})")
        return self.messages[language]

    def format(self, language: LanguageEnum = LanguageEnum.EN, **variables: Any) -> list[ChatMessage]:
        return [message.format(**variables) for message in self.to_messages(language)]
