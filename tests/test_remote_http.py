"""The `remote_http` grader against real HTTP services on 127.0.0.1, run as the engine runs it.

Each test starts its own service (http.server in a thread) whose behaviour the test chooses: correct,
slow, failing with 500 or 429, refusing with 400, answering too few results or in another order. The
expected payload is Kolibrify's protocol; the expected rewards are what each service computes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from http_services import UNDECLARED, Reply, Service, http_service

from grpcgrade.core.errors import InvalidParams
from grpcgrade.core.grading import grade_async
from grpcgrade.core.retry import MAX_ANSWER_BYTES
from grpcgrade.core.samples import Limits
from grpcgrade.grader import GraderError, GraderScore
from grpcgrade.graders.kolibrify.remote_http import RemoteHttpGrader
from grpcgrade.service.convert import sample_kwargs, sample_to_pb
from grpcgrade.testing import free_port


@pytest.fixture
def start_service() -> Iterator[Callable[..., Service]]:
    with contextlib.ExitStack() as stack:
        yield lambda behave, delay=0.0: stack.enter_context(http_service(behave, delay))


# -- service behaviours ------------------------------------------------------------------------------


def reward_of(sample: dict[str, Any]) -> float:
    """The services' reward: a tenth of the final response's length, plus the completion index."""
    return len(sample["final_response"] or "") / 10 + (sample["completion_index"] or 0)


def results(body: dict[str, Any], with_index: bool = True) -> list[dict[str, Any]]:
    out = []
    for sample in body["samples"]:
        item = {"sample_id": sample["sample_id"], "reward": reward_of(sample)}
        if with_index:
            item["completion_index"] = sample["completion_index"]
        out.append(item)
    return out


def correct(number: int, body: dict[str, Any]) -> Reply:
    return 200, {"results": results(body)}, {}


def failing_first(times: int, status: int, headers: dict[str, str] | None = None) -> Callable[..., Reply]:
    def behave(number: int, body: dict[str, Any]) -> Reply:
        if number <= times:
            return status, {"detail": f"failure {number}"}, headers or {}
        return correct(number, body)

    return behave


# -- helpers -----------------------------------------------------------------------------------------


def kwargs_of(**sample: Any) -> dict[str, Any]:
    """A sample's grader inputs exactly as the server builds them from a request's Sample."""
    out = sample_kwargs(sample_to_pb(sample), Limits())
    assert isinstance(out, dict)
    return out


def batch_of(n: int, **common: Any) -> list[dict[str, Any]]:
    return [kwargs_of(id=f"s{i}", response=f"<think>\nr\n</think>\n{'x' * i}", **common) for i in range(n)]


def grade(grader: RemoteHttpGrader, batch: list[dict[str, Any]]) -> list[Any]:
    grader.name = "judge"  # the registry names a configured grader after its key
    return asyncio.run(grade_async(grader, batch, timeout=20))


def scores(results_: list[Any]) -> list[float | str]:
    return [r.score if isinstance(r, GraderScore) else r.code for r in results_]


# -- tests -------------------------------------------------------------------------------------------


def test_sends_kolibrifys_payload_and_uses_the_rewards(start_service):
    service = start_service(correct)
    sample = {
        "id": "gsm8k:12",
        "query": "What is 70 + 2?",
        "response": "  <think>\nadd\n</think>\n72  ",
        "reference": "#### 72",
        "extra": {
            "system_prompt": "Be brief.",
            "metadata": {"level": 1},
            "completion_tokens": 187,
            "completion_index": 3,
        },
    }
    batch = [kwargs_of(**sample), kwargs_of(id="x", response="no tags")]
    out = grade(RemoteHttpGrader(service.url, timeout_s=5), batch)
    assert service.requests == [
        {
            "samples": [
                {
                    "sample_id": "gsm8k:12",
                    "prompt": "What is 70 + 2?",
                    "system_prompt": "Be brief.",
                    "answer": "#### 72",
                    "metadata": {"level": 1},
                    "completion": "  <think>\nadd\n</think>\n72  ",
                    "reasoning": "add",
                    "final_response": "72",
                    "completion_tokens": 187,
                    "completion_index": 3,
                },
                {
                    "sample_id": "x",
                    "prompt": "",
                    "system_prompt": None,
                    "answer": "",
                    "metadata": None,
                    "completion": "no tags",
                    "reasoning": None,
                    "final_response": None,
                    "completion_tokens": None,
                    "completion_index": None,
                },
            ]
        }
    ]
    assert scores(out) == [pytest.approx(3.2), 0.0]
    assert all(r.name == "judge" for r in out)


def test_results_in_another_order_are_matched_by_sample_id_and_completion_index(start_service):
    service = start_service(lambda n, body: (200, {"results": results(body)[::-1]}, {}))
    # A GRPO group: one prompt, four completions told apart only by completion_index.
    batch = [kwargs_of(id="p", response=f"<think>\nr\n</think>\n{'y' * i}", completion_index=i) for i in range(4)]
    assert scores(grade(RemoteHttpGrader(service.url), batch)) == [pytest.approx(i / 10 + i) for i in range(4)]


def test_results_without_completion_index_are_matched_by_a_unique_sample_id(start_service):
    service = start_service(lambda n, body: (200, {"results": results(body, with_index=False)[::-1]}, {}))
    assert scores(grade(RemoteHttpGrader(service.url), batch_of(3))) == [pytest.approx(i / 10) for i in range(3)]


def test_without_usable_ids_results_are_taken_by_position(start_service):
    def no_ids(number: int, body: dict[str, Any]) -> Reply:
        return 200, {"results": [{"reward": reward_of(s)} for s in body["samples"]]}, {}

    service = start_service(no_ids)
    assert scores(grade(RemoteHttpGrader(service.url), batch_of(3))) == [pytest.approx(i / 10) for i in range(3)]


def test_a_missing_result_fails_only_its_sample(start_service):
    service = start_service(lambda n, body: (200, {"results": results(body)[:-1]}, {}))
    out = grade(RemoteHttpGrader(service.url), batch_of(3))
    assert scores(out) == [0.0, pytest.approx(0.1), "INVALID_RESULT"]
    assert "no result for sample 's2'" in out[2].error


def test_too_few_results_without_ids_fail_the_call_s_samples(start_service):
    def few(number: int, body: dict[str, Any]) -> Reply:
        return 200, {"results": [{"reward": 1.0}] * (len(body["samples"]) - 1)}, {}

    out = grade(RemoteHttpGrader(start_service(few).url), batch_of(3))
    assert scores(out) == ["INVALID_RESULT"] * 3
    assert "2 results for 3 samples" in out[0].error


def test_a_bad_reward_fails_only_its_sample_and_a_bad_body_fails_the_call(start_service):
    def bad_reward(number: int, body: dict[str, Any]) -> Reply:
        out = results(body)
        out[1]["reward"] = "lots"
        return 200, {"results": out}, {}

    out = grade(RemoteHttpGrader(start_service(bad_reward).url), batch_of(3))
    assert scores(out) == [0.0, "INVALID_RESULT", pytest.approx(0.2)]
    assert "'lots'" in out[1].error
    out = grade(RemoteHttpGrader(start_service(lambda n, body: (200, b"<html>", {})).url), batch_of(2))
    assert scores(out) == ["INVALID_RESULT"] * 2
    assert "not JSON" in out[0].error


@pytest.mark.parametrize("declared", [True, False], ids=["declared-length", "read-to-the-end"])
def test_an_answer_past_the_bound_fails_the_call_read_no_further(start_service, declared):
    """An answer over MAX_ANSWER_BYTES, its length declared or not, fails the call's samples naming the bound
    (INVALID_RESULT, not retried): the whole answer was read into memory and graded, however long."""

    def padded(number: int, body: dict[str, Any]) -> Reply:
        return 200, {"results": results(body), "pad": "p" * MAX_ANSWER_BYTES}, {} if declared else {UNDECLARED: ""}

    service = start_service(padded)
    out = grade(RemoteHttpGrader(service.url, max_retries=2), batch_of(2))
    assert scores(out) == ["INVALID_RESULT"] * 2
    assert f"over {MAX_ANSWER_BYTES} bytes" in out[0].error
    assert len(service.requests) == 1


def test_an_answer_nested_past_the_parsers_limit_is_the_services_fault(start_service):
    """JSON nested past the interpreter's recursion limit fails the call as the service's bad answer
    (INVALID_RESULT, saying so); it was a bare RecursionError, reported as the grader's own failure."""
    service = start_service(lambda n, body: (200, b"[" * 100_000 + b"]" * 100_000, {}))
    out = grade(RemoteHttpGrader(service.url), batch_of(2))
    assert scores(out) == ["INVALID_RESULT"] * 2
    assert "nested too deeply" in out[0].error


