"""LLM judges against a real OpenAI-compatible HTTP server on 127.0.0.1, in process and through a real server.

The fake endpoint answers POST /v1/chat/completions with canned judgments chosen by a `CASE:<name>` marker
in the prompt, records every request (body, Authorization header, requests in flight), and can fail a
marker's first request (429, 503, dropped connection) or hold requests at a barrier that opens only when
enough of them are in flight at once: that proves concurrency without measuring time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

import grpcgrade
from grpcgrade.client import AsyncGradingClient
from grpcgrade.core.config import parse_config
from grpcgrade.core.errors import ConfigError, InvalidParams
from grpcgrade.core.retry import MAX_ANSWER_BYTES, MAX_BACKOFF_SECONDS, backoff
from grpcgrade.graders.llm.correctness import CORRECTNESS_PROMPT_EN
from grpcgrade.graders.llm.rank import RANK_PROMPT_ZH
from grpcgrade.graders.llm.rubric import RUBRIC_PROMPT_EN, RUBRIC_PROMPT_ZH, LLMRubricGrader
from grpcgrade.llm import models
from grpcgrade.llm.chat import ChatError
from grpcgrade.llm.parsing import JudgeOutputError, json_objects, parse_rank, parse_score
from grpcgrade.llm.prompt import PromptError
from grpcgrade.service.server import ServeOptions, build_server
from grpcgrade.service.structs import struct_to_dict
from grpcgrade.testing import eventually, free_port, start_server
from grpcgrade.v1 import grading_pb2 as pb

KEY_ENV = "GRPCGRADE_TEST_JUDGE_KEY"
KEY = "test-key-" + uuid.uuid4().hex
CJK = re.compile(r"[\u4e00-\u9fff]")
MARKER = re.compile(r"CASE:([\w-]+)")
#: The fake endpoint writes a large answer in pieces of this size, a moment apart, as a network delivers it.
PIECE = 64 * 1024


def completion(content: str) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class FakeJudge:
    """The endpoint's state, shared by its handler threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()
        self.barriers: dict[str, threading.Barrier] = {}
        self.release = threading.Event()  # set at teardown, so a held "slow" answer ends at once
        self.holds: dict[str, threading.Event] = {}  # "held" answers wait for their group's event
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def marked(self, marker: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r["marker"] == marker]

    def hold(self, group: str) -> threading.Event:
        """The event a "held" marker's answers wait for: the test sets it (teardown sets `release`)."""
        with self.lock:
            return self.holds.setdefault(group, threading.Event())

    def _barrier(self, group: str, parties: int) -> threading.Barrier:
        with self.lock:
            return self.barriers.setdefault(group, threading.Barrier(parties, timeout=10))

    def answer(self, marker: str, count: int) -> tuple[int, Any, dict[str, str]] | None:
        """(status, body, headers) for a request, or None to drop the connection without an answer."""
        kind = marker.split("-")[0]
        if kind == "score":
            score = int(marker.split("-")[1])
            return 200, completion(json.dumps({"score": score, "reason": f"canned {score}"})), {}
        if kind == "fenced":
            text = 'My verdict:\n```json\n{"score": 2, "reason": "fenced"}\n```\nThat is all.'
            return 200, completion(text), {}
        if kind == "malformed":
            return 200, completion("The response looks fine to me."), {}
        if kind == "nonnumeric":
            return 200, completion('{"score": "high", "reason": "words"}'), {}
        if kind == "outofrange":
            return 200, completion('{"score": 9, "reason": "too high"}'), {}
        if kind == "rankgood":
            return 200, completion('Ranking: {"rank": [2, 1, 3], "reason": "the second is best"}'), {}
        if kind == "rankbad":
            return 200, completion('{"rank": [1, 1, 2], "reason": "a tie"}'), {}
        if kind == "badrequest":
            return 400, {"error": {"message": "bad request"}}, {}
        if kind == "nested":  # JSON past the parser's nesting limit: the endpoint's fault, not the sample's
            return 200, b"[" * 100_000 + b"]" * 100_000, {}
        if kind == "oversize":  # a valid completion, one byte past the most the client reads
            pad = MAX_ANSWER_BYTES - len(json.dumps(completion('{"score": 2, "reason": "r"}')))
            return 200, {**completion('{"score": 2, "reason": "r"}'), "pad": "p" * pad}, {}
        if kind == "deepjudgment":  # a judgment nested past the parser's limit (quoting a response, say)
            return 200, completion('{"a": ' * 5_000 + '{"score": 3}'), {}
        if kind == "long":  # a long reasoning: arrives over several reads
            return 200, completion(json.dumps({"score": 2, "reason": "because " * 40_000})), {}
        if kind in ("flaky429", "flaky503", "drop") and count == 1:
            if kind == "drop":
                return None
            status = 429 if kind == "flaky429" else 503
            return status, {"error": {"message": "try later"}}, {"Retry-After": "0"}
        if kind in ("flaky429", "flaky503", "drop"):
            return 200, completion('{"score": 3, "reason": "second try"}'), {}
        if kind == "held":  # answered when the test says so: its requests hold the model's slots meanwhile
            held = self.hold(marker.rsplit("-", 1)[0])
            while not (held.wait(0.05) or self.release.is_set()):
                pass
            return 200, completion('{"score": 4, "reason": "after a while"}'), {}
        if kind == "slow":
            self.release.wait(10)
            return 200, completion('{"score": 5, "reason": "late"}'), {}
        if kind.startswith("barrier"):
            parties = int(kind.removeprefix("barrier"))
            try:
                self._barrier(marker.rsplit("-", 1)[0], parties).wait()
            except threading.BrokenBarrierError:
                return 400, {"error": {"message": f"fewer than {parties} requests were in flight at once"}}, {}
            return 200, completion('{"score": 1, "reason": "met at the barrier"}'), {}
        return 200, completion('{"score": 1, "reason": "no marker"}'), {}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        judge = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any, headers: dict[str, str]) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                # a client that stopped waiting (the timeout test) has closed the connection: nothing to answer
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    for start in range(0, len(data), PIECE):  # as a network delivers a large answer: in pieces
                        if start:
                            time.sleep(0.002)
                        self.wfile.write(data[start : start + PIECE])

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                content = body["messages"][-1]["content"]
                found = MARKER.search(content)
                marker = found.group(1) if found else ""
                group = marker.rsplit("-", 1)[0]
                with judge.lock:
                    judge.counts[marker] += 1
                    count = judge.counts[marker]
                    judge.requests.append(
                        {"marker": marker, "body": body, "path": self.path, "auth": self.headers.get("Authorization")}
                    )
                    judge.in_flight[group] += 1
                    judge.max_in_flight[group] = max(judge.max_in_flight[group], judge.in_flight[group])
                try:
                    if self.path != "/v1/chat/completions":
                        reply: tuple[int, Any, dict[str, str]] | None = (404, {"error": "no such path"}, {})
                    elif self.headers.get("Authorization") != f"Bearer {KEY}":
                        reply = (401, {"error": {"message": "invalid api key"}}, {})
                    elif marker.startswith("echoauth"):  # an endpoint whose error page shows the request's headers
                        shown = "".join(f"{k}: {v}\n" for k, v in self.headers.items())
                        reply = (400, {"error": {"message": f"bad request; you sent:\n{shown}"}}, {})
                    else:
                        reply = judge.answer(marker, count)
                finally:
                    with judge.lock:  # before answering: the client may send its next request right after
                        judge.in_flight[group] -= 1
                if reply is None:
                    self.close_connection = True
                    return
                self._send(*reply)

        return Handler


