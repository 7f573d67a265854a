"""The reward guard's options through the clients and the trainer adapters (TRL, veRL, OpenRLHF's HTTP),
against real servers on loopback: what the options do is asserted on the answers, and where the server
has nothing to show yet (the cache mode), on the requests a real gRPC server received."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent import futures

import aiohttp
import grpc
import pytest
from budgets import BUDGET, doubling

from grpcgrade.client import AsyncGradingClient, FailureBudgetExceeded, GradingClient
from grpcgrade.core.config import parse_http
from grpcgrade.core.errors import ConfigError
from grpcgrade.integrations.trl import async_reward_function, reward_function
from grpcgrade.integrations.verl import FAILED_KEY, compute_score
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

CHEAP = [{"name": "misbehave", "params": {"heavy": False}}]
OK, HANG, NAN = "ok", "hang", "nan"  # misbehave: 1.0, a loop that never ends, INVALID_RESULT


def responses(values: list[str]) -> list[dict]:
    return [{"response": v} for v in values]


def outcome(result: pb.EvaluateResponse) -> object:
    r = result.results[0]
    return r.error.code if r.HasField("error") else r.score


# -- the clients -----------------------------------------------------------------------------------------


def test_the_budget_is_the_whole_calls_not_each_chunks(server):
    """Chunks of 2, one at a time: the second chunk hangs until the budget is spent, so the third, sent
    after it, has no time left and comes back BUDGET_EXCEEDED although its samples are quick."""
    samples = responses([OK, OK, OK, HANG, OK, OK])
    with GradingClient(server.target, chunk_size=2, max_in_flight=1, timeout=60) as client:
        got = doubling(lambda b: [outcome(r) for r in client.batch_evaluate(samples, CHEAP, budget_seconds=b)], cut(3))
    assert got == [1.0, 1.0, 1.0] + ["BUDGET_EXCEEDED"] * 3


def test_a_budget_longer_than_the_timeout_still_answers_the_graded_samples(server):
    """veRL's reward_kwargs as the docs once gave them (timeout 60, budget 120), scaled down: the call's
    deadline moves past the budget, so the budget cuts the hanging sample and the others keep their scores.
    Before, the deadline ended the call first and every sample raised DEADLINE_EXCEEDED."""
    samples = responses([OK, HANG])
    with GradingClient(server.target, timeout=0.5) as client:
        got = doubling(lambda b: [outcome(r) for r in client.batch_evaluate(samples, CHEAP, budget_seconds=b)], cut(1))
        assert got == [1.0, "BUDGET_EXCEEDED"]
        table = doubling(
            lambda b: client.batch_scores(samples, CHEAP, budget_seconds=b), lambda t: t.rewards[0] is None
        )
        assert table.rewards == [1.0, None]
    got = doubling(lambda b: [outcome(r) for r in asyncio.run(_async_batch(server.target, 0.5, b))], cut(1))
    assert got == [1.0, "BUDGET_EXCEEDED"]


async def _async_batch(target: str, timeout: float, budget: float) -> list[pb.EvaluateResponse]:
    async with AsyncGradingClient(target, timeout=timeout) as client:
        return await client.batch_evaluate(responses([OK, HANG]), CHEAP, budget_seconds=budget)


def cut(quick: int) -> Callable[[list[object]], bool]:
    """Whether one of the first `quick` outcomes, samples graded before the hanging one, was cut."""
    return lambda got: "BUDGET_EXCEEDED" in got[:quick]


def test_the_async_client_takes_the_budget_too(server):
    async def go(budget: float) -> list[object]:
        async with AsyncGradingClient(server.target, chunk_size=2, max_in_flight=3, timeout=60) as client:
            return [
                outcome(r)
                for r in await client.batch_evaluate(responses([OK, OK, OK, HANG]), CHEAP, budget_seconds=budget)
            ]

    assert doubling(lambda b: asyncio.run(go(b)), cut(3)) == [1.0, 1.0, 1.0, "BUDGET_EXCEEDED"]


def test_the_failure_ratio_applies_to_each_chunk(server):
    """2 of 4 samples fail: within 0.5 as one call, but the first chunk of 2 is all failures."""
    samples = responses([NAN, NAN, OK, OK])
    with GradingClient(server.target, timeout=60) as client:
        assert len(client.batch_evaluate(samples, CHEAP, max_failure_ratio=0.5)) == 4
    with GradingClient(server.target, chunk_size=2, timeout=60) as client, pytest.raises(FailureBudgetExceeded) as err:
        client.batch_evaluate(samples, CHEAP, max_failure_ratio=0.5)
    assert isinstance(err.value, grpc.RpcError) and err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'misbehave' INVALID_RESULT x2" in err.value.details()
    assert str(err.value) == f"FAILED_PRECONDITION from {server.target}: {err.value.details()}"


def test_the_async_client_raises_the_failure_budget_too(server):
    async def go():
        async with AsyncGradingClient(server.target, timeout=60) as client:
            await client.batch_evaluate(responses([NAN, OK]), CHEAP, max_failure_ratio=0.0)

    with pytest.raises(FailureBudgetExceeded, match="1 of 2 samples failed"):
        asyncio.run(go())


def test_out_of_range_options_are_refused_naming_them(server):
    with GradingClient(server.target, timeout=60) as client:
        for kwargs, name in (
            ({"budget_seconds": -1}, "budget_seconds"),
            ({"max_failure_ratio": 2}, "max_failure_ratio"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                client.batch_evaluate(responses([OK]), CHEAP, **kwargs)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and name in err.value.details()
        with pytest.raises(ValueError, match="cache"):
            client.batch_evaluate(responses([OK]), CHEAP, cache="sometimes")


class Recorder(pb_grpc.GradingServiceServicer):
    """A real gRPC server that keeps every request it gets and scores each sample 1.0 (the result cache's
    mode has nothing else to show until the cache exists)."""

    def __init__(self) -> None:
        self.requests: list = []
        self.lock = threading.Lock()

    def _result(self, sample: pb.Sample) -> pb.EvaluateResponse:
        return pb.EvaluateResponse(id=sample.id, results=[pb.GraderResult(key="g", grader="g", score=1.0)], reward=1.0)

    def Evaluate(self, request, context):
        with self.lock:
            self.requests.append(request)
        return self._result(request.sample)

    def BatchEvaluate(self, request, context):
        with self.lock:
            self.requests.append(request)
        samples = list(request.samples) or [pb.Sample(id=i) for i in request.columns.id or request.columns.response]
        items = [pb.BatchItem(index=i, result=self._result(s)) for i, s in enumerate(samples)]
        yield pb.BatchEvaluateResponse(items=items)

    def ListGraders(self, request, context):
        return pb.ListGradersResponse(rewards=[pb.RewardInfo(name="r", graders=[pb.GraderSpec(name="g")])])


@pytest.fixture
def recorder():
    servicer = Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_GradingServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.target = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
    yield servicer
    server.stop(None)


def test_the_clients_fill_the_guard_fields(recorder):
    with GradingClient(recorder.target, chunk_size=2) as client:
        client.evaluate({"response": "x"}, ["g"], cache="off")
        client.batch_evaluate(responses(["a", "b", "c"]), ["g"], budget_seconds=30, max_failure_ratio=0.25, cache="on")
        client.batch_evaluate(responses(["a"]), ["g"], cache=pb.CACHE_MODE_OFF)
    unary, first, second, plain = recorder.requests
    assert unary.cache == pb.CACHE_MODE_OFF
    for part in (first, second):
        assert part.cache == pb.CACHE_MODE_ON and part.max_failure_ratio == 0.25
        assert 0 < part.budget_seconds <= 30  # the time left of the call's 30 s
    assert plain.cache == pb.CACHE_MODE_OFF and plain.budget_seconds == 0 and not plain.HasField("max_failure_ratio")


def test_the_async_clients_fill_the_guard_fields(recorder):
    async def go():
        async with AsyncGradingClient(recorder.target) as client:
            await client.evaluate({"response": "x"}, ["g"], cache="on")
            await client.batch_evaluate(responses(["a"]), ["g"], max_failure_ratio=0.0, cache="off")

    asyncio.run(go())
    unary, batch = recorder.requests
    assert unary.cache == pb.CACHE_MODE_ON
    assert batch.cache == pb.CACHE_MODE_OFF and batch.HasField("max_failure_ratio") and batch.max_failure_ratio == 0


# -- TRL -------------------------------------------------------------------------------------------------


def trl_call(func, completions: list[str]) -> list:
    return func(prompts=["q"] * len(completions), completions=completions)


def test_trl_reward_function_takes_the_budget_and_the_failure_ratio(server):
    in_budget = lambda b: trl_call(reward_function(server.target, CHEAP, budget_seconds=b, timeout=60), [OK, OK, HANG])  # noqa: E731
    assert doubling(in_budget, lambda got: None in got[:2]) == [1.0, 1.0, None]
    strict = reward_function(server.target, CHEAP, max_failure_ratio=0.0, timeout=60)
    with pytest.raises(FailureBudgetExceeded, match="misbehave"):
        trl_call(strict, [OK, NAN])
    assert trl_call(strict, [OK, OK]) == [1.0, 1.0]


def test_trl_async_reward_function_takes_them_too(server):
    def in_budget(budget: float) -> list:
        func = async_reward_function(server.target, CHEAP, budget_seconds=budget, timeout=60)
        return asyncio.run(func(prompts=["q", "q"], completions=[OK, HANG]))

    assert doubling(in_budget, lambda got: got[0] is None) == [1.0, None]


def test_trl_options_are_checked_when_the_function_is_made(server):
    for kwargs, name in (
        ({"budget_seconds": -1.0}, "budget_seconds"),
        ({"max_failure_ratio": 1.5}, "max_failure_ratio"),
        ({"cache": "maybe"}, "cache"),
    ):
        with pytest.raises(ValueError, match=name):
            reward_function(server.target, CHEAP, **kwargs)


def test_trl_cache_reaches_the_request(recorder):
    func = reward_function(recorder.target, ["g"], cache="off", check=False)
    assert trl_call(func, ["a"]) == [1.0]
    assert recorder.requests[-1].cache == pb.CACHE_MODE_OFF


# -- veRL ------------------------------------------------------------------------------------------------


def verl_step(kwargs: dict, solutions: list[str]) -> list[dict]:
    async def step():
        calls = (compute_score("d", s, "", {"index": i}, **kwargs) for i, s in enumerate(solutions))
        return await asyncio.gather(*calls)

    return asyncio.run(step())


def test_verl_compute_score_takes_the_budget(server):
    out = doubling(
        lambda b: verl_step({"target": server.target, "reward": "flaky", "budget_seconds": b}, [OK, HANG]),
        lambda out: out[0][FAILED_KEY] == 1.0,
    )
    assert [o[FAILED_KEY] for o in out] == [0.0, 1.0]
    assert out[1]["score"] == 0.0  # the failure score, flagged: not a grade


def test_verl_compute_score_fails_the_step_past_the_failure_ratio(server):
    with pytest.raises(FailureBudgetExceeded, match="misbehave"):
        verl_step({"target": server.target, "reward": "flaky", "max_failure_ratio": 0.0}, [OK, NAN])


def test_verl_cache_reaches_the_request(recorder):
    out = verl_step({"target": recorder.target, "reward": "r", "cache": "on"}, ["a"])
    assert out[0]["score"] == 1.0
    assert recorder.requests[-1].cache == pb.CACHE_MODE_ON


# -- OpenRLHF's HTTP face --------------------------------------------------------------------------------

HTTP_CONFIG = """
default_reward: flaky
http: {failure_reward: -1.0, budget_seconds: %s}
rewards:
  flaky:
    graders: [{name: misbehave, params: {heavy: false}}]
