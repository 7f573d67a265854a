"""OpenAI grader JSON run locally: validation, templating, the formula language, every grader type, and the
`openai_grader` grader end to end through real servers.

Expected scores are worked out by hand from the schema's definitions (string checks, the metrics' formulas,
the formula language); model graders answer from a loopback OpenAI-compatible endpoint with canned replies.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import yaml
from doc_examples import blocks, run_python
from openai_judge import VECTORS, Judge, answer, models_section, running_judge

from grpcgrade.core.config import parse_config
from grpcgrade.core.engine import Engine
from grpcgrade.core.registry import get_registry
from grpcgrade.grader import GraderError, GraderScore
from grpcgrade.graders.openai.formula import MAX_DEPTH, MAX_FORMULA_CHARS, FormulaError, UnknownVariable, parse
from grpcgrade.graders.openai.grader import AsyncOpenAIGrader, OpenAIGrader, namespaces, openai_grader
from grpcgrade.graders.openai.schema import GraderConfigError
from grpcgrade.graders.openai.templating import MAX_RENDERED_CHARS
from grpcgrade.llm import models
from grpcgrade.service.structs import struct_to_dict
from grpcgrade.testing import start_server


def check(input: str, reference: str, operation: str = "eq", name: str = "check") -> dict[str, Any]:
    return {"type": "string_check", "name": name, "input": input, "reference": reference, "operation": operation}


def similarity(metric: str, input: str = "{{ sample.output_text }}", reference: str = "{{ item.reference }}", **more):
    return {"type": "text_similarity", "name": metric, "input": input, "reference": reference,
            "evaluation_metric": metric, **more}  # fmt: skip


def score_model(content: Any, **more: Any) -> dict[str, Any]:
    return {"type": "score_model", "name": "judge", "model": "gpt-4o-2024-08-06",
            "input": [{"role": "user", "content": content}], **more}  # fmt: skip


def grade(grader: dict[str, Any], **sample: Any) -> GraderScore | GraderError:
    built = openai_grader(grader)
    if isinstance(built, OpenAIGrader):
        return built.evaluate(**sample)
    return asyncio.run(built.aevaluate(**sample))


def config_error(grader: Any, **params: Any) -> GraderConfigError:
    with pytest.raises(GraderConfigError) as caught:
        openai_grader(grader, **params)
    return caught.value


@pytest.fixture(scope="module")
def judge() -> Iterator[Judge]:
    with running_judge() as fake:
        yield fake


@pytest.fixture
def configured(judge: Judge) -> Iterator[Judge]:
    models.configure(models.parse_models(models_section(judge)))
    yield judge
    models.configure({})


# --- validation: every error names the JSON path of the bad field -----------------------------------------


@pytest.mark.parametrize(
    ("grader", "path", "message"),
    [
        ([], "grader", "must be an object"),
        ({"type": "regex", "name": "x"}, "grader.type", "must be one of string_check, text_similarity"),
        ({"type": "string_check", "input": "a", "reference": "b", "operation": "eq"}, "grader.name", "is required"),
        (check("a", "b", "equals"), "grader.operation", "must be one of eq, ne, like, ilike; got 'equals'"),
        ({**check("a", "b"), "refernce": "b"}, "grader.refernce", "unknown field"),
        ({k: v for k, v in check("a", "b").items() if k != "reference"}, "grader.reference", "is required"),
        (check("{{ answer }}", "b"), "grader.input", "starts with a namespace, `item` or `sample`"),
        (check("{{ sample.output }}", "b"), "grader.input", "the sample namespace has sample.output_text"),
        (check("{{ item }}", "b"), "grader.input", "name a variable of the namespace"),
        (check("{{ item.a[x] }}", "b"), "grader.input", "cannot read the path at '[x]'"),
        (similarity("jaccard"), "grader.evaluation_metric", "must be one of cosine, fuzzy_match"),
        (similarity("bleu", pass_threshold="high"), "grader.pass_threshold", "must be a finite number"),
        (score_model("x", range=[1, 0]), "grader.range", "the low end must be below the high end"),
        (score_model("x", range=[0, 1, 2]), "grader.range", "must be two numbers"),
        (score_model("x", sampling_params={"temperature": 3}), "grader.sampling_params.temperature", "from 0 to 2"),
        (score_model("x", sampling_params={"top_k": 3}), "grader.sampling_params.top_k", "unknown field"),
        (score_model([{"type": "input_video", "url": "u"}]), "grader.input[0].content[0].type", "must be one of"),
        ({**score_model("x"), "input": []}, "grader.input", "must not be empty"),
        ({**score_model("x"), "input": [{"role": "judge", "content": "x"}]}, "grader.input[0].role", "must be one of"),
        (
            {
                "type": "label_model",
                "name": "l",
                "model": "m",
                "input": [{"role": "user", "content": "x"}],
                "labels": ["a", "b"],
                "passing_labels": ["c"],
            },
            "grader.passing_labels[0]",
            "'c' is not one of the labels",
        ),  # fmt: skip
        (
            {"type": "multi", "name": "m", "calculate_output": "a", "graders": {"a": {"type": "multi", "name": "n"}}},
            "grader.graders.a.type",
            "cannot be multi graders",
        ),  # fmt: skip
        (
            {"type": "multi", "name": "m", "calculate_output": "1", "graders": {"my-key": check("a", "b")}},
            "grader.graders.my-key",
            "must be a formula variable name",
        ),  # fmt: skip
        (
            {"type": "multi", "name": "m", "calculate_output": "x", "graders": {"a": check("a", "b", "like!")}},
            "grader.graders.a.operation",
            "must be one of eq",
        ),  # fmt: skip
    ],
)
def test_a_bad_config_is_refused_at_the_json_path_of_the_bad_field(grader, path, message):
    error = config_error(grader)
    assert error.path == path
    assert message in str(error)
    assert error.param == "grader"  # the grpcgrade param that carries the config


def test_formula_errors_carry_openais_flags():
    graders = {"exact": check("a", "a"), "close": similarity("fuzzy_match")}
    bad_name = config_error({"type": "multi", "name": "m", "graders": graders, "calculate_output": "exact + far"})
    assert (bad_name.path, bad_name.flag) == ("grader.calculate_output", "invalid_variable_error")
    assert "unknown variable 'far'" in str(bad_name) and "close, exact" in str(bad_name)
    bad_syntax = config_error({"type": "multi", "name": "m", "graders": graders, "calculate_output": "exact +* 2"})
    assert (bad_syntax.path, bad_syntax.flag) == ("grader.calculate_output", "formula_parse_error")


WITHOUT_SANDBOX = """
import sys
sys.modules["grpcgrade_code"] = None  # this process has no code sandbox: importing it fails
from grpcgrade.graders.openai.grader import openai_grader
from grpcgrade.graders.openai.schema import GraderConfigError
try:
    openai_grader({"type": "python", "name": "p", "source": "def grade(sample, item):\\n    return 1.0\\n"})
