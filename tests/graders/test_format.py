"""In-process tests of the format family (all but ngram_repetition_penalty), beyond the conformance file.

Expected values come from the reference report (openjudge-graders.md §3, kolibrify-audacia-peers.md B),
from hand calculation, or from the standard library (`json`, `re` with the reference's own patterns).
"""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpcgrade.core.errors import InvalidParams
from grpcgrade.core.registry import get_registry
from grpcgrade.graders.format import json_match
from grpcgrade.graders.format.audacia import MAX_LITERAL_CHARS, CustomResponseGrader, JsonResponseGrader
from grpcgrade.graders.format.json_match import JsonMatchGrader
from grpcgrade.graders.format.json_validator import JsonValidatorGrader
from grpcgrade.graders.format.length_penalty import LengthPenaltyGrader
from grpcgrade.graders.format.reasoning_format import ReasoningFormatGrader
from grpcgrade.graders.format.reasoning_tool_call_format import ReasoningToolCallFormatGrader

DEEP_ARRAY = "[" * 200_000 + "]" * 200_000


def json_error(text: str) -> str:
    with pytest.raises(ValueError) as info:
        json.loads(text)
    return str(info.value)


@pytest.mark.parametrize(
    "name",
    [
        "json_validator",
        "json_match",
        "length_penalty",
        "reasoning_format",
        "reasoning_tool_call_format",
        "custom_response",
        "json_response",
    ],
)
def test_results_carry_the_registered_name(name):
    grader = get_registry().build(name)
    assert grader.name == name
    assert grader.evaluate(response="x", reference_response="x", query="q", extra_field=1).name == name


# --- json_validator ---------------------------------------------------------------------------------


def test_json_validator_valid_result():
    text = '{"name": "Alice", "age": 30}'
    result = JsonValidatorGrader().evaluate(response=text, reference_response="")
    assert (result.score, result.reason) == (1.0, "Valid JSON")
    assert result.metadata == {"is_valid": True, "response_length": len(text)}


@pytest.mark.parametrize("text", ['"hello"', "42", "true", "null", "[1, 2]", "Infinity", ' {"a": 1} \n'])
def test_json_validator_accepts_what_python_json_accepts(text):
    assert JsonValidatorGrader().evaluate(response=text).score == 1.0


@pytest.mark.parametrize("text", ['{"name": "Alice"', "plain text", "", "[1, 2,]", "{'a': 1}"])
def test_json_validator_decode_error(text):
    result = JsonValidatorGrader().evaluate(response=text)
    message = f"JSON decode error: {json_error(text)}"
    assert (result.score, result.reason) == (0.0, message)
    assert result.metadata == {"is_valid": False, "error_message": message, "response_length": len(text)}


def test_json_validator_non_string_input():
    result = JsonValidatorGrader().evaluate(response=42)
    assert result.score == 0.0
    assert result.reason == "Invalid input type: expected str, got int"
    assert result.metadata["response_length"] == 0


@pytest.mark.parametrize(
    ("text", "message_start"),
    [
        (DEEP_ARRAY, "Unexpected error: maximum recursion depth exceeded"),
        ("1" * 5000, "Unexpected error: Exceeds the limit (4300 digits)"),
    ],
)
def test_json_validator_hostile_input_scores_zero(text, message_start):
    result = JsonValidatorGrader().evaluate(response=text)
    assert result.score == 0.0
    assert result.reason.startswith(message_start)
    assert result.metadata["response_length"] == len(text)


# --- json_match -------------------------------------------------------------------------------------


def match(response, reference, **params):
    return JsonMatchGrader(**params).evaluate(response=response, reference_response=reference)


def test_json_match_result_shape():
    result = match('{"a": [1, 2]}', '{"a": [1, 2]}', strict_order=False)
    assert (result.score, result.reason) == (1.0, "JSON match: matched")
    assert result.metadata == {"matched": True, "strict_order": False, "ignore_extra_keys": False}
    result = match('{"a": 1}', '{"a": 2}')
    assert (result.score, result.reason) == (0.0, "JSON match: not matched")
    assert result.metadata == {"matched": False, "strict_order": True, "ignore_extra_keys": False}


