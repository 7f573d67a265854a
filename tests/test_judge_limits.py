"""LLM judges against a real endpoint that enforces a provider's request limit (grpcgrade.fake_judge: 429 with
Retry-After past it, a long tail on request): paced under the limit, retried within the sample's time, shared
between callers by weight, and counted. Real server, real HTTP; assertions on counts and order, never on time.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml

from grpcgrade.fake_judge import COMPLETION_TOKENS, SLOW_MARKER
from grpcgrade.service.convert import sample_to_pb, specs_to_pb
from grpcgrade.testing import ServerProcess, free_port, start_server
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

RPM = 600  # 10 a second, a burst of 10
TPM = 120_000  # 2,000 tokens a second, a burst of 2,000: about 7 judgments of llm_rubric's prompt


class Endpoint:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "grpcgrade.fake_judge", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd)
        for _ in range(400):
            try:
                self.stats()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the fake judge did not start")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=10) as reply:
            return json.load(reply)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def endpoints() -> Iterator[dict[str, Endpoint]]:
    made = {
        "paced": Endpoint("--requests-per-minute", str(RPM), "--slow-seconds", "10"),
        "shared": Endpoint("--requests-per-minute", str(RPM)),
        "unpaced": Endpoint("--requests-per-minute", str(RPM)),
        "tight": Endpoint("--requests-per-minute", "60"),
        "tokens": Endpoint("--requests-per-minute", "0", "--tokens-per-minute", str(TPM)),
        "tokens_unpaced": Endpoint("--requests-per-minute", "0", "--tokens-per-minute", str(TPM)),
        # no limit; its slow judgments outlast any test, so a step budget cuts them whatever the load
        "held": Endpoint("--requests-per-minute", "0", "--slow-seconds", "600"),
    }
    yield made
    for endpoint in made.values():
        endpoint.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, endpoints: dict[str, Endpoint]) -> Iterator[ServerProcess]:
    workdir: Path = tmp_path_factory.mktemp("judges")
    limited = {"requests_per_minute": RPM, "max_concurrency": 256, "timeout_seconds": 60, "max_retries": 0}
    config = {
        "grader_timeout_seconds": 120,
        "models": {
            "paced": {"base_url": endpoints["paced"].base_url, **limited},
            "shared": {"base_url": endpoints["shared"].base_url, **limited},
            # the same endpoint limit, not declared: what pacing saves
            "unpaced": {"base_url": endpoints["unpaced"].base_url, "max_concurrency": 256, "max_retries": 0},
            # declared 100 times what the endpoint allows: 429s, and samples whose time runs out
            "tight": {"base_url": endpoints["tight"].base_url, "requests_per_minute": 6000, "max_concurrency": 64},
            "tokens": {"base_url": endpoints["tokens"].base_url, "tokens_per_minute": TPM, "max_concurrency": 256},
            "tokens_unpaced": {"base_url": endpoints["tokens_unpaced"].base_url, "max_concurrency": 256},
            "held": {"base_url": endpoints["held"].base_url, "max_concurrency": 256, "max_retries": 0},
            "priced": {
                "base_url": endpoints["paced"].base_url,
                "requests_per_minute": RPM,
                "price_per_million_input_tokens": 2.5,
                "price_per_million_output_tokens": 10,
            },
        },
        "callers": {"light": {"weight": 3}, "heavy": {"weight": 1}},
        "rewards": {
            "judged": {"graders": [{"name": "llm_rubric", "params": {"rubric": "Polite?", "model": "priced"}}]}
        },
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    proc = start_server(workdir, "--config", "config.yaml", "--workers", "1", http=True)
    yield proc
    proc.stop()


def rubric(model: str) -> list[dict[str, Any]]:
    return [{"name": "llm_rubric", "params": {"rubric": "Is it polite?", "model": model}}]


def samples(tag: str, n: int, extra: str = "") -> list[dict[str, str]]:
    """Distinct samples (the result cache would answer repeats) with the endpoint's markers in them."""
    return [{"query": f"q {tag} {i} {time.time_ns()}", "response": f"CALLER-{tag} SCORE-4 {extra}"} for i in range(n)]


