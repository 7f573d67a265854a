"""veRL's calls of a custom reward function, restated for the tests (tests/test_verl.py, tests/test_tokens.py).

`verl_wrap` is veRL's `get_custom_reward_fn` (verl/trainer/ppo/reward.py): reward_kwargs merged into every
call, taking precedence. `reward_loop` is the reward loop's `run_single` (verl/experimental/reward_loop/
reward_manager/naive.py): one awaited call per sample, a step's samples concurrently, and the dict result
split into the reward and reward_extra_info.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict
from functools import partial


def _call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):
    return raw_fn(*args, **{**kwargs, **extra_kwargs})


async def _call_with_kwargs_async(raw_fn, extra_kwargs, *args, **kwargs):
    return await raw_fn(*args, **{**kwargs, **extra_kwargs})


def verl_wrap(raw_fn, reward_kwargs):
    if not inspect.iscoroutinefunction(raw_fn):
        return partial(_call_with_kwargs, raw_fn, reward_kwargs)
    return partial(_call_with_kwargs_async, raw_fn, reward_kwargs)


def reward_loop(fn, items):
    """[(data_source, solution_str, ground_truth, extra_info)] -> (rewards, reward_extra_info)."""

    async def run_single(data_source, solution_str, ground_truth, extra_info):
        loop = asyncio.get_running_loop()
        extra_info = {**extra_info, "num_turns": None, "rollout_reward_scores": {}}
        kwargs = dict(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth)
        if inspect.iscoroutinefunction(fn):
            return await fn(**kwargs, extra_info=extra_info)
        return await loop.run_in_executor(None, lambda: fn(**kwargs, extra_info=extra_info))

    async def step():
        return await asyncio.gather(*(run_single(*item) for item in items))

    results = asyncio.run(step())
    extra = defaultdict(list)
    for result in results:
        for key, value in result.items():
            extra[key].append(value)
    return [r["score"] for r in results], extra
