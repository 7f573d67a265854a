"""The judge models' limiter on its own: fair share by weight, token estimates corrected by usage, waits that
give up, and the configuration that sets them. Deterministic: a frozen clock, grants counted, no timing."""

from __future__ import annotations

import asyncio

import pytest

from grpcgrade.core.config import parse_config
from grpcgrade.core.context import DEFAULT_CALLER, caller_name
from grpcgrade.core.errors import ConfigError
from grpcgrade.llm.limits import PACE_SHARE, Grant, LimitWaitExpired, ModelLimiter, TokenEstimate, parse_weights
from grpcgrade.llm.models import parse_model
from grpcgrade.llm.usage import MAX_CALLERS, OTHER_CALLER, Usage


def frozen() -> float:
    return 100.0


async def settle() -> None:
    """Let every task that can run do so (a grant reaches its waiter through a few hand-overs)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def served(
    limiter: ModelLimiter,
    first: Grant,
    callers: list[str],
    grants: int,
    tokens: dict[str, int] | None = None,
    used: dict[str, int] | None = None,
) -> list[str]:
    """With the model's one slot held by `first`, requests from `callers` queue (in that order, each of the
    caller's `tokens`, else 1); the slot is then given back `grants` times (with the caller's `used` tokens
    as its answer's usage, when given): whose request got it each time."""
    order: list[Grant] = []

    async def take(caller: str) -> None:
        order.append(await limiter.acquire(caller, (tokens or {}).get(caller, 1)))

    tasks = [asyncio.create_task(take(c)) for c in callers]
    await settle()
    assert limiter.waiting == len(callers)
    grant = first
    for _ in range(grants):
        limiter.release(grant, None if used is None else used.get(grant.caller))
        await settle()
        grant = order[-1]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return [g.caller for g in order]


def test_callers_waiting_together_are_served_three_to_one_by_weight() -> None:
    async def run() -> list[str]:
        limiter = ModelLimiter(1, weights={"a": 3, "b": 1}, clock=frozen)
        return await served(limiter, await limiter.acquire("x", 1), ["a"] * 12 + ["b"] * 12, 16)

    order = asyncio.run(run())
    assert order.count("a") == 12 and order.count("b") == 4  # 3:1 while both wait
    assert all(order[i : i + 4].count("b") == 1 for i in range(0, 16, 4))  # b is never starved


def test_under_a_token_limit_callers_share_its_tokens_not_its_requests() -> None:
    """Two callers of equal weight, one sending 1,000-token requests and one 100-token ones, both waiting, on
    a model whose binding limit is tokens per minute: each gets the same tokens, so the short one is served
    ten times as often (requests counted alike, each got half the requests and the long one 10/11 of the
    tokens). With requests per minute alone, requests are what is shared."""

    async def run(limits: dict[str, float]) -> list[str]:
        limiter = ModelLimiter(1, clock=frozen, **limits)  # buckets far above the 22 requests: fairness only
        callers = ["long"] * 22 + ["short"] * 22
        return await served(limiter, await limiter.acquire("x", 1), callers, 22, {"long": 1000, "short": 100})

    by_tokens = asyncio.run(run({"tokens_per_minute": 1e12}))
    assert (by_tokens.count("long"), by_tokens.count("short")) == (2, 20)
    by_requests = asyncio.run(run({"requests_per_minute": 1e9}))
    assert (by_requests.count("long"), by_requests.count("short")) == (11, 11)


def test_a_callers_share_follows_the_tokens_its_answers_used() -> None:
    """Requests estimated alike (the model's average), but one caller's judgments answer at ten times the
    length: under a token limit, its pass is charged what its answers used, so it is served a tenth as often
    while both wait (11 and 11 before the correction)."""

    async def run() -> list[str]:
        limiter = ModelLimiter(1, tokens_per_minute=1e12, clock=frozen)
        callers = ["verbose"] * 22 + ["terse"] * 22
        estimates, usage = {"verbose": 100, "terse": 100}, {"verbose": 1000, "terse": 100}
        return await served(limiter, await limiter.acquire("x", 1), callers, 22, estimates, usage)

    order = asyncio.run(run())
    assert (order.count("verbose"), order.count("terse")) == (2, 20)  # the tokens shared 1:1


def test_a_caller_alone_gets_the_whole_model_and_saves_no_credit_while_idle() -> None:
    async def run() -> list[str]:
        limiter = ModelLimiter(1, weights={"a": 1, "b": 1}, clock=frozen)
        grant = await limiter.acquire("a", 1)
        for _ in range(5):  # a alone: served back to back
            limiter.release(grant)
            grant = await limiter.acquire("a", 1)
        return await served(limiter, grant, ["a", "a", "b", "b"], 4)

    # b was idle while a had 6 requests: from now on it gets its equal share, not 6 in a row
    assert asyncio.run(run()) == ["a", "b", "a", "b"]


def test_the_token_bucket_is_corrected_by_the_answers_usage() -> None:
    """6000 tokens a minute paced at 98%: 98 a second, a bucket of 98. A request estimated at 90 leaves 8;
    one of 50 waits, until the first's answer says it used 20: the 70 given back let it start."""

    async def run() -> tuple[bool, bool]:
        limiter = ModelLimiter(10, tokens_per_minute=6000, clock=frozen)
        assert limiter.tokens is not None and limiter.tokens.capacity == pytest.approx(6000 * PACE_SHARE / 60)
        first = await limiter.acquire("a", 90)
        second = asyncio.create_task(limiter.acquire("a", 50))
        await settle()
        before = second.done()
        limiter.release(first, used_tokens=20)
        await settle()
        after = second.done()
        second.cancel()
        return before, after

    assert asyncio.run(run()) == (False, True)