@pytest.fixture(scope="module")
def judge() -> Iterator[FakeJudge]:
    fake = FakeJudge()
    fake.thread.start()
    yield fake
    fake.release.set()
    fake.httpd.shutdown()
    fake.httpd.server_close()


def models_section(judge: FakeJudge) -> dict[str, Any]:
    common = {"base_url": judge.base_url, "api_key_env": KEY_ENV, "retry_backoff_seconds": 0.01}
    return {
        "default": {**common, "model": "judge-a", "max_concurrency": 8, "timeout_seconds": 5, "max_retries": 2},
        "narrow": {**common, "model": "judge-narrow", "max_concurrency": 2, "timeout_seconds": 5},
        "slow": {**common, "model": "judge-slow", "timeout_seconds": 0.3, "max_retries": 1},
        "keyless": {"base_url": judge.base_url, "model": "judge-keyless", "max_retries": 3},
    }


@pytest.fixture
def configured(judge: FakeJudge, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's models point at the fake judge; afterwards, back to the environment's."""
    monkeypatch.setenv(KEY_ENV, KEY)
    models.configure(models.parse_models(models_section(judge)))
    yield
    monkeypatch.delenv(KEY_ENV)
    models.configure({})


@pytest.fixture(scope="module")
def llm_server(judge: FakeJudge, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("llm-server")
    config = {
        "grader_timeout_seconds": 20,
        "models": models_section(judge),
        "rewards": {"judged": {"graders": [{"name": "llm_correctness", "params": {"min_score": 0, "max_score": 5}}]}},
    }
    path = tmp / "grpcgrade.yaml"
    path.write_text(yaml.safe_dump(config))
    srv = start_server(tmp, "--workers", "0", "--config", str(path), env={KEY_ENV: KEY})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def llm_client(llm_server):
    with llm_server.client(timeout=60) as c:
        yield c


def case(name: str) -> str:
    """A marker unique to this call, so request counts never mix between tests."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def result_of(reply: pb.EvaluateResponse) -> pb.GraderResult:
    (result,) = reply.results
    return result


def metadata(result: pb.GraderResult) -> dict[str, Any]:
    return struct_to_dict(result.metadata)


def prompt(template: str, **variables: Any) -> str:
    """What the seeds' PromptTemplate sends: the dedented prompt, filled by str.format."""
    return textwrap.dedent(template).strip().format(**variables)


# --- output parsing (in process) ------------------------------------------------------------------


def test_json_objects_are_found_in_prose_and_fences_nested_ones_not_separately():
    text = 'I think {not json} so:\n```json\n{"score": 4, "detail": {"score": 1}}\n```\nand {"rank": [1]}'
    assert json_objects(text) == [{"score": 4, "detail": {"score": 1}}, {"rank": [1]}]
    assert json_objects("no braces at all") == []


def test_reading_an_answer_is_bounded_however_the_response_shapes_it():
    """A judge may quote the graded response, so its answer's shape is the trainer's policy's: a run of
    braces is passed over (each was a decoding try, the time growing with the square of the length), an
    answer nested past the parser's limit or made of endless broken objects is the judge's unusable
    answer (a RecursionError before, blamed on the sample; a scan of seconds on the event loop)."""
    assert parse_score("{" * 20_000 + '{"score": 3, "reason": "r"}') == (3.0, "r")
    with pytest.raises(JudgeOutputError, match="nested too deeply"):
        json_objects('{"a": ' * 5_000 + '{"score": 3}')
    with pytest.raises(JudgeOutputError, match="too many JSON objects, or broken ones"):
        json_objects('{"a": 1, ' * 20_000 + '{"score": 3}')
    assert json_objects('{ }{\n"score": 2}') == [{}, {"score": 2}]  # every start an object can have
    # an object Python cannot read (an integer past its 4,300 digits) is passed over, as one not JSON is
    assert parse_score('{"x": ' + "1" * 5000 + '} {"score": 3, "reason": "r"}') == (3.0, "r")


def test_parse_score_takes_the_last_object_with_a_score():
    draft_then_answer = 'Draft: {"score": 2, "reason": "draft"}. Final: {"score": 4, "reason": "final"}'
    assert parse_score(draft_then_answer, (1, 5)) == (4.0, "final")
    assert parse_score('{"score": 0.5}') == (0.5, "")
    assert parse_score('{"score": 3, "reason": {"why": "ok"}}', (1, 5)) == (3.0, '{"why": "ok"}')


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("The response looks fine.", "no JSON object with 'score'"),
        ('{"reason": "no score"}', "no JSON object with 'score'"),
        ('{"score": "4"}', "not a number"),
        ('{"score": true}', "not a number"),
        ('{"score": NaN}', "not a number"),  # json.loads accepts NaN; a reward must not
        ('{"score": null}', "not a number"),
        ('{"score": 6}', "outside the range 1..5"),
        ('{"score": 0.99}', "outside the range 1..5"),
    ],
)
def test_parse_score_refuses_unusable_answers(text, message):
    with pytest.raises(JudgeOutputError, match=re.escape(message)):
        parse_score(text, (1, 5))


