"""The HTTP/JSON face (`--http-port`): OpenRLHF's remote reward model protocol, on the gRPC server's loop.

OpenRLHF (`openrlhf/utils/agent.py`, `SingleTurnAgentExecutor._fetch_rewards_via_http`, OpenRLHF 0.11)
POSTs `{"query": [...], "prompts": [...], "labels": [...]}` with aiohttp and no headers to
`--reward.remote_url`, and reads `rewards`, `scores` and `extra_logs` from the JSON answer (its own
`openrlhf/cli/serve_rm.py` answers the same three keys). `query` is prompt and completion decoded with
`skip_special_tokens=False`.

- `POST /rewards/NAME/get_reward` grades with the configured reward NAME, `POST /get_reward` with the
  configuration's `default_reward`.
- A sample's response is its query minus its prompt (when `prompts` is sent; a query that does not start
  with its prompt is a failed sample), then minus any trailing special tokens of `http.strip_suffixes`,
  removed repeatedly (so `...<|im_end|><|endoftext|>` loses both); its reference is its label (OpenRLHF
  sends its dataset's labels as they are: one that is not a string is its JSON text, `samples.as_text`).
- A sample whose graders failed gets `http.failure_reward` and `extra_logs.grpcgrade_failed` = 1 (else 0);
  OpenRLHF logs every extra_logs key, so the failure rate shows in its metrics.
- The reward guard (docs/reward-guard.md): the body's `budget_seconds` and `max_failure_ratio`, else the
  configuration's `http.budget_seconds` / `http.max_failure_ratio`. A sample cut by the budget is a failed
  sample; a request past its failure ratio is answered 400 (gRPC's FAILED_PRECONDITION, as google.rpc.Code
  maps it) whose text names the grader and its most frequent error code: OpenRLHF's client raises on any
  error status, so the step does not train on a batch of masks.
- The result cache (docs/reward-guard.md): the body's `cache`, "on", "off" or "default" (the server's
  default per grader, when absent).
- Auth, when the server has tokens: `Authorization: Bearer TOKEN`, or Basic auth whose password is the
  token, which aiohttp sends for a URL like `http://trainer:TOKEN@host:port/get_reward` (OpenRLHF cannot
  set headers).

aiohttp.web serves it (well kept, asyncio-native, and the client OpenRLHF itself uses), in the server
process and on its event loop: the same engine, limits, grader metrics and tokens as the gRPC service.
`build_http_app(..., subapps={prefix: app})` mounts further aiohttp applications under their prefixes: the
server mounts OpenAI's grader endpoints (`service.openai_http`, docs/openai-graders.md) at their MOUNT_PATH.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import BasicAuth, web

from grpcgrade.core.admission import Admission
from grpcgrade.core.config import HttpConfig
from grpcgrade.core.engine import Batch, Engine, GradedChunk
from grpcgrade.core.errors import (
    InvalidParams,
    Overloaded,
    SampleProblem,
    TooManyFailures,
    UnknownGrader,
    UnknownReward,
)
from grpcgrade.core.guard import call_guards
from grpcgrade.core.result_cache import CacheMode
from grpcgrade.core.samples import Limits, as_text, check_fields

from .metrics import Metrics
from .overload import admission_middleware, service_unavailable

#: extra_logs key of the per-sample failure flag.
FAILED_LOG = "grpcgrade_failed"
#: The status a request whose client went away is counted with (nginx's "client closed request").
CLIENT_CLOSED_REQUEST = 499


def response_of(query: str, prompt: str | None, suffixes: Sequence[str]) -> str:
    """The completion inside an OpenRLHF query (rule in the module docstring); SampleProblem when the
    query does not start with its prompt."""
    if prompt is not None:
        if not query.startswith(prompt):
            raise SampleProblem("the query does not start with its prompt, so the response cannot be cut out")
        query = query[len(prompt) :]
    stripped = True
    while stripped:
        stripped = False
        for suffix in suffixes:
            if query.endswith(suffix):
                query = query[: -len(suffix)]
                stripped = True
    return query


def _authorized(request: web.Request, tokens: Sequence[bytes]) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        presented = value.strip()
    elif scheme.lower() == "basic":
        try:
            presented = BasicAuth.decode(header).password
        except ValueError:
            return False
    else:
        return False
    return any(hmac.compare_digest(presented.encode(), t) for t in tokens)


def _strings(body: dict[str, Any], key: str, n: int | None) -> list[str] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise web.HTTPBadRequest(text=f"`{key}` must be a list of strings")
    if n is not None and len(value) != n:
        raise web.HTTPBadRequest(text=f"`{key}` has {len(value)} items but `query` has {n}")
    return value


def _labels(body: dict[str, Any], n: int) -> list[str]:
    """Each sample's reference. OpenRLHF sends its dataset's labels as they are (`data[label_key]`): a
    number or a list of answers is taken as its JSON text, null as no reference (`samples.as_text`)."""
    value = body.get("labels")
    if value is None:
        return [""] * n
    if not isinstance(value, list):
        raise web.HTTPBadRequest(text="`labels` must be a list, one label per query")
    if len(value) != n:
        raise web.HTTPBadRequest(text=f"`labels` has {len(value)} items but `query` has {n}")
    return [as_text(label) for label in value]


class RewardHandler:
    """Grades one OpenRLHF request with the engine, as the gRPC servicer would."""

    def __init__(
        self,
        engine: Engine,
        limits: Limits,
        http: HttpConfig,
        default_reward: str,
        tokens: Sequence[str],
        metrics: Metrics | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.admission = admission or Admission(limits)
        self.engine = engine
        self.limits = limits
        self.http = http
        self.default_reward = default_reward
        self.secrets = [t.encode() for t in tokens if t]
        self.metrics = metrics

    def _check_auth(self, request: web.Request) -> None:
        if self.secrets and not _authorized(request, self.secrets):
            raise web.HTTPUnauthorized(
                text="missing or invalid token (Authorization: Bearer TOKEN, or the URL's password)",
                headers={"WWW-Authenticate": 'Basic realm="grpcgrade"'},
            )

    async def default(self, request: web.Request) -> web.Response:
        self._check_auth(request)
        if not self.default_reward:
            raise web.HTTPNotFound(
                text="no default_reward in the server's configuration; POST to /rewards/NAME/get_reward instead"
            )
        return await self.grade(request, self.default_reward)

    async def named(self, request: web.Request) -> web.Response:
        self._check_auth(request)
        return await self.grade(request, request.match_info["name"])

    async def grade(self, request: web.Request, reward: str) -> web.Response:
        started = time.monotonic()
        try:
            body = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text="the body is not JSON") from None
        except RecursionError:  # nesting past the interpreter's limit: a bad body, not the server's trouble
            raise web.HTTPBadRequest(text="the body's JSON is nested too deeply") from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text='the body must be a JSON object with "query", "prompts", "labels"')
        cache = body.get("cache", CacheMode.DEFAULT.value)
        if cache not in set(CacheMode):
            allowed = ", ".join(f'"{mode.value}"' for mode in CacheMode)
            raise web.HTTPBadRequest(text=f"`cache` must be one of {allowed}, got {str(cache)[:40]!r}")
        try:
            jobs = self.engine.resolve([], reward, CacheMode(cache))
        except (UnknownReward, UnknownGrader) as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        except InvalidParams as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        queries = _strings(body, "query", None)
        if queries is None:
            raise web.HTTPBadRequest(text="`query` is required: a list of strings")
        n = len(queries)
        if n > self.limits.max_samples_per_batch:
            raise web.HTTPRequestEntityTooLarge(
                max_size=self.limits.max_samples_per_batch,
                actual_size=n,
                text=f"{n} queries, over the limit max_samples_per_batch={self.limits.max_samples_per_batch}",
            )
        prompts = _strings(body, "prompts", n)
        labels = _labels(body, n)
        deadline, failures = self._guards(body, n, started)

        def kwargs(i: int) -> dict[str, Any] | SampleProblem:
            try:
                prompt = prompts[i] if prompts is not None else None
                fields = {
                    "sample_id": "",
                    "query": prompt or "",
                    "response": response_of(queries[i], prompt, self.http.strip_suffixes),
                    "reference": labels[i],
                    "context": "",
                    "responses": [],
                }
                check_fields(fields, self.limits)
            except SampleProblem as exc:
                return exc
            return fields

        rewards: list[float | None] = [None] * n
        batch = Batch(n, lambda a, b: [(i, kwargs(i)) for i in range(a, b)])
        try:
            self.admission.reserve(n)
        except Overloaded as exc:
            raise service_unavailable(exc) from None
        try:
            async for graded in self.engine.grade_batch(
                jobs, batch, self.engine.chunks(jobs, n), reward=reward, deadline=deadline, failures=failures
            ):
                assert isinstance(graded, GradedChunk)  # no whole-chunk work offered: results come back as Python
                for index, value in zip(graded.indices, graded.rewards, strict=True):
                    rewards[index] = value
        except TooManyFailures as exc:
            if self.metrics is not None:
                self.metrics.failure_budget_calls.inc()
            raise web.HTTPBadRequest(text=f"FAILED_PRECONDITION: {exc}") from None
        finally:
            self.admission.release(n)
        out = [self.http.failure_reward if r is None else r for r in rewards]
        failed = [float(r is None) for r in rewards]
        return web.json_response({"rewards": out, "scores": out, "extra_logs": {FAILED_LOG: failed}})

    def _guards(self, body: dict[str, Any], n: int, started: float) -> tuple[Any, Any]:
        """The request's reward guard (its body's keys, else the server's `http` defaults); 400 naming a
        value out of range."""
        budget = body.get("budget_seconds", self.http.budget_seconds)
        ratio = body.get("max_failure_ratio", self.http.max_failure_ratio)
        for name, value in (("budget_seconds", budget), ("max_failure_ratio", ratio)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise web.HTTPBadRequest(text=f"`{name}` must be a number")
        try:
            return call_guards(float(budget or 0.0), None if ratio is None else float(ratio), n, started)
        except InvalidParams as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None


def build_http_app(
    engine: Engine,
    limits: Limits,
    http: HttpConfig,
    default_reward: str = "",
    *,
    tokens: Sequence[str] = (),
    metrics: Metrics | None = None,
    subapps: Mapping[str, web.Application] | None = None,
    admission: Admission | None = None,
) -> web.Application:
    """The HTTP face's application; `subapps` ({"/prefix": app}) are mounted beside the reward routes and
    share the request counting. Each checks the same `tokens` itself (answering in its own protocol's
    error format), so build them with the tokens too."""

    @web.middleware
    async def counted(request: web.Request, handler: Any) -> web.StreamResponse:
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_CLOSED_REQUEST  # nobody is there to answer: not a server error
            raise
        finally:
            if metrics is not None:
                metrics.http_requests.labels(request.method, str(status)).inc()

    admitted = admission_middleware(admission or Admission(limits))
    app = web.Application(middlewares=[counted, admitted], client_max_size=limits.max_message_bytes)
    handler = RewardHandler(engine, limits, http, default_reward, tokens, metrics, admission)
    app.router.add_post("/get_reward", handler.default)
    app.router.add_post("/rewards/{name}/get_reward", handler.named)
    for prefix, sub in (subapps or {}).items():
        app.add_subapp(prefix, sub)
    return app
