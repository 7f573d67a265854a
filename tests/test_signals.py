"""Reward-hacking and drift signals of a real server: score and reward histograms, errors per code, canaries.

Expected values come from the graders' definitions (json_validator: 1.0 when `json.loads` accepts the
response, else 0.0; length_penalty: -(length - max_length) * penalty_rate past the maximum), the reward
formula (sum(w_i * s_i) / sum(w_i)) and Prometheus' histogram definition (bucket `le` counts the values
<= le), never from an earlier scrape.
"""

from __future__ import annotations

import json
import math
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from expected import json_score
from grpc_health.v1 import health_pb2
from http_services import http_service

from grpcgrade.core.config import parse_config
from grpcgrade.core.errors import ConfigError, ErrorCode
from grpcgrade.core.grading import GraderStats, failed_stats, grader_stats, join_stats
from grpcgrade.core.histograms import EMPTY, SCORE_BUCKETS
from grpcgrade.core.rewards import RewardStats, reward_stats
from grpcgrade.grader import GraderScore
from grpcgrade.testing import ServerProcess, eventually, health_status, start_server

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

MAX_LENGTH, RATE, MAX_CHARS = 10, 0.1, 50
SHAPE = {
    "graders": [
        {"name": "json_validator", "weight": 3},
        {"name": "length_penalty", "params": {"min_length": 0, "max_length": MAX_LENGTH, "penalty_rate": RATE}},
    ]
}
RESPONSES = ['{"a": 1}', "[1, 2, 3, 4, 5]", "not json", "x" * 13, "y" * (MAX_CHARS + 10)]
TOO_LONG = {RESPONSES[-1]}  # over max_field_chars: INVALID_SAMPLE for every grader, no reward


def penalty(response: str) -> float:
    return -max(0, len(response) - MAX_LENGTH) * RATE


def reward(response: str) -> float:
    return (3 * json_score(response) + 1 * penalty(response)) / (3 + 1)


