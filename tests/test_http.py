"""The HTTP/JSON face, called exactly as OpenRLHF 0.11 calls a remote reward model.

`openrlhf_post` is `SingleTurnAgentExecutor._fetch_rewards_via_http` (openrlhf/utils/agent.py): a fresh
aiohttp session per request with a 180 s total timeout, `session.post(url, json=payload)` and no headers,
`raise_for_status()`, then `response.json()`.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from grpcgrade.testing import eventually

CONFIG = """
default_reward: gsm8k
http: {failure_reward: -1.0}
rewards:
  gsm8k:
    graders:
      - {name: math_exact, weight: 2}
      - {name: number_only}
  flaky:
    graders: [{name: misbehave, params: {heavy: false}}]
  exact:
    graders: [{name: string_match, params: {case_sensitive: true}}]
  napping:
    graders: [{name: napper}]
  tools:
    graders: [{name: tool_call_valid}]
"""
TOKEN = "s3cret-token"
TEMPLATE = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def http_server(face_server):
    return face_server(CONFIG, token=TOKEN)


async def openrlhf_post(url: str, data: dict) -> dict:
    timeout = aiohttp.ClientTimeout(total=180)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.post(url, json=data) as response:
        response.raise_for_status()
        return await response.json()


def post(url: str, data: dict) -> dict:
    return asyncio.run(openrlhf_post(url, data))


def authed(base: str, path: str) -> str:
    return base.replace("http://", f"http://trainer:{TOKEN}@") + path


def test_openrlhf_request_gets_rewards_scores_and_extra_logs(http_server):
    prompt = TEMPLATE.format(q="What is 8*9?")
    queries = [
        prompt + "<think>\nr\n</think>\n72<|im_end|>",
        prompt + "<think>\nr\n</think>\n71<|im_end|><|endoftext|>",
    ]
    body = {"query": queries, "prompts": [prompt, prompt], "labels": ["#### 72", "#### 72"]}
    default = post(authed(http_server.http, "/get_reward"), body)
    named = post(authed(http_server.http, "/rewards/gsm8k/get_reward"), body)
    # math_exact (x2) passes for 72 only; number_only passes for both once <|im_end|> is stripped.
    assert default["rewards"] == [pytest.approx(1.0), pytest.approx(1 / 3)]
    assert default == named
    assert default["scores"] == default["rewards"]
    assert default["extra_logs"] == {"grpcgrade_failed": [0.0, 0.0]}


def test_a_failed_sample_gets_the_failure_reward_and_a_flag(http_server):
    body = {"query": ["p-ok", "p-nan", "x-ok"], "prompts": ["p-", "p-", "p-"], "labels": ["", "", ""]}
    reply = post(authed(http_server.http, "/rewards/flaky/get_reward"), body)
    # "nan": the grader's result is not a score; "x-ok" does not start with its prompt.
    assert reply["rewards"] == [1.0, -1.0, -1.0]
    assert reply["extra_logs"]["grpcgrade_failed"] == [0.0, 1.0, 1.0]


def test_labels_of_any_json_type_are_references(http_server):
    """OpenRLHF sends its dataset's labels as they are (`label = data[label_key]`, openrlhf/datasets/
    prompts_dataset.py): a number, a list of answers, an object, null. Each is the reference as JSON text
    (null: none), as the TRL and veRL integrations take such values; before, one label that was not a string
    answered the whole request 400, and OpenRLHF's executor only logs that and leaves its samples unrewarded."""
    labels = [72, 0.5, ["4", 4], {"answer": "é"}, True, "text"]
    texts = [label if isinstance(label, str) else json.dumps(label, ensure_ascii=False) for label in labels]
    body = {"query": [*texts, "73", ""], "labels": [*labels, 72, None]}
    reply = post(authed(http_server.http, "/rewards/exact/get_reward"), body)
    # null is no reference: string_match requires one, so that sample failed rather than matched ""
    assert reply["rewards"] == [1.0] * len(labels) + [0.0, -1.0]
    assert reply["extra_logs"]["grpcgrade_failed"] == [0.0] * (len(labels) + 1) + [1.0]
    # NaN (Python's json writes it for a pandas column's missing number) is none too: it matched "NaN"
    reply = post(authed(http_server.http, "/rewards/exact/get_reward"), {"query": ["NaN"], "labels": [float("nan")]})
    assert (reply["rewards"], reply["extra_logs"]["grpcgrade_failed"]) == ([-1.0], [1.0])


