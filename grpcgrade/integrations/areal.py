"""AReaL's reward function (areal 1.0), graded by a grpcgrade server.

AReaL's workflows (`areal/workflow/rlvr.py`, `multi_turn.py`) wrap the configured `reward_fn` in
`areal.api.reward_api.AsyncRewardWrapper` and await, per generated completion,

    reward_fn(prompt, completions, prompt_ids, completion_ids, **data)

where `prompt` and `completions` are decoded strings, the ids are the token ids, and `data` is the dataset
row's other fields. The wrapper runs the function in a `ProcessPoolExecutor` (so it must be picklable),
with a timeout (15 s by default, after which the sample's reward is 0) and retries.

`RewardFunction(target, reward, ...)` is that function: `query` is the prompt, `response` the completion,
`reference` the row's `answer` (or `reference_key`), `completion_tokens` the count of `completion_ids`
(AReaL's own tokens: no server tokenizer needed), the row's other fields `extra`. It holds only its
settings when pickled; each worker process opens one client per target.

A failed sample (its graders failed) raises `SampleFailed` naming the grader and its error code: AReaL's
wrapper logs "Reward computation error" and retries, then raises into the workflow, which rejects the
rollout (`rollout/rejected` in AReaL's stats): the sample is left out, never trained on a made-up reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpcgrade.client import UnsendableSample
from grpcgrade.integrations.common import (
    failure_of,
    field,
    reward_of,
    shared_client,
    unsent_result,
    usable_extra,
)


class SampleFailed(RuntimeError):
    """A sample whose graders failed: it has no reward, and AReaL rejects its rollout."""


class RewardFunction:
    """AReaL's `reward_fn` backed by the server's `reward` (module docstring)."""

    def __init__(
        self,
        target: str,
        reward: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        reference_key: str = "answer",
    ) -> None:
        self.target, self.reward, self.token = target, reward, token
        self.timeout = timeout  # below the wrapper's 15 s, so a slow call is an error, not a silent 0
        self.reference_key = reference_key

    def __call__(
        self,
        prompt: str,
        completions: str,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        **data: Any,
    ) -> float:
        sample = {
            "query": prompt,
            "response": completions,
            **field("reference", data.get(self.reference_key)),
            "completion_tokens": len(completion_ids),
            **usable_extra(data.items(), skip=frozenset((self.reference_key, "completion_tokens"))),
        }
        try:
            result = shared_client(self.target, self.token, self.timeout).evaluate(sample, reward=self.reward)
        except UnsendableSample as exc:
            result = unsent_result(exc)
        value = reward_of(result)
        if value is None:
            raise SampleFailed(f"grpcgrade: the sample's graders failed ({failure_of(result)}); it has no reward")
        return value