except GraderConfigError as exc:
    print(exc.path, "|", exc)
"""


def test_python_graders_are_refused_where_there_is_no_code_sandbox():
    """A server without grpcgrade-code never runs a request's python; it says why (plugins/grpcgrade-code's
    tests run python graders in the sandbox)."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_SANDBOX], capture_output=True, text=True, check=True)
    path, message = done.stdout.split(" | ", 1)
    assert path == "grader.type" and "runs only inside the code sandbox" in message


def test_graders_the_server_cannot_run_are_refused_saying_why(configured):
    unknown_model = config_error({**score_model("x"), "model": "gpt-5"})
    assert unknown_model.path == "grader.model"
    assert "no model named 'gpt-5' is configured" in str(unknown_model) and "'o3-mini'" in str(unknown_model)
    no_embedder = config_error(similarity("cosine"), embedding_model="text-embedding-3-large")
    assert no_embedder.path == "grader.evaluation_metric" and "has no embedding model" in str(no_embedder)


def test_cosine_without_any_configured_model_is_refused():
    models.configure({})
    error = config_error(similarity("cosine"))
    assert "'cosine' compares embeddings, and this server has no embedding model" in str(error)


# --- templating --------------------------------------------------------------------------------------------

ITEM = {"answer": "Paris", "meta": {"tags": ["geo", "capital"], "a key": 3, "n": 4, "ok": True}, "rows": [{"v": 1}]}
TOOLS = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ item.answer }}", "Paris"),
        ("{{item.meta.tags[1]}}", "capital"),
        ("{{ item.meta.tags.0 }}", "geo"),
        ('{{ item.meta["a key"] }}', "3"),
        ("{{ item.meta.n }} / {{ item.meta.ok }}", "4 / true"),  # non-strings as JSON
        ("{{ item.rows }}", '[{"v":1}]'),
        ("{{ sample.output_text }}", '{"city": "Oslo", "temp": 21.5}'),
        ("{{ sample.output_json.city }}", "Oslo"),
        ("{{ sample.output_json.temp }}", "21.5"),
        ("{{ sample.output_tools[0].function.name }}", "get_weather"),
        ("{{ sample.output_tools[0].function.arguments }}", '{"city": "Oslo"}'),
        ("{{ sample.choices[0].message.tool_calls[0].id }}", "call_1"),
        ("{{ sample.choices[0].finish_reason }}", "tool_calls"),
        ("{{ item.reference }} and {{ item.query }}", "ref and q?"),  # the sample's standard fields join `item`
        ("no variables {at all}", "no variables {at all}"),
    ],
)
def test_templates_fill_from_the_sample(template, expected):
    sample = {"query": "q?", "response": '{"city": "Oslo", "temp": 21.5}', "reference": "ref",
              "tool_calls": TOOLS, **ITEM}  # fmt: skip
    result = grade(check(template, expected), **sample)
    assert (result.score, result.reason) == (1.0, "eq: holds"), result


