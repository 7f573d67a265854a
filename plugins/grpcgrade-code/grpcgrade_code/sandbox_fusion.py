"""The remote backend: a SandboxFusion-compatible HTTP service, for clusters that already run one.

The API is SandboxFusion's `run_code` (github.com/bytedance/SandboxFusion, sandbox/server/sandbox_api.py),
as veRL's sandbox_fusion scorer calls it:

    POST <url>   {"code", "language", "stdin", "compile_timeout", "run_timeout", "memory_limit_MB",
                  "files": {}, "fetch_files": []}
    200          {"status": "Success" | "Failed" | "SandboxError", "message",
                  "compile_result": null | {"status", "execution_time", "return_code", "stdout", "stderr"},
                  "run_result":     null | {...the same...}}

where a command's status is "Finished", "TimeLimitExceeded" or "Error" (the sandbox's own failure). The URL
is the operator's (an environment variable), never a request's.

Failures: a transport error (connection refused or reset, no answer in time) or an HTTP 429/5xx answer is
retried with exponential backoff and jitter (grpcgrade's backoff, honouring Retry-After), then becomes
`SandboxUnavailable`, as do a "SandboxError" status, another HTTP error and an answer that is not the API's.
Only a run's own outcome is ever a result. A concurrency limit keeps a large batch from flooding the
service; the wait for it is not part of any time limit. The answer's size is bounded: one over the limit
means the program wrote too much (its stdout and stderr are all that can make it large).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx

from grpcgrade.core.retry import backoff, is_transient, retry_after

from .languages import LANGUAGE_NAMES, MEMORY_MARKERS, python_parse_failed
from .sandbox import COMPILE_LIMITS, Limits, Outcome, Program, RunResult, SandboxUnavailable, Slots

log = logging.getLogger(__name__)

#: Seconds an HTTP attempt may take beyond the compile and run time limits (veRL's API_TIMEOUT).
API_GRACE_SECONDS = 10.0
#: How much of an error answer's body goes into a message.
EXCERPT_CHARS = 200
#: What `_post` returns for an answer over its size limit.
TOO_LARGE = object()
#: SandboxFusion's name for each language.
REMOTE_NAMES = {"python": "python", "cpp": "cpp", "javascript": "nodejs"}


def _command(raw: Any) -> dict[str, Any] | None:
    return raw if isinstance(raw, dict) else None


def _outcome_of(command: dict[str, Any], stderr: str) -> Outcome:
    status, code = command.get("status"), command.get("return_code")
    if status == "TimeLimitExceeded":
        return Outcome.TIME_LIMIT
    if status == "Finished" and code == 0:
        return Outcome.OK
    if any(marker in stderr for marker in MEMORY_MARKERS):
        return Outcome.MEMORY_LIMIT
    return Outcome.RUNTIME_ERROR


def to_result(body: Any, language: str, limits: Limits) -> RunResult:
    """A run_code answer as a RunResult; raises SandboxUnavailable for the sandbox's own failures."""
    if not isinstance(body, dict) or body.get("status") not in ("Success", "Failed", "SandboxError"):
        raise SandboxUnavailable(f"the sandbox service's answer is not SandboxFusion's: {str(body)[:EXCERPT_CHARS]}")
    if body["status"] == "SandboxError":
        raise SandboxUnavailable(f"the sandbox service failed: {str(body.get('message'))[:EXCERPT_CHARS]}")
    compiled, ran = _command(body.get("compile_result")), _command(body.get("run_result"))
    for command in (compiled, ran):
        if command is not None and command.get("status") == "Error":
            raise SandboxUnavailable(f"the sandbox service failed: {str(command.get('stderr'))[:EXCERPT_CHARS]}")
    if compiled is not None and (compiled.get("status") != "Finished" or compiled.get("return_code") != 0):
        return RunResult(Outcome.COMPILE_ERROR, stderr=str(compiled.get("stderr") or "")[: limits.output_bytes])
    if ran is None:
        raise SandboxUnavailable("the sandbox service answered without a run result")
    stdout, stderr = str(ran.get("stdout") or ""), str(ran.get("stderr") or "")
    outcome = _outcome_of(ran, stderr)
    if outcome is Outcome.RUNTIME_ERROR and language == "python" and python_parse_failed(stderr):
        outcome = Outcome.COMPILE_ERROR
    if len(stdout.encode()) > limits.output_bytes or len(stderr.encode()) > limits.output_bytes:
        outcome = Outcome.OUTPUT_LIMIT
    code = ran.get("return_code")
    return RunResult(
        outcome=outcome,
        stdout=stdout[: limits.output_bytes],
        stderr=stderr[: limits.output_bytes],
        exit_code=code if isinstance(code, int) and outcome is not Outcome.TIME_LIMIT else None,
        seconds=float(ran.get("execution_time") or 0.0),
    )