def codes(replies: list[Any]) -> list[str]:
    return [r.results[0].error.code if r.results[0].HasField("error") else "ok" for r in replies]


def most_in_any_second(log: list[list[Any]], weighed: bool = False) -> int:
    """The most answers (or, `weighed`, tokens) the endpoint logged within any one second (its own clock)."""
    return max((sum(w if weighed else 1 for u, w in log if t <= u < t + 1.0) for t, _ in log), default=0)


def test_judgments_are_paced_under_the_limit_and_all_made(server: ServerProcess, endpoints) -> None:
    with server.client(caller="pacing") as client:
        replies = client.batch_evaluate(samples("pacing", 50), rubric("paced"))
    assert codes(replies) == ["ok"] * 50
    assert [r.results[0].score for r in replies] == [4.0] * 50
    stats = endpoints["paced"].stats()
    assert stats["answered"] == 50
    assert stats["throttled"] <= 3  # clock jitter between the two buckets at most
    assert most_in_any_second(stats["log"]) <= RPM / 60 + 10 + 1  # the rate plus one burst (and a boundary)
    assert server.metric("grpcgrade_judge_requests_total", model="paced", caller="pacing") == 50 + stats["throttled"]


def test_judgments_are_paced_under_the_token_limit_by_estimates_the_answers_correct(
    server: ServerProcess, endpoints
) -> None:
    """Only tokens are limited. Each request's tokens are estimated before it is sent (its prompt's
    characters, plus 256 completion tokens until answers say otherwise) and corrected when its answer
    reports its usage: the endpoint, which counts the JSON of the messages, sees its limit kept."""
    with server.client(caller="tokens") as client:
        replies = client.batch_evaluate(samples("tokens", 40), rubric("tokens"))
    assert codes(replies) == ["ok"] * 40
    stats = endpoints["tokens"].stats()
    assert stats["answered"] == 40
    assert stats["throttled"] <= 3
    assert most_in_any_second(stats["tokens_log"], weighed=True) <= 2 * TPM / 60 + 300  # rate + burst (+ one)
    reported = sum(tokens for _, tokens in stats["tokens_log"])
    counted = server.metric("grpcgrade_judge_tokens_total", model="tokens")
    assert counted == reported
    with server.client(caller="tokens") as client:  # the same burst, the limit not declared: 429s
        assert codes(client.batch_evaluate(samples("tokens", 40), rubric("tokens_unpaced"))) == ["ok"] * 40
    assert endpoints["tokens_unpaced"].stats()["throttled"] >= 10


def test_without_declared_limits_the_same_burst_meets_429s(server: ServerProcess, endpoints) -> None:
    """The check above can fail: the endpoint does turn a burst away, and the retries still get every judgment."""
    with server.client(caller="unpaced") as client:
        replies = client.batch_evaluate(samples("unpaced", 50), rubric("unpaced"))
    assert codes(replies) == ["ok"] * 50  # 429s are retried after Retry-After, beyond max_retries: 0
    stats = endpoints["unpaced"].stats()
    assert stats["throttled"] >= 20
    assert server.metric("grpcgrade_judge_throttled_total", model="unpaced", code="429") == stats["throttled"]
    assert server.metric("grpcgrade_judge_retries_total", model="unpaced") >= stats["throttled"]


def test_slow_judgments_hold_no_other_judgment(server: ServerProcess, endpoints) -> None:
    """Two judgments the endpoint answers after 10 s, sent first: the 20 others, sent after them, are all
    answered while they are out (the endpoint logs each answer as it is given)."""
    batch = samples("slow", 2, SLOW_MARKER) + samples("fast", 20)
    before = len(endpoints["paced"].stats()["log"])
    with server.client(caller="slowmix") as client:
        replies = client.batch_evaluate(batch, rubric("paced"))
    assert codes(replies) == ["ok"] * 22
    answered = [marker for _, marker in endpoints["paced"].stats()["log"][before:]]
    assert answered == ["fast"] * 20 + ["slow"] * 2


