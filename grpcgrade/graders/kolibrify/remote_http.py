"""Kolibrify's `remote_http` grader: a batch of completions POSTed to a grading service of the user's.

The wire protocol is Kolibrify's (kolibrify/rl_dataserver/graders.py `ExternalHttpGrader`), so services
written for Kolibrify work unchanged:

    POST <url>  {"samples": [{"sample_id", "prompt", "system_prompt", "answer", "metadata", "completion",
                              "reasoning", "final_response", "completion_tokens", "completion_index"}]}
    200         {"results": [{"sample_id", "reward", "completion_index"?}]}

Where this differs from Kolibrify is decision K1: results are matched to samples by `sample_id` (and
`completion_index`) when the service returns them, else by position with the count checked; a failed
call becomes error results for that call's samples only; transient failures (connection errors,
timeouts, 429, 5xx) are retried with exponential backoff and jitter, other 4xx are not. A concurrency
limit keeps a large batch from opening hundreds of connections to the service at once.

The URL comes from the server's configuration file only. This grader is never registered under a name a
request could pass a `url` to: that would let any caller make the server send requests anywhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from grpcgrade.core.errors import ErrorCode, InvalidParams
from grpcgrade.core.retry import MAX_ANSWER_BYTES, backoff, error_excerpt, is_transient, retry_after
from grpcgrade.graders.kolibrify.compat import GradeResult, GraderInput

from .adapters import BatchFailure, KolibrifyGraderAdapter
from .parsing import is_number

log = logging.getLogger(__name__)


def _count(param: str, value: Any, minimum: int) -> int:
    if not is_number(value) or not float(value).is_integer() or value < minimum:
        raise InvalidParams(param, f"must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def _seconds(param: str, value: Any, *, positive: bool) -> float:
    if not is_number(value) or not (value > 0 if positive else value >= 0):
        raise InvalidParams(param, f"must be a number of seconds {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def payload(item: GraderInput) -> dict[str, Any]:
    """One sample as Kolibrify's ExternalHttpGrader sends it."""
    record = item.record
    return {
        "sample_id": item.sample_id,
        "prompt": record.get("prompt"),
        "system_prompt": record.get("system_prompt"),
        "answer": record.get("answer"),
        "metadata": record.get("metadata"),
        "completion": item.completion,
        "reasoning": item.reasoning,
        "final_response": item.answer,
        "completion_tokens": item.completion_tokens,
        "completion_index": item.completion_index,
    }


def _too_long() -> BatchFailure:
    return BatchFailure(ErrorCode.INVALID_RESULT, f"the grading service's answer is over {MAX_ANSWER_BYTES} bytes")