"""


@pytest.fixture(scope="module")
def http_server(face_server):
    srv = face_server(HTTP_CONFIG % BUDGET, workers=1)
    srv.get_reward = srv.http + "/get_reward"
    return srv


async def _post(url: str, body: dict) -> tuple[int, object]:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.post(url, json=body) as response:
        data = await response.json() if response.status == 200 else await response.text()
        return response.status, data


def post(url: str, body: dict) -> tuple[int, object]:
    return asyncio.run(_post(url, body))


def test_http_face_cuts_with_the_servers_default_budget(http_server):
    status, data = post(http_server.get_reward, {"query": [OK, OK, HANG]})
    assert status == 200
    assert data["rewards"] == [1.0, 1.0, -1.0] and data["extra_logs"]["grpcgrade_failed"] == [0.0, 0.0, 1.0]


def test_http_face_failure_ratio_from_the_body_is_a_400_naming_the_reason(http_server):
    before = http_server.metric("grpcgrade_failure_budget_exceeded_calls_total")
    status, text = post(http_server.get_reward, {"query": [OK, NAN, NAN], "max_failure_ratio": 0.5})
    assert status == 400
    assert "FAILED_PRECONDITION" in text and "'misbehave' INVALID_RESULT x2" in text
    assert http_server.metric("grpcgrade_failure_budget_exceeded_calls_total") - before == 1
    status, data = post(http_server.get_reward, {"query": [OK, NAN, OK], "max_failure_ratio": 0.5})
    assert status == 200 and data["rewards"] == [1.0, -1.0, 1.0]


def test_http_face_body_values_are_checked(http_server):
    for body, name in (
        ({"budget_seconds": -2}, "budget_seconds"),
        ({"budget_seconds": "soon"}, "budget_seconds"),
        ({"max_failure_ratio": 3}, "max_failure_ratio"),
    ):
        status, text = post(http_server.get_reward, {"query": [OK], **body})
        assert status == 400 and name in text


def test_http_defaults_in_the_configuration_are_checked():
    with pytest.raises(ConfigError, match="budget_seconds"):
        parse_http({"budget_seconds": -1}, "grpcgrade.yaml")
    with pytest.raises(ConfigError, match="max_failure_ratio"):
        parse_http({"max_failure_ratio": 1.01}, "grpcgrade.yaml")
    assert parse_http({"budget_seconds": 5, "max_failure_ratio": 0.2}, "x").max_failure_ratio == 0.2


def test_http_face_takes_the_cache_choice_from_the_body(http_server):
    """misbehave is not cached by default: "on" in the body makes a repeat a hit, "off" never is one."""

    def hits() -> float:
        return http_server.metric("grpcgrade_cache_hits_total", grader="misbehave") or 0.0

    before = hits()
    for _ in range(2):
        status, data = post(http_server.get_reward, {"query": ["cache-me"], "cache": "off"})
        assert status == 200 and data["rewards"] == [1.0]
    assert hits() == before
    for _ in range(2):
        status, data = post(http_server.get_reward, {"query": ["cache-me"], "cache": "on"})
        assert status == 200 and data["rewards"] == [1.0]
    assert hits() == before + 1
    status, text = post(http_server.get_reward, {"query": ["x"], "cache": "sometimes"})
    assert status == 400 and "`cache`" in text