@pytest.mark.parametrize(
    ("response", "reference", "params", "score"),
    [
        # D1: booleans are not numbers, numbers compare by value, NaN matches nothing.
        ('{"a": true}', '{"a": 1}', {}, 0.0),
        ("[false]", "[0]", {}, 0.0),
        ("[0.0]", "[false]", {"strict_order": False}, 0.0),
        ("[true, 1]", "[1, true]", {"strict_order": False}, 1.0),
        ("1.0", "1", {}, 1.0),
        ("-0.0", "0", {}, 1.0),
        ("1e20", "100000000000000000000", {}, 1.0),
        ("9007199254740993", "9007199254740992.0", {}, 0.0),
        ("NaN", "NaN", {}, 0.0),
        ("[NaN]", "[NaN]", {"strict_order": False}, 0.0),
        ('{"x": Infinity}', '{"x": Infinity}', {}, 1.0),
        ('"1"', "1", {}, 0.0),
        ("null", "null", {}, 1.0),
        ("[]", "{}", {}, 0.0),
        # D1: a missing key is not null, in either direction and with ignore_extra_keys.
        ('{"a": 1, "b": null}', '{"a": 1}', {}, 0.0),
        ('{"a": 1}', '{"a": 1, "b": null}', {"ignore_extra_keys": True}, 0.0),
        ('{"a": 1, "b": null}', '{"a": 1}', {"ignore_extra_keys": True}, 1.0),
        # Extra keys are ignored at every depth, but only in the response.
        ('{"a": {"b": 1, "c": 2}}', '{"a": {"b": 1}}', {"ignore_extra_keys": True}, 1.0),
        ('{"a": {"b": 1}}', '{"a": {"b": 1, "c": 2}}', {"ignore_extra_keys": True}, 0.0),
        ('[{"b": 1, "c": 2}]', '[{"b": 1}]', {"ignore_extra_keys": True}, 1.0),
        # Lists: length, order and multiplicity.
        ("[1, 2]", "[1, 2, 3]", {"strict_order": False}, 0.0),
        ("[1, 1, 2]", "[1, 2, 2]", {"strict_order": False}, 0.0),
        ("[[1, 2], [3]]", "[[3], [2, 1]]", {"strict_order": False}, 1.0),
        ("[[1, 2], [3]]", "[[3], [2, 1]]", {"strict_order": True}, 0.0),
        ('{"k": ["x", "y"]}', '{"k": ["y", "x"]}', {}, 0.0),
        ('{"k": ["x", "y"]}', '{"k": ["y", "x"]}', {"strict_order": False}, 1.0),
        ("[]", "[]", {"strict_order": False}, 1.0),
        ('"Alice"', '"alice"', {}, 0.0),
    ],
)
def test_json_match_semantics(response, reference, params, score):
    assert match(response, reference, **params).score == score


@pytest.mark.parametrize(
    ("response", "reference", "score"),
    [
        # The reference's greedy first fit pairs the first response item with the first reference item
        # and then fails; a pairing exists.
        ('[{"a": 1, "b": 2}, {"a": 1}]', '[{"a": 1}, {"a": 1, "b": 2}]', 1.0),
        # Duplicates: groups of equal items still need an augmenting path...
        ('[{"a": 1, "b": 1}, {"a": 1, "b": 1}, {"a": 1}, {"a": 1}]', '[{"a": 1}, {"a": 1}, {"b": 1}, {"b": 1}]', 1.0),
        # ... and counts matter: two {"b": 1} need two partners carrying "b".
        ('[{"a": 1, "b": 1}, {"a": 1}, {"a": 1}]', '[{"a": 1}, {"b": 1}, {"b": 1}]', 0.0),
        (
            '[{"a": 1, "b": 1}, {"a": 1, "b": 1}, {"a": 1, "c": 1}, {"a": 1, "c": 1}]',
            '[{"a": 1}, {"a": 1}, {"a": 1, "b": 1}, {"a": 1, "b": 1}]',
            1.0,
        ),
        ('[{"a": 1, "b": 2}, {"a": 1, "b": 2}]', '[{"a": 1}, {"b": 3}]', 0.0),
        ('[{"a": [1, {"x": 1, "y": 2}]}, 5]', '[5, {"a": [{"x": 1}, 1]}]', 1.0),
        ('[{"a": 1}, 5]', '[5, {"a": 1.0}]', 1.0),
        ('[{"a": 1}, 5]', '[6, {"a": 1}]', 0.0),
    ],
)
def test_json_match_unordered_lists_use_a_real_matching(response, reference, score):
    assert match(response, reference, strict_order=False, ignore_extra_keys=True).score == score


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.sampled_from([0, 1, 1.0, 2, "a", "b"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(["x", "y", "z"]), children, max_size=3)
    ),
    max_leaves=8,
)


