"""OpenAI's grader endpoints, served by the aiohttp sub-application on a loopback port and called with the real
`openai` package, exactly as an existing script calls OpenAI (`client.fine_tuning.alpha.graders.run(...)`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web
from doc_examples import blocks, run_python
from openai_judge import Judge, answer, models_section, running_judge

from grpcgrade.core.engine import Engine
from grpcgrade.core.errors import ErrorCode
from grpcgrade.core.grading import GraderStats
from grpcgrade.core.plugins import load_plugins, make_manager
from grpcgrade.core.registry import Registry
from grpcgrade.core.samples import Limits
from grpcgrade.grader import GraderError
from grpcgrade.graders.openai.outcome import ERROR_FLAGS
from grpcgrade.llm import models
from grpcgrade.service.http.openai_graders import (
    MAX_JSON_DEPTH,
    MOUNT_PATH,
    BadRequest,
    openai_graders_root,
    run_response,
)

TOKEN = "test-token-for-graders"
EXACT = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
         "reference": "{{ item.answer }}", "operation": "eq"}  # fmt: skip
DEEP = b"[" * (MAX_JSON_DEPTH + 5) + b"]" * (MAX_JSON_DEPTH + 5)
CLOSE = {"type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}",
         "reference": "{{ item.answer }}", "evaluation_metric": "fuzzy_match"}  # fmt: skip


@contextmanager
def serving(app: web.Application) -> Iterator[str]:
    """`app` on a free loopback port, its own event loop in a thread; yields the base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    ready = threading.Event()
    bound: list[int] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())  # a port of its own, no race
        bound.append(runner.addresses[0][1])
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{bound[0]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


class Observed:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def __call__(self, stats: GraderStats) -> None:
        self.calls.append((stats.grader, stats.ok, stats.errors))


@pytest.fixture(scope="module")
def judge() -> Iterator[Judge]:
    with running_judge() as fake:
        yield fake


@pytest.fixture(scope="module")
def observed() -> Observed:
    return Observed()


@pytest.fixture(scope="module")
def base_url(judge: Judge, observed: Observed) -> Iterator[str]:
    models.configure(models.parse_models(models_section(judge)))
    pm = make_manager()
    engine = Engine(Registry(load_plugins(pm), pm), pool=None, grader_timeout=10, observer=observed)
    app = openai_graders_root(engine, tokens=[TOKEN], limits=Limits(max_field_chars=10_000))
    with serving(app) as url:
        yield url
    models.configure({})


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key=TOKEN, max_retries=0) as c:
        yield c


def flags(response: Any) -> dict[str, bool]:
    errors = response.metadata.errors.model_dump(by_alias=True)
    return {name: errors[name] for name in ERROR_FLAGS}


def raised(flag: str) -> dict[str, bool]:
    return {name: name == flag for name in ERROR_FLAGS}


def test_mount_path_is_openais():
    assert MOUNT_PATH == "/v1/fine_tuning/alpha/graders"


def test_run_a_string_check(client, observed):
    response = client.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="Paris", item={"answer": "Paris"})
    assert response.reward == 1.0
    assert (response.metadata.name, response.metadata.type) == ("exact", "string_check")
    assert flags(response) == raised("")
    assert response.metadata.errors.api_model_grader_server_error_details is None
    assert response.sub_rewards == {} and response.metadata.scores == {}
    assert response.metadata.execution_time >= 0
    assert response.metadata.token_usage is None
    assert ("openai_grader", 1, 0) in observed.calls  # graded through the engine, so the metrics see it
    miss = client.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="Lyon", item={"answer": "Paris"})
    assert miss.reward == 0.0


def test_run_a_multi_grader_reports_sub_rewards(client):
    grader = {"type": "multi", "name": "city", "graders": {"exact": EXACT, "close": CLOSE},
              "calculate_output": "0.5 * exact + 0.5 * close"}  # fmt: skip
    response = client.fine_tuning.alpha.graders.run(grader=grader, model_sample="sitting", item={"answer": "kitten"})
    assert response.reward == pytest.approx(0.5 * 0 + 0.5 * 8 / 13)  # fuzzy: 1 - indel 5 / 13 characters
    assert response.sub_rewards == {"exact": 0.0, "close": pytest.approx(8 / 13)}
    assert response.metadata.scores == response.sub_rewards
    assert response.metadata.type == "multi"


def test_run_fills_output_json_when_the_model_sample_is_json(client):
    grader = {**EXACT, "input": "{{ sample.output_json.answer }}", "reference": "{{ item.expected }}"}
    response = client.fine_tuning.alpha.graders.run(grader=grader, model_sample='{"answer": 42}', item={"expected": 42})
    assert response.reward == 1.0
    not_json = client.fine_tuning.alpha.graders.run(grader=grader, model_sample="42!", item={"expected": 42})
    assert not_json.reward is None and flags(not_json) == raised("sample_parse_error")


