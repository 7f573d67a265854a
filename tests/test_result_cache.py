"""The result cache and the quarantine's store: keys, the time to live, the bound in bytes (a clock the
tests move, no sleeping), and the engine grading only what the cache cannot answer, each input once."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import yaml
from http_services import http_service

from grpcgrade import BaseGrader, FunctionGrader, GraderError, GraderRank, GraderScore
from grpcgrade.client import GradingClient
from grpcgrade.core.cached_grading import CachedGrading
from grpcgrade.core.engine import Engine, Job
from grpcgrade.core.errors import ErrorCode
from grpcgrade.core.grading import inputs_of
from grpcgrade.core.registry import get_registry
from grpcgrade.core.result_cache import (
    ENTRY_OVERHEAD_BYTES,
    BoundedStore,
    CacheMode,
    Quarantine,
    ResultCache,
    content_key,
    scope_of,
)
from grpcgrade.core.rewards import SpecData
from grpcgrade.service.convert import sample_to_pb, specs_to_pb
from grpcgrade.testing import ServerProcess, start_server
from grpcgrade.v1 import grading_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def grader(name: str = "judge", **params: Any) -> tuple[BaseGrader, dict[str, Any]]:
    def judge(response: str, reference: str = "") -> float:
        return 1.0

    return FunctionGrader(judge, name=name), params


def key(g: BaseGrader, params: dict[str, Any], **kwargs: Any) -> bytes:
    return content_key(scope_of(g, params), kwargs, inputs_of(g))


# -- keys --------------------------------------------------------------------------------------------


def test_a_key_is_the_grader_its_params_and_the_inputs_it_declares():
    g, params = grader(model="a")
    same = key(g, params, response="4", reference="four")
    assert key(g, params, reference="four", response="4") == same  # the order of fields does not matter
    assert key(g, params, response="5", reference="four") != same
    other_params, p2 = grader(model="b")
    assert key(other_params, p2, response="4", reference="four") != same
    other_name, p3 = grader(name="other", model="a")
    assert key(other_name, p3, response="4", reference="four") != same


def test_the_sample_id_is_not_part_of_the_key_unless_the_grader_names_it():
    class Open(BaseGrader):
        def evaluate(self, **kwargs: Any) -> GraderScore:
            return GraderScore(self.name, 1.0)

    class ById(BaseGrader):
        def evaluate(self, response: str, sample_id: str) -> GraderScore:
            return GraderScore(self.name, 1.0)

    g = Open()
    assert key(g, {}, response="r", sample_id="1") == key(g, {}, response="r", sample_id="2")
    h = ById()
    assert key(h, {}, response="r", sample_id="1") != key(h, {}, response="r", sample_id="2")


# -- the bounded store -------------------------------------------------------------------------------


def test_entries_expire_after_their_time_to_live():
    clock = Clock()
    g, params = grader()
    scope = scope_of(g, params)
    store: BoundedStore[str] = BoundedStore(max_bytes=1 << 20, ttl_seconds=60, clock=clock)
    store.put(b"k", "v", 10, scope)
    clock.now += 59.9
    assert store.get(b"k") == "v"
    clock.now += 0.1
    assert store.get(b"k") is None
    assert (len(store), store.bytes) == (0, 0)
    assert not store.holds(scope)


def test_the_byte_bound_evicts_the_least_recently_used_first():
    g, params = grader()
    scope = scope_of(g, params)
    entry = 100 + ENTRY_OVERHEAD_BYTES
    store: BoundedStore[int] = BoundedStore(max_bytes=10 * entry, ttl_seconds=60, clock=Clock())
    for i in range(10):
        store.put(bytes([i]), i, 100, scope)
    assert store.bytes == 10 * entry
    assert store.get(bytes([0])) == 0  # used: now the most recent
    store.put(b"new", 10, 100, scope)
    assert store.get(bytes([1])) is None  # the least recently used went
    assert store.get(bytes([0])) == 0
    assert store.get(b"new") == 10
    assert store.bytes == 10 * entry
    store.put(b"big", 11, 4 * entry - ENTRY_OVERHEAD_BYTES, scope)  # over the share one entry may take
    assert store.get(b"big") is None
    assert store.bytes <= store.max_bytes


def test_clear_drops_every_entry_or_one_graders():
    a, pa = grader(name="a")
    b, pb = grader(name="b")
    store: BoundedStore[int] = BoundedStore(max_bytes=1 << 20, ttl_seconds=60, clock=Clock())
    store.put(b"1", 1, 0, scope_of(a, pa))
    store.put(b"2", 2, 0, scope_of(b, pb))
    assert store.clear("a") == 1
    assert (store.get(b"1"), store.get(b"2")) == (None, 2)
    assert store.clear() == 1
    assert (len(store), store.bytes) == (0, 0)


def test_the_cache_keeps_successes_only_marked_as_cached():
    g, params = grader()
    scope = scope_of(g, params)
    cache = ResultCache(max_bytes=1 << 20, ttl_seconds=60, clock=Clock())
    score = GraderScore("judge", 0.5, "why", {"model": "m"})
    stored = cache.store(b"s", score, scope)
    assert stored is not None and stored.cached and not score.cached
    assert (stored.score, stored.reason, stored.metadata) == (0.5, "why", {"model": "m"})
    assert cache.get(b"s") is stored
    rank = cache.store(b"r", GraderRank("judge", [2, 1]), scope)
    assert rank is not None and rank.cached and rank.rank == [2, 1]
    assert cache.store(b"e", GraderError("judge", "HTTP 500", code=ErrorCode.GRADER_FAILED), scope) is None
    assert cache.get(b"e") is None


def test_a_quarantined_input_answers_with_its_code_until_it_expires():
    clock = Clock()
    g, params = grader()
    scope = scope_of(g, params)
    quarantine = Quarantine(max_bytes=1 << 20, ttl_seconds=600, clock=clock, wall_clock=lambda: 1_700_000_000.0)
    lost = GraderError("judge", "the worker process grading this sample died twice", code=ErrorCode.WORKER_LOST)
    quarantine.add(b"k", lost, scope, {"response": "die"}, inputs_of(g))
    error = quarantine.answer(b"k", "judge")
    assert error is not None and error.code == ErrorCode.WORKER_LOST
    assert "quarantined since 2023-11-14T22:13:20Z (the worker process grading this sample died twice)" in error.error
    assert "grpcgrade quarantine clear" in error.error
    ((_, entry),) = quarantine.items()
    assert (entry.value.hits, entry.value.preview) == (1, '{"response":"die"}')
    clock.now += 600
    assert quarantine.answer(b"k", "judge") is None


def test_a_timeout_is_answered_from_the_quarantine_only_for_calls_with_no_longer_limit():
    g, params = grader()
    quarantine = Quarantine(max_bytes=1 << 20, ttl_seconds=600, clock=Clock())
    late = GraderError("judge", "grader ran past its time limit of 2 s", code=ErrorCode.TIMEOUT)
    quarantine.add(b"k", late, scope_of(g, params), {"response": "slow"}, inputs_of(g), limit=2.0)
    assert quarantine.answer(b"k", "judge", 2.0) is not None
    assert quarantine.answer(b"k", "judge", 1.0) is not None
    assert quarantine.answer(b"k", "judge", 3.0) is None  # it might finish in 3 s: grade it
    assert quarantine.answer(b"k", "judge", None) is None  # no limit at all
    lost = GraderError("judge", "died", code=ErrorCode.WORKER_LOST)
    quarantine.add(b"w", lost, scope_of(g, params), {"response": "die"}, inputs_of(g), limit=2.0)
    assert quarantine.answer(b"w", "judge", None) is not None  # a dead worker is no matter of time


# -- the engine --------------------------------------------------------------------------------------


def counting_job(use_cache: bool, fail: set[str] | None = None) -> tuple[Job, list[str]]:
    """A job whose grader records every response it grades; responses in `fail` raise."""
    seen: list[str] = []

    def judge(response: str) -> float:
        seen.append(response)
        if response in (fail or set()):
            raise RuntimeError("the judge answered 500")
        return float(len(response))

    g = FunctionGrader(judge, name="judge")
    return Job(SpecData(name="judge"), g, inputs_of(g), False, use_cache), seen


def grade(engine: Engine, job: Job, responses: list[str]) -> list[Any]:
    chunk = [(i, {"sample_id": str(i), "response": r}) for i, r in enumerate(responses)]
    return asyncio.run(engine.grade_chunk([job], chunk)).columns[0]


def test_the_engine_grades_each_distinct_input_once_and_stores_only_successes():
    cached = CachedGrading(ResultCache(1 << 20, 60, clock=Clock()), Quarantine(1 << 20, 60, clock=Clock()))
    engine = Engine(get_registry(), cached=cached)
    job, seen = counting_job(use_cache=True, fail={"bad"})
    first = grade(engine, job, ["aa", "b", "aa", "bad", "aa"])
    assert seen == ["aa", "b", "bad"]  # duplicates graded once
    assert [getattr(r, "score", None) for r in first] == [2.0, 1.0, 2.0, None, 2.0]
    assert [getattr(r, "cached", False) for r in first] == [False, False, True, False, True]
    assert first[3].code == ErrorCode.GRADER_FAILED
    second = grade(engine, job, ["b", "bad", "aa"])
    assert seen == ["aa", "b", "bad", "bad"]  # only the failure is graded again
    assert [getattr(r, "cached", False) for r in second] == [True, False, True]
    assert (cached.hits["judge"], cached.misses["judge"]) == (4, 4)


def test_a_call_without_the_cache_grades_everything():
    cached = CachedGrading(ResultCache(1 << 20, 60, clock=Clock()), None)
    engine = Engine(get_registry(), cached=cached)
    job, seen = counting_job(use_cache=True)
    grade(engine, job, ["x"])
    off = Job(job.spec, job.grader, job.inputs, False, use_cache=False)  # the same grader, the cache off
    results = grade(engine, off, ["x", "x"])
    assert seen == ["x", "x", "x"]
    assert not any(r.cached for r in results)


@pytest.mark.parametrize(
    ("mode", "default", "expected"),
    [
        (CacheMode.DEFAULT, False, False),
        (CacheMode.DEFAULT, True, True),
        (CacheMode.ON, False, True),
        (CacheMode.OFF, True, False),
    ],
)
def test_who_uses_the_cache(mode, default, expected):
    g, _ = grader()
    g.cache_by_default = default
    assert CachedGrading(ResultCache(1 << 20, 60), None).uses_cache(g, mode) is expected
    assert CachedGrading(None, None).uses_cache(g, CacheMode.ON) is False  # the server turned it off


def test_the_expensive_graders_use_the_cache_by_default():
    from grpcgrade_code.grader import CodeTestsGrader
    from grpcgrade_math_verify import MathVerifyGrader

    from grpcgrade.graders.kolibrify.remote_http import RemoteHttpGrader
    from grpcgrade.graders.openai.grader import AsyncOpenAIGrader, OpenAIGrader
    from grpcgrade.llm.grader import LLMGrader

    for cls in (LLMGrader, AsyncOpenAIGrader, RemoteHttpGrader, CodeTestsGrader, MathVerifyGrader):
        assert cls.cache_by_default, cls
    assert not OpenAIGrader.cache_by_default  # string_check and friends: computed in microseconds
    assert not BaseGrader.cache_by_default


# -- through a real server, with a loopback judge that counts its calls --------------------------------

MARKER = re.compile(r"CASE:([\w-]+)")


class CountingJudge:
    """An OpenAI-compatible judge on 127.0.0.1: a prompt's `CASE:<marker>` picks the answer, and every
    request is recorded. A marker starting with `fail-once` gets HTTP 500 on its first request."""

    def __init__(self) -> None:
        self.service: Any = None

    def behave(self, number: int, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        marker = self.marker(body)
        if marker.startswith("fail-once") and self.calls(marker) == 1:
            return 500, {"error": {"message": "the judge is down"}}, {}
        content = json.dumps({"score": 4, "reason": f"judged {marker}"})
        message = {"role": "assistant", "content": content}
        return 200, {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}, {}

    @staticmethod
    def marker(body: dict[str, Any]) -> str:
        found = MARKER.search(json.dumps(body.get("messages", [])))
        return found.group(1) if found else ""

    def calls(self, marker: str) -> int:
        with self.service.lock:
            return sum(1 for body in self.service.requests if self.marker(body) == marker)


@pytest.fixture(scope="module")
def counting_judge() -> Iterator[CountingJudge]:
    judge = CountingJudge()
    with http_service(judge.behave) as service:
        judge.service = service
        yield judge


@pytest.fixture(scope="module")
def cache_server(counting_judge: CountingJudge, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("cache-server")
    base_url = counting_judge.service.url.removesuffix("/grade") + "/v1"
    config = {
        "models": {"default": {"base_url": base_url, "model": "judge", "max_retries": 0, "timeout_seconds": 10}},
        "cache": {"max_bytes": 1_000_000, "ttl_seconds": 3600},
    }
    path = tmp / "grpcgrade.yaml"
    path.write_text(yaml.safe_dump(config))
    srv = start_server(tmp, "--workers", "1", "--config", str(path))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def cache_client(cache_server: ServerProcess) -> Iterator[GradingClient]:
    with cache_server.client(timeout=60) as c:
        yield c


RUBRIC = [{"name": "llm_rubric", "params": {"rubric": "Names the capital."}}]


def case(kind: str = "ok") -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def only(reply: pb.EvaluateResponse) -> pb.GraderResult:
    (result,) = reply.results
    return result


def evaluate(client: GradingClient, sample: dict[str, Any], graders: Any, cache: int = 0) -> pb.GraderResult:
    request = pb.EvaluateRequest(graders=specs_to_pb(graders), sample=sample_to_pb(sample), cache=cache)
    return only(client.stub.Evaluate(request, timeout=60))


def test_a_repeated_judgment_is_answered_from_the_cache(cache_client, counting_judge):
    marker = case()
    sample = {"query": "Capital of France?", "response": f"Paris. CASE:{marker}"}
    first = evaluate(cache_client, sample, RUBRIC)
    second = evaluate(cache_client, {**sample, "id": "another id"}, RUBRIC)
    assert counting_judge.calls(marker) == 1
    assert (first.score, first.cached) == (4.0, False)
    assert (second.score, second.reason, second.cached) == (4.0, f"judged {marker}", True)
    batch = cache_client.batch_evaluate([sample], RUBRIC)
    assert only(batch[0]).cached and counting_judge.calls(marker) == 1


def test_duplicates_within_one_batch_reach_the_judge_once(cache_client, counting_judge):
    markers = [case(), case()]
    group = [{"id": str(i), "query": "q", "response": f"CASE:{markers[i % 2]}"} for i in range(8)]
    replies = cache_client.batch_evaluate(group, RUBRIC)
    assert [counting_judge.calls(m) for m in markers] == [1, 1]
    assert [only(r).score for r in replies] == [4.0] * 8
    assert [only(r).cached for r in replies] == [False, False] + [True] * 6
    assert [r.id for r in replies] == [str(i) for i in range(8)]


def test_cache_mode_off_reaches_the_judge_every_time(cache_client, counting_judge):
    marker = case()
    sample = {"query": "q", "response": f"CASE:{marker}"}
    evaluate(cache_client, sample, RUBRIC)
    off = [evaluate(cache_client, sample, RUBRIC, cache=pb.CACHE_MODE_OFF) for _ in range(2)]
    assert counting_judge.calls(marker) == 3
    assert not any(r.cached for r in off)
    request = pb.BatchEvaluateRequest(
        graders=specs_to_pb(RUBRIC), samples=[sample_to_pb(sample)] * 2, cache=pb.CACHE_MODE_OFF
    )
    replies = [
        item.result for message in cache_client.stub.BatchEvaluate(request, timeout=60) for item in message.items
    ]
    assert counting_judge.calls(marker) == 5  # no dedup either when the call turns the cache off
    assert not any(only(r).cached for r in replies)


def test_a_failed_judgment_is_not_cached_and_is_retried_next_call(cache_client, counting_judge):
    marker = case("fail-once")
    sample = {"query": "q", "response": f"CASE:{marker}"}
    failed = evaluate(cache_client, sample, RUBRIC)
    assert failed.error.code == "GRADER_FAILED" and "500" in failed.error.message
    retried = evaluate(cache_client, sample, RUBRIC)
    assert (retried.score, retried.cached) == (4.0, False)
    assert counting_judge.calls(marker) == 2
    assert evaluate(cache_client, sample, RUBRIC).cached
    assert counting_judge.calls(marker) == 2


def test_a_cheap_grader_uses_the_cache_only_when_the_call_asks(cache_client):
    sample = {"response": '{"a": ' + uuid.uuid4().hex[:4].join('""') + "}"}
    graders = ["json_validator"]
    assert not evaluate(cache_client, sample, graders).cached
    assert not evaluate(cache_client, sample, graders).cached  # off by default: not even stored
    assert not evaluate(cache_client, sample, graders, cache=pb.CACHE_MODE_ON).cached
    hit = evaluate(cache_client, sample, graders, cache=pb.CACHE_MODE_ON)
    assert (hit.score, hit.cached) == (1.0, True)
    replies = cache_client.batch_evaluate([sample] * 3, graders)  # whole chunks, no cache
    assert [(only(r).score, only(r).cached) for r in replies] == [(1.0, False)] * 3


def test_an_unknown_cache_mode_is_invalid_argument(cache_client):
    request = pb.EvaluateRequest(graders=specs_to_pb(["json_validator"]), sample=sample_to_pb({"response": "1"}))
    request.cache = 7  # proto3 enums are open: a newer client may send a mode this server does not know
    with pytest.raises(grpc.RpcError) as err:
        cache_client.stub.Evaluate(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown CacheMode 7" in err.value.details()


def test_hits_and_misses_are_counted_per_grader_and_clear_cache_forgets(cache_server, cache_client, counting_judge):
    hits = cache_server.metric("grpcgrade_cache_hits_total", grader="llm_rubric")
    misses = cache_server.metric("grpcgrade_cache_misses_total", grader="llm_rubric")
    marker = case()
    sample = {"query": "q", "response": f"CASE:{marker}"}
    cache_client.batch_evaluate([sample] * 3, RUBRIC)
    assert cache_server.metric("grpcgrade_cache_hits_total", grader="llm_rubric") == hits + 2
    assert cache_server.metric("grpcgrade_cache_misses_total", grader="llm_rubric") == misses + 1
    assert 0 < cache_server.metric("grpcgrade_cache_bytes") <= 1_000_000
    assert cache_client.clear_cache("llm_rubric") >= 1
    assert not evaluate(cache_client, sample, RUBRIC).cached
    assert counting_judge.calls(marker) == 2
    with pytest.raises(grpc.RpcError) as err:
        cache_client.clear_cache("no_such_grader")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_canaries_are_graded_for_real_not_answered_from_the_cache():
    from grpcgrade.core.canaries import Canary, run_canaries
    from grpcgrade.core.rewards import Reward

    cached = CachedGrading(ResultCache(1 << 20, 60), None)
    reward = Reward("exact", [SpecData(name="math_verify")])  # math_verify uses the cache by default
    engine = Engine(get_registry(), rewards={"exact": reward}, cached=cached)
    canary = Canary("exact", "right", {"response": "<think>2+2</think> $4$", "reference": "$4$"}, 1.0)
    for _ in range(2):
        (result,) = asyncio.run(run_canaries(engine, [canary]))
        assert result.passing
    assert (len(cached.cache), cached.hits["math_verify"], cached.misses["math_verify"]) == (0, 0, 0)
    jobs = engine.resolve([], "exact")  # a call asking for the same reward does use it
    asyncio.run(engine.grade_chunk(jobs, [(0, dict(canary.kwargs))]))
    assert len(cached.cache) == 1