def test_two_callers_share_a_model_by_weight(server: ServerProcess, endpoints) -> None:
    """`light` (weight 3) and `heavy` (weight 1) each send 60 judgments at once: while both wait, the
    endpoint answers three of light's for each of heavy's, and heavy is never starved."""
    done: dict[str, list[str]] = {}
    start = threading.Barrier(2)

    def send(caller: str) -> None:
        with server.client(caller=caller) as client:
            start.wait()
            done[caller] = codes(client.batch_evaluate(samples(caller, 60), rubric("shared")))

    threads = [threading.Thread(target=send, args=(caller,)) for caller in ("heavy", "light")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done == {"heavy": ["ok"] * 60, "light": ["ok"] * 60}
    order = [caller for _, caller in endpoints["shared"].stats()["log"]]
    assert len(order) == 120
    # Past the first burst (whoever came first took it) and up to the 60th answer, both still have work waiting.
    window = order[20:60]
    light = window.count("light")
    assert 25 <= light <= 35, window  # 3:1 of 40 is 30
    assert window.count("heavy") >= 5
    assert server.metric("grpcgrade_judge_requests_total", model="shared", caller="light") >= 60
    assert server.metric("grpcgrade_judge_requests_total", model="shared", caller="heavy") >= 60


def test_a_sample_whose_time_runs_out_while_rate_limited_is_rate_limited(server: ServerProcess, endpoints) -> None:
    """The endpoint allows 1 a second, the model declares 100: 20 judgments with 3 s each meet 429s, and
    those that cannot be judged in their time are RATE_LIMITED, never GRADER_FAILED."""
    with server.client(caller="tight") as client:
        replies = client.batch_evaluate(samples("tight", 20), rubric("tight"), grader_timeout=3)
    got = codes(replies)
    assert set(got) <= {"ok", "RATE_LIMITED"}
    assert got.count("RATE_LIMITED") >= 5  # at most ~1 + 3 a second can be judged in the 3 s
    assert got.count("ok") == endpoints["tight"].stats()["answered"]
    limited = [r.results[0].error.message for r in replies if r.results[0].HasField("error")]
    assert all("rate limits held it back" in m for m in limited)
    assert server.metric("grpcgrade_judge_rate_limited_total", model="tight", caller="tight") == got.count(
        "RATE_LIMITED"
    )
    assert server.metric("grpcgrade_grader_errors_total", grader="llm_rubric", code="RATE_LIMITED") >= 5


def test_tokens_and_cost_are_counted_per_model_and_caller(server: ServerProcess, endpoints) -> None:
    with server.client(caller="accounting") as client:
        replies = client.batch_evaluate(samples("accounting", 5), rubric("priced"))
    usage = [r.results[0].metadata["usage"] for r in replies]
    tokens_in = sum(u["prompt_tokens"] for u in usage)
    tokens_out = sum(u["completion_tokens"] for u in usage)
    assert tokens_out == 5 * COMPLETION_TOKENS
    labels = {"model": "priced", "caller": "accounting"}
    assert server.metric("grpcgrade_judge_tokens_total", direction="in", **labels) == tokens_in
    assert server.metric("grpcgrade_judge_tokens_total", direction="out", **labels) == tokens_out
    cost = (tokens_in * 2.5 + tokens_out * 10) / 1e6
    assert server.metric("grpcgrade_judge_cost_total", **labels) == pytest.approx(cost)
    assert server.metric("grpcgrade_judge_latency_seconds_count", **labels) == 5
    assert server.metric("grpcgrade_judge_queue_wait_seconds_count", **labels) == 5


def streamed(server: ServerProcess, batch: list[dict[str, str]], model: str, **fields: Any) -> list[Any]:
    """The items one BatchEvaluate call streams back, in the order they arrive (chunks of 10 samples)."""
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb(rubric(model)), samples=[sample_to_pb(s) for s in batch], chunk_size=10, **fields
    )
    with grpc.insecure_channel(server.target) as channel:
        stream = pb_grpc.GradingServiceStub(channel).BatchEvaluate(request, timeout=60)
        return [item for message in stream for item in message.items]