def test_parse_rank_needs_a_permutation_of_1_to_n():
    assert parse_rank('{"rank": [3, 1, 2], "reason": "r"}', 3) == ([3, 1, 2], "r")
    for bad, message in [
        ('{"rank": [1, 1, 2]}', "not a permutation of 1..3"),
        ('{"rank": [1, 2]}', "not a permutation of 1..3"),
        ('{"rank": [0, 1, 2]}', "not a permutation of 1..3"),
        ('{"rank": [1, 2, 3.5]}', "not a list of integers"),
        ('{"rank": "1,2,3"}', "not a list of integers"),
        ('{"order": [1, 2, 3]}', "no JSON object with 'rank'"),
    ]:
        with pytest.raises(JudgeOutputError, match=re.escape(message)):
            parse_rank(bad, 3)


def test_backoff_doubles_with_jitter_and_obeys_retry_after():
    for attempt in range(4):
        full = 0.5 * 2**attempt
        delays = [backoff(attempt, 0.5) for _ in range(50)]
        assert all(full / 2 <= d <= full for d in delays)
    assert backoff(30, 0.5) <= MAX_BACKOFF_SECONDS
    assert backoff(0, 0.5, after=7.0) == 7.0  # never sooner than the service asks
    assert backoff(0, 0.5, after=10_000.0) == MAX_BACKOFF_SECONDS


# --- templates (in process) -----------------------------------------------------------------------


def test_template_fills_variables_with_str_format_rules():
    template = grpcgrade.PromptTemplate(
        messages={
            grpcgrade.LanguageEnum.EN: [grpcgrade.ChatMessage(role="user", content='Q: {query} -> {{"score": 1}}')],
            grpcgrade.LanguageEnum.ZH: [grpcgrade.ChatMessage(role="user", content="问题：{query}")],
        }
    )
    value = "a {response} with {{braces}}"
    (en,) = template.format(grpcgrade.LanguageEnum.EN, query=value)
    assert en.content == f'Q: {value} -> {{"score": 1}}'
    (zh,) = template.format(grpcgrade.LanguageEnum.ZH, query="x")
    assert zh.content == "问题：x"
    with pytest.raises(PromptError, match="'query' has no value"):
        template.format(grpcgrade.LanguageEnum.EN)


def test_grader_language_must_have_a_prompt(configured):
    only_english = [grpcgrade.ChatMessage(role="user", content="{response}")]
    with pytest.raises(InvalidParams) as info:
        LLMRubricGrader(rubric="r", language="fr")
    assert info.value.param == "language"
    one_for_all = grpcgrade.LLMGrader(model="default", template=only_english, language="zh")
    assert one_for_all.template.to_messages(grpcgrade.LanguageEnum.ZH) == only_english
    english = grpcgrade.PromptTemplate(messages={grpcgrade.LanguageEnum.EN: only_english})
    with pytest.raises(InvalidParams, match="prompts in: en"):
        grpcgrade.LLMGrader(template=english, language="zh")


