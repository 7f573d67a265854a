"""LLMGrader: a grader whose judgment comes from a chat model, as the seeds define it.

It fills the template's `{variables}` from the sample's fields and the grader's params, asks the model,
and reads the structured answer: `{score, reason}` for pointwise graders, `{rank, reason}` for listwise
ones. A judge that fails or answers unusably raises, and the service turns that into the sample's error
result. The model is a configured model's name (see `grpcgrade.llm.models`), never an address.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.grader import BaseGrader, GraderMode, GraderRank, GraderScore

from .models import get_model
from .parsing import parse_rank, parse_score
from .prompt import ChatMessage, LanguageEnum, PromptTemplate
from .settings import DEFAULT_MODEL

if TYPE_CHECKING:
    from .chat import ChatModel, ChatReply


def parse_language(language: LanguageEnum | str) -> LanguageEnum:
    try:
        return LanguageEnum(language)
    except ValueError:
        allowed = ", ".join(lang.value for lang in LanguageEnum)
        raise InvalidParams("language", f"unknown language {language!r}; allowed: {allowed}") from None


def resolve_model(model: str | ChatModel) -> ChatModel:
    """A configured model by name; Python callers may also hand over a `ChatModel` they built."""
    if isinstance(model, str):
        return get_model(model)
    from .chat import ChatModel

    if isinstance(model, ChatModel):
        return model
    raise InvalidParams("model", f"must be the name of a configured model, not a {type(model).__name__}")


def _score_range(min_score: float | None, max_score: float | None) -> tuple[float, float] | None:
    if min_score is None and max_score is None:
        return None
    if min_score is None or max_score is None:
        raise InvalidParams("min_score" if min_score is None else "max_score", "give min_score and max_score together")
    for param, value in (("min_score", min_score), ("max_score", max_score)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidParams(param, f"must be a finite number, got {value!r}")
    if not min_score < max_score:
        raise InvalidParams("max_score", f"must be greater than min_score ({min_score:g})")
    return float(min_score), float(max_score)


class LLMGrader(BaseGrader):
    """Base class of graders judged by a chat model.

    Subclasses pass a `template` and usually narrow `aevaluate` to the sample fields they use. Template
    variables are the sample's fields plus the grader's extra keyword arguments (its params), the params
    winning, plus `min_score` / `max_score` when a score range is set. A pointwise score outside the range
    is an error, not a clipped score.

    Example:
        >>> grader = LLMGrader(template="Is {response} polite? Answer {{\"score\": 0 or 1, \"reason\": ...}}",
        ...                    name="polite", min_score=0, max_score=1)
        >>> result = await grader.aevaluate(response="Thanks!")
    """

    bounds_own_time = True  # each attempt has the model's timeout_seconds, and retries are bounded
    cache_by_default = True  # a judge call costs money and seconds; a failed one is never cached

    def __init__(
        self,
        model: str | ChatModel = DEFAULT_MODEL,
        *,
        template: PromptTemplate | str | Sequence[ChatMessage],
        name: str = "",
        mode: GraderMode | str | None = None,
        language: LanguageEnum | str = LanguageEnum.EN,
        description: str = "",
        min_score: float | None = None,
        max_score: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name=name, mode=mode, description=description, **kwargs)
        self.template = PromptTemplate.from_prompt(template)
        self.language = parse_language(language)
        languages = self.template.languages
        if languages is not None and self.language not in languages:
            have = ", ".join(lang.value for lang in languages)
            raise InvalidParams("language", f"this grader has prompts in: {have}")
        self.score_range = _score_range(min_score, max_score)
        self.variables = dict(kwargs)
        if self.score_range is not None:
            self.variables.update(min_score=f"{self.score_range[0]:g}", max_score=f"{self.score_range[1]:g}")
        self.model = resolve_model(model)

    async def ask(self, **kwargs: Any) -> ChatReply:
        """The model's raw reply to the filled template."""
        messages = self.template.format(self.language, **{**kwargs, **self.variables})
        return await self.model.achat(messages)

    def metadata(self, reply: ChatReply) -> dict[str, Any]:
        meta: dict[str, Any] = {"model": self.model.config.name, "attempts": reply.attempts}
        if reply.usage:
            meta["usage"] = reply.usage
        return meta

    async def aevaluate(self, **kwargs: Any) -> GraderScore | GraderRank:
        reply = await self.ask(**kwargs)
        if self.mode is GraderMode.LISTWISE:
            rank, reason = parse_rank(reply.content, len(kwargs.get("responses") or ()))
            return GraderRank(name=self.name, rank=rank, reason=reason, metadata=self.metadata(reply))
        score, reason = parse_score(reply.content, self.score_range)
        return GraderScore(name=self.name, score=score, reason=reason, metadata=self.metadata(reply))
