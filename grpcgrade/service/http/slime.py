"""slime's remote reward model: `POST /slime` (the configuration's `default_reward`) and
`POST /rewards/NAME/slime`.

slime (THUDM/slime, `slime/rollout/rm_hub/__init__.py`, `remote_rm`) with `--rm-type remote_rm --rm-url URL`
posts every sample as soon as it is generated: `{"prompt": sample.prompt, "response": sample.response,
"label": sample.label}` with aiohttp (one shared session: 64 connections, 120 s total timeout, no headers),
calls `raise_for_status()` and keeps `await resp.json()` as the sample's reward; with `--reward-key KEY`
slime reads `reward[KEY]`. A failed request is retried up to 10 times with backoff, then raised.

- The sample: `response` is the response; `prompt` the query (a string as it is; a list of chat messages,
  slime's prompt without a chat template applied, gives its last user message's text); `label` the
  reference (`samples.as_text`: a number or a list as its JSON text; null or absent: no reference, so a
  grader that requires one answers INVALID_SAMPLE, as over gRPC).
- The answer is the reward as a JSON number. With `?form=dict` in the URL, a JSON object for
  `--reward-key reward`: `{"reward": R, "grpcgrade_failed": 0 or 1, "graders": {KEY: score or null},
  "error": "grader CODE: message" (failed samples only)}`.
- A failed sample: slime cannot mask one (it trains on whatever number comes back, and an error status is
  retried and then ends the rollout), so it is answered the configuration's `http.failure_reward`, counted in
  `grpcgrade_http_failed_samples_total{face="slime"}` and logged as a WARNING naming the grader and its
  error code; the dict form says so too (`grpcgrade_failed` 1 and `error`).
- The reward guard: `http.budget_seconds` (or `?budget_seconds=S` in the URL) bounds each sample; no
  failure ratio, since a request holds one sample.
- Token counts: slime sends none, so a reward gating on `completion_tokens` is refused (400 naming
  `--tokenizer`) unless the server has a tokenizer to count the response with.
- Auth: Basic auth from the URL (`http://slime:TOKEN@host:port/slime`), which aiohttp sends.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from grpcgrade.core.chat import last_text
from grpcgrade.core.samples import text_or_none

from .common import FaceContext, Graded, faced, sample_fields

#: The `face` label of this protocol's requests.
FACE = "slime"
#: `?form=` values: the reward as a number (slime's default), or the object for `--reward-key reward`.
FORMS = ("number", "dict")


def _query(prompt: Any) -> str | None:
    if isinstance(prompt, list):
        return last_text(prompt, "user")
    if prompt is None or isinstance(prompt, str):
        return prompt
    raise web.HTTPBadRequest(text="`prompt` must be a string or a list of chat messages")


def _guard_options(request: web.Request) -> dict[str, Any]:
    """`?budget_seconds=S` from the URL (slime sends no options of its own)."""
    raw = request.query.get("budget_seconds")
    if raw is None:
        return {}
    try:
        return {"budget_seconds": float(raw)}
    except ValueError:
        raise web.HTTPBadRequest(text="`budget_seconds` must be a number") from None


class SlimeFace:
    """Grades one slime sample with the face's engine call."""

    def __init__(self, ctx: FaceContext) -> None:
        self.ctx = ctx

    async def reward(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        ctx = self.ctx
        ctx.check_auth(request)
        name = ctx.reward_of(request, "slime")
        form = request.query.get("form", "number")
        if form not in FORMS:
            raise web.HTTPBadRequest(text=f"`form` must be one of {', '.join(FORMS)}, got {form[:40]!r}")
        body = await ctx.json_object(request, '"prompt", "response", "label"')
        jobs = ctx.resolve(name)
        ctx.require_counts(name, jobs, "slime's remote reward model")
        response = body.get("response")
        if not isinstance(response, str):
            raise web.HTTPBadRequest(text="`response` is required: a string")
        label = body.get("label")
        reference = text_or_none(label)  # no label (null, NaN): INVALID_SAMPLE if required
        sample = sample_fields(response, query=_query(body.get("prompt")), reference=reference)
        guards = ctx.guards(_guard_options(request), 1, started, ratio=False)
        (graded,) = await ctx.grade(name, jobs, [sample], guards, FACE, request.content_length or 0)
        value = ctx.http.failure_reward if graded.reward is None else graded.reward
        if form == "number":
            return web.json_response(value)
        return web.json_response(self._as_dict(value, graded, [job.spec.label for job in jobs]))

    @staticmethod
    def _as_dict(value: float, graded: Graded, keys: list[str]) -> dict[str, Any]:
        scores = {key: getattr(result, "score", None) for key, result in zip(keys, graded.results, strict=False)}
        out: dict[str, Any] = {"reward": value, "grpcgrade_failed": int(graded.reward is None), "graders": scores}
        if graded.reward is None:
            out["error"] = graded.why()
        return out


def add_routes(app: web.Application, ctx: FaceContext) -> None:
    """`POST /slime` (the default reward) and `POST /rewards/{name}/slime`."""
    handler = faced(FACE, SlimeFace(ctx).reward)
    app.router.add_post("/slime", handler)
    app.router.add_post("/rewards/{name}/slime", handler)