@pytest.mark.parametrize(
    ("template", "sample", "flag", "message"),
    [
        ("{{ item.answr }}", {}, "invalid_variable_error", "{{ item.answr }}: item has no key 'answr'"),
        ("{{ item.meta.tags[5] }}", {}, "invalid_variable_error", "item.meta.tags has 2 items, no [5]"),
        ("{{ item.answer.x }}", {}, "invalid_variable_error", "item.answer is str, which has no 'x'"),
        ("{{ sample.output_tools[0].id }}", {}, "invalid_variable_error", "sample.output_tools has 0 items"),
        ("{{ sample.output_json.city }}", {"response": "Oslo"}, "sample_parse_error", "not valid JSON"),
    ],
)
def test_a_missing_variable_is_the_samples_error_naming_it(template, sample, flag, message):
    result = grade(check(template, "x"), **ITEM, **sample)
    assert isinstance(result, GraderError)
    assert message in result.error
    assert result.metadata["errors"] == [flag]
    assert result.code == "INVALID_SAMPLE"


def test_a_template_that_fills_past_the_limit_is_an_error():
    big = "x" * (MAX_RENDERED_CHARS // 3 + 1)
    result = grade(check("{{ item.big }}{{ item.big }}{{ item.big }}", "x"), big=big)
    assert isinstance(result, GraderError) and result.metadata["errors"] == ["other_error"]
    assert "over the limit" in result.error


# --- the formula language ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("formula", "expected"),
    [
        ("0.5 * a + 0.5 * b", 0.5 * 1 + 0.5 * 0.25),
        ("a + b * 2", 1.5),  # * before +
        ("(a + b) * 2", 2.5),
        ("2 ^ 3 ^ 2", 512.0),  # ^ is right-associative: 2^(3^2)
        ("-2 ^ 2", -4.0),  # ^ binds tighter than unary minus
        ("2 ^ -1", 0.5),
        ("a / 4 - -b", 0.5),
        ("min(a, b, 0.5) + max(b)", 0.5),
        ("abs(b - a) + floor(2.7) + ceil(0.2)", 3.75),
        ("sqrt(16) * exp(0) + log(1)", 4.0),
        ("1e-3 * 1000 + .5", 1.5),
    ],
)
def test_formulas_evaluate_as_defined(formula, expected):
    assert parse(formula, {"a", "b"}).evaluate({"a": 1.0, "b": 0.25}) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("formula", "message"),
    [
        ("", "empty"),
        ("a +", "ends where a value was expected"),
        ("a b", "unexpected 'b'"),
        ("(a", "expected ')'"),
        ("a ** 2", "unexpected '*'"),
        ("pow(a, 2)", "unknown function 'pow'"),
        ("sqrt(a, 2)", "takes one argument"),
        ("max()", "at least one argument"),
        ("__import__('os').system('x')", "unexpected character"),
        ("a.__class__", "unexpected character '.'"),
        ("1e400", "too large"),
        ("(" * 10_000 + "a" + ")" * 10_000, "characters, over the limit"),
        ("(" * 1000 + "a" + ")" * 1000, f"nested more than {MAX_DEPTH} levels"),
        ("-" * 1000 + "a", f"nested more than {MAX_DEPTH} levels"),
        ("2^" * 1000 + "2", f"nested more than {MAX_DEPTH} levels"),
        ("min(" * 500 + "a" + ")" * 500, f"nested more than {MAX_DEPTH} levels"),
    ],
)
def test_malformed_and_hostile_formulas_are_errors_not_crashes(formula, message):
    with pytest.raises(FormulaError, match=re.escape(message)):
        parse(formula, {"a"})


