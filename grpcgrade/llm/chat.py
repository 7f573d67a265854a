"""A client for OpenAI-compatible `/chat/completions` endpoints (OpenAI, vLLM, SGLang, Ollama, LiteLLM...).

One `ChatModel` per configured model, shared by every grader that names it, so `max_concurrency` bounds the
calls the whole server makes to that endpoint. Transient failures (429, 5xx, connection errors, timeouts)
are retried with exponential backoff and jitter, so a burst of graders does not retry in lockstep; any
other failure is final at once, since repeating a 400 or a 401 cannot help.

The same endpoint also answers `/embeddings` (`aembed`), for graders that compare texts by embedding.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from grpcgrade.core.retry import backoff, error_excerpt, is_transient, retry_after

from .models import ModelConfig
from .prompt import ChatMessage

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


class ChatModel:
    """An endpoint with its concurrency limit. The HTTP client and the limit belong to one event loop."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._gate: asyncio.Semaphore | None = None

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """The server has one loop; a script calling `asyncio.run` twice gets a fresh client the second time."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._gate is None:
            c = self.config
            headers = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else {}
            self._client = httpx.AsyncClient(
                headers=headers,
                timeout=c.timeout_seconds,
                # the semaphore is the one limit: a wait for a pooled connection would count against the timeout
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=c.max_concurrency),
            )
            self._gate = asyncio.Semaphore(c.max_concurrency)
            self._loop = loop
        return self._client, self._gate

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
        c = self.config
        client, gate = self._session()
        for attempt in range(c.max_retries + 1):
            try:
                async with gate:  # waiting for a slot is not the endpoint's slowness: the time limit starts inside
                    return parse(await self._post(client, url, body), attempt + 1)
            except _Transient as exc:
                if attempt == c.max_retries:
                    raise ChatError(f"model {c.name!r}: {exc} (after {attempt + 1} attempts)") from None
                await asyncio.sleep(backoff(attempt, c.retry_backoff_seconds, exc.retry_after))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _excerpt(self, text: str) -> str:
        """An answer's text for an error message, cut short, the API key never among it."""
        return error_excerpt(text, [self.config.api_key or ""])

    async def _post(self, client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Any:
        """The endpoint's JSON answer; raises _Transient for what a retry may fix, ChatError for the rest."""
        c = self.config
        try:
            async with asyncio.timeout(c.timeout_seconds):
                response = await client.post(url, json=body)
        except (TimeoutError, httpx.TimeoutException):
            raise _Transient(f"no answer within {c.timeout_seconds:g} s") from None
        except httpx.TransportError as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        status = response.status_code
        if is_transient(status):
            raise _Transient(f"HTTP {status}: {self._excerpt(response.text)}", retry_after(response.headers))
        if status != 200:
            raise ChatError(f"model {c.name!r}: HTTP {status}: {self._excerpt(response.text)}")
        try:
            return response.json()
        except ValueError:
            raise ChatError(f"model {c.name!r}: not JSON: {self._excerpt(response.text)}") from None

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
