"""A client for OpenAI-compatible `/chat/completions` endpoints (OpenAI, vLLM, SGLang, Ollama, LiteLLM...).

One `ChatModel` per configured model, shared by every grader that names it, so the model's provider limits
(`max_concurrency`, `requests_per_minute`, `tokens_per_minute`) pace the calls the whole server makes to
that endpoint, shared fairly between callers (`limits`). A 429 or 503 pauses the model and is retried
within the sample's time limit; other transient failures (5xx, connection errors, timeouts) are retried
with exponential backoff and jitter, so a burst of graders does not retry in lockstep; any other failure is
final at once, since repeating a 400 or a 401 cannot help. What the calls cost is tallied in `usage`.

The same endpoint also answers `/embeddings` (`aembed`), for graders that compare texts by embedding.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from grpcgrade.core.context import CALLER, SAMPLE_TIME_LIMIT
from grpcgrade.core.errors import GraderRateLimited, GraderTimeout
from grpcgrade.core.loops import closed_with_its_loop
from grpcgrade.core.retry import (
    MAX_ANSWER_BYTES,
    MAX_BACKOFF_SECONDS,
    backoff,
    error_excerpt,
    is_transient,
    retry_after,
)

from .limits import LimitWaitExpired, ModelLimiter, TokenEstimate
from .prompt import ChatMessage
from .settings import ModelConfig
from .usage import USAGE, Tally

T = TypeVar("T")


class ChatError(RuntimeError):
    """The judge call failed (after any retries); the sample gets an error result."""


class ChatRefusal(ChatError):
    """The model answered with a refusal (the completion's `message.refusal`) instead of content."""


@dataclass(frozen=True)
class ChatReply:
    content: str
    attempts: int
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EmbeddingReply:
    vectors: list[list[float]]
    attempts: int
    usage: dict[str, Any] = field(default_factory=dict)


class _Transient(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Throttled(_Transient):
    """A 429 or 503: the provider's limits (or its load) turned the request away; retried while time allows."""

    def __init__(self, message: str, status: int, retry_after: float | None) -> None:
        super().__init__(message, retry_after)
        self.status = status


#: The answers that say "over the limit, come back later", retried within the sample's time limit.
THROTTLED = frozenset({429, 503})


async def read_answer(content: aiohttp.StreamReader, limit: int) -> bytes:
    """An answer's body to its end, or its first `limit` + 1 bytes when it is longer. One `read(n)` returns
    only what has arrived so far: a large answer (two 3,072-dimension embeddings are ~120 kB) comes in
    several, and reading once cut it short."""
    body = bytearray()
    while len(body) <= limit:
        piece = await content.read(limit + 1 - len(body))
        if not piece:
            break
        body += piece
    return bytes(body)


def _left(deadline: float | None) -> float | None:
    """Seconds until `deadline` (`time.monotonic()`), never negative; None: no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class ChatModel:
    """An endpoint with its provider limits (`limits.ModelLimiter`) and its usage tally. The HTTP client and
    the limiter belong to one event loop."""

    def __init__(self, config: ModelConfig, weights: Mapping[str, float] | None = None) -> None:
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.weights = dict(weights or {})
        self.estimate = TokenEstimate()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: aiohttp.ClientSession | None = None
        self._closer: AsyncGenerator[None, None] | None = None  # `core.loops.closed_with_its_loop` of `_client`
        self._limiter: ModelLimiter | None = None

    def _session(self) -> tuple[aiohttp.ClientSession, ModelLimiter]:
        """The server has one loop; a script calling `asyncio.run` twice gets a fresh client the second time.
        A client is closed on its own loop, when that loop ends or when this model moves to another loop
        (`core.loops.closed_with_its_loop`): one dropped open kept its connections until the garbage collector came.

        aiohttp rather than httpx: measured with 2,000 judgments in flight against a loopback endpoint
        answering in 1 s, httpx took 89-110 s and 30 s of CPU, aiohttp 3.8-6.6 s and 0.6-1.3 s of CPU
        (httpx's pool grows quadratically with the connections waiting in it, as NeMo Gym found)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._limiter is None:
            c = self.config
            headers = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else {}
            self._client = aiohttp.ClientSession(
                headers=headers,
                # the limiter is the one limit: a wait for a pooled connection would count against the timeout
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
                timeout=aiohttp.ClientTimeout(total=None),  # each attempt's own, in `_post`
            )
            self._limiter = ModelLimiter(
                c.max_concurrency, c.requests_per_minute or None, c.tokens_per_minute or None, self.weights
            )
            self._closer = closed_with_its_loop(self._client.close)  # the last client's, dropped: its loop closes it
            self._loop = loop
        return self._client, self._limiter

    def is_open(self) -> bool:
        """Whether an HTTP session is open that its loop can still close (a closed loop closes nothing)."""
        return self._client is not None and not self._client.closed and not (self._loop and self._loop.is_closed())

    async def aclose(self) -> None:
        """Close the HTTP client (its connections) if this loop opened it; the next call opens a new one."""
        if self._client is not None and self._loop is asyncio.get_running_loop():
            client, closer = self._client, self._closer
            self._client = self._closer = None
            await client.close()
            if closer is not None:  # ended here, not left to the loop's finalizer hook as a task
                await closer.aclose()

    async def achat(
        self, messages: Sequence[ChatMessage | Mapping[str, Any]], options: Mapping[str, Any] | None = None
    ) -> ChatReply:
        """The model's reply to `messages` (ChatMessages, or chat-completions message dicts as they are sent).

        `options` (sampling parameters, `response_format`) join the request body; the operator's `extra_body`
        wins over them, so a request cannot lift a limit the configuration sets.
        """
        c = self.config
        wire = [m.to_dict() if isinstance(m, ChatMessage) else dict(m) for m in messages]
        body = {**(options or {}), **c.extra_body, "model": c.model, "messages": wire}
        return await self._call(self.url, body, self._chat_reply)

    async def aembed(self, texts: Sequence[str]) -> EmbeddingReply:
        """One embedding per text from the endpoint's `/embeddings` (the operator's `extra_body` is for chat)."""
        body = {"model": self.config.model, "input": list(texts)}
        url = self.config.base_url.rstrip("/") + "/embeddings"
        return await self._call(url, body, lambda data, attempts: self._embedding_reply(data, attempts, len(texts)))

    async def _call(self, url: str, body: dict[str, Any], parse: Callable[[Any, int], T]) -> T:
        """`parse` of the endpoint's answer, each attempt granted by the model's limiter in the caller's turn.

        The sample's time limit (`context.SAMPLE_TIME_LIMIT`) starts with its first attempt, not with its
        wait for a turn. A 429 or 503 pauses the whole model for its Retry-After (or a backoff) and is
        retried while the time allows (without a limit, `max_retries` times); when the time runs out while
        the limits hold the judgment back, it is RATE_LIMITED (`GraderRateLimited`), and when it runs out
        during an attempt, TIMEOUT. Other transient failures are retried `max_retries` times."""
        c = self.config
        client, limiter = self._session()
        caller = CALLER.get()
        tally = USAGE.tally(c.name, caller)
        limit = SAMPLE_TIME_LIMIT.get()
        deadline: float | None = None
        prompt, completion = self.estimate.before(body)
        throttled = failed = 0
        for attempt in itertools.count(1):
            try:
                grant = await limiter.acquire(caller, prompt + completion, _left(deadline))
            except LimitWaitExpired:
                tally.rate_limited += 1
                raise GraderRateLimited(self._ran_out(limit, throttled)) from None
            tally.queue_wait.observe(grant.waited)
            if deadline is None and limit is not None:
                deadline = time.monotonic() + limit
            tally.requests += 1
            tally.retries += attempt > 1
            used: int | None = None
            wait = 0.0  # the pause before retrying a failure, taken after the slot is given back
            began = time.monotonic()
            try:
                data = await self._post(client, url, body, _left(deadline))
                used = self._count(tally, body, data)
                return parse(data, attempt)
            except _Throttled as exc:
                tally.throttled[exc.status] = tally.throttled.get(exc.status, 0) + 1
                # the provider's own word when it gives one (0 is none: a tight loop); else backoff with jitter
                pause = exc.retry_after or backoff(throttled, c.retry_backoff_seconds)
                pause = min(pause, MAX_BACKOFF_SECONDS)
                throttled += 1
                limiter.pause(pause)
                if deadline is None and throttled > c.max_retries:
                    raise ChatError(f"model {c.name!r}: {exc} (after {attempt} attempts)") from None
                if deadline is not None and time.monotonic() + pause >= deadline:
                    tally.rate_limited += 1
                    raise GraderRateLimited(self._ran_out(limit, throttled)) from None
            except _Transient as exc:
                failed += 1
                if failed > c.max_retries:
                    raise ChatError(f"model {c.name!r}: {exc} (after {attempt} attempts)") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise GraderTimeout from None
                wait = min(backoff(failed - 1, c.retry_backoff_seconds, exc.retry_after), _left(deadline) or math.inf)
            finally:
                tally.latency.observe(time.monotonic() - began)
                limiter.release(grant, used)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable: the attempts end by returning or raising")

    def _ran_out(self, limit: float | None, throttled: int) -> str:
        c = self.config
        said = f" after {throttled} answers of 429/503" if throttled else ""
        return (
            f"model {c.name!r}: the sample's time limit of {limit:g} s ran out while the model's rate limits held "
            f"it back{said}"
        )

    def _count(self, tally: Tally, body: dict[str, Any], data: Any) -> int | None:
        """An answer's reported usage, added to the tally (tokens, cost) and the token estimate; its total."""
        usage = data.get("usage") if isinstance(data, dict) else None
        if not isinstance(usage, dict):
            return None
        tokens_in, tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
        if not isinstance(tokens_in, int) or not isinstance(tokens_out, int):
            return None
        c = self.config
        tally.tokens_in += tokens_in
        tally.tokens_out += tokens_out
        tally.cost += (
            tokens_in * c.price_per_million_input_tokens + tokens_out * c.price_per_million_output_tokens
        ) / 1e6
        self.estimate.learn(body, tokens_in, tokens_out)
        return tokens_in + tokens_out

    def _excerpt(self, text: str) -> str:
        """An answer's text for an error message, cut short, the API key never among it."""
        return error_excerpt(text, [self.config.api_key or ""])

    async def _post(self, client: aiohttp.ClientSession, url: str, body: dict[str, Any], left: float | None) -> Any:
        """The endpoint's JSON answer; raises _Throttled (429, 503) or _Transient for what a retry may fix,
        ChatError for the rest, GraderTimeout when the sample's time (`left`) ran out during the attempt."""
        c = self.config
        limit = c.timeout_seconds if left is None else min(c.timeout_seconds, left)
        try:
            async with asyncio.timeout(limit), client.post(url, json=body) as response:
                status, headers = response.status, response.headers
                raw = await read_answer(response.content, MAX_ANSWER_BYTES)
        except TimeoutError:
            if left is not None and limit >= left:
                raise GraderTimeout from None
            raise _Transient(f"no answer within {c.timeout_seconds:g} s") from None
        except aiohttp.ClientError as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        text = raw.decode("utf-8", "replace")
        if status in THROTTLED:
            raise _Throttled(f"HTTP {status}: {self._excerpt(text)}", status, retry_after(headers))
        if is_transient(status):
            raise _Transient(f"HTTP {status}: {self._excerpt(text)}", retry_after(headers))
        if status != 200:
            raise ChatError(f"model {c.name!r}: HTTP {status}: {self._excerpt(text)}")
        if len(raw) > MAX_ANSWER_BYTES:
            raise ChatError(f"model {c.name!r}: the answer is over {MAX_ANSWER_BYTES} bytes")
        try:
            return json.loads(raw)
        except RecursionError:  # the endpoint's fault, not the sample's (which a RecursionError would be blamed on)
            raise ChatError(f"model {c.name!r}: not JSON this server takes: nested too deeply") from None
        except ValueError:
            raise ChatError(f"model {c.name!r}: not JSON: {self._excerpt(text)}") from None

    def _chat_reply(self, data: Any, attempts: int) -> ChatReply:
        name = self.config.name
        try:
            message = data["choices"][0]["message"]
            content = message.get("content")
        except (LookupError, TypeError, AttributeError):
            raise ChatError(f"model {name!r}: not a chat completion: {self._excerpt(str(data))}") from None
        refusal = message.get("refusal")
        if isinstance(refusal, str) and refusal:
            raise ChatRefusal(f"model {name!r} refused: {self._excerpt(refusal)}")
        if not isinstance(content, str):
            raise ChatError(f"model {name!r}: the completion has no text content")
        usage = data.get("usage")
        return ChatReply(content, attempts, usage if isinstance(usage, dict) else {})

    def _embedding_reply(self, data: Any, attempts: int, count: int) -> EmbeddingReply:
        name = self.config.name
        try:
            rows = sorted(data["data"], key=lambda row: row.get("index", 0))
            vectors = [[float(x) for x in row["embedding"]] for row in rows]
        except (LookupError, TypeError, ValueError, AttributeError):
            raise ChatError(f"model {name!r}: not an embeddings answer: {self._excerpt(str(data))}") from None
        if (
            len(vectors) != count
            or len({len(v) for v in vectors}) > 1
            or not all(math.isfinite(x) for v in vectors for x in v)
        ):
            raise ChatError(f"model {name!r}: expected {count} finite embeddings of one size")
        usage = data.get("usage")
        return EmbeddingReply(vectors, attempts, usage if isinstance(usage, dict) else {})
