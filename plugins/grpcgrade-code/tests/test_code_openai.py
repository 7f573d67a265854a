"""OpenAI's `python` grader type runs in this sandbox: in-process, over gRPC, and over OpenAI's HTTP endpoint
called with the real `openai` package. Scores follow from each `grade` function's source."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from code_helpers import backend_in_use, broken_backend

from grpcgrade import ErrorCode, GraderError, GraderScore
from grpcgrade.graders.openai.grader import AsyncOpenAIGrader, openai_grader
from grpcgrade.testing import free_port, start_server

EXACT = {
    "type": "python",
    "name": "exact",
    "source": "def grade(sample, item):\n    return float(sample['output_text'].strip() == item['answer'])\n",
    "pass_threshold": 0.5,
}
TOKEN = "code-sandbox-test-token"


def grade(grader: dict, **sample: object) -> GraderScore | GraderError:
    built = openai_grader(grader)
    assert isinstance(built, AsyncOpenAIGrader)  # it waits on the sandbox, in the event loop
    return asyncio.run(built.aevaluate(**sample))


def test_grade_runs_in_the_sandbox() -> None:
    good = grade(EXACT, response=" 42\n", answer="42")
    assert isinstance(good, GraderScore) and good.score == 1.0
    assert good.metadata["passed"] is True and good.metadata["type"] == "python"
    bad = grade(EXACT, response="41", answer="42")
    assert isinstance(bad, GraderScore) and bad.score == 0.0 and bad.metadata["passed"] is False


def test_it_sees_the_whole_sample_namespace() -> None:
    source = "def grade(sample, item):\n    return float(sample['output_json']['n'] + len(sample['choices']))\n"
    result = grade({"type": "python", "name": "ns", "source": source}, response='{"n": 2}')
    assert isinstance(result, GraderScore) and result.score == 3.0


def test_a_grade_that_raises_is_a_runtime_error_flag() -> None:
    raising = {"type": "python", "name": "r", "source": "def grade(sample, item):\n    return 1 / 0\n"}
    result = grade(raising, response="x")
    assert isinstance(result, GraderError) and result.code == ErrorCode.GRADER_FAILED
    assert result.metadata["errors"] == ["python_grader_runtime_error"]
    assert "ZeroDivisionError" in result.error


@pytest.fixture
def broken_sandbox() -> Iterator[None]:
    with backend_in_use(broken_backend()):
        yield


def test_a_sandbox_that_cannot_run_it_is_a_server_error_flag(broken_sandbox: None) -> None:
    result = grade(EXACT, response="42", answer="42")
    assert isinstance(result, GraderError) and result.code == ErrorCode.SANDBOX_UNAVAILABLE
    assert result.metadata["errors"] == ["python_grader_server_error"]


def test_over_grpc_and_over_openais_http_endpoint(tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text(TOKEN + "\n")
    port = free_port()
    args = ["--workers", "0", "--auth-token-file", "tokens", "--http-port", str(port)]
    server = start_server(tmp_path, *args, metrics=False)
    try:
        with server.client(timeout=60, token=TOKEN) as client:
            reply = client.evaluate({"response": "42", "extra": {"answer": "42"}}, [{"name": "openai_grader",
                                    "params": {"grader": EXACT}}])  # fmt: skip
        http = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=TOKEN)
        run = http.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="41", item={"answer": "42"})
    finally:
        server.stop()
    assert reply.results[0].score == 1.0 and reply.reward == 1.0
    assert run.reward == 0.0 and not any(run.metadata.errors.model_dump().values())