def buckets(server: ServerProcess, name: str, **labels: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound, from the server's /metrics."""
    out = {}
    for (sample, tags), value in server.metrics().items():
        tags_ = dict(tags)
        if sample == f"{name}_bucket" and labels.items() <= tags_.items():
            out[float(tags_["le"])] = value
    return out


def expected_buckets(values: list[float], bounds: Iterator[float] | list[float]) -> dict[float, float]:
    return {le: float(sum(v <= le for v in values)) for le in bounds}


def write_config(tmp_path: Path, config: dict[str, Any]) -> str:
    path = tmp_path / "grpcgrade.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.parametrize("workers", ["0", "2"], ids=["inline", "whole-chunks-in-workers"])
def test_score_and_reward_histograms_and_errors_per_code(tmp_path: Path, workers: str) -> None:
    config = write_config(tmp_path, {"limits": {"max_field_chars": MAX_CHARS}, "rewards": {"shape": SHAPE}})
    server = start_server(tmp_path, "--workers", workers, "--config", config)
    try:
        with server.client(timeout=60) as client:
            samples = [{"id": str(i), "response": r} for i, r in enumerate(RESPONSES)]
            client.batch_evaluate(samples, reward="shape")
            client.evaluate({"response": RESPONSES[0]}, reward="shape")  # a unary call counts too
            client.batch_evaluate(samples[:2], ["json_validator"])  # ad hoc graders: no configured reward
        graded = [r for r in RESPONSES if r not in TOO_LONG]
        json_scores = [json_score(r) for r in [*graded, RESPONSES[0], *RESPONSES[:2]]]
        penalties = [penalty(r) for r in [*graded, RESPONSES[0]]]
        rewards = [reward(r) for r in [*graded, RESPONSES[0]]]

        got = buckets(server, "grpcgrade_grader_score", grader="json_validator")
        assert got == expected_buckets(json_scores, got) and got[math.inf] == len(json_scores)
        assert server.metric("grpcgrade_grader_score_count", grader="json_validator") == len(json_scores)
        assert server.metric("grpcgrade_grader_score_sum", grader="json_validator") == sum(json_scores)
        got = buckets(server, "grpcgrade_grader_score", grader="length_penalty")
        assert got == expected_buckets(penalties, got) and got[-0.25] == 2  # -0.5 and -0.3: negative buckets work
        assert server.metric("grpcgrade_grader_score_sum", grader="length_penalty") == pytest.approx(sum(penalties))

        got = buckets(server, "grpcgrade_reward_value", reward="shape")
        assert got == expected_buckets(rewards, got) and got[math.inf] == len(rewards)
        assert server.metric("grpcgrade_reward_value_sum", reward="shape") == pytest.approx(sum(rewards))
        squares = server.metric("grpcgrade_reward_value_squares_total", reward="shape")
        assert squares == pytest.approx(sum(r * r for r in rewards))
        assert server.metric("grpcgrade_reward_absent_total", reward="shape") == len(TOO_LONG)

        for grader in ("json_validator", "length_penalty"):
            errors = server.metric("grpcgrade_grader_errors_total", grader=grader, code="INVALID_SAMPLE")
            assert errors == len(TOO_LONG)
            assert errors == server.metric("grpcgrade_evaluations_total", grader=grader, outcome="error")
    finally:
        assert server.stop() == 0


def test_the_http_face_counts_its_configured_reward(tmp_path: Path) -> None:
    """OpenRLHF's POST /rewards/NAME/get_reward grades with a configured reward: its values are counted."""
    config = write_config(tmp_path, {"limits": {"max_field_chars": MAX_CHARS}, "rewards": {"shape": SHAPE}})
    server = start_server(tmp_path, "--workers", "1", "--config", config, http=True)
    try:
        body = json.dumps({"query": RESPONSES}).encode()
        request = urllib.request.Request(f"{server.http}/rewards/shape/get_reward", data=body)
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert json.load(answer)["extra_logs"]["grpcgrade_failed"] == [float(r in TOO_LONG) for r in RESPONSES]
        rewards = [reward(r) for r in RESPONSES if r not in TOO_LONG]
        got = buckets(server, "grpcgrade_reward_value", reward="shape")
        assert got == expected_buckets(rewards, got) and got[math.inf] == len(rewards)
        assert server.metric("grpcgrade_reward_value_sum", reward="shape") == pytest.approx(sum(rewards))
        assert server.metric("grpcgrade_reward_absent_total", reward="shape") == len(TOO_LONG)
    finally:
        assert server.stop() == 0


def wait_for(predicate: Any, what: str, bound: float = 60.0) -> None:
    eventually(predicate, what, bound, every=0.1)


CANARIES = [
    {"name": "valid", "sample": {"response": '{"a": 1}'}, "expect": 1},
    {"name": "wrong", "sample": {"response": "not json"}, "expect": 1},
    {"name": "empty", "sample": {"response": ""}, "expect": 0, "tolerance": 0.01},
]


def test_canaries_pass_and_fail_in_the_metrics_and_leave_health_alone_by_default(tmp_path: Path) -> None:
    rewards = {"json": {"graders": ["json_validator"], "canaries": CANARIES}}
    config = write_config(tmp_path, {"canary": {"interval_seconds": 0.5}, "rewards": rewards})
    server = start_server(tmp_path, "--workers", "1", "--config", config)
    try:
        # The first run is done before SERVING: its results are there at once.
        assert server.metric("grpcgrade_canary_passing", reward="json", canary="valid") == 1
        assert server.metric("grpcgrade_canary_passing", reward="json", canary="wrong") == 0
        assert server.metric("grpcgrade_canary_passing", reward="json", canary="empty") == 1
        assert server.metric("grpcgrade_canary_value", reward="json", canary="wrong") == json_score("not json")
        assert health_status(server.target) == SERVING  # fail_health is off by default
        first = server.metric("grpcgrade_canary_last_run_timestamp_seconds", reward="json", canary="wrong")
        assert first > 0
        wait_for(
            lambda: server.metric("grpcgrade_canary_last_run_timestamp_seconds", reward="json", canary="wrong") > first,
            "a periodic canary run",
        )
        # Canaries are not training traffic: the grading metrics leave them out.
        assert server.metric("grpcgrade_evaluations_total", grader="json_validator") == 0
        assert buckets(server, "grpcgrade_grader_score", grader="json_validator") == {}
    finally:
        assert server.stop() == 0


def test_a_failing_canary_fails_health_with_the_option_until_it_passes_again(tmp_path: Path) -> None:
    """A loopback judge whose verdict the test changes: a drifting judge, then a fixed one."""
    verdict = {"score": 0.0}

    def judge(number: int, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        content = json.dumps({"score": verdict["score"], "reason": "canned"})
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        return 200, {"id": "c", "object": "chat.completion", "model": "judge", "choices": [choice]}, {}

    with http_service(judge) as service:
        base_url = service.url.removesuffix("/grade") + "/v1"
        rubric = {"name": "llm_rubric", "params": {"rubric": "is it polite", "min_score": 0, "max_score": 1}}
        thanks = {"name": "thanks", "sample": {"query": "hi", "response": "thank you"}, "expect": 1}
        config = write_config(
            tmp_path,
            {
                "models": {"default": {"base_url": base_url, "model": "judge", "max_retries": 0}},
                "canary": {"interval_seconds": 0.5, "fail_health": True},
                "rewards": {
                    "polite": {
                        "graders": [rubric],
                        "canaries": [thanks],
                    },
                    "json": {"graders": ["json_validator"], "canaries": CANARIES[:1]},
                },
            },
        )
        server = start_server(tmp_path, "--workers", "0", "--config", config, status=NOT_SERVING)
        try:
            wait_for(
                lambda: server.metric("grpcgrade_canary_last_run_timestamp_seconds", reward="polite") > 0,
                "the first canary run",
            )
            assert server.metric("grpcgrade_canary_passing", reward="polite", canary="thanks") == 0
            assert server.metric("grpcgrade_canary_passing", reward="json", canary="valid") == 1
            assert health_status(server.target) == NOT_SERVING
            with server.client(timeout=30) as client:  # NOT_SERVING steers balancers away; calls still work
                assert client.evaluate({"response": "{}"}, reward="json").reward == 1.0
            verdict["score"] = 1.0  # the judge is fixed
            wait_for(lambda: health_status(server.target) == SERVING, "SERVING once the canary passes")
            assert server.metric("grpcgrade_canary_passing", reward="polite", canary="thanks") == 1
            verdict["score"] = 0.4  # and drifts again
            wait_for(lambda: health_status(server.target) == NOT_SERVING, "NOT_SERVING once it fails again")
            assert server.metric("grpcgrade_canary_value", reward="polite", canary="thanks") == 0.4
        finally:
            assert server.stop() == 0


def test_an_erroring_canary_is_failing(tmp_path: Path) -> None:
    """A judge that answers nonsense gives an error result: no reward, so the canary fails."""
    with http_service(lambda n, body: (500, {"error": {"message": "down"}}, {})) as service:
        base_url = service.url.removesuffix("/grade") + "/v1"
        rubric = {"name": "llm_rubric", "params": {"rubric": "r", "min_score": 0, "max_score": 1}}
        config = write_config(
            tmp_path,
            {
                "models": {"default": {"base_url": base_url, "model": "judge", "max_retries": 0}},
                "rewards": {"polite": {"graders": [rubric], "canaries": [{"sample": {"response": "x"}, "expect": 0}]}},
            },
        )
        server = start_server(tmp_path, "--workers", "0", "--config", config)
        try:
            assert server.metric("grpcgrade_canary_passing", reward="polite", canary="0") == 0
            assert math.isnan(server.metric("grpcgrade_canary_value", reward="polite", canary="0"))
        finally:
            assert server.stop() == 0


@pytest.mark.parametrize(
    ("canary", "message"),
    [
        ({"sample": {}, "expect": 1, "expected": 1}, "rewards.r.canaries[0]: unknown key 'expected'"),
        ({"sample": {"response": "{}"}}, "rewards.r.canaries[0]: needs `expect`"),
        ({"expect": 1}, "rewards.r.canaries[0]: needs `sample`"),
        ({"sample": {}, "expect": math.inf}, "rewards.r.canaries[0].expect: must be a number"),
        ({"sample": {}, "expect": "high"}, "rewards.r.canaries[0].expect: must be a number"),
        ({"sample": {}, "expect": 1, "tolerance": -0.1}, "rewards.r.canaries[0].tolerance: must be at least 0"),
        ({"sample": {"response": 3}, "expect": 1}, "rewards.r.canaries[0].sample.response: must be a string"),
        ({"sample": {"query": "q", "ground_truth": "x"}, "expect": 1}, "collides with a standard sample field"),
    ],
)
def test_a_bad_canary_is_a_config_error_naming_it(canary: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_config({"rewards": {"r": {"graders": ["json_validator"], "canaries": [canary]}}})


def test_a_bad_canary_stops_the_server_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {
            "canary": {"interval_seconds": 0},
            "rewards": {"r": {"graders": ["json_validator"], "canaries": [{"sample": {}, "expect": 1}]}},
        },
    )
    with pytest.raises(RuntimeError) as failed:
        start_server(tmp_path, "--workers", "0", "--config", config)
    assert "canary.interval_seconds: must be between 0.5 and 86400, got 0" in str(failed.value)
    assert "Traceback" not in str(failed.value)


def test_a_chunk_graded_piece_by_piece_joins_its_stats_per_grader_and_reward() -> None:
    """A worker that died on a chunk: the pieces graded one by one are joined back for the metrics."""
    graded = [GraderScore("json_validator", 0.0), GraderScore("json_validator", 1.0)]
    parts = [
        [grader_stats("json_validator", graded, 0.25), reward_stats("json", [1.0, None])],
        [failed_stats("json_validator", ErrorCode.WORKER_LOST), RewardStats("json", EMPTY, 1)],
    ]
    stats, rewards = join_stats(parts)
    assert isinstance(stats, GraderStats) and isinstance(rewards, RewardStats)
    assert (stats.grader, stats.ok, stats.errors, stats.seconds) == ("json_validator", 2, 1, 0.25)
    assert stats.error_codes == ((ErrorCode.WORKER_LOST, 1),)
    assert stats.scores.buckets == tuple(sum(s <= le for s in (0.0, 1.0)) for le in SCORE_BUCKETS)
    assert (stats.scores.observed, stats.scores.total) == (2, 1.0)
    assert (rewards.reward, rewards.values.observed, rewards.values.total, rewards.absent) == ("json", 1, 1.0, 2)
    assert rewards.values.squares == 1.0
