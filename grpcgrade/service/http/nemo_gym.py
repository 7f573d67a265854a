"""NeMo Gym's resources-server verify: `POST /verify` (the configuration's `default_reward`),
`POST /rewards/NAME/verify`, and the `POST /seed_session` its agents call first.

NeMo Gym (`nemo-gym` 0.4.0, `nemo_gym/base_resources_server.py`) agents post each rollout to their resources
server's `/verify` (`responses_api_agents/simple_agent/app.py`: `server_client.post(server_name=...,
url_path="/verify", json=verify_request.model_dump())`, `raise_for_status`, then
`BaseVerifyResponse.model_validate(...)`), at `http://{host}:{port}` of the server's config, after
`/seed_session`. The body is a `BaseVerifyRequest`: `responses_create_params` (the Responses API request,
its `input` the conversation), `response` (the Responses API answer, its `output` items) and the task's
own fields (`expected_answer`, ...). The answer is that request echoed with `reward` (`BaseVerifyResponse`),
plus fields NeMo Gym averages into its metrics when numeric (`reward_profile.compute_aggregate_metrics`).

- The sample: `response` is the text of the assistant `message` items' `output_text` parts; `query` the
  last user input's text (`input` a string is itself); `reference` the task's `expected_answer`
  (`samples.as_text`; without one, a grader that requires a reference answers INVALID_SAMPLE);
  the agent inputs (docs/agents.md) a grader of the reward names are made from the Responses API items in
  the Chat Completions shape: `messages` the conversation (`input`, then the `output` items:
  `chat_messages`), `tool_calls` the `function_call` output items (`{"id", "type": "function", "function":
  {"name", "arguments"}}`) and `tool_definitions` the request's function `tools`; every other task field
  goes to `extra` as it is;
  `completion_tokens` is the output items' `generation_token_ids` count when NeMo-RL sends them, else
  `response.usage.output_tokens`.
- The answer adds `reward`, `reward_components` ({grader key: score or null}) and `grpcgrade_failed`
  (0 or 1). A failed sample's `reward` is the configuration's `http.failure_reward` (NeMo Gym requires a
  number), with `grpcgrade_failed` 1 (so its mean in NeMo Gym's aggregate metrics is the failure rate)
  and `grpcgrade_error` naming the grader and its error code; it is also counted in
  `grpcgrade_http_failed_samples_total{face="nemo_gym"}` and logged.
- NeMo Gym's `BaseVerifyResponse` ignores fields it does not declare (pydantic's default): declare
  `reward_components` and `grpcgrade_failed` in a subclass to read them (docs/trainers.md).
- Auth: Basic auth from the URL, which aiohttp sends: the server config's `host: "gym:TOKEN@HOST"`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from grpcgrade.core.chat import last_text, message_text
from grpcgrade.core.grading import inputs_of
from grpcgrade.core.samples import INPUT_FIELDS, SAMPLE_FIELDS, text_or_none

from .common import FaceContext, faced, sample_fields
from .limits import off_loop

#: The `face` label of this protocol's requests.
FACE = "nemo_gym"
#: The request's own keys (not task fields, so not `extra`), and the task field that is the reference.
PROTOCOL_KEYS = frozenset(("responses_create_params", "response"))
REFERENCE_KEY = "expected_answer"
#: Keys the answer sets; a request field of the same name is not passed on to graders either.
#: The content part holding a message's text in the Responses API's output.
TEXT_PART = "output_text"
ANSWER_KEYS = ("reward", "reward_components", "grpcgrade_failed", "grpcgrade_error")


def _items(response: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    output = response.get("output")
    if not isinstance(output, list):
        raise web.HTTPBadRequest(text="`response.output` is required: the Responses API output items")
    return [item for item in output if isinstance(item, Mapping)]


def response_text(items: list[Mapping[str, Any]]) -> str:
    """The assistant messages' `output_text` parts, in order."""
    return "".join(
        message_text(
            [p for p in item.get("content") or () if isinstance(p, Mapping) and p.get("type") == "output_text"]
        )
        for item in items
        if item.get("type") == "message" and item.get("role", "assistant") == "assistant"
    )


def _call(item: Mapping[str, Any]) -> dict[str, Any]:
    """A `function_call` item as a Chat Completions tool call."""
    return {
        "id": item.get("call_id", ""),
        "type": "function",
        "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")},
    }


def tool_calls(items: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`function_call` items as Chat Completions tool calls."""
    return [_call(item) for item in items if item.get("type") == "function_call"]


def chat_messages(params: Mapping[str, Any], items: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rollout, its `input` then its `output` items, as Chat Completions messages (docs/agents.md), grouped
    as NeMo Gym's own `ResponsesConverter` groups them: an assistant's text and the `function_call` items
    that follow it are one assistant message with `tool_calls`, until a user, system, developer or tool
    message ends that turn; a `function_call_output` is a `tool` message answering its `call_id`. `input`
    given as a string is the user's message; `instructions` come first as a system message. Message text is
    the content string or its text parts (`message_text`); `reasoning` items and tools other than functions
    are left out, as `response` leaves them out."""
    given = params.get("input")
    inputs: list[Any] = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or ())
    instructions = params.get("instructions")
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    text: list[str] = []
    calls: list[dict[str, Any]] = []

    def end_turn() -> None:
        if text or calls:
            turn: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
            if calls:
                turn["tool_calls"] = calls.copy()
            messages.append(turn)
            text.clear()
            calls.clear()

    for item in (*inputs, *items):
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type") or ("message" if item.get("role") else None)
        if kind == "message":
            role = item.get("role") or "assistant"  # an output message is the assistant's
            if role == "assistant":
                text.append(message_text(item.get("content")))
            else:
                end_turn()
                messages.append({"role": role, "content": message_text(item.get("content"))})
        elif kind == "function_call":
            calls.append(_call(item))
        elif kind == "function_call_output":
            end_turn()
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id", ""), "content": message_text(item.get("output"))}
            )
    end_turn()
    return messages