def test_unknown_names_are_their_own_error():
    with pytest.raises(UnknownVariable, match="it is a function"):
        parse("exp + 1", {"a"})


@pytest.mark.parametrize(
    ("formula", "message"),
    [
        ("9 ^ 9 ^ 9 ^ 9", "too large"),  # floats: overflows at once instead of building a huge integer
        ("10 ^ 400", "too large"),
        ("exp(1000)", "too large"),
        ("a / (a - 1)", "division by zero"),
        ("sqrt(-a)", "math domain error"),
        ("log(a - 1)", "math domain error"),
        ("(-8) ^ (1 / 3)", "math domain error"),
    ],
)
def test_formulas_that_cannot_be_computed_raise(formula, message):
    with pytest.raises(FormulaError, match=message):
        parse(formula, {"a"}).evaluate({"a": 1.0})


def test_long_flat_formulas_evaluate_without_recursion():
    terms = (MAX_FORMULA_CHARS - 1) // 2
    formula = "+".join(["a"] * terms)
    assert len(formula) <= MAX_FORMULA_CHARS
    assert parse(formula, {"a"}).evaluate({"a": 1.0}) == terms


# --- the grader types, in process ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "text", "reference", "expected"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "Paris", "paris", 0.0),
        ("ne", "Paris", "paris", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "The capital is Paris.", "Paris", 1.0),
        ("like", "The capital is PARIS.", "Paris", 0.0),
        ("ilike", "The capital is PARIS.", "Paris", 1.0),
        ("ilike", "The capital is Lyon.", "Paris", 0.0),
    ],
)
def test_string_check_operations(operation, text, reference, expected):
    result = grade(
        check("{{ sample.output_text }}", "{{ item.reference }}", operation), response=text, reference=reference
    )
    assert result.score == expected
    assert result.metadata == {"name": "check", "type": "string_check"}


@pytest.mark.parametrize(
    ("metric", "text", "reference", "expected"),
    [
        # rapidfuzz's ratio: 1 - indel distance / total length; LCS("kitten", "sitting") = 4 -> 1 - 5/13
        ("fuzzy_match", "sitting", "kitten", 8 / 13),
        # unigram overlap 5 of 6 on both sides -> F = 5/6
        ("rouge_1", "the cat lay on the mat", "the cat sat on the mat", 5 / 6),
        # bigrams: 3 of 5 shared (the cat, on the, the mat)
        ("rouge_2", "the cat lay on the mat", "the cat sat on the mat", 3 / 5),
        # trigrams: (one two three) shared, (two three four/five) not -> 1/2
        ("rouge_3", "one two three five", "one two three four", 1 / 2),
        ("rouge_4", "a b c d e", "a b c d e", 1.0),
        ("rouge_5", "a b c d e f", "a b c d e f", 1.0),
        # LCS "the cat on the mat" = 5 tokens of 6
        ("rouge_l", "the cat lay on the mat", "the cat sat on the mat", 5 / 6),
        ("bleu", "the cat sat on the mat", "the cat sat on the mat", 1.0),
        ("gleu", "the cat sat on the mat", "the cat sat on the mat", 1.0),
        # METEOR: all 3 words match in 1 chunk: Fmean 1, penalty 0.5 * (1/3)^3 = 1/54
        ("meteor", "the cat sat", "the cat sat", 1 - 1 / 54),
    ],
)
def test_text_similarity_metrics(metric, text, reference, expected):
    result = grade(similarity(metric, pass_threshold=0.7), response=text, reference=reference)
    assert result.score == pytest.approx(expected)
    assert result.metadata["passed"] is (expected >= 0.7)
    assert (result.metadata["metric"], result.metadata["pass_threshold"]) == (metric, 0.7)


def test_text_similarity_is_synchronous_and_heavy_so_the_service_can_use_workers():
    grader = openai_grader(similarity("bleu"))
    assert isinstance(grader, OpenAIGrader) and grader.is_sync and grader.heavy
    assert not openai_grader(check("a", "b")).heavy


