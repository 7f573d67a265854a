"""Kolibrify's `completion_length_cap`: a 0/1 gate on the completion's token count.

The trainer sends the count (`completion_tokens` in the sample's extra): only it knows the tokenizer for
sure, and a count it sends always wins. Without one, the grader counts the response with its `tokenizer`
(the reward's or the server's, `--tokenizer`: see `core.tokens`), as Kolibrify's dataserver counts with the
model's tokenizer; with no tokenizer either, Kolibrify's meaning holds (`treat_missing_as_fail`). Meant as a
multiplicative gate on the other graders. A sent count must be a whole number (D12; `10.0` is 10): anything
else is that sample's INVALID_SAMPLE.
"""

from __future__ import annotations

from typing import Any

from grpcgrade.core.errors import ErrorCode, InvalidParams, SampleProblem
from grpcgrade.core.tokens import count_tokens, load
from grpcgrade.grader import BaseGrader, GraderError, GraderResult, GraderScore

from .parsing import is_number, token_count


class CompletionLengthCapGrader(BaseGrader):
    """1.0 within `max_completion_tokens`, else `min_reward`; a missing count is counted with `tokenizer`
    when there is one, else fails unless told otherwise."""

    #: The server fills `tokenizer` from `--tokenizer` (or the reward's) when the params name none; trainer
    #: paths that never send counts refuse a reward with such a gate that has no tokenizer (`core.tokens`).
    counts_tokens = True

    def __init__(
        self,
        max_completion_tokens: int = 0,
        treat_missing_as_fail: bool = True,
        min_reward: float = 0.0,
        tokenizer: str = "",
    ) -> None:
        if not is_number(max_completion_tokens) or not max_completion_tokens > 0:
            raise InvalidParams("max_completion_tokens", "required: a positive token count")
        if not is_number(min_reward) or not 0.0 <= min_reward <= 1.0:
            raise InvalidParams("min_reward", "must be a number between 0 and 1")
        if not isinstance(treat_missing_as_fail, bool):
            raise InvalidParams("treat_missing_as_fail", "must be true or false")
        if not isinstance(tokenizer, str):
            raise InvalidParams("tokenizer", "must be tiktoken:ENCODING or the path of a tokenizer.json")
        if tokenizer:
            load(tokenizer)  # an unusable tokenizer is refused when the reward is built, not per sample
        super().__init__()
        self.tokenizer = tokenizer
        self.max_completion_tokens = max_completion_tokens
        self.treat_missing_as_fail = treat_missing_as_fail
        self.min_reward = float(min_reward)

    def evaluate(self, completion_tokens: Any = None, response: str = "", **kwargs: Any) -> GraderResult:
        try:
            completion_tokens = token_count(completion_tokens)
        except SampleProblem as exc:
            return GraderError(self.name, str(exc), code=ErrorCode.INVALID_SAMPLE)
        counted = completion_tokens is None and bool(self.tokenizer)
        if counted:
            completion_tokens = count_tokens(response or "", self.tokenizer)
        if completion_tokens is None:
            score = self.min_reward if self.treat_missing_as_fail else 1.0
            return GraderScore(
                name=self.name,
                score=score,
                reason="no completion_tokens in the sample"
                + ("; counted as over the cap" if self.treat_missing_as_fail else "; not enforced"),
                metadata={"completion_tokens": None, "max_completion_tokens": self.max_completion_tokens},
            )
        within = completion_tokens <= self.max_completion_tokens
        return GraderScore(
            name=self.name,
            score=1.0 if within else self.min_reward,
            reason=f"{completion_tokens} tokens{f' (counted with {self.tokenizer})' if counted else ''}, "
            f"cap {self.max_completion_tokens:.15g}" + ("" if within else ": over the cap"),
            metadata={
                "completion_tokens": completion_tokens,
                "max_completion_tokens": self.max_completion_tokens,
                **({"tokenizer": self.tokenizer} if counted else {}),
            },
        )