def test_500_is_retried_until_it_succeeds(start_service):
    service = start_service(failing_first(1, 500))
    out = grade(RemoteHttpGrader(service.url, max_retries=2, retry_backoff_s=0.01), batch_of(2))
    assert scores(out) == [0.0, pytest.approx(0.1)]
    assert len(service.requests) == 2
    assert service.requests[0] == service.requests[1]


def test_500_every_time_becomes_per_sample_errors_after_the_retries(start_service):
    service = start_service(failing_first(99, 500))
    out = grade(RemoteHttpGrader(service.url, max_retries=2, retry_backoff_s=0.01), batch_of(2))
    assert scores(out) == ["GRADER_FAILED"] * 2
    assert "HTTP 500" in out[0].error and "3 attempts" in out[0].error
    assert len(service.requests) == 3


def test_429_is_retried(start_service):
    service = start_service(failing_first(1, 429, {"Retry-After": "0"}))
    out = grade(RemoteHttpGrader(service.url, max_retries=1, retry_backoff_s=0.01), batch_of(2))
    assert scores(out) == [0.0, pytest.approx(0.1)]
    assert len(service.requests) == 2


def test_400_is_not_retried(start_service):
    service = start_service(failing_first(99, 400))
    out = grade(RemoteHttpGrader(service.url, max_retries=3, retry_backoff_s=0.01), batch_of(2))
    assert scores(out) == ["GRADER_FAILED"] * 2
    assert "HTTP 400" in out[0].error and "failure 1" in out[0].error
    assert len(service.requests) == 1