def test_cosine_compares_embeddings_of_the_configured_model(configured):
    grader = openai_grader(similarity("cosine", input="{{ item.a }}", reference="{{ item.b }}"))
    assert isinstance(grader, AsyncOpenAIGrader)
    result = asyncio.run(grader.aevaluate(a="cat", b="kitten"))
    assert result.score == pytest.approx(0.6)  # [1, 0] . [0.6, 0.8]
    assert result.metadata["model_grader_token_usage_per_model"] == {
        "embedding": {"prompt_tokens": 4, "total_tokens": 4}
    }
    path, body = configured.embedding_requests()[-1]
    assert (path, body) == ("/v1/embeddings", {"model": "embed-x", "input": ["cat", "kitten"]})
    assert asyncio.run(grader.aevaluate(a="cat", b="dog")).score == 0.0
    zero = asyncio.run(grader.aevaluate(a="cat", b="void"))
    assert isinstance(zero, GraderError) and "all zeros" in zero.error
    assert set(VECTORS) >= {"cat", "kitten", "dog"}


def test_cosine_of_wide_embeddings_reads_the_whole_answer(configured):
    """Two 3,072-dimension embeddings are ~120 kB of JSON, more than one read of the connection brings: the
    client read only what had arrived and refused the rest as "not JSON" (every such sample failed)."""
    grader = openai_grader(similarity("cosine", input="{{ item.a }}", reference="{{ item.b }}"))
    a, b = VECTORS["wide-sin"], VECTORS["wide-cos"]
    expected = sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    result = asyncio.run(grader.aevaluate(a="wide-sin", b="wide-cos"))
    assert isinstance(result, GraderScore), result
    assert result.score == pytest.approx(expected)


def test_multi_combines_sub_graders_by_the_formula_and_reports_each():
    grader = {
        "type": "multi",
        "name": "answer quality",
        "graders": {
            "exact": check("{{ sample.output_text }}", "{{ item.reference }}", name="exact"),
            "close": similarity("fuzzy_match"),
            "mentions": check("{{ sample.output_text }}", "{{ item.city }}", "ilike", name="mentions"),
        },
        "calculate_output": "0.5 * exact + 0.25 * close + 0.25 * mentions",
    }
    result = grade(grader, response="sitting", reference="kitten", city="SITTING")
    assert result.score == pytest.approx(0.5 * 0 + 0.25 * 8 / 13 + 0.25 * 1)
    assert result.metadata["sub_rewards"] == {"exact": 0.0, "close": pytest.approx(8 / 13), "mentions": 1.0}
    assert (result.metadata["name"], result.metadata["type"]) == ("answer quality", "multi")


def test_multi_accepts_the_generated_types_single_grader_form():
    grader = {"type": "multi", "name": "m", "graders": check("x", "x", name="same"), "calculate_output": "same * 3"}
    assert grade(grader).score == 3.0


def test_a_failing_sub_grader_fails_the_multi_grader_but_keeps_the_others_sub_rewards():
    grader = {
        "type": "multi",
        "name": "m",
        "graders": {"ok": check("a", "a"), "broken": check("{{ item.missing }}", "a")},
        "calculate_output": "ok + broken",
    }
    result = grade(grader)
    assert isinstance(result, GraderError) and result.code == "INVALID_SAMPLE"
    assert result.metadata["errors"] == ["invalid_variable_error"]
    assert result.metadata["sub_rewards"] == {"ok": 1.0}
    assert result.error.startswith("broken: template variable {{ item.missing }}")


def test_a_formula_that_cannot_be_computed_for_a_sample_is_an_error_result():
    grader = {"type": "multi", "name": "m", "graders": {"a": check("{{ item.x }}", "yes")}, "calculate_output": "1 / a"}
    assert grade(grader, x="yes").score == 1.0
    failed = grade(grader, x="no")
    assert isinstance(failed, GraderError) and failed.metadata["errors"] == ["formula_parse_error"]
    assert "division by zero" in failed.error and failed.code == "INVALID_RESULT"


# --- model graders against the loopback judge -------------------------------------------------------------