def spec_match(response, reference, strict_order, ignore_extra_keys) -> bool:
    """D1 written down directly: brute force over every pairing of unordered lists."""
    if isinstance(response, bool) or isinstance(reference, bool):
        return type(response) is type(reference) and response == reference
    if isinstance(reference, dict):
        if not isinstance(response, dict) or (not ignore_extra_keys and response.keys() != reference.keys()):
            return False
        return all(
            k in response and spec_match(response[k], v, strict_order, ignore_extra_keys) for k, v in reference.items()
        )
    if isinstance(reference, list):
        if not isinstance(response, list) or len(response) != len(reference):
            return False
        orders = [reference] if strict_order else itertools.permutations(reference)
        return any(
            all(spec_match(r, c, strict_order, ignore_extra_keys) for r, c in zip(response, order, strict=True))
            for order in orders
        )
    if isinstance(response, (dict, list)):
        return False
    return response == reference


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, JSON_VALUES, st.booleans(), st.booleans())
def test_json_match_agrees_with_the_d1_specification(response, reference, strict_order, ignore_extra_keys):
    result = match(
        json.dumps(response), json.dumps(reference), strict_order=strict_order, ignore_extra_keys=ignore_extra_keys
    )
    assert result.metadata["matched"] is spec_match(response, reference, strict_order, ignore_extra_keys)


@pytest.mark.parametrize(
    ("response", "reference", "error", "message"),
    [
        ("not json", '{"a": 1}', "response_parse_error", json_error("not json")),
        ('{"a": 1}', "{bad", "reference_parse_error", json_error("{bad")),
        ("bad", "bad too", "response_parse_error", json_error("bad")),
        ('{"a": 1}', "", "reference_parse_error", json_error("")),
    ],
)
def test_json_match_parse_errors(response, reference, error, message):
    result = match(response, reference)
    assert (result.score, result.reason) == (0.0, message)
    assert result.metadata == {"matched": False, "error": error, "error_message": message}


def test_json_match_none_response_is_a_parse_error():
    assert match(None, "{}").metadata["error"] == "response_parse_error"


