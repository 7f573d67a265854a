"""OpenAI's grader endpoints over HTTP: `POST .../graders/run` and `POST .../graders/validate`.

Scripts written for `openai.OpenAI().fine_tuning.alpha.graders.run(...)` work unchanged against a grpcgrade
server once they point `base_url` at it: the request and response bodies are OpenAI's
(`openai.types.fine_tuning.alpha.grader_run_*`, `grader_validate_*`), and errors come as OpenAI's error
object, whose `param` is the JSON path of the bad field.

`openai_graders_app` is an aiohttp.web sub-application the HTTP face (`build_http_app`) mounts at
`MOUNT_PATH`; it grades through the server's engine (its registry and cache, worker pool, time limits and
metrics), so an HTTP run is graded exactly as a gRPC one with grader `openai_grader`.

What differs from OpenAI: when a grader fails on the sample, `reward` is null (OpenAI puts a number beside
the error flags); grpcgrade never reports a number that no grader computed. A grader config that does not
parse is HTTP 400 on both endpoints, except a formula or formula variable error on `run`, which OpenAI
reports with `formula_parse_error` / `invalid_variable_error` and so does grpcgrade.

One extension (docs/agents.md): `run` also takes `tool_calls`, the sample's chat-completions tool calls,
which fill `sample.output_tools` (OpenAI's `model_sample` is text only). OpenAI's own client never sends it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from grpcgrade.core.config import HttpConfig
from grpcgrade.core.engine import Engine
from grpcgrade.core.errors import ErrorCode, InvalidParams, SampleProblem
from grpcgrade.core.params import MAX_PARAMS_BYTES
from grpcgrade.core.rewards import SpecData
from grpcgrade.core.samples import Limits, check_fields
from grpcgrade.grader import GraderError, GraderResult, GraderScore
from grpcgrade.graders.openai.grader import ITEM_KWARG
from grpcgrade.graders.openai.outcome import ERROR_FLAGS
from grpcgrade.graders.openai.schema import GraderConfigError

from ..callers import caller_middleware
from .common import MAX_JSON_DEPTH, BodyError, authorized, faced, read_json
from .forward import NESTING, UNREACHABLE_RETRY_SECONDS, EngineLink, too_deep

__all__ = ["MAX_JSON_DEPTH", "MOUNT_PATH", "openai_graders_app", "openai_graders_root", "run_response"]

#: Where OpenAI serves these endpoints; mount the sub-application here.
MOUNT_PATH = "/v1/fine_tuning/alpha/graders"
GRADER_NAME = "openai_grader"
#: The `face` label of these endpoints' requests.
FACE = "openai_graders"
# grpcgrade error codes that are not an openai_grader outcome (time limit, a crash) -> OpenAI's flag
_CODE_FLAGS: dict[str, str] = {
    ErrorCode.TIMEOUT: "unresponsive_reward_error",
    ErrorCode.INVALID_SAMPLE: "sample_parse_error",
    ErrorCode.RATE_LIMITED: "model_grader_server_error",  # the judge model's provider limits held it back
}
_DETAIL_FIELDS = {
    "model_grader_server_error_details": None,
    "python_grader_runtime_error_details": None,
    "python_grader_server_error_type": None,
}


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code

    def response(self) -> web.Response:
        """The error in OpenAI's shape; a 503 (the body's parsing processes died under it or hung: the server's
        trouble) with the retry hint every face sends with one."""
        error = {"message": str(self), "type": "invalid_request_error", "param": self.param, "code": self.code}
        headers = {"Retry-After": str(UNREACHABLE_RETRY_SECONDS)} if self.status == 503 else None
        return web.json_response({"error": error}, status=self.status, headers=headers)


async def _body(
    request: web.Request, http: HttpConfig, limits: Limits, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The body, read and parsed within the HTTP face's limits (off the loop when large), with the fields it
    passes on whole size-checked: `grader` as a grader's params (MAX_PARAMS_BYTES of JSON), `item` and
    `tool_calls` as a sample's `extra` (max_field_chars)."""
    try:
        body, sizes = await read_json(request, http, sized=("grader", "item", "tool_calls"))
    except BodyError as exc:
        raise BadRequest(str(exc), status=exc.status) from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    bounds = (("grader", MAX_PARAMS_BYTES, "a grader's params"), ("item", limits.max_field_chars, "max_field_chars"),
              ("tool_calls", limits.max_field_chars, "max_field_chars"))  # fmt: skip
    for name, limit, what in bounds:
        if sizes.get(name, 0) > limit:
            raise BadRequest(f"{name}: {sizes[name]} bytes as JSON, over the limit of {limit} ({what})", param=name)
    tools = body.get("tool_calls")
    if too_deep(body.get("item")) or (isinstance(tools, list) and any(too_deep(t) for t in tools)):
        name = "item" if too_deep(body.get("item")) else "tool_calls"
        raise BadRequest(f"{name}: nested deeper than a sample carries ({NESTING})", param=name)
    for name in required:
        if name not in body:
            raise BadRequest(f"{name}: is required", param=name)
    unknown = sorted(set(body) - set(required) - set(optional))
    if unknown:
        raise BadRequest(f"{unknown[0]}: unknown field (allowed: {', '.join((*required, *optional))})", unknown[0])
    return body


def _auth(request: web.Request, tokens: Sequence[bytes]) -> None:
    if tokens and not authorized(request, tokens):
        raise BadRequest("missing or invalid bearer token", status=401, code="invalid_api_key")


def _config_error(exc: InvalidParams) -> BadRequest:
    if isinstance(exc, GraderConfigError):
        return BadRequest(exc.detail, param=exc.path)
    return BadRequest(str(exc), param=exc.param)


