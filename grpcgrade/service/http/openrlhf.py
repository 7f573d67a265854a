"""OpenRLHF's remote reward model protocol: `POST /get_reward` and `POST /rewards/NAME/get_reward`.

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
- Agent inputs (docs/agents.md): the body's optional `messages`, `tool_calls` and `tool_definitions`, each a
  list with one entry per query (that sample's list, or null), become the samples' agent inputs. OpenRLHF's
  own agent executors send none; a custom `--agent_func_path` or another client may.
- The result cache (docs/reward-guard.md): the body's `cache`, "on", "off" or "default" (the server's
  default per grader, when absent).
- Auth, when the server has tokens (`common.authorized`): Basic auth whose password is the token is what
  aiohttp sends for a URL like `http://trainer:TOKEN@host:port/get_reward` (OpenRLHF cannot set headers).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from grpcgrade.core.errors import SampleProblem, as_value
from grpcgrade.core.samples import text_or_none

from .common import FaceContext, agent_columns, faced, sample_fields
from .limits import json_size, off_loop

#: The `face` label of this protocol's requests.
FACE = "openrlhf"
#: extra_logs key of the per-sample failure flag.
FAILED_LOG = "grpcgrade_failed"


def response_of(query: str, prompt: str | None, suffixes: Sequence[str]) -> str:
    """The completion inside an OpenRLHF query (rule in the module docstring); SampleProblem when the
    query does not start with its prompt."""
    if prompt is not None:
        if not query.startswith(prompt):
            raise SampleProblem("the query does not start with its prompt, so the response cannot be cut out")
        query = query[len(prompt) :]
    stripped = bool(suffixes) and query.endswith(tuple(suffixes))  # one C call for the usual answer: none
    while stripped:
        stripped = False
        for suffix in suffixes:
            if query.endswith(suffix):
                query = query[: -len(suffix)]
                stripped = True
    return query


def _strings(body: dict[str, Any], key: str, n: int | None) -> list[str] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise web.HTTPBadRequest(text=f"`{key}` must be a list of strings")
    if n is not None and len(value) != n:
        raise web.HTTPBadRequest(text=f"`{key}` has {len(value)} items but `query` has {n}")
    return value


def _labels(body: dict[str, Any], n: int, max_chars: int) -> list[str | None | SampleProblem]:
    """Each sample's reference. OpenRLHF sends its dataset's labels as they are (`data[label_key]`): a
    number or a list of answers is taken as its JSON text (`samples.as_text`); null or NaN, or no `labels`, is no
    reference (a grader that requires one answers INVALID_SAMPLE). A label whose JSON text would be over
    `max_chars` is its sample's problem, found without encoding it at once (`json_size`): this runs off
    the loop, and one C encoding of a large label would hold the GIL, and so the loop, throughout."""
    value = body.get("labels")
    if value is None:
        return [None] * n
    if not isinstance(value, list):
        raise web.HTTPBadRequest(text="`labels` must be a list, one label per query")
    if len(value) != n:
        raise web.HTTPBadRequest(text=f"`labels` has {len(value)} items but `query` has {n}")
    out: list[str | None | SampleProblem] = []
    for label in value:
        if label is not None and type(label) is not str and json_size(label) > max_chars:
            out.append(SampleProblem(f"its label is over {max_chars} characters as JSON (max_field_chars)"))
        else:
            out.append(text_or_none(label))
    return out


#: Numbers encoded per step of the event loop in an answer (a few ms each).
ENCODE_STEP = 8192


async def json_numbers(values: list[float]) -> str:
    """`values` as a JSON array, ENCODE_STEP of them per step of the event loop: encoding a 100k-sample
    answer at once (twice: `rewards` and `scores`) held the loop for 60-90 ms."""
    pieces = []
    for start in range(0, len(values), ENCODE_STEP):
        if start:
            await asyncio.sleep(0)
        pieces.append(json.dumps(values[start : start + ENCODE_STEP])[1:-1])
    return "[" + ",".join(pieces) + "]"


class LazySamples:
    """`common.Samples` made one by one when asked for: the engine asks chunk by chunk, so each of the
    event loop's steps makes one chunk's samples, not the whole batch's."""

    def __init__(self, n: int, make: Callable[[int], dict[str, Any] | SampleProblem]) -> None:
        self.n, self.make = n, make

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int, /) -> dict[str, Any] | SampleProblem:
        return self.make(index)


class OpenRLHFFace:
    """Grades one OpenRLHF request with the face's engine call."""

    def __init__(self, ctx: FaceContext) -> None:
        self.ctx = ctx

    async def get_reward(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        ctx = self.ctx
        ctx.check_auth(request)
        reward = ctx.reward_of(request, "get_reward")
        body = await ctx.json_object(request, '"query", "prompts", "labels"')
        jobs = ctx.resolve(reward, body.get("cache", "default"))
        ctx.require_counts(reward, jobs, "OpenRLHF's remote reward model")
        queries = _strings(body, "query", None)
        if queries is None:
            raise web.HTTPBadRequest(text="`query` is required: a list of strings")
        n = len(queries)
        ctx.check_count(n, "queries")
        prompts = _strings(body, "prompts", n)
        labels = await off_loop(request, _labels, body, n, ctx.limits.max_field_chars)
        agent = agent_columns(body, n)
        guards = ctx.guards(body, n, started)

        def sample(i: int) -> dict[str, Any] | SampleProblem:
            prompt = prompts[i] if prompts is not None else None
            label = labels[i]
            if isinstance(label, SampleProblem):
                return label
            try:
                response = response_of(queries[i], prompt, ctx.http.strip_suffixes)
            except SampleProblem as exc:
                return as_value(exc)
            return sample_fields(response, query=prompt, reference=label, agent=agent[i])

        graded = await ctx.grade(reward, jobs, LazySamples(n, sample), guards, FACE, request.content_length or 0)
        out = [ctx.http.failure_reward if value is None else value for value in graded.rewards]
        failed = [float(value is None) for value in graded.rewards]
        if n <= ENCODE_STEP:  # one step: no coroutine for each
            rewards, flags = json.dumps(out), json.dumps(failed)
        else:
            rewards, flags = await json_numbers(out), await json_numbers(failed)
        answer = f'{{"rewards": {rewards}, "scores": {rewards}, "extra_logs": {{"{FAILED_LOG}": {flags}}}}}'
        return web.Response(text=answer, content_type="application/json")


def add_routes(app: web.Application, ctx: FaceContext) -> None:
    """`POST /get_reward` (the default reward) and `POST /rewards/{name}/get_reward`."""
    handler = faced(FACE, OpenRLHFFace(ctx).get_reward)
    app.router.add_post("/get_reward", handler)
    app.router.add_post("/rewards/{name}/get_reward", handler)