def test_grader_score_range_is_checked_at_construction():
    for kwargs, param in [
        ({"min_score": 5, "max_score": 1}, "max_score"),
        ({"min_score": 1, "max_score": 1}, "max_score"),
        ({"min_score": 0, "max_score": float("inf")}, "max_score"),
        ({"min_score": 1}, "max_score"),
    ]:
        with pytest.raises(InvalidParams) as info:
            grpcgrade.LLMGrader(template="{response}", **kwargs)
        assert info.value.param == param
    with pytest.raises(InvalidParams) as info:
        LLMRubricGrader(rubric="  ")
    assert info.value.param == "rubric"


# --- model configuration (in process) ---------------------------------------------------------------


def test_parse_models_accepts_a_list_or_a_mapping(monkeypatch):
    monkeypatch.setenv("GRPCGRADE_TEST_KEY_A", "secret-a")
    as_list = models.parse_models(
        [{"name": "a", "base_url": "http://127.0.0.1:1/v1", "model": "m-a", "api_key_env": "GRPCGRADE_TEST_KEY_A"}]
    )
    as_mapping = models.parse_models(
        {"a": {"base_url": "http://127.0.0.1:1/v1", "model": "m-a", "api_key_env": "GRPCGRADE_TEST_KEY_A"}}
    )
    assert as_list == as_mapping
    a = as_list["a"]
    assert (a.name, a.model, a.api_key) == ("a", "m-a", "secret-a")
    assert (a.max_concurrency, a.timeout_seconds, a.max_retries) == (16, 60.0, 2)
    assert "secret-a" not in repr(a)
    assert models.parse_models({"m": {"base_url": "https://h/v1"}})["m"].model == "m"  # the name by default


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"a": {"base_url": "ftp://h/v1"}}, "base_url must be an http(s) URL"),
        ({"a": {"base_url": "http:///v1"}}, "base_url must be an http(s) URL"),
        ({"a": {"base_url": "http://h", "url": "x"}}, "unknown setting 'url'"),
        ({"a": {"base_url": "http://h", "api_key_env": "GRPCGRADE_TEST_UNSET_VAR"}}, "'GRPCGRADE_TEST_UNSET_VAR'"),
        ({"a": {"base_url": "http://h", "max_concurrency": 0}}, "max_concurrency must be at least 1"),
        ({"a": {"base_url": "http://h", "max_concurrency": 2.5}}, "max_concurrency must be an integer"),
        ({"a": {"base_url": "http://h", "timeout_seconds": "soon"}}, "timeout_seconds must be a number"),
        ({"a": {"base_url": "http://h", "extra_body": {"model": "other"}}}, "extra_body may not set 'model'"),
        ([{"name": "a", "base_url": "http://h"}, {"name": "a", "base_url": "http://h"}], "defined twice"),
        ([{"base_url": "http://h"}], "`name` is required"),
        ("default", "must be a list or a mapping"),
    ],
)
def test_parse_models_refuses_bad_settings(section, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        models.parse_models(section)


def test_server_config_reads_models_and_reports_where_it_is_wrong():
    config = parse_config({"models": {"judge": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}}, "cfg.yaml")
    assert config.models["judge"].base_url == "http://127.0.0.1:9/v1"
    with pytest.raises(ConfigError, match=r"cfg\.yaml: models: model 'judge': base_url"):
        parse_config({"models": {"judge": {"base_url": "judge.example"}}}, "cfg.yaml")


def test_default_model_comes_from_the_environment_unless_configured(monkeypatch):
    monkeypatch.setenv("GRPCGRADE_LLM_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    try:
        models.configure({})
        default = models.get_model("default").config
        assert (default.base_url, default.model, default.api_key) == ("http://127.0.0.1:9/v1", "env-model", "env-key")
        models.configure(models.parse_models({"default": {"base_url": "http://127.0.0.1:8/v1", "model": "cfg"}}))
        assert models.get_model("default").config.model == "cfg"
        monkeypatch.delenv("GRPCGRADE_LLM_MODEL")
        models.configure({})
        with pytest.raises(InvalidParams, match="configured models: none") as info:
            models.get_model("default")
        assert info.value.param == "model"
    finally:
        monkeypatch.undo()
        models.configure({})


# --- the grader in process, against the fake endpoint -----------------------------------------------


def test_custom_llm_grader_in_process(judge, configured):
    """A grader written the seeds' way: params become template variables; each asyncio.run gets a client."""
    grader = grpcgrade.LLMGrader(
        model="default",
        name="polite",
        template=[
            grpcgrade.ChatMessage(role="system", content="Judge {aspect}."),
            grpcgrade.ChatMessage(role="user", content="{response} CASE:{marker}"),
        ],
        min_score=0,
        max_score=5,
        aspect="politeness",
    )
    marker = case("score-4")
    for _ in range(2):  # a second event loop must not reuse the first loop's client
        result = asyncio.run(grader.aevaluate(response="Thank you!", marker=marker))
        assert (result.name, result.score, result.reason) == ("polite", 4.0, "canned 4")
        assert result.metadata == {
            "model": "default",
            "attempts": 1,
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
    request = judge.marked(marker)[0]
    assert request["body"]["messages"] == [
        {"role": "system", "content": "Judge politeness."},
        {"role": "user", "content": f"Thank you! CASE:{marker}"},
    ]
    assert request["path"] == "/v1/chat/completions"
    with pytest.raises(JudgeOutputError, match="outside the range 0..5"):
        asyncio.run(grader.aevaluate(response="x", marker=case("outofrange")))
    sample_tries = case("score-2")  # a sample field does not override a param of the grader
    asyncio.run(grader.aevaluate(response="x", marker=sample_tries, aspect="length"))
    assert judge.marked(sample_tries)[0]["body"]["messages"][0]["content"] == "Judge politeness."


def test_a_client_is_closed_when_its_event_loop_ends(judge, configured):
    """A script's `asyncio.run` opened the model's HTTP session and left it open as its loop ended (aiohttp
    cannot close a session once its loop is closed): its connections stayed until the garbage collector. Now
    the loop's end closes it, and the next loop gets a session of its own."""
    grader = grpcgrade.LLMGrader(model="default", template="{response}", min_score=0, max_score=5)

    async def judged() -> Any:
        assert (await grader.aevaluate(response=f"CASE:{case('score-4')}")).score == 4.0
        return models.get_model("default")._client

    first = asyncio.run(judged())
    assert first is not None and first.closed
    second = asyncio.run(judged())
    assert second is not first and second.closed


def test_a_client_left_on_a_loop_that_goes_on_is_closed_on_that_loop(judge, configured):
    """The model used on a loop that keeps running (another thread's), then on this one: the session it
    leaves is closed on its own loop, not dropped open."""
    grader = grpcgrade.LLMGrader(model="default", template="{response}", min_score=0, max_score=5)
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()

    async def judged() -> Any:
        assert (await grader.aevaluate(response=f"CASE:{case('score-4')}")).score == 4.0
        return models.get_model("default")._client

    try:
        left = asyncio.run_coroutine_threadsafe(judged(), other).result(60)
        assert left is not None and not left.closed
        asyncio.run(judged())
        eventually(lambda: left.closed, "the left session closed on its loop", bound=20)
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(10)
        other.close()


def test_non_transient_errors_fail_at_once_in_process(judge, configured):
    grader = grpcgrade.LLMGrader(model="keyless", template="{response}", min_score=1, max_score=5)
    marker = case("score-3")
    with pytest.raises(ChatError, match="HTTP 401"):
        asyncio.run(grader.aevaluate(response=f"CASE:{marker}"))
    assert len(judge.marked(marker)) == 1  # max_retries is 3, but a 401 is not retried
    assert judge.marked(marker)[0]["auth"] is None  # no api_key_env: no Authorization header


# --- end to end through a real grpcgrade server ------------------------------------------------------


def test_an_error_page_echoing_the_api_key_is_redacted(llm_server, llm_client, judge):
    marker = case("echoauth")
    reply = llm_client.evaluate({"response": f"CASE:{marker}"}, [{"name": "llm_rubric", "params": {"rubric": "r"}}])
    error = result_of(reply).error
    assert error.code == "GRADER_FAILED" and "HTTP 400" in error.message
    assert judge.marked(marker)[0]["auth"] == f"Bearer {KEY}"  # the key was sent, and shown back
    assert KEY not in error.message and KEY not in llm_server.log()
    assert "[redacted]" in error.message


def test_pointwise_judgments_and_bad_answers_become_error_results(llm_client, judge):
    markers = [case(k) for k in ("score-4", "fenced", "malformed", "nonnumeric", "outofrange")]
    samples = [{"id": str(i), "query": "Capital?", "response": f"Paris. CASE:{m}"} for i, m in enumerate(markers)]
    replies = llm_client.batch_evaluate(samples, [{"name": "llm_rubric", "params": {"rubric": "Names the capital."}}])
    results = [result_of(r) for r in replies]
    assert [(r.score, r.reason) for r in results[:2]] == [(4.0, "canned 4"), (2.0, "fenced")]
    assert [r.reward for r in replies[:2]] == [4.0, 2.0]
    assert metadata(results[0])["model"] == "default"
    assert metadata(results[0])["attempts"] == 1
    errors = [(r.error.code, r.error.message) for r in results[2:]]
    assert all(code == "GRADER_FAILED" for code, _ in errors)
    assert "no JSON object with 'score'" in errors[0][1]
    assert "not a number: 'high'" in errors[1][1]
    assert "outside the range 1..5" in errors[2][1]
    assert not any(r.HasField("reward") for r in replies[2:])
    assert [len(judge.marked(m)) for m in markers] == [1] * 5  # a bad answer is final, not retried


def test_prompt_that_reaches_the_endpoint_in_english_and_chinese(llm_client, judge):
    rubric = "States the boiling point of water at sea level."
    query = "At what temperature does water boil?"
    sent = {}
    for language in ("en", "zh"):
        marker = case("score-5")
        response = f"100 °C, i.e. {{response}} {{{{braces}}}} stay as they are. CASE:{marker}"
        reply = llm_client.evaluate(
            {"query": query, "response": response},
            [{"name": "llm_rubric", "params": {"rubric": rubric, "language": language}}],
        )
        assert result_of(reply).score == 5.0
        (request,) = judge.marked(marker)
        assert request["body"]["model"] == "judge-a"
        assert request["auth"] == f"Bearer {KEY}"
        (message,) = request["body"]["messages"]
        assert message["role"] == "user"
        template = RUBRIC_PROMPT_EN if language == "en" else RUBRIC_PROMPT_ZH
        assert message["content"] == prompt(
            template, rubric=rubric, query=query, response=response, min_score="1", max_score="5"
        )
        sent[language] = message["content"]
    assert rubric in sent["en"] and query in sent["en"] and "{response} {{braces}}" in sent["en"]
    assert not CJK.search(sent["en"])
    assert "评分标准" in sent["zh"] and rubric in sent["zh"]


def test_correctness_sends_the_reference_and_needs_one(llm_client, judge):
    marker, missing = case("score-5"), case("score-5")
    samples = [
        {"query": "2+2?", "response": f"Four. CASE:{marker}", "reference": "4"},
        {"query": "2+2?", "response": f"Four. CASE:{missing}"},
    ]
    replies = llm_client.batch_evaluate(samples, [{"name": "llm_correctness", "params": {"min_score": 0}}])
    assert result_of(replies[0]).score == 5.0
    (request,) = judge.marked(marker)
    assert request["body"]["messages"][0]["content"] == prompt(
        CORRECTNESS_PROMPT_EN,
        query="2+2?",
        reference="4",
        response=f"Four. CASE:{marker}",
        min_score="0",
        max_score="5",
    )
    error = result_of(replies[1]).error  # a sample without a reference never reaches the judge
    assert error.code == "INVALID_SAMPLE" and "missing input 'reference'" in error.message
    assert judge.marked(missing) == []


def test_configured_reward_with_an_llm_grader(llm_client, judge):
    """The reward's graders are built at start, so the models must be configured before that."""
    marker = case("score-3")
    sample = {"query": "q", "response": f"CASE:{marker}", "reference": "r"}
    reply = llm_client.evaluate(sample, reward="judged")
    assert (result_of(reply).grader, reply.reward) == ("llm_correctness", 3.0)
    assert judge.marked(marker)[0]["body"]["messages"][0]["content"] == prompt(
        CORRECTNESS_PROMPT_EN, query="q", reference="r", response=f"CASE:{marker}", min_score="0", max_score="5"
    )


def test_listwise_rank_and_a_rank_that_is_not_a_permutation(llm_client, judge):
    good, bad = case("rankgood"), case("rankbad")
    responses = ["Paris is in Germany.", "Paris.", "It is {Paris}."]
    replies = llm_client.batch_evaluate(
        [
            {"query": f"Capital of France? CASE:{good}", "responses": responses},
            {"query": f"Capital of France? CASE:{bad}", "responses": responses},
        ],
        [{"name": "llm_rank", "params": {"language": "zh"}}],
    )
    ok, broken = (result_of(r) for r in replies)
    assert (list(ok.rank), ok.reason) == ([2, 1, 3], "the second is best")
    assert broken.error.code == "GRADER_FAILED"
    assert "not a permutation of 1..3" in broken.error.message
    content = judge.marked(good)[0]["body"]["messages"][0]["content"]
    numbered = "\n\n".join(f"<response_{i}>\n{r}\n</response_{i}>" for i, r in enumerate(responses, 1))
    assert content == prompt(
        RANK_PROMPT_ZH,
        num_responses=3,
        rubric="整体质量：正确性、有用性、与问题的相关性以及表达的清晰度。",
        query=f"Capital of France? CASE:{good}",
        numbered_responses=numbered,
    )


def test_transient_failures_are_retried(llm_client, judge):
    markers = [case("flaky429"), case("flaky503"), case("drop")]
    replies = llm_client.batch_evaluate(
        [{"response": f"CASE:{m}"} for m in markers], [{"name": "llm_rubric", "params": {"rubric": "r"}}]
    )
    for marker, reply in zip(markers, replies, strict=True):
        result = result_of(reply)
        assert not result.HasField("error"), result.error.message
        assert (result.score, metadata(result)["attempts"]) == (3.0, 2)
        assert len(judge.marked(marker)) == 2


def test_failures_that_retrying_cannot_fix_are_final(llm_client, judge):
    rejected, unauthorised = case("badrequest"), case("score-5")
    replies = llm_client.batch_evaluate(
        [{"response": f"CASE:{rejected}"}], [{"name": "llm_rubric", "params": {"rubric": "r"}}]
    )
    assert "HTTP 400" in result_of(replies[0]).error.message
    reply = llm_client.evaluate(
        {"response": f"CASE:{unauthorised}"}, [{"name": "llm_rubric", "params": {"rubric": "r", "model": "keyless"}}]
    )
    assert "HTTP 401" in result_of(reply).error.message
    assert (len(judge.marked(rejected)), len(judge.marked(unauthorised))) == (1, 1)


def test_answers_are_read_whole_and_the_endpoints_faults_are_its_own(llm_client, judge):
    """A long reasoning (~320 kB, more than one read of the connection) is read whole: the client read once
    and refused what had arrived as "not JSON". An answer nested past the parser's limit is the endpoint's
    error (GRADER_FAILED naming the model), not INVALID_SAMPLE, which blamed the sample; one past the most
    the client reads is refused naming the limit; so is a judgment nested too deeply (INVALID_SAMPLE too)."""
    markers = [case(kind) for kind in ("long", "nested", "oversize", "deepjudgment")]
    rubric = [{"name": "llm_rubric", "params": {"rubric": "r"}}]
    replies = llm_client.batch_evaluate([{"response": f"CASE:{m}"} for m in markers], rubric)
    graded, deep, big, deep_judgment = (result_of(r) for r in replies)
    assert graded.score == 2.0 and not graded.HasField("error")
    assert [r.error.code for r in (deep, big, deep_judgment)] == ["GRADER_FAILED"] * 3
    assert "model 'default'" in deep.error.message and "nested too deeply" in deep.error.message
    assert f"over {MAX_ANSWER_BYTES} bytes" in big.error.message
    assert "answer is nested too deeply to read" in deep_judgment.error.message


def test_an_answer_slower_than_the_model_timeout_is_an_error_result(llm_client, judge):
    marker = case("slow")
    reply = llm_client.evaluate(
        {"response": f"CASE:{marker}"}, [{"name": "llm_rubric", "params": {"rubric": "r", "model": "slow"}}]
    )
    error = result_of(reply).error
    assert error.code == "GRADER_FAILED"
    assert "model 'slow': no answer within 0.3 s (after 2 attempts)" in error.message
    assert len(judge.marked(marker)) == 2  # a timeout is retried once (max_retries: 1)
    assert judge.marked(marker)[0]["body"]["model"] == "judge-slow"


def test_judge_calls_run_concurrently_within_each_models_limit(llm_client, judge):
    wide, narrow = case("barrier4"), case("barrier2")
    rubric = {"name": "llm_rubric", "params": {"rubric": "r"}}
    # the barrier opens only when 4 requests are in flight together: a serial client would get 400s
    replies = llm_client.batch_evaluate([{"response": f"CASE:{wide}-{i}"} for i in range(4)], [rubric])
    assert [result_of(r).score for r in replies] == [1.0] * 4, [result_of(r).error.message for r in replies]
    assert judge.max_in_flight[wide] == 4
    # model "narrow" allows 2 at once: 6 samples pass a barrier of 2 in pairs, never 3 in flight
    narrow_rubric = {"name": "llm_rubric", "params": {"rubric": "r", "model": "narrow"}}
    replies = llm_client.batch_evaluate([{"response": f"CASE:{narrow}-{i}"} for i in range(6)], [narrow_rubric])
    assert [result_of(r).score for r in replies] == [1.0] * 6, [result_of(r).error.message for r in replies]
    assert judge.max_in_flight[narrow] == 2
    assert {r["body"]["model"] for r in judge.requests if r["marker"].startswith(narrow)} == {"judge-narrow"}


def test_queueing_for_a_model_slot_does_not_count_against_the_grader_time_limit(llm_server, judge):
    """A call without a time limit holds both of model "narrow"'s slots (its judge answers when the test
    says); a call under a 1 s grader limit queues behind it for longer than 1 s, then its judgments, each
    answered at once, are graded: the wait for a slot did not count against the limit. Nothing here races
    the load: the held judgments end when released, and the server's queue-wait histogram shows the
    queued samples waited past the limit (so the case is the one meant)."""
    holder, marker, caller = case("held"), case("score-4"), f"queued-{uuid.uuid4().hex[:8]}"
    rubric = {"name": "llm_rubric", "params": {"rubric": "r", "model": "narrow"}}
    limit = 1.0  # a bucket bound of the queue-wait histogram (usage.SECONDS_BUCKETS)
    with (
        llm_server.client(timeout=60) as held_client,
        llm_server.client(timeout=60, caller=caller) as queued_client,
        ThreadPoolExecutor(2) as pool,
    ):
        holding = pool.submit(
            held_client.batch_evaluate, [{"response": f"CASE:{holder}-{i}"} for i in range(2)], [rubric]
        )
        eventually(lambda: judge.in_flight[holder] == 2, "the model's two slots held")
        queued_before = llm_server.metric("grpcgrade_samples_queued")
        samples = [{"response": f"CASE:{marker}-{i}"} for i in range(2)]
        queued = pool.submit(queued_client.batch_evaluate, samples, [rubric], grader_timeout=limit)
        eventually(lambda: llm_server.metric("grpcgrade_samples_queued") == queued_before + 2, "the call admitted")
        time.sleep(limit + 0.5)  # its samples wait for a slot meanwhile: longer than their time limit
        judge.hold(holder).set()
        replies = queued.result()
        assert [result_of(r).score for r in holding.result()] == [4.0, 4.0]
    assert [result_of(r).score for r in replies] == [4.0] * 2, [result_of(r).error.message for r in replies]
    assert len([r for r in judge.requests if r["marker"].startswith(marker)]) == 2
    waits = {"model": "narrow", "caller": caller}
    assert llm_server.metric("grpcgrade_judge_queue_wait_seconds_count", **waits) == 2
    assert llm_server.metric("grpcgrade_judge_queue_wait_seconds_bucket", le=str(limit), **waits) == 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"rubric": "r", "model": "gpt-unknown"},
            "no model named 'gpt-unknown' is configured; configured models: 'default', 'keyless', 'narrow', 'slow'",
        ),
        (
            {"rubric": "r", "model": {"base_url": "http://169.254.169.254/v1", "model": "x"}},
            "parameter 'model': must be str",
        ),
        ({"rubric": "r", "base_url": "http://169.254.169.254/v1"}, "parameter 'base_url': unknown parameter"),
        ({"rubric": "r", "language": "fr"}, "unknown language 'fr'"),
        ({}, "parameter 'rubric': required"),
        ({"rubric": "r", "min_score": 5, "max_score": 1}, "parameter 'max_score'"),
    ],
)
def test_bad_grader_params_are_invalid_argument_and_reach_no_endpoint(llm_client, judge, params, message):
    before = len(judge.requests)
    with pytest.raises(grpc.RpcError) as info:
        llm_client.evaluate({"response": "x"}, [{"name": "llm_rubric", "params": params}])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()
    assert len(judge.requests) == before