def _loads_refusal(text: str) -> type[BaseException]:
    """How `json.loads` refuses `text` other than as malformed JSON (so the reference, which catches only
    JSONDecodeError and TypeError, raises)."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        raise AssertionError("malformed, not a refusal") from None
    except (RecursionError, ValueError) as exc:
        return type(exc)
    raise AssertionError("accepted")


NESTED_1100 = "[" * 1100 + "]" * 1100
HUGE_INT = "1" * 4400


@pytest.mark.parametrize("text", [NESTED_1100, DEEP_ARRAY, HUGE_INT])
@pytest.mark.parametrize("side", ["response", "reference"])
def test_json_match_raises_where_json_loads_refuses_otherwise(text, side):
    """D7: the reference raises, so the service's result is an error result (the sample's reward absent)."""
    from grpcgrade.core.grading import grade_sync
    from grpcgrade.grader import GraderError

    expected = _loads_refusal(text)
    response, reference = (text, "[]") if side == "response" else ("[]", text)
    with pytest.raises(expected):
        match(response, reference)
    [result] = grade_sync(JsonMatchGrader(), [{"response": response, "reference_response": reference}], None)
    assert isinstance(result, GraderError)


@pytest.mark.parametrize("text", [NESTED_1100, HUGE_INT])
def test_tool_call_json_that_json_loads_refuses_otherwise_raises(text):
    from grpcgrade.core.grading import grade_sync
    from grpcgrade.grader import GraderError

    expected = _loads_refusal(text)
    response = f"<think>t</think><tool_call>{text}</tool_call>"
    with pytest.raises(expected):
        ReasoningToolCallFormatGrader().evaluate(response=response)
    [result] = grade_sync(ReasoningToolCallFormatGrader(), [{"response": response}], None)
    assert isinstance(result, GraderError)


def test_json_match_nesting_just_parseable_scores_or_raises_cleanly():
    # Whether json.loads or the comparison hits the recursion limit first depends on the stack depth here.
    text = '{"a":' * 480 + "1" + "}" * 480
    try:
        result = match(text, text, ignore_extra_keys=True)
    except RecursionError:
        pass  # json.loads refused it: the reference raises too
    except ValueError as e:
        assert str(e) == "JSON nested too deeply to compare"
    else:
        assert result.score in (0.0, 1.0)


def test_json_match_gives_up_on_a_quadratic_pairing(monkeypatch):
    monkeypatch.setattr(json_match, "PAIR_CHECK_BUDGET", 50)
    items = json.dumps([{"a": {"x": i}} for i in range(20)])
    with pytest.raises(ValueError, match="more than 50 item checks"):
        match(items, items, strict_order=False, ignore_extra_keys=True)
    # Items told apart by a scalar field are paired through the index, well within the budget.
    response = json.dumps([{"id": i, "extra": True} for i in range(200)])
    reference = json.dumps([{"id": i} for i in reversed(range(200))])
    assert match(response, reference, strict_order=False, ignore_extra_keys=True).score == 1.0


# --- length_penalty ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "response", "score", "reason"),
    [
        ({"min_length": 50, "max_length": 200, "penalty_rate": 0.1}, "Short", -4.5, "Too short: 5 < 50"),
        ({"min_length": 50, "max_length": 200, "penalty_rate": 0.1}, "A" * 250, -5.0, "Too long: 250 > 200"),
        (
            {"min_length": 50, "max_length": 200, "penalty_rate": 0.1},
            "This response has an acceptable length that falls within the specified range.",
            0.0,
            "Length acceptable: 50 <= 77 <= 200",
        ),
        ({"min_length": 10, "penalty_rate": 0.1}, "x" * 7, -0.30000000000000004, "Too short: 7 < 10"),
        ({"min_length": 3, "max_length": 5}, "abc", 0.0, "Length acceptable: 3 <= 3 <= 5"),
        ({"min_length": 3, "max_length": 5}, "abcde", 0.0, "Length acceptable: 3 <= 5 <= 5"),
        ({"min_length": 3, "max_length": 5, "penalty_rate": 2.0}, "abcdefg", -4.0, "Too long: 7 > 5"),
        ({"min_length": 3}, "你好世", 0.0, "Length acceptable: 3 <= 3 <= 1000"),
        ({}, "", -0.1, "Too short: 0 < 10"),
    ],
)
def test_length_penalty(params, response, score, reason):
    result = LengthPenaltyGrader(**params).evaluate(response=response, reference_response="ignored")
    assert result.score == score  # bit for bit, float artefacts included
    assert result.reason == reason
    defaults = {"min_length": 10, "max_length": 1000}
    assert result.metadata == {"length": len(response), **defaults, **_bounds(params), "penalty": score}


def _bounds(params):
    return {k: v for k, v in params.items() if k in ("min_length", "max_length")}


# --- reasoning_format -------------------------------------------------------------------------------


def test_reasoning_format_result_shape():
    result = ReasoningFormatGrader().evaluate(response="<think>t</think><answer>a</answer>")
    assert (result.score, result.reason) == (1.0, "All format requirements met")
    assert result.metadata == {
        "has_think_tag": True,
        "has_answer_tag": True,
        "total_reward": 1.0,
        "think_token": "think",
        "answer_token": "answer",
    }
    result = ReasoningFormatGrader().evaluate(response="Python is great.")
    assert result.reason == "Missing <think></think> tags; Missing <answer></answer> tags"
    assert (result.score, result.metadata["has_think_tag"], result.metadata["has_answer_tag"]) == (0.0, False, False)


@pytest.mark.parametrize(
    ("response", "score", "reason"),
    [
        ("<think></think><answer></answer>", 1.0, "All format requirements met"),
        ("x <answer>a</answer> y <think>\nt\n</think> z", 1.0, "All format requirements met"),
        ("<think>a</think><think>b</think><answer>c</answer>", 1.0, "All format requirements met"),
        ("<think>t<answer>a</answer></think>", 1.0, "All format requirements met"),
        ("<think>t</think> final", 0.0, "Missing <answer></answer> tags"),
        ("<think>t<answer>a</answer>", 0.0, "Missing <think></think> tags"),
        ("</think><think> <answer>a</answer>", 0.0, "Missing <think></think> tags"),
        ("<THINK>t</THINK><answer>a</answer>", 0.0, "Missing <think></think> tags"),
    ],
)
def test_reasoning_format_is_lenient_about_order_and_text(response, score, reason):
    result = ReasoningFormatGrader().evaluate(response=response)
    assert (result.score, result.reason) == (score, reason)


def test_reasoning_format_custom_tokens():
    grader = ReasoningFormatGrader(think_token="reasoning", answer_token="solution")
    result = grader.evaluate(response="<reasoning>r</reasoning>")
    assert result.reason == "Missing <solution></solution> tags"
    assert result.metadata["think_token"] == "reasoning"
    assert result.metadata["answer_token"] == "solution"


def test_reasoning_format_token_is_a_regex_as_in_the_reference():
    grader = ReasoningFormatGrader(think_token="th.nk")
    assert grader.evaluate(response="<thxnk>t</thynk><answer>a</answer>").score == 1.0
    assert grader.evaluate(response="<think>t</thynk>").reason == "Missing <answer></answer> tags"


@pytest.mark.parametrize("param", ["think_token", "answer_token"])
def test_reasoning_format_refuses_a_broken_pattern(param):
    with pytest.raises(InvalidParams) as info:
        ReasoningFormatGrader(**{param: "a(b"})
    assert info.value.param == param


def test_reasoning_format_token_error_only_the_compiler_finds_raises_at_grading_as_in_the_reference():
    token = "(?<=a+)b"  # parses, but Python's compiler refuses a variable-width lookbehind
    with pytest.raises(re.error) as expected:
        re.search(f"<{token}>.*?</{token}>", "x", re.DOTALL)
    grader = ReasoningFormatGrader(think_token=token)
    with pytest.raises(re.error) as got:
        grader.evaluate(response="x")
    assert str(got.value) == str(expected.value)


FRAGMENTS = ["<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "x", " ", "\n", "\u3000"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=10))
def test_reasoning_format_agrees_with_the_reference_regexes(parts):
    text = "".join(parts)
    result = ReasoningFormatGrader().evaluate(response=text)
    assert result.metadata["has_think_tag"] is bool(re.search("<think>.*?</think>", text, re.DOTALL))
    assert result.metadata["has_answer_tag"] is bool(re.search("<answer>.*?</answer>", text, re.DOTALL))


def test_reasoning_format_many_unclosed_tags():
    assert ReasoningFormatGrader().evaluate(response="<think>" * 200_000 + "<answer>x</answer>").score == 0.0


# --- reasoning_tool_call_format ---------------------------------------------------------------------

CALL = '{"name": "search", "arguments": {"q": "x"}}'
VALID_ANSWER = "Valid <think></think> + <answer></answer> format"
INVALID_ANSWER = "Invalid <think></think> + <answer></answer> format"
VALID_TOOL = "Valid <think></think> + <tool_call></tool_call> format with valid JSON"
INVALID_TOOL = "Invalid <think></think> + <tool_call></tool_call> format"
INVALID_JSON = "Invalid JSON format in <tool_call> tags"
COMBINATION = "Invalid combination: should have either <answer> or <tool_call> tags, not both or neither"
MISSING_THINK = "Missing <think></think> tags"


@pytest.mark.parametrize(
    ("response", "score", "reason", "valid_json", "count"),
    [
        ("<think>t</think>\n<answer>a</answer>", 1.0, VALID_ANSWER, False, 0),
        (" \n<think>t</think><answer>a</answer>\n", 1.0, VALID_ANSWER, False, 0),
        ("\u3000<think>t</think>\u2003<answer>a</answer>\u00a0", 1.0, VALID_ANSWER, False, 0),
        ("<think>t</think><answer>a</answer> post", 0.0, INVALID_ANSWER, False, 0),
        ("<think>t</think><answer>a</answer><answer>b</answer>", 0.0, INVALID_ANSWER, False, 0),
        ("<answer>a</answer><think>t</think>", 0.0, INVALID_ANSWER, False, 0),
        (f"<think>t</think>\n<tool_call>\n{CALL}\n</tool_call>", 1.0, VALID_TOOL, True, 1),
        (f"<think>t</think><tool_call>{CALL}</tool_call> <tool_call>{CALL}</tool_call>\n", 1.0, VALID_TOOL, True, 2),
        # One lazy group may span both calls (the reference's regex accepts this layout).
        (f"<think>t</think><tool_call>{CALL}</tool_call>y<tool_call>{CALL}</tool_call>", 1.0, VALID_TOOL, True, 2),
        (f"<think>t</think><tool_call>{CALL}</tool_call> trailing", 0.0, INVALID_TOOL, True, 1),
        (f"<think>a</think><think>b</think><tool_call>{CALL}</tool_call>", 0.0, INVALID_TOOL, True, 1),
        (f"<think>t</think><tool_call><tool_call>{CALL}</tool_call></tool_call>", 0.0, INVALID_TOOL, True, 1),
        ('<think>t</think><tool_call>{"name": "f"}</tool_call>', 0.0, INVALID_JSON, False, 1),
        ("<think>t</think><tool_call>{bad}</tool_call>", 0.0, INVALID_JSON, False, 1),
        (f"<think>t</think><tool_call>{CALL}</tool_call><tool_call>nope</tool_call>", 0.0, INVALID_JSON, False, 2),
        # D3: JSON that is not an object is invalid JSON for a tool call (the reference raises TypeError).
        ('<think>t</think><tool_call>["name", "arguments"]</tool_call>', 0.0, INVALID_JSON, False, 1),
        ('<think>t</think><tool_call>"name arguments"</tool_call>', 0.0, INVALID_JSON, False, 1),
        ("<think>t</think><tool_call>5</tool_call>", 0.0, INVALID_JSON, False, 1),
        ("<think>t</think><tool_call>null</tool_call>", 0.0, INVALID_JSON, False, 1),
        (f"<think>t</think><tool_call>{CALL}</tool_call><answer>a</answer>", 0.0, COMBINATION, False, 1),
        ("<think>t</think>", 0.0, COMBINATION, False, 0),
        ("<answer>a</answer>", 0.0, MISSING_THINK, False, 0),
        ("", 0.0, MISSING_THINK, False, 0),
    ],
)
def test_reasoning_tool_call_format(response, score, reason, valid_json, count):
    result = ReasoningToolCallFormatGrader().evaluate(response=response)
    assert (result.score, result.reason) == (score, reason)
    assert result.metadata["valid_tool_call_json"] is valid_json
    assert result.metadata["tool_call_count"] == count
    assert result.metadata["valid_format"] is (score == 1.0)
    assert result.metadata["reward"] == score
    assert set(result.metadata) == {
        "has_think_tag",
        "has_answer_tag",
        "has_tool_call_tag",
        "valid_format",
        "valid_tool_call_json",
        "tool_call_count",
        "reward",
    }


def reference_layout(text: str) -> bool:
    """The reference's structural checks for the tool-call branch, with its own regexes."""
    return bool(
        re.match(r"^\s*<think>.*?</think>\s*(?:<tool_call>.*?</tool_call>\s*)+$", text, re.DOTALL)
        and text.count("<think>") == 1
        and text.count("</think>") == 1
        and text.count("<tool_call>") == text.count("</tool_call>")
        and not re.search(r"</tool_call>\s*</tool_call>", text)
        and not re.search(r"<tool_call>\s*<tool_call>", text)
    )