def test_text_utf8_cannot_encode_fails_its_sample_only(http_server):
    """JSON may escape a lone surrogate ("\\ud800": a completion cut inside a character by a detokenizer),
    which json.loads takes and no UTF-8 string, so no protobuf message, can hold: that sample fails
    (INVALID_SAMPLE, the failure reward and its flag), in a batch and in a crowd of one-sample posts whose
    other samples the server grades together with it. (Before, the request answered 500, and so did every
    post coalesced into the same chunk.)"""
    body = {"query": ["72", "\ud800", "73", "72"], "labels": ["72", "72", "72", "7\udc80"]}
    reply = post(authed(http_server.http, "/rewards/exact/get_reward"), body)
    assert reply["rewards"] == [1.0, -1.0, 0.0, -1.0]
    assert reply["extra_logs"]["grpcgrade_failed"] == [0.0, 1.0, 0.0, 1.0]

    async def crowd() -> list[dict]:
        url = authed(http_server.http, "/rewards/exact/get_reward")
        bodies = [{"query": ["\ud800" if k % 5 == 2 else f"{k}"], "labels": [f"{k}"]} for k in range(20)]
        return await asyncio.gather(*(openrlhf_post(url, b) for b in bodies))

    replies = asyncio.run(crowd())
    assert [r["rewards"][0] for r in replies] == [-1.0 if k % 5 == 2 else 1.0 for k in range(20)]
    assert "field 'response': text that UTF-8 cannot encode" in http_server.log()


def test_a_sample_that_cannot_be_graded_is_logged_and_counted(http_server):
    """A query that does not start with its prompt (a tokenizer that does not round-trip the prompt) and a
    request without labels for a reward that compares with one: failed samples, each counted per face, and
    the server log says why."""
    counted = http_server.metric("grpcgrade_http_unusable_samples_total", face="openrlhf")
    prompt = TEMPLATE.format(q="What is 8*9?")
    body = {"query": [prompt + "72", " " + prompt + "72"], "prompts": [prompt, prompt], "labels": ["72", "72"]}
    reply = post(authed(http_server.http, "/get_reward"), body)
    assert reply["extra_logs"]["grpcgrade_failed"] == [0.0, 1.0]
    no_labels = post(authed(http_server.http, "/get_reward"), {"query": ["72", "72"]})
    assert no_labels["extra_logs"]["grpcgrade_failed"] == [1.0, 1.0]
    assert http_server.metric("grpcgrade_http_unusable_samples_total", face="openrlhf") == counted + 3
    log = http_server.log()
    assert "openrlhf face: 1 of 2 samples could not be graded" in log and "does not start with its prompt" in log
    assert "missing input 'reference'" in log and "math_exact" in log


def test_bearer_header_also_authenticates(http_server):
    async def go(headers):
        async with aiohttp.ClientSession() as session:
            body = {"query": ["ok"]}
            async with session.post(http_server.http + "/rewards/flaky/get_reward", json=body, headers=headers) as r:
                return r.status, await r.text()

    assert asyncio.run(go({"Authorization": f"Bearer {TOKEN}"}))[0] == 200
    status, text = asyncio.run(go({}))
    assert status == 401 and "token" in text
    assert asyncio.run(go({"Authorization": "Bearer wrong"}))[0] == 401
    bad_password = http_server.http.replace("http://", "http://trainer:nope@") + "/get_reward"
    with pytest.raises(aiohttp.ClientResponseError) as err:
        post(bad_password, {"query": ["x"]})
    assert err.value.status == 401


def test_bad_requests_are_named(http_server):
    async def go(path, **kw):
        async with aiohttp.ClientSession() as session, session.post(authed(http_server.http, path), **kw) as r:
            return r.status, await r.text()

    assert asyncio.run(go("/rewards/gsm9k/get_reward", json={"query": []})) == (
        404,
        "unknown reward 'gsm9k'; did you mean 'gsm8k'?; "
        "configured rewards: 'exact', 'flaky', 'gsm8k', 'napping', 'tools'",
    )
    status, text = asyncio.run(go("/get_reward", json={"query": ["a"], "prompts": ["a", "b"]}))
    assert status == 400 and "`prompts` has 2 items but `query` has 1" in text
    status, text = asyncio.run(go("/get_reward", data=b"{not json"))
    assert (status, text) == (400, "the request body is not valid JSON")
    status, text = asyncio.run(go("/get_reward", json={"prompts": []}))
    assert status == 400 and "`query` is required" in text
    status, text = asyncio.run(go("/get_reward", json={"query": ["a"], "labels": "a"}))
    assert status == 400 and "`labels` must be a list" in text
    status, text = asyncio.run(go("/get_reward", json={"query": ["a"], "labels": ["a", "b"]}))
    assert status == 400 and "`labels` has 2 items but `query` has 1" in text
    # a `cache` that is a list or an object (not hashable): was a 500
    for cache in ([], {"mode": "on"}):
        status, text = asyncio.run(go("/get_reward", json={"query": ["a"], "cache": cache}))
        assert status == 400 and "`cache` must be one of" in text
    # JSON nested past the interpreter's recursion limit (within the body size limit): was a 500
    deep = b"[" * 50_000 + b"]" * 50_000
    status, text = asyncio.run(go("/get_reward", data=b'{"query": ["x"], "labels": ' + deep + b"}"))
    assert (status, text) == (400, "the request body is nested more than 100 levels deep")