def test_a_missing_variable_is_flagged_and_has_no_reward(client):
    response = client.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="Paris")  # no item at all
    assert response.reward is None
    assert flags(response) == raised("invalid_variable_error")
    extension = response.metadata.model_extra["grpcgrade"]
    assert extension["error"]["code"] == "INVALID_SAMPLE"
    assert "{{ item.answer }}: item has no key 'answer'" in extension["error"]["message"]


def test_run_a_score_model_grader(client, judge):
    marker = judge.reply(answer(0.8))
    grader = {"type": "score_model", "name": "judge", "model": "gpt-4o-2024-08-06",
              "input": [{"role": "user", "content": f"Reference: {{{{ item.reference_answer }}}}\n"
                                                    f"Model answer: {{{{ sample.output_text }}}} {marker}"}],
              "sampling_params": {"temperature": 1, "top_p": 1, "seed": 42}}  # fmt: skip
    response = client.fine_tuning.alpha.graders.run(
        grader=grader, model_sample="fuzzy wuzzy was a bear", item={"reference_answer": "fuzzy wuzzy was a bear"}
    )
    assert response.reward == 0.8
    assert flags(response) == raised("")
    assert response.metadata.token_usage == 27
    assert response.metadata.sampled_model_name == "judge-x"
    assert response.api_model_grader_token_usage_per_model == {
        "gpt-4o-2024-08-06": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}
    }
    ((_, body),) = judge.requests(marker)
    assert (
        body["messages"][0]["content"]
        == f"Reference: fuzzy wuzzy was a bear\nModel answer: fuzzy wuzzy was a bear {marker}"
    )


def test_judge_failures_are_openais_model_grader_flags(client, judge):
    def run(marker: str) -> Any:
        grader = {
            "type": "score_model",
            "name": "j",
            "model": "o3-mini",
            "input": [{"role": "user", "content": marker}],
        }
        return client.fine_tuning.alpha.graders.run(grader=grader, model_sample="x")

    server = run(judge.reply(status=400))
    assert server.reward is None and flags(server) == raised("model_grader_server_error")
    assert "HTTP 400" in server.metadata.errors.api_model_grader_server_error_details
    unparsable = run(judge.reply("0.7"))
    assert unparsable.reward is None and flags(unparsable) == raised("model_grader_parse_error")
    refused = run(judge.reply(refusal="No."))
    assert refused.reward is None and flags(refused) == raised("model_grader_refusal_error")


def test_formula_errors_on_run_are_flagged_as_openai_does(client):
    grader = {"type": "multi", "name": "m", "graders": {"exact": EXACT}, "calculate_output": "exact +"}
    parse_error = client.fine_tuning.alpha.graders.run(grader=grader, model_sample="a", item={"answer": "a"})
    assert parse_error.reward is None and flags(parse_error) == raised("formula_parse_error")
    unknown = {**grader, "calculate_output": "exact + bonus"}
    variable = client.fine_tuning.alpha.graders.run(grader=unknown, model_sample="a", item={"answer": "a"})
    assert variable.reward is None and flags(variable) == raised("invalid_variable_error")
    division = {**grader, "calculate_output": "1 / exact"}
    computed = client.fine_tuning.alpha.graders.run(grader=division, model_sample="b", item={"answer": "a"})
    assert computed.reward is None and flags(computed) == raised("formula_parse_error")


def test_validate_returns_the_grader(client):
    grader = {"type": "multi", "name": "city", "graders": {"exact": EXACT, "close": CLOSE},
              "calculate_output": "max(exact, close)"}  # fmt: skip
    response = client.fine_tuning.alpha.graders.validate(grader=grader)
    assert response.grader.model_dump(exclude_none=True) == grader


@pytest.mark.parametrize(
    ("grader", "param", "message"),
    [
        ({**EXACT, "operation": "startswith"}, "grader.operation", "must be one of eq, ne, like, ilike"),
        ({**CLOSE, "evaluation_metric": "cosine"}, None, None),  # valid: the judge's models include "embedding"
        (
            {"type": "multi", "name": "m", "graders": {"a": EXACT}, "calculate_output": "a +"},
            "grader.calculate_output",
            "ends where a value was expected",
        ),  # fmt: skip
        (
            {"type": "score_model", "name": "j", "model": "gpt-4.1", "input": [{"role": "user", "content": "x"}]},
            "grader.model",
            "no model named 'gpt-4.1' is configured",
        ),  # fmt: skip
        (
            {"type": "python", "name": "p", "source": 5},
            "grader.source",
            "must be a string, got a number",
        ),  # fmt: skip
    ],
)
def test_validate_refuses_a_bad_grader_naming_the_path(client, grader, param, message):
    if param is None:
        assert client.fine_tuning.alpha.graders.validate(grader=grader).grader is not None
        return
    with pytest.raises(openai.BadRequestError) as caught:
        client.fine_tuning.alpha.graders.validate(grader=grader)
    error = caught.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert message in error["message"]
    if "calculate_output" not in param:  # run refuses it too (a bad formula on run is a flag: see above)
        with pytest.raises(openai.BadRequestError):
            client.fine_tuning.alpha.graders.run(grader=grader, model_sample="x")


