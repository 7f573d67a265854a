"""A client for OpenAI-compatible `/chat/completions` endpoints (OpenAI, vLLM, SGLang, Ollama, LiteLLM...).

One `ChatModel` per configured model, shared by every grader that names it, so `max_concurrency` bounds the
calls the whole server makes to that endpoint. Transient failures (429, 5xx, connection errors, timeouts)
are retried with exponential backoff and jitter, so a burst of graders does not retry in lockstep; any
other failure is final at once, since repeating a 400 or a 401 cannot help.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx

from grpcgrade.core.retry import backoff, is_transient, retry_after

from .models import ModelConfig
from .prompt import ChatMessage

_EXCERPT = 300


class ChatError(RuntimeError):
    """The judge call failed (after any retries); the sample gets an error result."""


@dataclass(frozen=True)
class ChatReply:
    content: str
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

    async def achat(self, messages: list[ChatMessage]) -> ChatReply:
        c = self.config
        body = {**c.extra_body, "model": c.model, "messages": [m.to_dict() for m in messages]}
        client, gate = self._session()
        for attempt in range(c.max_retries + 1):
            try:
                async with gate:  # waiting for a slot is not the endpoint's slowness: the time limit starts inside
                    return await self._post(client, body, attempt + 1)
            except _Transient as exc:
                if attempt == c.max_retries:
                    raise ChatError(f"model {c.name!r}: {exc} (after {attempt + 1} attempts)") from None
                await asyncio.sleep(backoff(attempt, c.retry_backoff_seconds, exc.retry_after))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any], attempts: int) -> ChatReply:
        c = self.config
        try:
            async with asyncio.timeout(c.timeout_seconds):
                response = await client.post(self.url, json=body)
        except (TimeoutError, httpx.TimeoutException):
            raise _Transient(f"no answer within {c.timeout_seconds:g} s") from None
        except httpx.TransportError as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        status = response.status_code
        if is_transient(status):
            raise _Transient(f"HTTP {status}: {response.text[:_EXCERPT]}", retry_after(response.headers))
        if status != 200:
            raise ChatError(f"model {c.name!r}: HTTP {status}: {response.text[:_EXCERPT]}")
        try:
            data = response.json()
            content = data["choices"][0]["message"]["content"]
        except (ValueError, LookupError, TypeError):
            raise ChatError(f"model {c.name!r}: not a chat completion: {response.text[:_EXCERPT]}") from None
        if not isinstance(content, str):
            raise ChatError(f"model {c.name!r}: the completion has no text content")
        usage = data.get("usage")
        return ChatReply(content, attempts, usage if isinstance(usage, dict) else {})