def test_slow_judgments_hold_back_no_other_sample_in_their_chunk_or_behind_it(server: ServerProcess) -> None:
    """Samples 0 and 10, the first of the first two chunks, are judged in 10 s, the 38 others at once: all
    38 come back before either slow one (each sample is handed on when its judgment is in)."""
    batch = [samples("slow", 1, SLOW_MARKER)[0] if i in (0, 10) else samples("fast", 1)[0] for i in range(40)]
    items = streamed(server, batch, "paced")
    assert sorted(i.index for i in items) == list(range(40))
    assert {i.index for i in items[-2:]} == {0, 10}
    assert all(not i.result.results[0].HasField("error") for i in items)


def test_a_step_budget_cuts_only_the_judgments_still_unanswered(server: ServerProcess) -> None:
    """The same batch under a 4 s step budget: the two slow judgments alone are BUDGET_EXCEEDED. Judged by a
    model without a request limit, whose slow judgments never end within the test: through the paced one,
    the 38 fast judgments took 3.8 s of pacing once the test before had spent its burst, and under load
    some ran past the budget."""
    batch = [samples("slow", 1, SLOW_MARKER)[0] if i in (0, 10) else samples("fast", 1)[0] for i in range(40)]
    items = streamed(server, batch, "held", budget_seconds=4.0)
    assert sorted(i.index for i in items) == list(range(40))  # each sample answered exactly once
    errors = {i.index: i.result.results[0].error.code for i in items if i.result.results[0].HasField("error")}
    assert errors == {0: "BUDGET_EXCEEDED", 10: "BUDGET_EXCEEDED"}


def test_the_http_face_takes_the_caller_from_its_header(server: ServerProcess) -> None:
    """OpenRLHF's reward route with `X-Grpcgrade-Caller`: its judgments count under that caller."""
    body = {"query": [f"q {time.time_ns()} CALLER-web SCORE-2"], "prompts": ["q"], "labels": [""]}
    request = urllib.request.Request(
        f"{server.http}/rewards/judged/get_reward",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Grpcgrade-Caller": "web-trainer"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert json.load(reply)["rewards"] == [2.0]
    assert server.metric("grpcgrade_judge_requests_total", model="priced", caller="web-trainer") == 1


def test_one_sample_posts_of_two_callers_are_judged_each_under_its_own_caller(server: ServerProcess) -> None:
    """Concurrent one-sample posts of one plan are coalesced by the HTTP face into chunks; each sample's
    judgment still counts (and queues) under its own post's caller. Before, a chunk carried the caller of
    the call that started it to the engine, and every sample in it was judged as that caller's."""
    callers = [f"pair-{tag}-{time.time_ns()}" for tag in ("a", "b")]

    async def post(session: aiohttp.ClientSession, caller: str, i: int) -> float:
        body = {"query": [f"q {caller} {i} {time.time_ns()} SCORE-3"]}
        async with session.post(
            f"{server.http}/rewards/judged/get_reward", json=body, headers={"X-Grpcgrade-Caller": caller}
        ) as reply:
            assert reply.status == 200, await reply.text()
            return (await reply.json())["rewards"][0]

    async def together() -> list[float]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            return await asyncio.gather(*(post(session, callers[i % 2], i) for i in range(8)))

    assert asyncio.run(together()) == [3.0] * 8
    for caller in callers:
        assert server.metric("grpcgrade_judge_requests_total", model="priced", caller=caller) == 4