def tool_definitions(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's function tools (the Responses API's flat `{"type": "function", "name", "description",
    "parameters"}`) in the Chat Completions shape `{"type": "function", "function": {...}}`."""
    tools = params.get("tools")
    return [
        {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool}}
        for tool in (tools if isinstance(tools, list) else ())
        if isinstance(tool, Mapping) and tool.get("type") == "function"
    ]


def completion_tokens(response: Mapping[str, Any], items: list[Mapping[str, Any]]) -> int | None:
    """The trainer's own count (NeMo-RL's `generation_token_ids`), else the model's `usage.output_tokens`."""
    ids = [item["generation_token_ids"] for item in items if isinstance(item.get("generation_token_ids"), list)]
    if ids:
        return sum(len(i) for i in ids)
    usage = response.get("usage")
    count = usage.get("output_tokens") if isinstance(usage, Mapping) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def query_of(params: Mapping[str, Any]) -> str:
    """The last user input's text (`input` as a string is the user's message)."""
    given = params.get("input")
    if isinstance(given, str):
        return given
    return last_text(given, "user") if isinstance(given, list) else ""


#: How each agent input is made from the request's params and the response's items. Only those a grader of the
#: reward names are made: the others' graders neither pay for the conversion nor fail a long rollout on the
#: field's size limit (`max_field_chars`), which a conversation may pass.
AGENT_INPUTS: dict[str, Callable[[Mapping[str, Any], list[Mapping[str, Any]]], list[dict[str, Any]]]] = {
    "messages": chat_messages,
    "tool_calls": lambda params, items: tool_calls(items),
    "tool_definitions": lambda params, items: tool_definitions(params),
}


def rollout_sample(body: Mapping[str, Any], declared: frozenset[str]) -> dict[str, Any]:
    """The sample of a `BaseVerifyRequest` (rules in the module docstring), with the agent inputs the
    reward's graders `declared`; 400 when it is not one."""
    params, response = body.get("responses_create_params"), body.get("response")
    if not isinstance(params, Mapping) or not isinstance(response, Mapping):
        raise web.HTTPBadRequest(text="`responses_create_params` and `response` are required: JSON objects")
    items = _items(response)
    agent = {name: build(params, items) for name, build in AGENT_INPUTS.items() if name in declared}
    skip = PROTOCOL_KEYS | {REFERENCE_KEY} | INPUT_FIELDS | set(SAMPLE_FIELDS) | set(ANSWER_KEYS) | set(agent)
    extra = {key: value for key, value in body.items() if key not in skip}
    tokens = completion_tokens(response, items)
    if tokens is not None:
        extra["completion_tokens"] = tokens
    answer_given = body.get(REFERENCE_KEY)
    reference = text_or_none(answer_given)  # none (null, NaN): INVALID_SAMPLE if required
    return sample_fields(response_text(items), query=query_of(params), reference=reference, extra=extra, agent=agent)


def echoed(raw: bytes, body: Mapping[str, Any], added: Mapping[str, Any]) -> bytes:
    """The answer: the request echoed with `added` (`BaseVerifyResponse`). Made from the request's own bytes
    with the new keys appended, not by encoding the parsed request again: that is one C call on the event
    loop as long as the body is large (80 ms for 8 MB). A request already holding one of the keys is
    encoded again instead (an object's keys are unique)."""
    head = raw.rstrip()
    if head.endswith(b"}") and len(body) and not any(key in body for key in added):
        return head[:-1] + b"," + json.dumps(added)[1:].encode()
    return json.dumps({**body, **added}).encode()


class NemoGymFace:
    """Verifies one NeMo Gym rollout with the face's engine call."""

    def __init__(self, ctx: FaceContext) -> None:
        self.ctx = ctx

    async def verify(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        ctx = self.ctx
        ctx.check_auth(request)
        name = ctx.reward_of(request, "verify")
        body = await ctx.json_object(request, '"responses_create_params", "response" and the task\'s fields')
        jobs = ctx.resolve(name)
        declared = frozenset().union(*(inputs_of(job.grader).names for job in jobs))
        sample = await off_loop(request, rollout_sample, body, declared)  # a large body's walks off the loop
        guards = ctx.guards({}, 1, started, ratio=False)
        (graded,) = await ctx.grade(name, jobs, [sample], guards, FACE, request.content_length or 0)
        keys = [job.spec.label for job in jobs]
        added: dict[str, Any] = {
            "reward": ctx.http.failure_reward if graded.reward is None else graded.reward,
            "reward_components": {
                key: getattr(result, "score", None) for key, result in zip(keys, graded.results, strict=False)
            },
            "grpcgrade_failed": int(graded.reward is None),
        }
        if graded.reward is None:
            added["grpcgrade_error"] = graded.why()
        return web.Response(body=echoed(await request.read(), body, added), content_type="application/json")

    async def seed_session(self, request: web.Request) -> web.Response:
        """NeMo Gym's agents seed a session before verifying; a stateless reward has nothing to seed."""
        self.ctx.check_auth(request)
        return web.json_response({})


def add_routes(app: web.Application, ctx: FaceContext) -> None:
    """`POST /verify` (the default reward), `POST /rewards/{name}/verify` and `POST /seed_session`."""
    face = NemoGymFace(ctx)
    verify = faced(FACE, face.verify)
    app.router.add_post("/verify", verify)
    app.router.add_post("/rewards/{name}/verify", verify)
    app.router.add_post("/seed_session", faced(FACE, face.seed_session))
