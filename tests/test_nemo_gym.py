"""The NeMo Gym face: `/verify` as NeMo Gym's agents post it.

The `trainers`-marked test runs nemo-gym 0.4.0's own client and models (tests/trainers/nemo_gym_verify.py in
.venv-nemo-gym); the others post the same JSON body with aiohttp, to check the mapping and the refusals.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import aiohttp
import pytest

from grpcgrade.core.tokens import count_tokens
from grpcgrade.service.http.nemo_gym import chat_messages, tool_calls

CONFIG = """
default_reward: capped
tokenizer: tiktoken:cl100k_base
http: {failure_reward: -1.0}
rewards:
  capped:
    graders:
      - {name: math_exact}
      - {name: completion_length_cap, params: {max_completion_tokens: 8}, gate: true}
  flaky:
    graders: [{name: misbehave, params: {heavy: false}}]
  agent:
    graders:
      - {name: tool_call_sequence, params: {strict_mode: false}}
      - {name: tool_call_valid}
      - {name: action_loop_detection}
"""
TOKEN = "gym-token"
SCRIPT = Path(__file__).parent / "trainers" / "nemo_gym_verify.py"
ROLLOUTS = [  # the answer, how many tokens the policy generated, and whether it called a tool first
    {"question": "What is 8*9?", "text": "<think>r</think>72", "token_ids": [7, 2], "expected_answer": "72"},
    {
        "question": "What is 8*9?",
        "text": "<think>r</think>71",
        "token_ids": [7, 1],
        "expected_answer": "72",
        "tool_call": True,
    },
    {
        "question": "What is 8*9?",
        "text": "<think>r</think>72",
        "token_ids": list(range(9)),
        "expected_answer": "72",
    },  # too long
]


@pytest.fixture(scope="module")
def gym_server(face_server):
    return face_server(CONFIG, token=TOKEN)


def direct(srv, reward: str, rollouts: list[dict]) -> list[float | None]:
    """The same samples graded over gRPC: the rewards the face must answer."""
    rows = [
        {"query": r["question"], "response": r["text"], "reference": r["expected_answer"],
         "completion_tokens": len(r["token_ids"])}
        for r in rollouts
    ]  # fmt: skip
    with srv.client(token=TOKEN) as client:
        return client.batch_scores(rows, reward=reward).rewards


def verify_body(rollout: dict, usage_tokens: int | None = None, counts: bool = True) -> dict:
    """A BaseVerifyRequest's JSON as NeMo Gym's agent dumps it (the fields that matter here)."""
    output = [{"type": "function_call", "call_id": "c1", "name": "calc", "arguments": "{}"}] * bool(
        rollout.get("tool_call")
    )
    message = {"id": "m1", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": rollout["text"], "annotations": []}]}  # fmt: skip
    if usage_tokens is None and counts:
        message["generation_token_ids"] = rollout["token_ids"]
    response = {"id": "r", "object": "response", "output": [*output, message]}
    if usage_tokens is not None:
        response["usage"] = {"input_tokens": 3, "output_tokens": usage_tokens}
    params = {"input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": rollout["question"]}]}
    return {"responses_create_params": params, "response": response, "expected_answer": rollout["expected_answer"],
            "level": "easy"}  # fmt: skip


async def _post(url: str, body: object, token: str | None = TOKEN) -> tuple[int, object]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else await r.text())


def test_verify_echoes_the_request_with_rewards_equal_to_direct_grading(gym_server):
    base = f"http://127.0.0.1:{gym_server.http_port}"
    expected = direct(gym_server, "capped", ROLLOUTS)
    assert expected == [1.0, 0.0, 0.0]  # the long one is gated out by its token count
    for rollout, reward in zip(ROLLOUTS, expected, strict=True):
        body = verify_body(rollout)
        status, answer = asyncio.run(_post(f"{base}/verify", body))
        assert status == 200 and answer["reward"] == reward
        assert {k: answer[k] for k in body} == body  # the request echoed, task fields and all
        assert answer["grpcgrade_failed"] == 0 and set(answer["reward_components"]) == {
            "math_exact", "completion_length_cap"}  # fmt: skip
    # usage.output_tokens counts when no generation_token_ids come
    status, answer = asyncio.run(_post(f"{base}/rewards/capped/verify", verify_body(ROLLOUTS[0], usage_tokens=9)))
    assert (status, answer["reward"]) == (200, 0.0)


def test_a_rollout_without_counts_is_counted_by_the_configured_tokenizer(gym_server):
    base = f"http://127.0.0.1:{gym_server.http_port}"
    short = {"question": "What is 8*9?", "text": "<think>r</think>72", "token_ids": [], "expected_answer": "72"}
    long = {**short, "text": "<think>" + "let me think " * 5 + "</think>72"}
    counts = [count_tokens(r["text"], "tiktoken:cl100k_base") for r in (short, long)]
    assert counts[0] <= 8 < counts[1]  # the gate's cap, between them
    rows = [{"query": r["question"], "response": r["text"], "reference": "72", "completion_tokens": c}
            for r, c in zip((short, long), counts, strict=True)]  # fmt: skip
    with gym_server.client(token=TOKEN) as client:
        expected = client.batch_scores(rows, reward="capped").rewards
    assert expected == [1.0, 0.0]  # the long one gated out by the tokenizer's count
    for rollout, reward in zip((short, long), expected, strict=True):
        status, answer = asyncio.run(_post(f"{base}/verify", verify_body(rollout, counts=False)))
        assert (status, answer["reward"]) == (200, reward)


def test_a_failed_rollout_is_flagged_in_the_answer(gym_server):
    base = f"http://127.0.0.1:{gym_server.http_port}"
    body = verify_body({"question": "q", "text": "nan", "token_ids": [1], "expected_answer": ""})
    status, answer = asyncio.run(_post(f"{base}/rewards/flaky/verify", body))
    assert status == 200 and answer["reward"] == -1.0  # http.failure_reward: NeMo Gym requires a number
    assert answer["grpcgrade_failed"] == 1 and answer["reward_components"] == {"misbehave": None}
    assert answer["grpcgrade_error"].startswith("misbehave ")
    assert gym_server.metric("grpcgrade_http_failed_samples_total", face="nemo_gym", reward="flaky") >= 1


def test_verify_refusals_name_the_problem(gym_server):
    base = f"http://127.0.0.1:{gym_server.http_port}"
    assert asyncio.run(_post(f"{base}/verify", {}, token=None))[0] == 401
    status, text = asyncio.run(_post(f"{base}/verify", {"response": {}}))
    assert status == 400 and "`responses_create_params` and `response` are required" in text
    status, text = asyncio.run(_post(f"{base}/verify", {"responses_create_params": {}, "response": {}}))
    assert status == 400 and "`response.output` is required" in text
    assert asyncio.run(_post(f"{base}/seed_session", {"responses_create_params": {}})) == (200, {})


def test_function_calls_are_chat_completions_tool_calls():
    items = [
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c9", "name": "calc", "arguments": '{"x": 1}'},
    ]
    assert tool_calls(items) == [
        {"id": "c9", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}
    ]


@pytest.mark.trainers
def test_nemo_gym_client_and_models_verify_against_the_face(gym_server, nemo_gym_python):
    args = {"host": f"gym:{TOKEN}@127.0.0.1", "port": gym_server.http_port, "rollouts": ROLLOUTS}
    run = subprocess.run([str(nemo_gym_python), str(SCRIPT)], input=json.dumps(args), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    answers = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [a["reward"] for a in answers] == direct(gym_server, "capped", ROLLOUTS)
    assert all(a["echoed"] and a["grpcgrade_failed"] == 0 for a in answers)
    assert answers[2]["reward_components"] == {"math_exact": 1.0, "completion_length_cap": 0.0}


# -- agent rollouts: the agent graders get `messages`, `tool_calls` and `tool_definitions` ---------------------

#: A calculator agent's rollout as NeMo Gym records it (tests/trainers/nemo_gym_verify.py's `agent` spec), and
#: the task's reference steps (OpenJudge's `reference_tool_calls`, a task field and so `extra`).
STEPS = [[{"function": {"name": "calc", "arguments": {"x": "8*9"}}}]]
AGENT = {"question": "What is 8*9?", "text": "The answer is 72", "token_ids": [1, 2], "expected_answer": "72",
         "agent": True, "reference_tool_calls": STEPS}  # fmt: skip
CALL = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": "8*9"}'}}
CALC = {
    "name": "calc",
    "description": "Evaluates an arithmetic expression",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
}
#: The same rollout written by hand in the OpenAI chat format (docs/agents.md): what a gRPC caller sends.
AGENT_SAMPLE = {
    "query": AGENT["question"],
    "response": AGENT["text"],
    "reference": "72",
    "completion_tokens": 2,
    "messages": [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": AGENT["question"]},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "72"},
        {"role": "assistant", "content": AGENT["text"]},
    ],
    "tool_calls": [CALL],
    "tool_definitions": [{"type": "function", "function": CALC}],
    "extra": {"reference_tool_calls": AGENT["reference_tool_calls"], "level": "easy"},
}


def agent_body() -> dict:
    """`AGENT` as NeMo Gym's agent posts it: the tool in the request, the call and its output in the output."""
    body = verify_body(AGENT)
    body["responses_create_params"]["input"][0]["content"] = "Answer with a number."
    body["responses_create_params"]["tools"] = [{"type": "function", **CALC, "strict": True}]
    call = {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": '{"x": "8*9"}'}
    output = {"type": "function_call_output", "call_id": "c1", "output": "72"}
    body["response"]["output"][:0] = [call, output]
    body["reference_tool_calls"] = AGENT["reference_tool_calls"]
    return body


def direct_components(srv, reward: str, sample: dict) -> dict[str, float]:
    with srv.client(token=TOKEN) as client:
        reply = client.evaluate(sample, reward=reward)
    assert not any(r.HasField("error") for r in reply.results), reply
    return {r.key or r.grader: r.score for r in reply.results}


def test_an_agent_rollout_reaches_the_agent_graders_as_messages_and_tool_calls(gym_server):
    """The components equal gRPC grading of the same rollout written by hand in the chat format; before the
    face passed `messages`, each of these graders answered INVALID_SAMPLE and the rollout failed."""
    expected = direct_components(gym_server, "agent", AGENT_SAMPLE)
    assert expected == {"tool_call_sequence": 1.0, "tool_call_valid": 1.0, "action_loop_detection": 1.0}
    status, answer = asyncio.run(_post(f"http://127.0.0.1:{gym_server.http_port}/rewards/agent/verify", agent_body()))
    assert status == 200 and answer["grpcgrade_failed"] == 0, answer
    assert answer["reward_components"] == expected


def test_a_conversation_over_the_field_limit_fails_only_the_rewards_that_read_it(gym_server):
    """The agent inputs are made for the graders that name them: a rollout whose conversation passes
    `max_field_chars` (1,000,000 by default) still gets its math reward; an agent reward answers that it
    is too large, as the gRPC service answers such a field."""
    base = f"http://127.0.0.1:{gym_server.http_port}"
    body = agent_body()
    body["responses_create_params"]["input"][0]["content"] = "Answer with a number. " * 50_000  # 1.1 MB
    status, answer = asyncio.run(_post(f"{base}/verify", body))
    assert (status, answer["grpcgrade_failed"]) == (200, 0)  # `capped`: no agent grader
    assert [answer["reward"]] == direct(gym_server, "capped", [AGENT])
    status, answer = asyncio.run(_post(f"{base}/rewards/agent/verify", body))
    assert status == 200 and answer["grpcgrade_failed"] == 1
    assert "INVALID_SAMPLE" in answer["grpcgrade_error"] and "max_field_chars" in answer["grpcgrade_error"]


def test_responses_items_become_chat_turns_as_nemo_gyms_converter_groups_them():
    """Parallel calls are one assistant turn with its text; a tool output or a user message ends the turn."""
    call = {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"}
    params = {"input": "hi", "instructions": "Be brief."}
    items = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        call,
        {**call, "call_id": "b"},
        {"type": "function_call_output", "call_id": "a", "output": "1"},
        {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_text", "text": "2"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "1 and 2"}]},
    ]
    as_call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert chat_messages(params, items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [{"id": "a", **as_call}, {"id": "b", **as_call}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "assistant", "content": "1 and 2"},
    ]


#: NeMo Gym's own `ResponsesConverter` (what its vLLM model server sends the policy) on a request whose input
#: is a whole rollout; prints its messages.
CONVERT = """
import json, sys
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.responses_converter import ResponsesConverter

params = NeMoGymResponseCreateParamsNonStreaming.model_validate(json.loads(sys.stdin.read()))
converted = ResponsesConverter(return_token_id_information=False).responses_to_chat_completion_create_params(params)
print(json.dumps(converted.model_dump(exclude_none=True)["messages"]))
"""


@pytest.mark.trainers
def test_nemo_gym_agent_rollouts_verify_and_convert_as_nemo_gym_does(gym_server, nemo_gym_python):
    """nemo-gym's own models post the agent rollout; and its own converter turns the same items into the
    same chat turns as the face's `chat_messages`."""
    args = {"host": f"gym:{TOKEN}@127.0.0.1", "port": gym_server.http_port, "path": "/rewards/agent/verify",
            "rollouts": [AGENT]}  # fmt: skip
    run = subprocess.run([str(nemo_gym_python), str(SCRIPT)], input=json.dumps(args), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    (answer,) = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert answer["grpcgrade_failed"] == 0 and answer["reward_components"] == direct_components(
        gym_server, "agent", AGENT_SAMPLE
    )
    body = agent_body()
    params, items = body["responses_create_params"], body["response"]["output"]
    whole = {"input": [*params["input"], *items]}
    run = subprocess.run([str(nemo_gym_python), "-c", CONVERT], input=json.dumps(whole), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    # They dump without None (an assistant turn of calls only has no `content`) and give `tool_calls: []`.
    theirs = [{k: v for k, v in m.items() if v != []} for m in json.loads(run.stdout)]
    assert [{k: v for k, v in m.items() if v is not None} for m in chat_messages(params, items)] == theirs