def test_a_wrong_or_missing_token_is_401(base_url):
    wrong = openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0)
    with wrong, pytest.raises(openai.AuthenticationError) as caught:
        wrong.fine_tuning.alpha.graders.validate(grader=EXACT)
    assert caught.value.body["code"] == "invalid_api_key"
    reply = httpx.post(f"{base_url}{MOUNT_PATH}/validate", json={"grader": EXACT}, timeout=10)
    assert reply.status_code == 401 and reply.json()["error"]["message"] == "missing or invalid bearer token"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b'{"grader": {}}', "model_sample", "model_sample: is required"),
        (b'{"grader": {}, "model_sample": 3}', "model_sample", "must be a string"),
        (b'{"grader": {}, "model_sample": "x", "sample": {}}', "sample", "unknown field"),
        (b'{"grader": {}, "model_sample": "' + b"x" * 10_001 + b'"}', "model_sample", "over the limit of 10000"),
        (
            b'{"grader": {}, "model_sample": "x", "item": '
            + b"[" * (MAX_JSON_DEPTH + 5)
            + b"]" * (MAX_JSON_DEPTH + 5)
            + b"}",
            None,
            f"nested more than {MAX_JSON_DEPTH} levels",
        ),
        (b'{"grader": {"type": "string_check"}, "model_sample": "x"}', "grader.name", "grader.name: is required"),
    ],
)
def test_malformed_run_requests_are_400_saying_what_is_wrong(base_url, body, param, message):
    reply = httpx.post(
        f"{base_url}{MOUNT_PATH}/run", content=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == param and message in error["message"]


def test_docs_http_example_runs_unchanged_but_for_the_address(base_url):
    script = blocks("openai-graders.md", "python")[1]
    assert 'base_url="http://127.0.0.1:8080/v1", api_key="my-token"' in script
    script = script.replace("http://127.0.0.1:8080", base_url).replace("my-token", TOKEN)
    reward, subs = run_python(script, "openai-graders.md").strip().split(" ", 1)
    # "Pariss" against "Paris": exact 0, fuzzy 1 - 1/11
    assert float(reward) == pytest.approx(0.5 * 10 / 11)
    assert subs == repr({"exact": 0.0, "close": 10 / 11})


def test_errors_from_outside_the_grader_map_to_openai_flags():
    """A time limit or a crash (results the engine makes, without the grader's own flags)."""
    timeout = GraderError("openai_grader", "grader ran past its time limit of 5 s", code=ErrorCode.TIMEOUT)
    crash = GraderError("openai_grader", "RuntimeError: boom", code=ErrorCode.GRADER_FAILED)
    for result, flag in ((timeout, "unresponsive_reward_error"), (crash, "other_error")):
        body = run_response(result, EXACT, 0.5)
        assert body["reward"] is None
        assert {k: v for k, v in body["metadata"]["errors"].items() if k in ERROR_FLAGS} == raised(flag)
        assert (body["metadata"]["name"], body["metadata"]["type"]) == ("exact", "string_check")
        assert body["metadata"]["grpcgrade"]["error"] == {"code": result.code, "message": result.error}


def test_run_takes_tool_calls_as_output_tools(client):
    """grpcgrade's one extension of the run body (docs/agents.md): `tool_calls` fill `sample.output_tools`.
    OpenAI's client sends it through `extra_body`."""
    picked = {
        "type": "string_check",
        "name": "picked",
        "input": "{{ sample.output_tools[0].function.name }}",
        "reference": "{{ item.tool }}",
        "operation": "eq",
    }
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    run = client.fine_tuning.alpha.graders.run
    hit = run(grader=picked, model_sample="", item={"tool": "weather"}, extra_body={"tool_calls": [call]})
    assert hit.reward == 1.0
    miss = run(grader=picked, model_sample="", item={"tool": "stocks"}, extra_body={"tool_calls": [call]})
    assert miss.reward == 0.0
    with pytest.raises(openai.BadRequestError, match="tool_calls"):
        run(grader=picked, model_sample="", item={}, extra_body={"tool_calls": "weather"})
    with pytest.raises(openai.BadRequestError, match="max_field_chars"):  # this app's limit is 10,000
        run(grader=picked, model_sample="", item={}, extra_body={"tool_calls": [{"x": "y" * 20_000}]})


def test_a_body_its_parsing_processes_could_not_parse_is_503_with_a_retry_hint():
    """The route's answer to a body whose parsing processes died under it twice or hung (`read_json`'s
    BodyError, status 503): the server's trouble, so a retry hint as every other face sends with a 503; it
    had none, and the OpenAI SDK then retries on its own backoff instead of the server's word."""
    from grpcgrade.core.json_body import BodyError

    body_error = BodyError("the request body could not be parsed (WORKER_LOST): died twice", status=503)
    refused = BadRequest(str(body_error), status=body_error.status).response()
    assert refused.status == 503 and int(refused.headers["Retry-After"]) >= 1
    assert BadRequest("model_sample: is required", param="model_sample").response().headers.get("Retry-After") is None