def test_score_model_asks_the_configured_model_for_a_structured_score(configured):
    marker = configured.reply(answer(0.75))
    grader = {
        **score_model("ignored"),
        "input": [
            {"role": "developer", "content": "Grade the answer against {{ item.reference_answer }}."},
            {"role": "user", "content": f"Answer: {{{{ sample.output_text }}}} {marker}", "type": "message"},
        ],
        "sampling_params": {"temperature": 0, "seed": 42, "max_completions_tokens": 300, "top_p": 1},
        "pass_threshold": 0.5,
    }
    result = grade(grader, response="fuzzy wuzzy", reference_answer="fuzzy wuzzy was a bear")
    assert result.score == 0.75 and result.metadata["passed"] is True
    assert result.metadata["steps"] == [{"description": "compared", "conclusion": "done"}]
    assert result.metadata["token_usage"] == 27
    assert result.metadata["model_grader_token_usage_per_model"] == {
        "gpt-4o-2024-08-06": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}
    }
    assert result.metadata["sampled_model_name"] == "judge-x"
    ((path, body),) = configured.requests(marker)
    assert path == "/v1/chat/completions"
    assert body["model"] == "judge-x"
    assert body["messages"] == [
        {"role": "system", "content": "Grade the answer against fuzzy wuzzy was a bear."},
        {"role": "user", "content": f"Answer: fuzzy wuzzy {marker}"},
    ]
    assert (body["temperature"], body["seed"], body["max_completion_tokens"], body["top_p"]) == (0, 42, 300, 1)
    schema = body["response_format"]["json_schema"]["schema"]
    assert body["response_format"]["type"] == "json_schema"
    assert schema["properties"]["result"] == {"type": "number"} and schema["required"] == ["steps", "result"]


def test_score_model_range_and_content_parts(configured):
    marker = configured.reply("Here it is:\n```json\n" + answer(7) + "\n```")
    content = [
        {"type": "input_text", "text": "Rate from 0 to 10."},
        "{{ sample.output_text }}",
        {"type": "input_image", "image_url": "{{ item.picture }}", "detail": "low"},
        {"type": "output_text", "text": marker},
    ]
    result = grade(score_model(content, range=[0, 10]), response="a sunset", picture="https://img.test/1.png")
    assert result.score == 7.0 and result.metadata["range"] == [0.0, 10.0]
    ((_, body),) = configured.requests(marker)
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Rate from 0 to 10."},
                {"type": "text", "text": "a sunset"},
                {"type": "image_url", "image_url": {"url": "https://img.test/1.png", "detail": "low"}},
                {"type": "text", "text": marker},
            ],
        }
    ]


@pytest.mark.parametrize(
    ("reply", "flag", "message"),
    [
        ({"content": answer(1.5)}, "model_grader_parse_error", "outside the range [0, 1]"),  # OpenAI would clip
        ({"content": answer(-0.1)}, "model_grader_parse_error", "outside the range [0, 1]"),
        ({"content": answer("high")}, "model_grader_parse_error", "not a number: 'high'"),
        ({"content": "I would say 0.8."}, "model_grader_parse_error", "no JSON object with 'result'"),
        ({"refusal": "I can't help with that."}, "model_grader_refusal_error", "refused: I can't help with that."),
        ({"status": 400}, "model_grader_server_error", "HTTP 400"),
    ],
)
def test_unusable_judge_answers_are_error_results_never_scores(configured, reply, flag, message):
    marker = configured.reply(**reply)
    result = grade(score_model(f"Score it. {marker}"))
    assert isinstance(result, GraderError)
    assert result.metadata["errors"] == [flag]
    assert message in result.error
    assert len(configured.requests(marker)) == 1


def test_label_model_passes_on_a_passing_label(configured):
    def label_grader(marker: str) -> dict[str, Any]:
        return {
            "type": "label_model", "name": "sentiment", "model": "o3-mini",
            "input": [{"role": "user", "content": f"Classify: {{{{ sample.output_text }}}} {marker}"}],
            "labels": ["positive", "neutral", "negative"], "passing_labels": ["positive", "neutral"],
        }  # fmt: skip

    outcomes = {}
    for label in ("positive", "neutral", "negative", "ecstatic"):
        marker = configured.reply(answer(label))
        outcomes[label] = grade(label_grader(marker), response="I love it")
        ((_, body),) = configured.requests(marker)
        assert body["model"] == "judge-y"
        assert body["response_format"]["json_schema"]["schema"]["properties"]["result"] == {
            "type": "string",
            "enum": ["positive", "neutral", "negative"],
        }
    assert [outcomes[k].score for k in ("positive", "neutral", "negative")] == [1.0, 1.0, 0.0]
    assert outcomes["negative"].metadata["label"] == "negative"
    assert isinstance(outcomes["ecstatic"], GraderError)
    assert "not one of ['positive', 'neutral', 'negative']" in outcomes["ecstatic"].error


