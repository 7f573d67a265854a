"""A model's provider limits, kept for the whole server, and each model's capacity shared between callers.

Providers limit a key by requests per minute, tokens per minute and (self-hosted servers) requests in
flight; past them they answer 429 (or 503) and the judgment is lost or retried in a storm. Pacing in each
trainer process cannot help when several share a key: only the server sees every judgment, so it paces
them here, one `ModelLimiter` per model:

* **Requests and tokens per minute** are token buckets refilled continuously at rate/60 per second (a
  little under: `PACE_SHARE`), each holding at most `BURST_SECONDS` of its rate: a steady pace at the
  limit, never a minute's worth at once (providers enforce their per-minute limits over shorter windows).
  A request takes its token estimate before it is sent (`TokenEstimate`); when its answer reports its
  usage, the difference is given back or taken (the bucket may go below zero: the next requests wait).
* **A 429 or 503** closes the model until its Retry-After (or a backoff): the provider says the key is over
  its limit, so no other request of the model is sent either (`pause`).
* **Fair share.** Each caller has its own queue; when the model has room, the next request is taken from
  the caller with the least service so far relative to its weight (start-time fair queuing: each caller's
  "pass" advances by a request's cost / weight, and a caller that was idle starts at the current pass, so
  idleness is not saved up as credit). A request's cost is its share of the model's scarcest paced limit
  (dominant resource fairness, `ModelLimiter._cost`): under a tokens-per-minute limit, its estimated
  tokens. A caller with weight 3 gets 3 times the model a caller with weight 1 gets while both have work
  waiting (3 requests for every 1 when their requests are alike); a caller alone gets the whole model.

The waits are futures granted by one dispatcher per model, run whenever the state changes (a request
arrives or finishes, a bucket refills), so thousands of waiting judgments cost no polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: How much of its per-minute rate a bucket holds at most: the largest burst the server sends.
BURST_SECONDS = 1.0
#: The share of a declared per-minute limit the server paces at. Requests reach the provider a little
#: earlier or later than they were sent; at exactly the limit, both buckets sit at their edge and every
#: such jitter is a 429 (measured: 78 in 2,000 at 100/s). 2 % under it, the provider's bucket keeps a
#: margin that absorbs the jitter.
PACE_SHARE = 0.98
#: The completion tokens a request is assumed to use before any answer has reported its usage, when the
#: request sets no `max_tokens`.
FIRST_COMPLETION_ESTIMATE = 256
#: Characters per prompt token assumed before any answer has reported its usage (English text in BPE).
FIRST_CHARS_PER_TOKEN = 4.0
#: How fast the estimate follows the reported usage (the weight of the newest answer).
ESTIMATE_SMOOTHING = 0.1


class TokenBucket:
    """`rate` units per second, at most `capacity` saved; `take` may leave it below zero (a debt)."""

    def __init__(self, per_minute: float, clock: Callable[[], float], share: float = PACE_SHARE) -> None:
        self.rate = per_minute * share / 60.0
        self.capacity = max(1.0, self.rate * BURST_SECONDS)
        self.clock = clock
        self.level = self.capacity
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait(self, amount: float) -> float:
        """Seconds until `amount` (at most the capacity: a larger request waits for a full bucket) is there."""
        self._refill()
        short = min(amount, self.capacity) - self.level
        return 0.0 if short <= 0 else short / self.rate

    def take(self, amount: float) -> None:
        self._refill()
        self.level -= amount

    def give(self, amount: float) -> None:
        """A correction: `amount` (negative to take more) back, as an answer's usage shows."""
        self._refill()
        self.level = min(self.capacity, self.level + amount)