def test_list_graders_shows_the_llm_judges(llm_client):
    graders = {g.name: g for g in llm_client.list_graders().graders}
    assert graders["llm_rank"].mode == pb.GRADER_MODE_LISTWISE
    assert graders["llm_rubric"].mode == pb.GRADER_MODE_POINTWISE
    rubric = {p.name: p for p in graders["llm_rubric"].params}
    assert rubric["rubric"].required
    assert rubric["model"].default.string_value == "default"
    assert rubric["language"].default.string_value == "en"
    assert (rubric["min_score"].default.number_value, rubric["max_score"].default.number_value) == (1, 5)
    assert {p.name for p in graders["llm_correctness"].params} == {"model", "language", "min_score", "max_score"}


def test_the_llm_api_is_exported_without_importing_httpx():
    import subprocess
    import sys

    code = "import sys, grpcgrade; grpcgrade.LLMGrader; grpcgrade.PromptTemplate; print('httpx' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
    )
    assert out.stdout.strip() == "False"


def test_judge_calls_are_not_logged_by_httpx_at_info(llm_server, llm_client, judge):
    """httpx logs one INFO line per request; the server (at its default --log-level info) keeps every
    library at WARNING, so judge calls do not flood the log, while grpcgrade's own INFO lines stay."""
    marker = case("score-3")
    reply = llm_client.evaluate({"query": "q", "response": f"CASE:{marker}", "reference": "r"}, reward="judged")
    assert reply.reward == 3.0 and judge.marked(marker)  # the judge was called over HTTP
    log = llm_server.log()
    assert "INFO grpcgrade.service.server: grpcgrade serving on" in log
    assert not [line for line in log.splitlines() if " httpx: " in line or " httpcore" in line], log