def test_a_slow_service_times_out_per_call_and_is_retried(start_service):
    service = start_service(correct, delay=2.0)
    out = grade(RemoteHttpGrader(service.url, timeout_s=0.2, max_retries=1, retry_backoff_s=0.01), batch_of(2))
    assert scores(out) == ["TIMEOUT"] * 2
    assert "within 0.2 s" in out[0].error and "2 attempts" in out[0].error
    assert len(service.requests) == 2


def test_an_unreachable_service_gives_per_sample_errors():
    grader = RemoteHttpGrader(f"http://127.0.0.1:{free_port()}/grade", max_retries=1, retry_backoff_s=0.01)
    out = grade(grader, batch_of(2))
    assert scores(out) == ["GRADER_FAILED"] * 2
    assert "unreachable" in out[0].error


def test_chunks_go_out_as_separate_posts_within_the_concurrency_limit(start_service):
    service = start_service(correct, delay=0.05)
    grader = RemoteHttpGrader(service.url, chunk_size=2, max_concurrency=2)
    out = grade(grader, batch_of(7))
    assert scores(out) == [pytest.approx(i / 10) for i in range(7)]
    assert sorted(len(body["samples"]) for body in service.requests) == [1, 2, 2, 2]
    assert service.max_in_flight <= 2


def test_a_failed_chunk_leaves_the_other_chunks_their_scores(start_service):
    def fail_s2(number: int, body: dict[str, Any]) -> Reply:
        if any(s["sample_id"] == "s2" for s in body["samples"]):
            return 400, {"detail": "no"}, {}
        return correct(number, body)

    out = grade(RemoteHttpGrader(start_service(fail_s2).url, chunk_size=2), batch_of(4))
    assert scores(out) == [0.0, pytest.approx(0.1), "GRADER_FAILED", "GRADER_FAILED"]


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"url": "ftp://example/x"}, "url"),
        ({"url": "http://127.0.0.1/x", "timeout_s": 0}, "timeout_s"),
        ({"url": "http://127.0.0.1/x", "max_concurrency": 0}, "max_concurrency"),
        ({"url": "http://127.0.0.1/x", "max_retries": -1}, "max_retries"),
        ({"url": "http://127.0.0.1/x", "max_retries": 1.5}, "max_retries"),
        ({"url": "http://127.0.0.1/x", "chunk_size": 0}, "chunk_size"),
        ({"url": "http://127.0.0.1/x", "retry_backoff_s": -1}, "retry_backoff_s"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(params, param):
    with pytest.raises(InvalidParams) as err:
        RemoteHttpGrader(**params)
    assert err.value.param == param


def test_error_results_are_grader_errors_of_the_configured_name(start_service):
    out = grade(RemoteHttpGrader(start_service(failing_first(99, 404)).url), batch_of(1))
    assert isinstance(out[0], GraderError) and out[0].name == "judge"
