"""The slime face, called exactly as slime calls a remote reward model (slime is not on PyPI).

`slime_remote_rm` is slime's `remote_rm` (THUDM/slime, slime/rollout/rm_hub/__init__.py): one shared aiohttp
session (`TCPConnector(limit=64)`, `ClientTimeout(total=120)`), `session.post(args.rm_url, json={"prompt",
"response", "label"})`, `raise_for_status()`, and the JSON body itself is the sample's reward; with
`--reward-key KEY`, slime reads `reward[KEY]` (`Sample.get_reward_value`).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from grpcgrade.core.tokens import count_tokens

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
  capped:
    graders:
      - {name: math_exact}
      - {name: completion_length_cap, params: {max_completion_tokens: 8}, gate: true}
  counted:
    tokenizer: tiktoken:cl100k_base
    graders:
      - {name: math_exact}
      - {name: completion_length_cap, params: {max_completion_tokens: 8}, gate: true}
"""
TOKEN = "slime-token"
SAMPLES = [  # (prompt, response, label) as slime's Sample holds them
    ("What is 8*9?", "<think>r</think>72", "72"),
    ("What is 8*9?", "The answer is 71", 72),  # a numeric label, as a dataset column gives it
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 8*9?"}], "72", "72"),
]


@pytest.fixture(scope="module")
def slime_server(face_server):
    srv = face_server(CONFIG, token=TOKEN)
    srv.rm_url = srv.http.replace("http://", f"http://slime:{TOKEN}@")  # slime's --rm-url, with the token
    return srv


async def slime_remote_rm(rm_url: str, samples: list[tuple], reward_key: str | None = None) -> list:
    """slime's remote_rm for every sample, concurrently as `batched_async_rm` gathers them."""
    connector = aiohttp.TCPConnector(limit=64, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(prompt, response, label):
            payload = {"prompt": prompt, "response": response, "label": label}
            async with session.post(rm_url, json=payload) as resp:
                resp.raise_for_status()
                reward = await resp.json()
            return reward if not reward_key else reward[reward_key]

        return await asyncio.gather(*(one(*s) for s in samples))


def direct(srv, reward: str, samples: list[tuple]) -> list[float | None]:
    """The same samples graded over gRPC: the rewards the face must answer."""
    rows = []
    for prompt, response, label in samples:
        query = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        rows.append({"query": query, "response": response, "reference": str(label)})
    with srv.client(token=TOKEN) as client:
        return client.batch_scores(rows, reward=reward).rewards


def test_slime_rewards_equal_direct_grading(slime_server):
    named = asyncio.run(slime_remote_rm(f"{slime_server.rm_url}/rewards/gsm8k/slime", SAMPLES))
    default = asyncio.run(slime_remote_rm(f"{slime_server.rm_url}/slime", SAMPLES))
    expected = direct(slime_server, "gsm8k", SAMPLES)
    assert named == default == pytest.approx(expected)
    assert all(type(r) is float for r in named)  # the body is the reward itself, a JSON number
    assert named[0] == pytest.approx(1.0) and named[1] == pytest.approx(0.0)  # graded, not all one value


def test_a_failed_sample_is_the_failure_value_counted_and_flagged_in_the_dict_form(slime_server):
    samples = [("p", "ok", ""), ("p", "nan", "")]  # misbehave: "nan" is not a score
    before = slime_server.metric("grpcgrade_http_failed_samples_total", face="slime", reward="flaky")
    rewards = asyncio.run(slime_remote_rm(f"{slime_server.rm_url}/rewards/flaky/slime", samples))
    assert rewards == [1.0, -1.0]  # http.failure_reward: slime cannot mask a sample
    assert direct(slime_server, "flaky", samples) == [1.0, None]
    after = slime_server.metric("grpcgrade_http_failed_samples_total", face="slime", reward="flaky")
    assert after == before + 1
    log = slime_server.log_path.read_text()
    assert "slime face: 1 of 1 samples of reward 'flaky' failed (answered as the face's failure value)" in log
    url = f"{slime_server.rm_url}/rewards/flaky/slime?form=dict"
    assert asyncio.run(slime_remote_rm(url, samples, reward_key="reward")) == [1.0, -1.0]

    async def whole(sample):
        async with aiohttp.ClientSession() as session:
            body = {"prompt": sample[0], "response": sample[1], "label": sample[2]}
            async with session.post(url, json=body) as resp:
                return await resp.json()

    ok, failed = (asyncio.run(whole(s)) for s in samples)
    assert ok == {"reward": 1.0, "grpcgrade_failed": 0, "graders": {"misbehave": 1.0}}
    assert failed["grpcgrade_failed"] == 1 and failed["graders"] == {"misbehave": None}
    assert failed["error"].startswith("misbehave ")


def test_slime_requests_are_refused_clearly(slime_server):
    base = slime_server.rm_url.replace(f"slime:{TOKEN}@", "")

    async def go(url, **kwargs):
        async with aiohttp.ClientSession() as session, session.post(url, **kwargs) as r:
            return r.status, await r.text()

    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert asyncio.run(go(f"{base}/slime", json={"response": "1"}))[0] == 401
    status, text = asyncio.run(go(f"{base}/slime", json={"prompt": "q"}, headers=auth))
    assert (status, text) == (400, "`response` is required: a string")
    status, text = asyncio.run(go(f"{base}/slime?form=list", json={"response": "1"}, headers=auth))
    assert status == 400 and "`form` must be one of number, dict" in text
    status, text = asyncio.run(go(f"{base}/rewards/gsm9k/slime", json={"response": "1"}, headers=auth))
    assert status == 404 and "unknown reward 'gsm9k'" in text
    status, text = asyncio.run(go(f"{base}/slime?budget_seconds=soon", json={"response": "1"}, headers=auth))
    assert (status, text) == (400, "`budget_seconds` must be a number")
    assert slime_server.metric("grpcgrade_http_requests_total", face="slime", code="400") >= 3


def test_a_length_gate_counts_with_the_configured_tokenizer_or_is_refused(slime_server):
    samples = [
        ("What is 8*9?", "<think>r</think>72", "72"),
        ("What is 8*9?", "<think>" + "hm " * 9 + "</think>72", "72"),
    ]
    counts = [count_tokens(response, "tiktoken:cl100k_base") for _, response, _ in samples]
    assert counts[0] <= 8 < counts[1]  # the gate's cap, between them
    rows = [
        {"query": q, "response": r, "reference": a, "completion_tokens": c}
        for (q, r, a), c in zip(samples, counts, strict=True)
    ]
    with slime_server.client(token=TOKEN) as client:
        expected = client.batch_scores(rows, reward="capped").rewards
    assert expected == [1.0, 0.0]
    assert asyncio.run(slime_remote_rm(f"{slime_server.rm_url}/rewards/counted/slime", samples)) == expected

    async def refused():
        async with aiohttp.ClientSession() as session:
            url = f"{slime_server.rm_url}/rewards/capped/slime"
            async with session.post(url, json={"prompt": "q", "response": "72", "label": "72"}) as resp:
                return resp.status, await resp.text()

    status, text = asyncio.run(refused())
    assert status == 400 and "slime's remote reward model never sends" in text and "--tokenizer" in text
