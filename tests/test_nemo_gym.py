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
from grpcgrade.service.http.nemo_gym import tool_calls
from grpcgrade.testing import free_port, start_server

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
def gym_server(tmp_path_factory, plugin_env):
    tmp = tmp_path_factory.mktemp("gym")
    (tmp / "config.yaml").write_text(CONFIG)
    (tmp / "tokens").write_text(TOKEN + "\n")
    port = free_port()
    args = ["--workers", "0", "--config", "config.yaml", "--auth-token-file", "tokens", "--http-port", str(port)]
    srv = start_server(tmp, *args, env=plugin_env)
    srv.http_port = port  # type: ignore[attr-defined]
    yield srv
    srv.stop()


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


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), keys  # an answer whose object repeats a key
    return dict(pairs)


@pytest.mark.parametrize("own_reward", [False, True])
def test_a_large_rollout_is_echoed_whole_with_one_of_each_key(gym_server, own_reward):
    """A rollout past the inline-parse size (a large task field): walked off the event loop, and answered
    with the request's own bytes and the answer's keys appended; a request that already holds one of those
    keys is encoded again instead, so the answer never repeats a key and the answer's value wins."""
    body = {**verify_body(ROLLOUTS[0]), "notes": "n" * 50_000}
    if own_reward:
        body["reward"] = 5.0
    expected = direct(gym_server, "capped", ROLLOUTS[:1])

    async def post() -> tuple[int, str]:
        url, headers = f"http://127.0.0.1:{gym_server.http_port}/verify", {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as r:
            return r.status, await r.text()

    status, text = asyncio.run(post())
    assert status == 200, text
    answer = json.loads(text, object_pairs_hook=unique_keys)
    assert answer["reward"] == expected[0] == 1.0
    assert {k: answer[k] for k in body if k != "reward"} == {k: v for k, v in body.items() if k != "reward"}
    assert answer["grpcgrade_failed"] == 0


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
