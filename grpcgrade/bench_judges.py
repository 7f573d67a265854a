"""`grpcgrade bench --judges N`: LLM judge throughput as a share of what the endpoint's limit allows.

A fake OpenAI-compatible endpoint (`grpcgrade.fake_judge`, its own process) allows `requests_per_minute`
and answers 429 with Retry-After beyond, with a long tail of slow answers; a server whose `models:` declares
that limit grades N distinct judgments (`llm_rubric`) in one BatchEvaluate. In T seconds the endpoint
allows at most its burst plus rate x T requests, so `judge_throughput_x_limit` = judgments answered /
(burst + rate x T): 1.0 is every request the limit allows, used. The goal is >= 0.9 (issue 34).

With `requests_per_minute` 0 the endpoint has no limit and answers every request in `ALL_IN_FLIGHT_LATENCY`
seconds, and the model's concurrency is N: all N judgments are in flight at once, which measures the judge
client itself (the choice of aiohttp over httpx was measured so: docs/llm-judges.md#provider-limits).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

#: The endpoint the benchmark judges against: its limit, latency, and long tail.
JUDGE_RPM = 6000.0
JUDGE_LATENCY = 0.05
JUDGE_SLOW_SHARE = 0.01
JUDGE_SLOW_SECONDS = 1.0
#: Requests in flight the server may hold for the model: enough for the rate x the slow answers.
JUDGE_CONCURRENCY = 512
#: Without a limit: how long the endpoint takes to answer each of the N judgments all in flight at once.
ALL_IN_FLIGHT_LATENCY = 1.0


def _stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as reply:
        return dict(json.load(reply))


def bench_judges(judgments: int, requests_per_minute: float = JUDGE_RPM, workers: int = 1) -> dict[str, Any]:
    """Judge `judgments` samples through a server against the fake endpoint; the figures and the share."""
    import yaml

    from .fake_judge import Bucket
    from .testing import free_port, start_server

    port = free_port()
    limited = requests_per_minute > 0
    latency, slow_share = (JUDGE_LATENCY, JUDGE_SLOW_SHARE) if limited else (ALL_IN_FLIGHT_LATENCY, 0.0)
    endpoint = subprocess.Popen(
        [sys.executable, "-m", "grpcgrade.fake_judge", "--port", str(port)]
        + ["--requests-per-minute", str(requests_per_minute), "--latency", str(latency)]
        + ["--slow-share", str(slow_share), "--slow-seconds", str(JUDGE_SLOW_SECONDS)]
    )
    try:
        for _ in range(400):
            try:
                _stats(port)
                break
            except OSError:
                time.sleep(0.05)
        model = {"base_url": f"http://127.0.0.1:{port}/v1", "requests_per_minute": requests_per_minute}
        model["max_concurrency"] = JUDGE_CONCURRENCY if limited else judgments
        config = {"models": {"judge": model}, "grader_timeout_seconds": 600, "cache": {"enabled": False}}
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "config.yaml").write_text(yaml.safe_dump(config))
            server = start_server(Path(tmp), "--config", "config.yaml", "--workers", str(workers))
            try:
                samples = [{"query": f"question {i}", "response": f"answer {i} SCORE-3"} for i in range(judgments)]
                graders = [{"name": "llm_rubric", "params": {"rubric": "Is it right?", "model": "judge"}}]
                with server.client(timeout=3600) as client:
                    start = time.perf_counter()
                    replies = client.batch_evaluate(samples, graders)
                    elapsed = time.perf_counter() - start
            finally:
                server.stop()
        stats = _stats(port)
    finally:
        endpoint.terminate()
        endpoint.wait(10)
    ok = sum(1 for r in replies if not r.results[0].HasField("error"))
    figures = {
        "judge_judgments": judgments,
        "judge_answered": ok,
        "judge_seconds": round(elapsed, 3),
        "judge_per_second": round(ok / elapsed, 1),
        "judge_endpoint_429s": stats["throttled"],
        "judge_endpoint_max_in_flight": stats["max_in_flight"],
    }
    if not limited:
        return {**figures, "judge_endpoint_latency_seconds": latency}
    bucket = Bucket(requests_per_minute)  # the endpoint's own burst and rate, as it enforces them
    allowed = bucket.capacity + bucket.rate * elapsed
    return {
        **figures,
        "judge_endpoint_limit_per_second": round(bucket.rate, 1),
        "judge_throughput_x_limit": round(ok / allowed, 3),
    }
