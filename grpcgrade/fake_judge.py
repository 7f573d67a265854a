"""A fake OpenAI-compatible judge that enforces a provider's limits: for `grpcgrade bench` and tests.

It answers `POST /v1/chat/completions` as a judge would (`{"score": ..., "reason": ...}` with a `usage`),
but only `requests_per_minute` of them and `tokens_per_minute` of their tokens (its usage, counted when
the request arrives): each bucket refills at its rate/60 per second and holds `burst_seconds` of that; a
request beyond is answered 429 with a `Retry-After` (seconds until the buckets have room for it), as
OpenAI and vLLM's routers do. Answers take `latency` seconds, and a share of them
(`slow_share`, or any whose prompt says `SLOW-JUDGMENT`) take `slow_seconds`: the long tail of a real
endpoint. A prompt's `SCORE-<n>` marker sets the score (default 1); its `CALLER-<name>` marker is logged,
so a test can see whose judgments the endpoint answered in which order.

`GET /stats` reports what it saw: answers, 429s, the most requests in flight, and the log of answered
requests `[seconds since start, caller marker]` in order. aiohttp, one event loop: it holds thousands of
connections open at once, as a provider does.

    python -m grpcgrade.fake_judge --port 8400 --requests-per-minute 1200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

_SCORE = re.compile(r"SCORE-(\d+(?:\.\d+)?)")
_CALLER = re.compile(r"CALLER-([A-Za-z0-9_]+)")
SLOW_MARKER = "SLOW-JUDGMENT"
#: The completion tokens every answer reports (its prompt's: the JSON of its messages, 4 characters a token).
COMPLETION_TOKENS = 12


class Bucket:
    """`per_minute`/60 a second, holding `burst_seconds` of that (as providers enforce per-minute limits)."""

    def __init__(self, per_minute: float, burst_seconds: float = 1.0) -> None:
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate * burst_seconds)
        self.level = self.capacity
        self.stamp = time.monotonic()

    def short(self, amount: float) -> float:
        """Seconds until `amount` is there (0: it is, and is taken); no limit when the rate is 0."""
        if not self.rate:
            return 0.0
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        amount = min(amount, self.capacity)
        return 0.0 if self.level >= amount else (amount - self.level) / self.rate

    def take(self, amount: float) -> None:
        self.level -= amount


@dataclass
class FakeJudge:
    requests_per_minute: float
    tokens_per_minute: float = 0.0
    burst_seconds: float = 1.0
    latency: float = 0.02
    slow_share: float = 0.0
    slow_seconds: float = 2.0
    seed: int = 7
    answered: int = 0
    throttled: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    log: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.requests = Bucket(self.requests_per_minute, self.burst_seconds)
        self.tokens = Bucket(self.tokens_per_minute, self.burst_seconds)
        self.start = time.monotonic()
        self.rng = random.Random(self.seed)
        self.tokens_log: list[tuple[float, int]] = []

    def admit(self, tokens: int) -> float:
        """0 when the request is within both limits (taken from the buckets), else the seconds to wait."""
        wait = max(self.requests.short(1), self.tokens.short(tokens))
        if not wait:
            self.requests.take(1)
            self.tokens.take(tokens)
        return wait

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        text = json.dumps(body.get("messages", ""))
        usage = {"prompt_tokens": len(text) // 4 + 1, "completion_tokens": COMPLETION_TOKENS}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        wait = self.admit(usage["total_tokens"])
        if wait:
            self.throttled += 1
            error = {"error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit"}}
            return web.json_response(error, status=429, headers={"Retry-After": f"{wait:.3f}"})
        caller = _CALLER.search(text)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            slow = SLOW_MARKER in text or self.rng.random() < self.slow_share
            await asyncio.sleep(self.slow_seconds if slow else self.latency)
        finally:
            self.in_flight -= 1
        self.answered += 1
        self.log.append((round(time.monotonic() - self.start, 4), caller.group(1) if caller else ""))
        self.tokens_log.append((round(time.monotonic() - self.start, 4), usage["total_tokens"]))
        score = _SCORE.search(text)
        content = json.dumps({"score": float(score.group(1)) if score else 1.0, "reason": "judged"})
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        return web.json_response({"object": "chat.completion", "choices": [choice], "usage": usage})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.report())

    def report(self) -> dict[str, Any]:
        return {
            "answered": self.answered,
            "throttled": self.throttled,
            "max_in_flight": self.max_in_flight,
            "requests_per_minute": self.requests_per_minute,
            "log": self.log,
            "tokens_log": self.tokens_log,
        }

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/stats", self.stats)
        return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m grpcgrade.fake_judge", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--requests-per-minute", type=float, default=1200.0, help="0: no limit")
    parser.add_argument("--tokens-per-minute", type=float, default=0.0, help="0: no limit")
    parser.add_argument("--burst-seconds", type=float, default=1.0)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--slow-share", type=float, default=0.0)
    parser.add_argument("--slow-seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    judge = FakeJudge(
        args.requests_per_minute,
        args.tokens_per_minute,
        args.burst_seconds,
        args.latency,
        args.slow_share,
        args.slow_seconds,
    )
    # handler_cancellation: a judgment whose caller went away (a step budget cut it) ends, as a provider's
    # does, instead of holding the judge's shutdown until it would have answered
    web.run_app(judge.app(), host="127.0.0.1", port=args.port, print=None, backlog=4096, handler_cancellation=True)


if __name__ == "__main__":
    main()