def test_a_stopping_server_closes_the_judge_clients_session(judge, tmp_path, monkeypatch):
    """A drained server closes the judge client's aiohttp session (its pooled connections) instead of
    leaving it to the garbage collector, which aiohttp reports as "Unclosed client session" (if it runs
    before the process ends). The server runs in this process (`build_server`, as `grpcgrade serve` does),
    so the test sees the session itself."""
    monkeypatch.setenv(KEY_ENV, KEY)
    path = tmp_path / "grpcgrade.yaml"
    path.write_text(yaml.safe_dump({"models": models_section(judge)}))
    opts = ServeOptions(port=free_port(), workers=0, config=str(path), grace_seconds=5)

    async def serve_one_judgment() -> tuple[pb.EvaluateResponse, bool]:
        service = build_server(opts)
        await service.start()
        try:
            async with AsyncGradingClient(f"127.0.0.1:{opts.port}", timeout=60) as client:
                reply = await client.evaluate(
                    {"query": "Capital?", "response": f"Paris. CASE:{case('score-4')}"},
                    [{"name": "llm_rubric", "params": {"rubric": "Names the capital."}}],
                )
            session = models.get_model("default")._client
            assert session is not None  # the judgment went over it
        finally:
            await service.stop()
        return reply, session.closed

    try:
        reply, closed = asyncio.run(serve_one_judgment())
    finally:
        models.configure({})
    assert result_of(reply).score == 4.0
    assert closed


def test_clients_a_new_configuration_replaces_are_closed_at_the_next_drain(judge, configured):
    """`configure` replaced the models' clients and dropped the old ones with their aiohttp sessions open
    (a server's `close_clients` after its drain no longer knew them). Now they wait for that call, on the
    loop that opened them; the new configuration's clients are closed by it too."""
    grader = grpcgrade.LLMGrader(model="default", template="{response}", min_score=0, max_score=5)

    async def judge_reconfigure_and_drain() -> tuple[bool, bool, bool]:
        await grader.aevaluate(response=f"CASE:{case('score-4')}")
        old = models.get_model("default")._client
        assert old is not None and not old.closed  # the judgment went over it
        models.configure(models.parse_models(models_section(judge)))
        replacing = grpcgrade.LLMGrader(model="default", template="{response}", min_score=0, max_score=5)
        assert (await replacing.aevaluate(response=f"CASE:{case('score-2')}")).score == 2.0
        new = models.get_model("default")._client
        assert new is not None and new is not old
        open_until_the_drain = not old.closed
        await models.close_clients()
        return open_until_the_drain, old.closed, new.closed

    assert asyncio.run(judge_reconfigure_and_drain()) == (True, True, True)