@dataclass
class TokenEstimate:
    """A request's tokens before it is sent: its prompt's characters over the characters per token seen in
    answers so far, plus its `max_tokens` (providers count it against the limit when the request arrives),
    else the completion tokens answers have used so far."""

    chars_per_token: float = FIRST_CHARS_PER_TOKEN
    completion: float = FIRST_COMPLETION_ESTIMATE

    def before(self, body: Mapping[str, Any]) -> tuple[int, int]:
        """(prompt, completion) tokens `body` is expected to use."""
        chars = sum(len(str(m.get("content") or "")) for m in body.get("messages") or () if isinstance(m, Mapping))
        chars += sum(len(str(t)) for t in body.get("input") or ()) if isinstance(body.get("input"), list) else 0
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        completion = limit if isinstance(limit, int) and limit > 0 else self.completion
        return math.ceil(chars / self.chars_per_token) + 1, math.ceil(completion)

    def learn(self, body: Mapping[str, Any], prompt_tokens: int, completion_tokens: int) -> None:
        """What an answer's usage says of a request's tokens."""
        chars = sum(len(str(m.get("content") or "")) for m in body.get("messages") or () if isinstance(m, Mapping))
        a = ESTIMATE_SMOOTHING
        if chars and prompt_tokens > 0:
            self.chars_per_token += a * (chars / prompt_tokens - self.chars_per_token)
        if "messages" in body:
            self.completion += a * (max(completion_tokens, 0) - self.completion)


@dataclass(eq=False)
class Grant:
    """A request's permission to be sent: its caller, its token estimate (taken from the bucket), and how
    long it waited for it."""

    caller: str
    tokens: int
    waited: float = 0.0


@dataclass(eq=False)
class _Waiter:
    caller: str
    tokens: int
    since: float
    future: asyncio.Future[Grant]
    order: int


@dataclass
class _Caller:
    weight: float
    queue: deque[_Waiter] = field(default_factory=deque)
    passed: float = 0.0  # service received / weight, in the model's virtual time


class LimitWaitExpired(Exception):
    """The wait for the model's limits outlasted the time the request had."""