def test_http_requests_are_counted_in_the_shared_metrics(http_server):
    before = http_server.metric("grpcgrade_http_requests_total", face="openrlhf", code="200")
    post(authed(http_server.http, "/get_reward"), {"query": ["1"], "labels": ["1"]})
    assert http_server.metric("grpcgrade_http_requests_total", face="openrlhf", code="200") == before + 1
    assert http_server.metric("grpcgrade_evaluations_total", grader="number_only") >= 1


def test_a_request_its_client_gave_up_on_stops_grading_and_counts_as_499(http_server):
    """OpenRLHF gives up on a request after its timeout and posts it again, up to five times. The request it
    left (napper hangs on "hang") stops grading and is counted 499. Before, it graded on to an answer nobody
    read (here: until the grader's time limit, then a 200)."""
    url = authed(http_server.http, "/rewards/napping/get_reward")
    before = http_server.metric("grpcgrade_http_requests_total", code="499")

    async def give_up() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as session:
            with pytest.raises(asyncio.TimeoutError):
                async with session.post(url, json={"query": ["hang"], "labels": [None]}) as response:
                    await response.json()

    asyncio.run(give_up())
    counted = lambda: http_server.metric("grpcgrade_http_requests_total", code="499") != before  # noqa: E731
    eventually(counted, "the abandoned request counted")
    assert http_server.metric("grpcgrade_http_requests_total", code="499") == before + 1


def test_openai_grader_endpoints_are_mounted_on_the_same_port(http_server):
    from grpcgrade.service.http.openai_graders import MOUNT_PATH

    grader = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}", "reference": "x"}
    grader["operation"] = "eq"

    async def go(headers):
        async with aiohttp.ClientSession() as session:
            url = f"{http_server.http}{MOUNT_PATH}/validate"
            async with session.post(url, json={"grader": grader}, headers=headers) as r:
                return r.status, await r.json()

    refused = http_server.metric("grpcgrade_http_requests_total", face="openai_graders", code="401")
    status, body = asyncio.run(go({"Authorization": f"Bearer {TOKEN}"}))
    assert status == 200 and body == {"grader": grader}
    status, body = asyncio.run(go({}))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"  # OpenAI's error object, its own auth
    # counted under its own face, a refused request too
    assert http_server.metric("grpcgrade_http_requests_total", face="openai_graders", code="401") == refused + 1


def test_agent_inputs_travel_per_sample(http_server):
    """The body's `tool_calls` and `tool_definitions` (docs/agents.md): one entry per query, null for none."""
    weather = {"name": "weather", "parameters": {"type": "object", "required": ["city"]}}
    good = {"type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    bad = {"type": "function", "function": {"name": "weather", "arguments": "{}"}}
    body = {
        "query": ["a", "b", "c"],
        "tool_calls": [[good], [bad], None],
        "tool_definitions": [[weather], [weather], [weather]],
    }
    reply = post(authed(http_server.http, "/rewards/tools/get_reward"), body)
    # valid; a defined tool with arguments its schema refuses (half credit); no tool_calls sent: INVALID_SAMPLE
    assert reply["rewards"] == [1.0, 0.5, -1.0]
    assert reply["extra_logs"]["grpcgrade_failed"] == [0.0, 0.0, 1.0]


def test_bad_agent_inputs_are_named(http_server):
    async def status(body: dict) -> tuple[int, str]:
        url = authed(http_server.http, "/rewards/tools/get_reward")
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as r:
            return r.status, await r.text()

    assert asyncio.run(status({"query": ["a"], "tool_calls": [[], []]})) == (
        400,
        "`tool_calls` must be a list with one entry per sample (1)",
    )
    assert asyncio.run(status({"query": ["a"], "messages": ["hi"]})) == (
        400,
        "`messages[0]` must be a list (or null), not str",
    )
