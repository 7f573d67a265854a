"""verifiers' rubrics (verifiers 0.3.1, the classic `vf.Rubric` API; 0.4 replaced it with `vf.Task`),
graded by a grpcgrade server.

A verifiers environment scores rollouts with its `Rubric`: `await rubric.score_rollout(state)` for one,
`await rubric.score_group(states)` for a group (which gathers every rollout's call of each reward function
at once). Each reward function is called with the names it declares out of the state's `prompt`,
`completion`, `answer`, `info`, `state`, `task`... and its weighted sum is `state["reward"]`, each function's
value `state["metrics"][name]`.

`rubric(target, reward)` builds a `vf.Rubric` of two functions: `grpcgrade` (weight 1), the server's
reward for the rollout, and `grpcgrade_failed` (weight 0: a metric only), 1.0 when the rollout's graders
failed. A group's calls arrive together and leave as one BatchEvaluate (the client's `Coalescer`), so
scoring a group is one call. The sample: `query` the prompt's last user message, `response` the
completion's last assistant message, `reference` the `answer`, `extra` the `info`.

A failed rollout: verifiers scores a reward function that raises as 0.0 and only logs it, so the failure
would look like a wrong answer; instead `grpcgrade` answers `failure_reward` (0.0 unless set) and
`grpcgrade_failed` is 1.0 in the rollout's metrics (verifiers averages metrics in its reports), with a
logged WARNING naming the grader and its error code. A call that fails as a whole raises out of the
reward function, which verifiers logs and scores 0.0: check the server before training (`client.check`).

The rubric sends no token counts, so `rubric()` asks the server once whether the reward gates on one
(`completion_length_cap`) without a tokenizer to make it, and refuses (ValueError naming `--tokenizer`) if
so: raised from the reward function it would only be logged and every rollout scored 0.0.
"""

from __future__ import annotations

from typing import Any

import verifiers as vf

from grpcgrade.client import DEFAULT_LINGER, AsyncGradingClient, Coalescer, UnsendableSample
from grpcgrade.core.loops import PerLoop
from grpcgrade.integrations.common import (
    failure_of,
    field,
    last_text,
    log,
    require_counts,
    reward_of,
    unsent_result,
    usable_extra,
)

#: The rubric's function names (and so the keys of `state["metrics"]`).
REWARD_NAME = "grpcgrade"
FAILED_NAME = "grpcgrade_failed"
#: Where a rollout's failure flag waits in its state between the two functions.
STATE_KEY = "grpcgrade_failed"


def rubric(
    target: str,
    reward: str,
    *,
    token: str | None = None,
    timeout: float = 60.0,
    failure_reward: float = 0.0,
    linger: float = DEFAULT_LINGER,
) -> vf.Rubric:
    """A `vf.Rubric` whose reward is the server's `reward` (module docstring); ValueError for a reward that
    gates on a token count the server cannot make."""
    require_counts(target, token, timeout, reward, "verifiers' rubric")

    def open_coalescer() -> Coalescer:
        return AsyncGradingClient(target, token=token, timeout=timeout).coalescer(reward=reward, linger=linger)

    # gRPC's asyncio channels belong to the loop that made them: a client per loop, closed as its loop ends
    coalescers = PerLoop(open_coalescer, lambda held: held.client.close())

    async def grpcgrade(prompt: Any, completion: Any, answer: Any, state: Any, info: Any = None) -> float:
        sample = {
            "query": last_text(prompt, "user"),
            "response": last_text(completion, "assistant"),
            **field("reference", answer),
            **usable_extra((info or {}).items()),
        }
        try:
            result = await coalescers.get().evaluate(sample)
        except UnsendableSample as exc:
            result = unsent_result(exc)
        value = reward_of(result)
        state[STATE_KEY] = float(value is None)
        if value is None:
            log.warning(
                "grpcgrade: a rollout's graders failed (%s); its reward is %s", failure_of(result), failure_reward
            )
            return failure_reward
        return value

    def grpcgrade_failed(state: Any) -> float:
        return float(state.get(STATE_KEY, 1.0))  # never scored: not a success either

    grpcgrade.__name__, grpcgrade_failed.__name__ = REWARD_NAME, FAILED_NAME
    return vf.Rubric(funcs=[grpcgrade, grpcgrade_failed], weights=[1.0, 0.0])