class ModelLimiter:
    """One model's limits (see the module docstring): `acquire` a `Grant` before each request, `release`
    it after, `pause` on a 429 or 503. Belongs to one event loop."""

    def __init__(
        self,
        max_concurrency: int,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        weights: Mapping[str, float] | None = None,
        default_weight: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_concurrency = max_concurrency
        self.clock = clock
        self.requests = TokenBucket(requests_per_minute, clock) if requests_per_minute else None
        self.tokens = TokenBucket(tokens_per_minute, clock) if tokens_per_minute else None
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        self.in_flight = 0
        self.paused_until = 0.0
        self.vtime = 0.0  # the pass of the request granted last
        self.callers: dict[str, _Caller] = {}  # only callers with requests waiting
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        return sum(len(c.queue) for c in self.callers.values())

    async def acquire(self, caller: str, tokens: int, timeout: float | None = None) -> Grant:
        """Wait for the model's room and this caller's turn; raises LimitWaitExpired after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(caller, tokens, self.clock(), loop.create_future(), next(self._order))
        state = self.callers.get(caller)
        if state is None:
            weight = self.weights.get(caller, self.default_weight)
            state = self.callers[caller] = _Caller(weight, passed=self.vtime)
        state.queue.append(waiter)
        self._dispatch()
        future = waiter.future
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            if future.done():  # granted in the same tick the time ran out: the grant stands
                return future.result()
            self._forget(waiter)
            raise LimitWaitExpired(f"no turn within {timeout:g} s") from None
        except BaseException:  # the sample was cancelled: a grant it got is given back at once
            if future.done():
                self.release(future.result())
            else:
                self._forget(waiter)
            raise

    def _forget(self, waiter: _Waiter) -> None:
        waiter.future.cancel()
        state = self.callers.get(waiter.caller)
        if state is not None:
            with contextlib.suppress(ValueError):
                state.queue.remove(waiter)
            if not state.queue:
                del self.callers[waiter.caller]
        self._dispatch()  # the waiter may have been the head holding the others' turn

    def release(self, grant: Grant, used_tokens: int | None = None) -> None:
        """A request is done; `used_tokens` (its answer's usage) corrects its estimate in the token bucket,
        and in its caller's pass while the caller has requests waiting: the estimate is the model's
        average, and a caller whose judgments answer at length would otherwise be charged like the rest.
        (A caller with none waiting starts again at the current pass, so there is nothing to correct.)"""
        self.in_flight -= 1
        if self.tokens is not None and used_tokens is not None:
            self.tokens.give(grant.tokens - used_tokens)
            state = self.callers.get(grant.caller)
            if state is not None:
                state.passed += (self._cost(used_tokens) - self._cost(grant.tokens)) / state.weight
        self._dispatch()

    def pause(self, seconds: float) -> None:
        """No request of this model starts for `seconds` (a 429's or 503's Retry-After, or a backoff)."""
        self.paused_until = max(self.paused_until, self.clock() + seconds)

    def _next(self) -> _Waiter | None:
        """The head of the queue of the caller whose turn it is (the least pass; the oldest on a tie)."""
        best: tuple[float, int] | None = None
        chosen = None
        for name in list(self.callers):
            state = self.callers[name]
            while state.queue and state.queue[0].future.done():  # given up (timed out, cancelled)
                state.queue.popleft()
            if not state.queue:
                del self.callers[name]
                continue
            key = (state.passed, state.queue[0].order)
            if best is None or key < best:
                best, chosen = key, state.queue[0]
        return chosen

    def _delay(self, waiter: _Waiter) -> float:
        """Seconds until the model has room for `waiter` (0: now)."""
        delay = max(0.0, self.paused_until - self.clock())
        if self.requests is not None:
            delay = max(delay, self.requests.wait(1))
        if self.tokens is not None:
            delay = max(delay, self.tokens.wait(waiter.tokens))
        return delay

    def _cost(self, tokens: int) -> float:
        """What a request of `tokens` (estimated) takes of the model, for the fair share: the seconds of its
        scarcest paced limit it uses (dominant resource fairness). With a tokens-per-minute limit a caller
        of 4,000-token prompts uses ten times the model a caller of 400-token ones does, and is served a
        tenth as often, as the provider counts it; with requests per minute alone, or only a concurrency
        limit, every request costs the same."""
        seconds = [1.0 / self.requests.rate] if self.requests is not None else []
        if self.tokens is not None:
            seconds.append(tokens / self.tokens.rate)
        return max(seconds, default=1.0)

    def _dispatch(self) -> None:
        """Grant requests while the model has room, in fair-share order; when a bucket or a pause holds the
        next one back, come back when it will have room (a request finishing also comes back here)."""
        while self.in_flight < self.max_concurrency:
            waiter = self._next()
            if waiter is None:
                return
            delay = self._delay(waiter)
            if delay > 0:
                self._wake_in(delay)
                return
            state = self.callers[waiter.caller]
            state.queue.popleft()
            self.vtime = state.passed
            state.passed += self._cost(waiter.tokens) / state.weight
            if not state.queue:
                del self.callers[waiter.caller]
            if self.requests is not None:
                self.requests.take(1)
            if self.tokens is not None:
                self.tokens.take(waiter.tokens)
            self.in_flight += 1
            waiter.future.set_result(Grant(waiter.caller, waiter.tokens, self.clock() - waiter.since))

    def _wake_in(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._wake)

    def _wake(self) -> None:
        self._timer = None
        self._dispatch()


def parse_weights(raw: Any) -> dict[str, float]:
    """The `callers:` section: caller name -> {weight: N} (or the number alone); raises ValueError."""
    if not raw:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError("`callers` must be a mapping of caller name -> {weight: N}")
    out: dict[str, float] = {}
    for name, body in raw.items():
        weight = body.get("weight", 1) if isinstance(body, Mapping) else body
        unknown: Sequence[str] = sorted(set(body) - {"weight"}) if isinstance(body, Mapping) else ()
        if unknown:
            raise ValueError(f"caller {name!r}: unknown setting {unknown[0]!r} (allowed: weight)")
        ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight)
        if not ok or weight <= 0:
            raise ValueError(f"caller {name!r}: weight must be a positive number, got {weight!r}")
        out[str(name)] = float(weight)
    return out