class SandboxFusionBackend:
    """Runs programs on a SandboxFusion-compatible service at `url` (its run_code endpoint)."""

    name = "sandbox_fusion"

    def __init__(
        self,
        url: str,
        max_concurrency: int = 32,
        max_retries: int = 2,
        retry_backoff_seconds: float = 0.5,
        languages: tuple[str, ...] = LANGUAGE_NAMES,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the SandboxFusion URL must be http:// or https://, got {url!r}")
        self.url = url if url.rstrip("/").endswith("/run_code") else url.rstrip("/") + "/run_code"
        self.host = httpx.URL(self.url).host  # for messages: the full URL may carry credentials
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.retry_backoff_seconds = retry_backoff_seconds
        self._languages = frozenset(languages)
        self._slots = Slots(max_concurrency)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None

    def languages(self) -> frozenset[str]:
        return self._languages

    async def prepare(self, language: str, source: str) -> Program:
        """The service compiles on every run, so preparing only checks the language."""
        if language not in self._languages:
            raise ValueError(f"unknown language {language!r}; known: {', '.join(sorted(self._languages))}")
        return Program(language, source)

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._loop = loop
            self._client = httpx.AsyncClient(limits=httpx.Limits(max_connections=self.max_concurrency))
        return self._client

    async def execute(self, program: Program, stdin: str, limits: Limits) -> RunResult:
        body = {
            "code": program.source,
            "language": REMOTE_NAMES[program.language],
            "stdin": stdin,
            "compile_timeout": COMPILE_LIMITS.time_seconds,
            "run_timeout": limits.time_seconds,
            "memory_limit_MB": limits.memory_mb,
            "files": {},
            "fetch_files": [],
        }
        timeout = COMPILE_LIMITS.time_seconds + limits.time_seconds + API_GRACE_SECONDS
        # Both output streams, JSON-escaped (at most 6 bytes a byte), and the compiler's messages.
        max_body = 12 * limits.output_bytes + COMPILE_LIMITS.output_bytes
        async with self._slots:
            answer = await self._post(body, timeout, max_body)
        if answer is TOO_LARGE:
            return RunResult(Outcome.OUTPUT_LIMIT, stderr=f"the answer was over {max_body} bytes")
        return to_result(answer, program.language, limits)

    async def _post(self, body: dict[str, Any], timeout: float, max_body: int) -> Any:
        """The service's JSON answer (TOO_LARGE over `max_body` bytes), retrying transient failures."""
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            after = None
            try:
                async with asyncio.timeout(timeout):
                    async with self._http().stream("POST", self.url, json=body, timeout=timeout) as response:
                        if response.is_success:
                            return await _read_json(response, max_body)
                        excerpt = (await response.aread())[:EXCERPT_CHARS].decode(errors="replace")
                        failure = f"HTTP {response.status_code}: {excerpt}"
                        if not is_transient(response.status_code):
                            raise SandboxUnavailable(f"the sandbox service at {self.host} answered {failure}")
                        after = retry_after(response.headers)
            except (httpx.TransportError, TimeoutError) as exc:
                failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if attempt + 1 < attempts:
                pause = backoff(attempt, self.retry_backoff_seconds, after)
                log.warning("sandbox service at %s: %s; retry %d of %d in %.2f s", self.host, failure,
                            attempt + 1, self.max_retries, pause)  # fmt: skip
                await asyncio.sleep(pause)
        raise SandboxUnavailable(f"the sandbox service at {self.host} failed {attempts} times; last: {failure}")


async def _read_json(response: httpx.Response, max_body: int) -> Any:
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) > max_body:
            return TOO_LARGE
    try:
        return json.loads(data)
    except ValueError as exc:
        raise SandboxUnavailable(f"the sandbox service's answer is not JSON: {exc}") from exc