def test_multi_with_a_model_grader_runs_asynchronously_and_sums_token_usage(configured):
    first, second = configured.reply(answer(0.5)), configured.reply(answer(1))
    grader = {
        "type": "multi",
        "name": "m",
        "graders": {"a": score_model(f"one {first}"), "b": score_model(f"two {second}"), "c": check("x", "x")},
        "calculate_output": "(a + b) / 2 * c",
    }
    built = openai_grader(grader)
    assert isinstance(built, AsyncOpenAIGrader) and built.bounds_own_time
    result = asyncio.run(built.aevaluate())
    assert result.score == 0.75
    assert result.metadata["sub_rewards"] == {"a": 0.5, "b": 1.0, "c": 1.0}
    assert result.metadata["token_usage"] == 54
    assert result.metadata["model_grader_token_usage_per_model"]["gpt-4o-2024-08-06"]["total_tokens"] == 54


# --- through a real grpcgrade server -----------------------------------------------------------------------

CITY = {"type": "multi", "name": "city", "calculate_output": "0.7 * exact + 0.3 * close", "graders": {
    "exact": check("{{ sample.output_text }}", "{{ item.reference }}", name="exact"),
    "close": similarity("fuzzy_match"),
}}  # fmt: skip


def spec(grader: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"name": "openai_grader", "params": {"grader": grader}, **more}


def test_openai_grader_in_batch_evaluate_with_workers(client):
    """The session server has worker processes: text similarity is heavy, so it runs there."""
    samples = [
        {"id": "a", "response": "Paris", "reference": "Paris"},
        {"id": "b", "response": "sitting", "reference": "kitten"},
        {"id": "c", "response": "Paris", "extra": {"city": "x"}},  # no reference: {{ item.reference }} is missing
    ]
    replies = client.batch_evaluate(samples, [spec(CITY)])
    assert replies[0].reward == pytest.approx(1.0)
    assert replies[1].reward == pytest.approx(0.3 * 8 / 13)
    meta = struct_to_dict(replies[1].results[0].metadata)
    assert meta["sub_rewards"] == {"exact": 0.0, "close": pytest.approx(8 / 13)}
    assert (meta["name"], meta["type"]) == ("city", "multi")
    failed = replies[2].results[0]
    assert not replies[2].HasField("reward")
    assert (
        failed.error.code == "INVALID_SAMPLE"
        and "{{ item.reference }}: item has no key 'reference'" in failed.error.message
    )
    assert struct_to_dict(failed.metadata)["errors"] == ["invalid_variable_error"]


def test_openai_grader_in_a_reward_combination(client):
    reply = client.evaluate(
        {"response": "Paris", "reference": "Paris"},
        [spec(check("{{ sample.output_text }}", "Lyon"), weight=1), spec(CITY, key="city", weight=3)],
    )
    assert reply.reward == pytest.approx((0 * 1 + 1.0 * 3) / 4)
    assert [r.key for r in reply.results] == ["openai_grader", "city"]


def test_a_bad_config_is_invalid_argument_naming_the_path(client):
    bad = {**CITY, "graders": {**CITY["graders"], "close": similarity("levenshtein")}}
    with pytest.raises(grpc.RpcError) as caught:
        client.evaluate({"response": "x"}, [spec(bad)])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "grader.graders.close.evaluation_metric: must be one of cosine" in caught.value.details()


def test_list_graders_documents_openai_grader(client):
    (entry,) = [g for g in client.list_graders().graders if g.name == "openai_grader"]
    assert "OpenAI's grader JSON configs" in entry.description
    assert [(p.name, p.required) for p in entry.params] == [("grader", True), ("embedding_model", False)]