def run_response(result: GraderResult, grader: Any, seconds: float) -> dict[str, Any]:
    """OpenAI's GraderRunResponse for one graded sample."""
    meta = dict(result.metadata)
    flags = set(meta.get("errors", ()))
    if isinstance(result, GraderError) and not flags:  # failed outside the grader: a time limit or a crash
        flags.add(_CODE_FLAGS.get(result.code, "other_error"))
    errors: dict[str, Any] = {flag: flag in flags for flag in ERROR_FLAGS}
    errors.update(_DETAIL_FIELDS)
    if "model_grader_server_error" in flags and isinstance(result, GraderError):
        errors["model_grader_server_error_details"] = result.error
    sub_rewards = meta.get("sub_rewards", {})
    config = grader if isinstance(grader, dict) else {}
    extension: dict[str, Any] = {"reason": result.reason}
    if isinstance(result, GraderError):
        extension["error"] = {"code": result.code, "message": result.error}
    return {
        "reward": result.score if isinstance(result, GraderScore) else None,
        "sub_rewards": sub_rewards,
        "model_grader_token_usage_per_model": meta.get("model_grader_token_usage_per_model", {}),
        "metadata": {
            "name": meta.get("name", config.get("name", "")),
            "type": meta.get("type", config.get("type", "")),
            "errors": errors,
            "execution_time": seconds,
            "scores": sub_rewards,
            "token_usage": meta.get("token_usage"),
            "sampled_model_name": meta.get("sampled_model_name"),
            "grpcgrade": extension,
        },
    }


def flagged_response(grader: Any, exc: GraderConfigError) -> dict[str, Any]:
    """A run whose grader config OpenAI would have accepted and then flagged (a bad formula)."""
    failed = GraderError(GRADER_NAME, exc.detail, code=ErrorCode.INVALID_RESULT, metadata={"errors": [exc.flag]})
    return run_response(failed, grader, 0.0)


def openai_graders_app(
    engine: Engine,
    *,
    tokens: Sequence[str] = (),
    limits: Limits | None = None,
    http: HttpConfig | None = None,
    link: EngineLink | None = None,
) -> web.Application:
    """The `run` and `validate` endpoints as a sub-application to mount at MOUNT_PATH.

    `tokens`: bearer tokens to accept (none: no check here, e.g. when the parent application authenticates).
    `limits`: the server's request limits; `model_sample` is a sample field, bounded by `max_field_chars`.
    `http`: the HTTP face's limits on bodies (`limits.py`; the defaults when None).
    `link`: the engine's process, when the face runs in its own (`forward`): `engine` then only checks
    grader configs, and the sample is graded there.
    """
    limits = limits or Limits()
    http = http or HttpConfig()
    accepted = [t.encode() for t in tokens if t]

    async def run(request: web.Request) -> web.Response:
        try:
            _auth(request, accepted)
            body = await _body(request, http, limits, ("grader", "model_sample"), ("item", "tool_calls"))
            sample = body["model_sample"]
            if not isinstance(sample, str):
                raise BadRequest("model_sample: must be a string", param="model_sample")
            if len(sample) > limits.max_field_chars:
                message = f"model_sample: {len(sample)} characters, over the limit of {limits.max_field_chars}"
                raise BadRequest(message, param="model_sample")
            tools = body.get("tool_calls")
            if tools is not None:
                if not isinstance(tools, list):
                    raise BadRequest("tool_calls: must be a list of tool calls", param="tool_calls")
                try:
                    check_fields({"tool_calls": tools}, limits)
                except SampleProblem as exc:
                    raise BadRequest(str(exc), param="tool_calls") from None
            try:
                jobs = engine.resolve([SpecData(GRADER_NAME, {"grader": body["grader"]})])
            except GraderConfigError as exc:
                if exc.flag in ("formula_parse_error", "invalid_variable_error") and "calculate_output" in exc.path:
                    return web.json_response(flagged_response(body["grader"], exc))
                raise _config_error(exc) from None
            except InvalidParams as exc:
                raise _config_error(exc) from None
        except BadRequest as exc:
            return exc.response()
        item = body.get("item")
        kwargs = {"response": sample, ITEM_KWARG: {} if item is None else item}
        if tools is not None:
            kwargs["tool_calls"] = tools
        start = time.perf_counter()
        if link is not None:
            graded = await link.grade_chunk(jobs, [(0, kwargs)], full=True)
        else:
            graded = await engine.grade_chunk(jobs, [(0, kwargs)])
        result = graded.columns[0][0]
        return web.json_response(run_response(result, body["grader"], time.perf_counter() - start))

    async def validate(request: web.Request) -> web.Response:
        try:
            _auth(request, accepted)
            body = await _body(request, http, limits, ("grader",))
            try:
                engine.resolve([SpecData(GRADER_NAME, {"grader": body["grader"]})])
            except InvalidParams as exc:
                raise _config_error(exc) from None
        except BadRequest as exc:
            return exc.response()
        return web.json_response({"grader": body["grader"]})

    app = web.Application()
    app.router.add_post("/run", faced(FACE, run))
    app.router.add_post("/validate", faced(FACE, validate))
    return app


def openai_graders_root(
    engine: Engine, *, tokens: Sequence[str] = (), limits: Limits | None = None, http: HttpConfig | None = None
) -> web.Application:
    """A whole application serving only the grader endpoints at MOUNT_PATH (the request body limit is the
    root application's, so it is set here from `http.max_body_bytes`)."""
    limits = limits or Limits()
    http = http or HttpConfig()
    root = web.Application(middlewares=[caller_middleware], client_max_size=http.max_body_bytes)
    root.add_subapp(MOUNT_PATH, openai_graders_app(engine, tokens=tokens, limits=limits, http=http))
    return root
