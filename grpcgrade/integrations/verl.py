"""veRL's custom reward function, graded by a grpcgrade server.

veRL loads `custom_reward_function.path` / `.name` and merges `custom_reward_function.reward_kwargs` into
every call (`verl/trainer/ppo/reward.py`, `get_custom_reward_fn` and `_call_with_kwargs[_async]`, veRL 0.9).
Its reward loop (`verl/experimental/reward_loop/reward_manager/naive.py`, `run_single`) then calls it once
per sample, from reward-worker actors, as each sample's rollout finishes (`agent_loop.py`), or a whole step
at once with a colocated reward model:

    await compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)

(an `async def` is awaited on the loop; a plain function runs in the loop's thread pool). A dict result
gives `score` as the reward and every key to `reward_extra_info`, one list per key, so every sample's dict
has the same keys here: `score`, `grpcgrade/failed` (1.0 when the sample's graders failed: its `score` is
then `failure_score`, not a grade) and `grpcgrade/<key>` per grader of the configured rewards (NaN where it
failed). The per-sample calls that arrive together reach the server as one BatchEvaluate: `Coalescer`.
The reward guard's options (`budget_seconds`, `max_failure_ratio`, `cache`; docs/reward-guard.md) apply
to each of those calls: a sample cut by the budget is a failed sample; a call past its failure ratio
raises `grpcgrade.client.FailureBudgetExceeded` in every `compute_score` it answers, which veRL does not
catch (the run ends). Calls of one sample make a failure ratio mean "any failure": docs/trainers.md says
to leave it out.

`compute_score` is the async form (veRL's reward loop); `compute_score_sync` the blocking one, for the
per-sample managers of veRL before 0.9 that call the function directly (`naive`, `prime`:
`verl/workers/reward_manager/naive.py`); `compute_score_batch` the batch form, for the `batch` manager
(`verl/workers/reward_manager/batch.py`), which calls it once per step with plural keywords:

    compute_score(data_sources=..., solution_strs=..., ground_truths=..., extra_infos=..., **reward_kwargs)

and takes one result per sample (a dict: its `score` and the rest to reward_extra_info; the oldest batch
manager, which reads only numbers, gets floats with `scores_only=True`).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from grpcgrade.client import DEFAULT_LINGER, DEFAULT_MAX_BATCH, AsyncGradingClient, Cache, Coalescer, UnsendableSample
from grpcgrade.core.loops import PerLoop
from grpcgrade.integrations.common import (  # absolute: veRL may load this file by path
    agent_inputs,
    field,
    reward_of,
    score_of,
    uncounted_gates,
    uncounted_refusal,
    unsent_result,
    usable_extra,
)
from grpcgrade.v1 import grading_pb2 as pb

#: The key of the failure flag in the returned dict (and so in veRL's reward_extra_info).
FAILED_KEY = "grpcgrade/failed"
#: Prefix of the per-grader keys.
GRADER_PREFIX = "grpcgrade/"
#: `extra_info` keys that name the sample (its id) rather than grade it.
ID_KEYS = ("index", "id")


class _Connection:
    """One event loop's client for one target, its coalescers (one per reward) and the reward's labels."""

    def __init__(self, target: str, token: str | None, timeout: float, linger: float, max_batch: int) -> None:
        self.client = AsyncGradingClient(target, token=token, timeout=timeout)
        self.linger, self.max_batch = linger, max_batch
        self.coalescers: dict[tuple[Any, ...], Coalescer] = {}
        self.labels: dict[str, list[str]] | None = None
        self.uncounted: dict[str, list[str]] = {}  # per reward: its length gates without a tokenizer
        self._catalog_lock = asyncio.Lock()

    def coalescer(self, reward: str, **guards: Any) -> Coalescer:
        """The coalescer of one reward and one set of the reward guard's options."""
        key = (reward, *sorted(guards.items()))
        c = self.coalescers.get(key)
        if c is None:
            c = self.coalescers[key] = self.client.coalescer(
                reward=reward, linger=self.linger, max_batch=self.max_batch, view=pb.RESULT_VIEW_SCORES, **guards
            )
        return c

    async def keys(self, rewards: list[str]) -> list[str]:
        """Every grader key of the rewards this configuration can pick, in a stable order."""
        async with self._catalog_lock:
            if self.labels is None:
                catalog = await self.client.list_graders()
                self.labels = {r.name: [g.key or g.name for g in r.graders] for r in catalog.rewards}
                self.uncounted = {r.name: uncounted_gates(catalog, r.name) for r in catalog.rewards}
        missing = [r for r in rewards if r not in self.labels]
        if missing:
            raise ValueError(f"grpcgrade: the server at {self.client.target} has no reward {missing[0]!r}")
        return list(dict.fromkeys(k for r in rewards for k in self.labels[r]))


#: Each event loop's connections, by their options; each closed as its loop ends.
_connections = PerLoop(_Connection, lambda held: held.client.close())


def _pick(data_source: str, reward: str | None, rewards: Mapping[str, str] | None) -> tuple[str, list[str]]:
    """The reward for this sample, and every reward the configuration can pick (for the dict's keys)."""
    if bool(reward) == bool(rewards):
        raise ValueError("grpcgrade: set exactly one of reward_kwargs.reward or reward_kwargs.rewards")
    if reward:
        return reward, [reward]
    assert rewards is not None
    if data_source not in rewards:
        raise ValueError(f"grpcgrade: reward_kwargs.rewards names no reward for data_source {data_source!r}")
    return rewards[data_source], list(dict.fromkeys(rewards.values()))