@pytest.fixture(scope="module")
def judged_server(judge: Judge, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("openai-server")
    marker = judge.reply(answer(0.9))
    reward = score_model(f"Is {{{{ sample.output_text }}}} right? {marker}", pass_threshold=0.5)
    config = {"models": models_section(judge), "rewards": {"rft": {"graders": [spec(reward)]}}}
    path = tmp / "grpcgrade.yaml"
    path.write_text(yaml.safe_dump(config))
    srv = start_server(tmp, "--workers", "0", "--config", str(path))
    yield srv, marker
    srv.stop()


def test_model_graders_through_a_configured_server(judged_server, judge):
    server, marker = judged_server
    with server.client(timeout=30) as c:
        reply = c.evaluate({"response": "42"}, reward="rft")
        assert reply.reward == 0.9
        meta = struct_to_dict(reply.results[0].metadata)
        assert meta["passed"] is True and meta["token_usage"] == 27
        bad = judge.reply("not json at all")
        replies = c.batch_evaluate(
            [{"response": "a"}, {"response": "b"}], [spec(score_model(f"{{{{ sample.output_text }}}} {bad}"))]
        )
    assert all(not r.HasField("reward") for r in replies)
    assert {r.results[0].error.code for r in replies} == {"INVALID_RESULT"}
    assert sorted(body["messages"][0]["content"] for _, body in judge.requests(bad)) == [f"a {bad}", f"b {bad}"]


# --- the examples of docs/openai-graders.md ------------------------------------------------------------------

PAGE = "openai-graders.md"


def test_docs_grpc_example_runs_against_a_server(server):
    script = blocks(PAGE, "python")[0]
    assert "127.0.0.1:50051" in script
    assert run_python(script.replace("127.0.0.1:50051", server.target), PAGE).strip() == "1.0"


def test_docs_server_config_example_resolves(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    config_yaml, embedding_yaml = blocks(PAGE, "yaml")
    config = parse_config(yaml.safe_load(config_yaml))
    assert set(config.models) == {"gpt-4o-2024-08-06"} and set(config.rewards) == {"rft"}
    engine = Engine(get_registry(), rewards=config.rewards)
    jobs = engine.resolve([], "rft")
    openai_job = jobs[0]
    # "Paris" against "Pariss": exact 0, fuzzy 1 - 1/11; 0.7 * 0 + 0.3 * 10/11
    result = openai_job.grader.evaluate(response="Paris", reference="Pariss")
    assert result.score == pytest.approx(0.3 * 10 / 11)
    models.configure(parse_config(yaml.safe_load(embedding_yaml)).models)
    try:
        assert isinstance(openai_grader(similarity("cosine")), AsyncOpenAIGrader)
    finally:
        models.configure({})


def test_docs_multi_example_grades_a_tool_call():
    (grader,) = (json.loads(b) for b in blocks(PAGE, "json"))
    call = [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]
    same = grade(grader, response="", tool_calls=call, function="get_weather", arguments='{"city":"Oslo"}')
    assert same.score == 1.0
    # arguments 15 vs 16 characters, one insertion apart: fuzzy 1 - 1/31
    close = grade(grader, response="", tool_calls=call, function="get_weather", arguments='{"city":"Oslo."}')
    assert close.score == pytest.approx(0.5 + 0.5 * (1 - 1 / 31))
    wrong_name = grade(grader, response="", tool_calls=call, function="get_time", arguments='{"city":"Oslo"}')
    assert wrong_name.score == 0.0
    no_call = grade(grader, response="It is sunny.", function="get_weather", arguments="{}")
    assert isinstance(no_call, GraderError) and "sample.output_tools has 0 items" in no_call.error


def test_the_filled_messages_of_a_model_grader_are_bounded_together(configured):
    marker = configured.reply(answer(1))
    big = "x" * (MAX_RENDERED_CHARS // 2 + 1)  # each message alone is under the limit, the two are not
    grader = {**score_model(f"{{{{ item.big }}}} {marker}"), "input": [
        {"role": "user", "content": f"{{{{ item.big }}}} {marker}"},
        {"role": "user", "content": "{{ item.big }}"},
    ]}  # fmt: skip
    result = grade(grader, big=big)
    assert isinstance(result, GraderError) and result.metadata["errors"] == ["other_error"]
    assert "filled messages are over the limit" in result.error
    assert configured.requests(marker) == []  # refused before any call


def test_unclosed_braces_are_literal_text_even_in_a_hostile_template():
    hostile = "{{" * 90_000  # a regex scan from every "{{" to the end would take quadratic time here
    assert grade(check(hostile, hostile)).score == 1.0
    assert grade(check("{{ item.a }} and {{ unclosed", "x and {{ unclosed"), a="x").score == 1.0


def test_the_whole_sample_namespace_as_a_python_grader_would_receive_it():
    ns = namespaces({"response": '{"a": 1}', "tool_calls": TOOLS, "query": "q", "extra_key": [1]})
    assert ns.item == {"query": "q", "extra_key": [1], "tool_calls": TOOLS}
    message = {"role": "assistant", "content": '{"a": 1}', "tool_calls": TOOLS}
    assert ns.sample() == {
        "output_text": '{"a": 1}',
        "output_json": {"a": 1},
        "output_tools": TOOLS,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
    }
    plain = namespaces({"response": "not json"}).sample()
    assert plain["output_json"] is None and plain["output_tools"] == []
    assert plain["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in plain["choices"][0]["message"]