TOOL_FRAGMENTS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "{}", "x", " ", "\n", "\u2003"]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(TOOL_FRAGMENTS), max_size=9))
def test_tool_call_layout_agrees_with_the_reference_regexes(parts):
    text = "".join(parts)
    result = ReasoningToolCallFormatGrader().evaluate(response=text)
    assert result.metadata["has_tool_call_tag"] is bool(re.findall("<tool_call>(.*?)</tool_call>", text, re.DOTALL))
    assert result.metadata["tool_call_count"] == len(re.findall("<tool_call>(.*?)</tool_call>", text, re.DOTALL))
    if (
        result.metadata["has_think_tag"]
        and not result.metadata["has_answer_tag"]
        and result.metadata["has_tool_call_tag"]
    ):
        # No payload here is a valid call, so valid_tool_call_json tells whether the layout passed.
        assert result.metadata["valid_tool_call_json"] is not reference_layout(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "a", " ", "\n"]), max_size=9))
def test_answer_layout_agrees_with_the_reference_regex(parts):
    text = "".join(parts)
    result = ReasoningToolCallFormatGrader().evaluate(response=text)
    if result.metadata["has_think_tag"] and result.metadata["has_answer_tag"]:
        expected = bool(
            re.match(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", text, re.DOTALL)
            and all(text.count(tag) == 1 for tag in ("<think>", "</think>", "<answer>", "</answer>"))
        )
        assert result.metadata["valid_format"] is expected


def test_tool_call_layout_that_backtracks_exponentially_in_the_reference():
    text = "<think>t</think>" + f"<tool_call>{CALL}</tool_call>" * 60 + "x"
    result = ReasoningToolCallFormatGrader().evaluate(response=text)
    assert (result.score, result.reason, result.metadata["tool_call_count"]) == (0.0, INVALID_TOOL, 60)


# --- custom_response / json_response (Audacia) ------------------------------------------------------


@pytest.mark.parametrize(
    ("expected_type", "response", "found", "passed"),
    [
        # Audacia's own test cases, as text.
        ("str", "some string", "str", True),
        ("dict", '{"key": "value"}', "dict", True),
        ("list", "[1, 2, 3]", "list", True),
        ("str", "123", "int", False),
        ("dict", "{'not a dict'}", "set", False),
        # JSON first, then Python literals, then text.
        ("dict", "{'a': 1}", "dict", True),
        ("object", '{"a": 1}', "dict", True),
        ("array", "[]", "list", True),
        ("string", '"quoted"', "str", True),
        ("str", "'single quoted'", "str", True),
        ("bool", "true", "bool", True),
        ("boolean", "False", "bool", True),
        ("int", "true", "bool", False),
        ("null", "null", "null", True),
        ("null", "None", "null", True),
        ("int", "42", "int", True),
        ("int", "1_000", "int", True),
        ("int", "1.5", "float", False),
        ("float", "1.5", "float", True),
        ("float", "3", "int", True),
        ("number", "-7", "int", True),
        ("number", "NaN", "float", True),
        ("number", "false", "bool", False),
        ("list", "(1, 2)", "tuple", False),
        ("str", "(1, 2)", "tuple", False),
        ("str", "", "str", True),
        ("str", "[1, 2", "str", True),
        (" Dict ", "{}", "dict", True),
    ],
)
def test_custom_response(expected_type, response, found, passed):
    result = CustomResponseGrader(expected_type=expected_type).evaluate(response=response)
    canonical = expected_type.strip().lower()
    assert result.score == (1.0 if passed else 0.0)
    assert result.metadata == {"format": found, "expected_type": canonical, "result": "pass" if passed else "fail"}
    if passed:
        assert result.reason == f"Response format {found} matches expected type {canonical}"
    else:
        assert result.reason == (
            f"Evaluation failed: output type of response not the expected format (expected {canonical}, got {found})"
        )


@pytest.mark.parametrize(
    ("value", "expected_type", "passed"),
    [({"key": "value"}, "dict", True), ([1, 2, 3], "list", True), (123, "str", False), ({"not a dict"}, "dict", False)],
)
def test_custom_response_checks_objects_as_they_are(value, expected_type, passed):
    assert CustomResponseGrader(expected_type).evaluate(response=value).metadata["result"] == (
        "pass" if passed else "fail"
    )


def test_custom_response_refuses_unknown_types():
    with pytest.raises(InvalidParams) as info:
        CustomResponseGrader(expected_type="tuple")
    assert info.value.param == "expected_type"


@pytest.mark.parametrize(
    "response",
    [
        DEEP_ARRAY,  # too deep for json, too long for the Python parser
        "(" * 60_000,  # too many nested parentheses for the Python parser
        "-" * 90_000 + "1",  # exhausts the Python parser's stack (MemoryError)
        "(" + "1," * (MAX_LITERAL_CHARS // 2) + ")",  # a tuple literal, but past the length guard
    ],
)
def test_custom_response_hostile_text_is_read_as_a_string(response):
    result = CustomResponseGrader(expected_type="str").evaluate(response=response)
    assert (result.score, result.metadata["format"]) == (1.0, "str")


def test_custom_response_literal_just_under_the_length_guard_is_parsed():
    text = "(" + "1," * ((MAX_LITERAL_CHARS - 2) // 2) + ")"
    assert len(text) <= MAX_LITERAL_CHARS
    assert CustomResponseGrader(expected_type="str").evaluate(response=text).metadata["format"] == "tuple"


def test_json_response_passes_objects():
    result = JsonResponseGrader().evaluate(response='{"a": 1}')
    assert (result.score, result.reason) == (1.0, "Response is a valid JSON object")
    assert result.metadata == {"format": "dict", "result": "pass"}


@pytest.mark.parametrize(
    ("response", "found"),
    [("[1, 2, 3]", "list"), ('"just a string"', "str"), ("42", "int"), ("null", "null")],
)
def test_json_response_fails_other_json(response, found):
    result = JsonResponseGrader().evaluate(response=response)
    assert result.score == 0.0
    assert result.reason == f"Evaluation failed: output is not a valid JSON format (a JSON {found}, not an object)"
    assert result.metadata == {"format": found, "result": "fail"}


@pytest.mark.parametrize(
    ("response", "found", "error"),
    [
        ("invalid json", "str", "JSONDecodeError: " + json_error("invalid json")),
        ('{"missing": "value"', "str", "JSONDecodeError: " + json_error('{"missing": "value"')),
        ("{'a': 1}", "str", "JSONDecodeError: " + json_error("{'a': 1}")),
        (1234, "int", "TypeError: the JSON object must be str, bytes or bytearray, not int"),
    ],
)
def test_json_response_fails_unparseable_input(response, found, error):
    result = JsonResponseGrader().evaluate(response=response)
    assert result.score == 0.0
    assert result.reason == f"Evaluation failed: output is not a valid JSON format ({error})"
    assert result.metadata == {"format": found, "result": "fail"}


def test_json_response_hostile_nesting_fails():
    result = JsonResponseGrader().evaluate(response=DEEP_ARRAY)
    assert (result.score, result.metadata["format"]) == (0.0, "str")
    assert "RecursionError" in result.reason