def sample_of(solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None) -> dict[str, Any]:
    """veRL's call as a sample: the solution is the response, the ground truth the reference, the
    `extra_info` item `question` (or `query`, `prompt`) the query and `index` (or `id`) the id; every other
    JSON-valued item of `extra_info` goes to `extra` (see `usable_extra`), the agent loop's `num_turns`
    among them, but its `messages`, `tool_calls` and `tool_definitions` lists (what an agent loop puts in its
    `extra_fields`, which veRL's reward loop merges into `extra_info`) are the sample's agent inputs. A
    ground truth of None or NaN (`is_missing`), or no query in `extra_info`, is a field the sample does not
    carry: a grader that requires it answers INVALID_SAMPLE instead of grading an empty text."""
    info = dict(extra_info or {})
    query = next((info[k] for k in ("question", "query", "prompt") if isinstance(info.get(k), str)), None)
    sample_id = next((info[k] for k in ID_KEYS if info.get(k) is not None), "")
    sample: dict[str, Any] = {"id": str(sample_id), "response": solution_str}
    if query is not None:
        sample["query"] = query
    sample.update(field("reference", ground_truth))
    extra = usable_extra(info.items(), frozenset(("question", "prompt", *ID_KEYS)))
    if extra:  # without it, a sample of texts only: one keyword call fills its message (`add_samples`)
        sample["extra"] = extra
    sample.update(agent_inputs(info.items()))
    return sample


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    *,
    target: str = "127.0.0.1:50051",
    reward: str | None = None,
    rewards: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    failure_score: float = 0.0,
    token: str | None = None,
    linger: float = DEFAULT_LINGER,
    max_batch: int = DEFAULT_MAX_BATCH,
    budget_seconds: float = 0.0,
    max_failure_ratio: float | None = None,
    cache: Cache = None,
    **kwargs: Any,
) -> dict[str, float]:
    """veRL's reward-loop call for one sample (see the module docstring); `target`, `reward` or `rewards`,
    `timeout`, the reward guard's `budget_seconds`, `max_failure_ratio` and `cache`... come from
    `custom_reward_function.reward_kwargs`. Other keyword arguments veRL adds (`reward_router_address`,
    ...) are ignored. A call that fails as a whole (server unreachable, unknown reward, past its failure
    budget) raises: training must not go on with rewards nobody computed."""
    chosen, every = _pick(data_source, reward, rewards)
    conn = _connections.get(str(target), token, float(timeout), float(linger), int(max_batch))
    keys = await conn.keys(every)
    gates = conn.uncounted.get(chosen)
    if gates and "completion_tokens" not in (extra_info or {}):
        raise uncounted_refusal(chosen, gates, "veRL's compute_score")
    guards = {"budget_seconds": float(budget_seconds), "max_failure_ratio": max_failure_ratio, "cache": cache}
    coalescer = conn.coalescer(chosen, **guards)
    try:
        result = await coalescer.evaluate(sample_of(solution_str, ground_truth, extra_info))
    except UnsendableSample as exc:
        result = unsent_result(exc)
    value = reward_of(result)
    out = {"score": float(failure_score) if value is None else value, FAILED_KEY: float(value is None)}
    for key in keys:
        score = score_of(result, key)
        out[GRADER_PREFIX + key] = math.nan if score is None else score
    return out


class _LoopThread:
    """An event loop in a daemon thread, so blocking callers from many threads share one coalescer."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="grpcgrade-verl", daemon=True).start()


_loop_thread: _LoopThread | None = None
_loop_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    """The one event loop (in a daemon thread) the blocking forms share."""
    global _loop_thread
    with _loop_lock:
        if _loop_thread is None:
            _loop_thread = _LoopThread()
        return _loop_thread.loop


def compute_score_sync(
    data_source: str,
    solution_str: str,
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    **kw: Any,
) -> dict[str, float]:
    """`compute_score` for callers that block (veRL's legacy reward managers, or a thread pool): calls from
    many threads at once are still coalesced, on one background event loop."""
    loop = _background_loop()
    future = asyncio.run_coroutine_threadsafe(
        compute_score(data_source, solution_str, ground_truth, extra_info, **kw), loop
    )
    return future.result()


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
    *,
    scores_only: bool = False,
    **kw: Any,
) -> list[dict[str, float]] | list[float]:
    """veRL's `batch` reward manager's call (plural keywords, one call per step; see the module docstring):
    `compute_score` for every sample, as one coalesced stream of calls, in order. Its arrays come as veRL
    holds them (numpy object arrays). `scores_only`: each sample's reward as a float, for the batch manager
    of veRL before 0.4, which turns anything else into 0.0."""
    n = len(solution_strs)
    if not len(data_sources) == len(ground_truths) == n:
        raise ValueError(
            f"grpcgrade: {len(data_sources)} data_sources, {n} solution_strs, {len(ground_truths)} ground_truths"
        )
    infos = list(extra_infos) if extra_infos is not None else [None] * n
    loop = _background_loop()

    async def every() -> list[dict[str, float]]:
        calls = (
            compute_score(str(d), s, g, i, **kw)
            for d, s, g, i in zip(data_sources, solution_strs, ground_truths, infos, strict=True)
        )
        return list(await asyncio.gather(*calls))

    results = asyncio.run_coroutine_threadsafe(every(), loop).result()
    return [r["score"] for r in results] if scores_only else results