async def _bounded_body(response: httpx.Response) -> bytes:
    """A streamed answer's body (decoded, when compressed) to its end; BatchFailure past MAX_ANSWER_BYTES,
    read no further (`client.post` would read any length into memory), or at once for a declared length
    past it. Not retried: a retry brings the same answer."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise _too_long()
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) > MAX_ANSWER_BYTES:
            raise _too_long()
    return bytes(body)


class HttpGradingClient:
    """The Kolibrify-protocol call: `grade_batch` is one POST (with retries) of the whole input list.

    The HTTP client and the concurrency semaphore belong to one event loop, so they are made on first
    use in the running loop (the server's), not when the configuration is read.
    """

    def __init__(
        self, url: str, timeout_s: float, max_concurrency: int, max_retries: int, retry_backoff_s: float
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.host = httpx.URL(url).host  # for logs: the full URL may carry credentials
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._slots is None or self._loop is not loop:
            self._loop = loop
            self._client = httpx.AsyncClient(
                timeout=self.timeout_s, limits=httpx.Limits(max_connections=self.max_concurrency)
            )
            self._slots = asyncio.Semaphore(self.max_concurrency)
        return self._client, self._slots

    async def _post(self, body: dict[str, Any]) -> bytes:
        """The service's successful answer's body (at most MAX_ANSWER_BYTES); BatchFailure once the retries
        are spent, or at once for an answer no retry can mend."""
        client, slots = self._session()
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            after = None
            try:
                async with (
                    slots,  # waiting for a slot does not count against the call's time limit
                    asyncio.timeout(self.timeout_s),
                    client.stream("POST", self.url, json=body) as response,
                ):
                    raw = await _bounded_body(response)
            except (httpx.TimeoutException, TimeoutError):
                failure = BatchFailure(
                    ErrorCode.TIMEOUT, f"the grading service did not answer within {self.timeout_s:g} s"
                )
            except httpx.TransportError as exc:
                failure = BatchFailure(
                    ErrorCode.GRADER_FAILED, f"grading service unreachable: {type(exc).__name__}: {exc}"
                )
            else:
                if response.is_success:
                    return raw
                status, excerpt = response.status_code, error_excerpt(raw.decode("utf-8", "replace"))
                failure = BatchFailure(ErrorCode.GRADER_FAILED, f"grading service answered HTTP {status}: {excerpt}")
                if not is_transient(status):
                    raise failure  # the request itself is wrong: sending it again cannot help
                after = retry_after(response.headers)
            if attempt + 1 == attempts:
                break
            pause = backoff(attempt, self.retry_backoff_s, after)
            log.warning(
                "remote grader at %s: %s; retry %d of %d in %.2f s",
                self.host,
                failure,
                attempt + 1,
                self.max_retries,
                pause,
            )
            await asyncio.sleep(pause)
        raise BatchFailure(failure.code, f"{failure} ({attempts} attempt{'s' if attempts > 1 else ''})")

    async def grade_batch(self, inputs: Sequence[GraderInput]) -> list[GradeResult]:
        raw = await self._post({"samples": [payload(item) for item in inputs]})
        try:
            data = json.loads(raw)
        except RecursionError:  # the service's fault: left uncaught it would be blamed on the samples
            raise BatchFailure(ErrorCode.INVALID_RESULT, "the grading service's answer is nested too deeply") from None
        except ValueError as exc:
            raise BatchFailure(ErrorCode.INVALID_RESULT, f"the grading service's answer is not JSON: {exc}") from None
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list):
            raise BatchFailure(ErrorCode.INVALID_RESULT, 'the grading service\'s answer has no "results" list')
        entries: list[dict[str, Any]] = [r if isinstance(r, dict) else {} for r in results]
        # Taken as sent, missing or not: the adapter checks each result's sample id and reward.
        return [GradeResult(r.get("sample_id"), r.get("reward"), r.get("completion_index")) for r in entries]  # type: ignore[arg-type]


class RemoteHttpGrader(KolibrifyGraderAdapter):
    """A Kolibrify `external_graders` entry of `type: remote_http`; only a configuration file makes one.

    `url` and `timeout_s` are Kolibrify's keys (`timeout_s` bounds each attempt). The others extend it:
    `max_concurrency` requests in flight at once, `max_retries` extra attempts after a transient failure,
    `retry_backoff_s` the first pause (doubled each retry, with jitter), and `chunk_size` samples per
    POST (default: the whole chunk the server grades at once).
    """

    bounds_own_time = True  # `timeout_s` per attempt, `max_retries` retries
    cache_by_default = True  # a round trip to another service per chunk

    def __init__(
        self,
        url: str,
        timeout_s: float = 60.0,
        max_concurrency: int = 8,
        max_retries: int = 2,
        retry_backoff_s: float = 0.5,
        chunk_size: int | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidParams("url", f"must be an http:// or https:// URL, got {url!r}")
        client = HttpGradingClient(
            url,
            timeout_s=_seconds("timeout_s", timeout_s, positive=True),
            max_concurrency=_count("max_concurrency", max_concurrency, 1),
            max_retries=_count("max_retries", max_retries, 0),
            retry_backoff_s=_seconds("retry_backoff_s", retry_backoff_s, positive=False),
        )
        super().__init__(
            client,
            chunk_size=None if chunk_size is None else _count("chunk_size", chunk_size, 1),
            description=f"Kolibrify remote_http grader at {client.host}",
        )