def test_without_usage_the_estimate_stands() -> None:
    async def run() -> bool:
        limiter = ModelLimiter(10, tokens_per_minute=6000, clock=frozen)
        first = await limiter.acquire("a", 90)
        second = asyncio.create_task(limiter.acquire("a", 50))
        await settle()
        limiter.release(first)  # no usage reported: the 90 stay taken
        await settle()
        done = second.done()
        second.cancel()
        return done

    assert asyncio.run(run()) is False


def test_the_request_bucket_allows_its_burst_then_waits() -> None:
    async def run() -> int:
        limiter = ModelLimiter(1000, requests_per_minute=600, clock=frozen)  # 9.8 a second, a burst of 9.8
        tasks = [asyncio.create_task(limiter.acquire("a", 1)) for _ in range(20)]
        await settle()
        granted = sum(t.done() for t in tasks)
        for t in tasks:
            t.cancel()
        return granted

    assert asyncio.run(run()) == 9


def test_a_wait_that_outlasts_its_time_gives_up_and_leaves_the_queue() -> None:
    async def run() -> tuple[int, int]:
        limiter = ModelLimiter(1)
        held = await limiter.acquire("a", 1)
        with pytest.raises(LimitWaitExpired):
            await limiter.acquire("a", 1, timeout=0.01)
        left = limiter.waiting
        limiter.release(held)
        again = await limiter.acquire("b", 1, timeout=1)  # the slot came back, the expired wait took nothing
        return left, limiter.in_flight if isinstance(again, Grant) else -1

    assert asyncio.run(run()) == (0, 1)


def test_a_cancelled_sample_gives_its_slot_back() -> None:
    async def run() -> int:
        limiter = ModelLimiter(1)
        held = await limiter.acquire("a", 1)
        waiter = asyncio.create_task(limiter.acquire("a", 1))
        await settle()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        limiter.release(held)
        return limiter.in_flight + limiter.waiting

    assert asyncio.run(run()) == 0


def test_a_pause_holds_every_request_of_the_model() -> None:
    async def run() -> bool:
        limiter = ModelLimiter(10, clock=frozen)
        limiter.pause(5)  # a 429's Retry-After; the frozen clock never reaches it
        waiter = asyncio.create_task(limiter.acquire("b", 1))
        await settle()
        done = waiter.done()
        waiter.cancel()
        return done

    assert asyncio.run(run()) is False


def test_token_estimates_count_max_tokens_and_learn_from_usage() -> None:
    estimate = TokenEstimate()
    body = {"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 64}
    assert estimate.before(body) == (101, 64)  # 400 characters at 4 a token, plus one
    unbounded = {"messages": body["messages"]}
    assert estimate.before(unbounded)[1] == 256
    for _ in range(200):
        estimate.learn(unbounded, prompt_tokens=200, completion_tokens=10)  # 2 characters a token, 10 out
    assert estimate.before(unbounded) == pytest.approx((201, 10), abs=2)


def test_model_limits_and_prices_are_checked() -> None:
    config = parse_model(
        "j",
        {
            "base_url": "http://127.0.0.1:1/v1",
            "requests_per_minute": 600,
            "tokens_per_minute": 1e6,
            "price_per_million_input_tokens": 2.5,
        },
    )
    assert (config.requests_per_minute, config.tokens_per_minute, config.price_per_million_input_tokens) == (
        600,
        1e6,
        2.5,
    )
    for key, value in (("requests_per_minute", -1), ("tokens_per_minute", float("inf")), ("requests_per_minute", "x")):
        with pytest.raises(ValueError, match=key):
            parse_model("j", {"base_url": "http://127.0.0.1:1/v1", key: value})


def test_callers_weights_are_checked() -> None:
    assert parse_weights({"a": {"weight": 3}, "b": 0.5}) == {"a": 3.0, "b": 0.5}
    for bad in ({"a": {"weight": 0}}, {"a": {"weight": True}}, {"a": {"share": 1}}, ["a"]):
        with pytest.raises(ValueError):
            parse_weights(bad)
    assert parse_config({"callers": {"rl": {"weight": 2}}}, "x.yaml").callers == {"rl": 2.0}
    with pytest.raises(ConfigError, match="callers"):
        parse_config({"callers": {"rl": {"weight": -2}}}, "x.yaml")


def test_caller_names_are_made_safe_and_bounded() -> None:
    assert caller_name(None) == caller_name("") == DEFAULT_CALLER
    assert caller_name("rl main\n{x}") == "rl_main__x_"
    assert caller_name(b"exp-1") == "exp-1"
    assert len(caller_name("y" * 500)) == 64


def test_usage_counts_a_bounded_number_of_callers_apart() -> None:
    usage = Usage(callers=["configured"])
    for i in range(MAX_CALLERS + 5):
        usage.tally("m", f"c{i}").requests += 1
    usage.tally("m", "configured").requests += 1
    callers = {caller: t.requests for _, caller, t in usage.snapshot()}
    assert callers[OTHER_CALLER] == 5 and callers["configured"] == 1
    assert len(callers) == MAX_CALLERS + 2
