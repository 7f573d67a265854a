"""Kolibrify family: behaviour beyond tests/fixtures/kolibrify_public.jsonl.

Expected values are the Kolibrify report's stated results (kolibrify-audacia-peers.md A.4, its
upstream tests in A.8) or come from the stdlib XML parser that Kolibrify itself uses.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpcgrade.core.errors import InvalidParams
from grpcgrade.core.registry import get_registry
from grpcgrade.grader import GraderScore
from grpcgrade.graders import kolibrify
from grpcgrade.graders.kolibrify.category_match import CategoryMatchGrader
from grpcgrade.graders.kolibrify.completion_length_cap import CompletionLengthCapGrader
from grpcgrade.graders.kolibrify.json_graders import JsonSchemaGrader, JsonValidGrader
from grpcgrade.graders.kolibrify.latex_only import LatexOnlyGrader
from grpcgrade.graders.kolibrify.math_exact import MathExactGrader
from grpcgrade.graders.kolibrify.number_only import NumberOnlyGrader
from grpcgrade.graders.kolibrify.parsing import split_think
from grpcgrade.graders.kolibrify.think_format import ThinkFormatGrader
from grpcgrade.graders.kolibrify.xml_schema import MAX_XML_DEPTH, MAX_XML_NAME_CHARS, XmlSchemaGrader

SCHEMA_STRICT = {"schema": json.dumps({"type": "object", "required": ["answer"], "allow_additional_properties": False})}
SCHEMA_LOOSE = {"schema": json.dumps({"type": "object", "required": ["answer"]})}
ROOT_ANSWER = {"schema": json.dumps({"root_tag": "answer"})}


def think(answer: str) -> str:
    """A completion in Kolibrify's expected layout whose final answer is `answer`."""
    return f"<think>\nreasoning\n</think>\n{answer}"


def assert_jsonable(result: GraderScore) -> None:
    json.dumps(result.metadata)


# --- parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>\nr\n</think>\nans", ("r", "ans")),
        ("  <think> r </think>  ans  ", ("r", "ans")),
        ("pre <think>a</think>b</think>c", ("a", "b</think>c")),  # first of each tag
        ("<think>a</think>\n<think>b</think>\nans", ("a", "<think>b</think>\nans")),
        ("<think></think>ans", (None, "ans")),
        ("<think>r</think>", ("r", None)),
        ("<think></think>", (None, None)),
        ("r</think>\nans", (None, None)),  # template pre-filled <think>
        ("<think>r", (None, None)),
        ("</think>x<think>r", (None, None)),  # reversed
        ("no tags", (None, None)),
    ],
)
def test_split_think(completion: str, expected: tuple[str | None, str | None]) -> None:
    assert split_think(completion) == expected


# --- think_format --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<think>\nr\n</think>\n\nans", 1.0),
        ("x <think>r</think>\nans", 0.875),
        ("<think>r</think>\tans", 1.0),  # whitespace other than a space is no penalty
        ("<think>r", 0.25),
        ("no tags", 0.0),
        ("", 0.0),
        ("<think>a</think>\n<think>b</think>\n<think>c</think>\n<think>d</think>\nans", 0.1),
        ("<think>" * 9 + "</think>" * 9 + "\nans", 0.0),  # clamped at 0
    ],
)
def test_think_format_scores(completion: str, score: float) -> None:
    assert ThinkFormatGrader().evaluate(response=completion).score == pytest.approx(score, abs=1e-12)


def test_think_format_reason_and_metadata() -> None:
    perfect = get_registry().build("think_format").evaluate(response="<think>\nr\n</think>\nans")
    assert perfect.name == "think_format"
    assert perfect.reason == "well-formed <think> block and final answer"
    assert perfect.metadata == {"open_tags": 1, "close_tags": 1, "final_answer_present": True}

    spaced = ThinkFormatGrader().evaluate(response="<think>r</think> ans")
    assert "space instead of a newline" in spaced.reason
    glued = ThinkFormatGrader().evaluate(response="<think>r</think>ans")
    assert "glued" in glued.reason
    empty = ThinkFormatGrader().evaluate(response="<think>r</think>")
    assert empty.metadata["final_answer_present"] is False
    assert "no final answer" in empty.reason
    repeated = ThinkFormatGrader().evaluate(response="<think>a</think>\n<think>b</think>\nans")
    assert repeated.metadata == {"open_tags": 2, "close_tags": 2, "final_answer_present": True}
    assert "2 extra think tag(s)" in repeated.reason


# --- math_exact ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold", "score"),
    [
        ("-72", "#### 72", 0.0),  # the sign is part of the number
        ("1,000", "1000", 0.0),  # comma splits the number
        ("3.5", "3.50", 0.0),  # string comparison
        ("1 2 3 72", "#### 72", 1.0),  # any number may match
        ("72", "72 and 5", 1.0),  # the reference's first number is the gold
        ("5", "72 and 5", 0.0),
        ("72", "", 0.0),  # no reference
        ("72", "seventy-two", 0.0),  # a reference without a number
        ("   ", "72", 0.0),
    ],
)
def test_math_exact(answer: str, gold: str, score: float) -> None:
    assert MathExactGrader().evaluate(response=think(answer), reference=gold).score == score


def test_math_exact_reason_and_metadata() -> None:
    hit = MathExactGrader().evaluate(response=think("The answer is 72 dollars"), reference="#### 72")
    assert hit.metadata == {"answer_found": True, "gold": "72", "numbers_in_answer": 1}
    assert hit.reason == "the final answer contains 72"
    miss = MathExactGrader().evaluate(response=think("71 or 73"), reference="#### 72")
    assert miss.metadata == {"answer_found": True, "gold": "72", "numbers_in_answer": 2}
    assert miss.reason == "none of the 2 number(s) in the final answer is 72"
    untagged = MathExactGrader().evaluate(response="72", reference="72")
    assert untagged.metadata["answer_found"] is False
    assert untagged.reason == "no final answer after </think>"


# --- number_only ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ("-3.5", 1.0),
        ("+.5", 1.0),
        ("1,234", 0.5),
        ("42" + "x" * 9, 0.5),
        ("42" + "x" * 10, 0.4),
        ("42" + "x" * 19, 0.4),
        ("42" + "x" * 20, 0.3),
        ("42" + "x" * 29, 0.3),
        ("42" + "x" * 30, 0.2),
        ("42" + "x" * 39, 0.2),
        ("42" + "x" * 40, 0.1),
        ("no digits", 0.0),
    ],
)
def test_number_only_tiers(answer: str, score: float) -> None:
    assert NumberOnlyGrader().evaluate(response=think(answer)).score == score


def test_number_only_metadata() -> None:
    result = NumberOnlyGrader().evaluate(response=think("42 apples"))
    assert result.metadata == {"answer_found": True, "number": "42", "extra_chars": 7}
    assert result.reason == "number 42 with 7 other character(s)"
    untagged = NumberOnlyGrader().evaluate(response="42")
    assert untagged.score == 0.0
    assert untagged.metadata == {"answer_found": False, "number": None, "extra_chars": None}
    wordy = NumberOnlyGrader().evaluate(response=think("none"))
    assert wordy.reason == "no number in the final answer"
    assert wordy.metadata["answer_found"] is True


# --- json_valid ----------------------------------------------------------------------------------


def required(*keys: object) -> dict[str, object]:
    return {"expected_json_schema": {"required": list(keys)}}


@pytest.mark.parametrize(
    ("completion", "metadata", "score"),
    [
        ('  {"a": 1, "b": 2}\n', required("a", "b"), 1.0),
        ('"ab"', required("a"), 1.0),  # `in` on a string is a substring test
        ('["a", "b"]', required("a"), 1.0),  # ... and membership on a list
        ('[{"a": 1}]', required("a"), 0.0),
        ("5", required("a"), 0.0),  # `in` on a number raises: 0
        ("null", required("a"), 0.0),
        ("5", None, 1.0),
        ('{"a": 1}', {"expected_json_schema": {"required": "a"}}, 1.0),  # not a list: ignored
        ('{"a": 1}', {"expected_json_schema": ["a"]}, 1.0),
        ("{'a': 1}", None, 0.0),
        ("", None, 0.0),
    ],
)
def test_json_valid(completion: str, metadata: object, score: float) -> None:
    assert JsonValidGrader().evaluate(response=completion, metadata=metadata).score == score


def test_json_valid_metadata() -> None:
    missing = JsonValidGrader().evaluate(response='{"a": 1}', metadata=required("a", "b"))
    assert missing.metadata == {"valid_json": True, "missing_keys": ["b"]}
    assert missing.reason == "valid JSON missing required keys ['b']"
    invalid = JsonValidGrader().evaluate(response="{")
    assert invalid.metadata == {"valid_json": False, "missing_keys": None}
    assert invalid.reason.startswith("not valid JSON")


# --- json_schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "metadata", "score"),
    [
        ('{"not_answer": 1}', SCHEMA_LOOSE, 0.8),  # extra keys allowed by default
        ('{"answer": 1, "more": 2}', SCHEMA_LOOSE, 1.0),
        ("not json", SCHEMA_STRICT, 0.0),
        ("null", SCHEMA_STRICT, 0.0),  # a parsed null counts as unparsable
        ("None", SCHEMA_STRICT, 0.0),
        ("(1, 2)", SCHEMA_STRICT, 0.5 * 0.9),  # a Python tuple literal
        ('"just a string"', SCHEMA_STRICT, 0.5),
        ('{"answer": 1}', {"schema": json.dumps({"required": "answer"})}, 0.5),  # required not a list
        ('{"answer": 1}', {"schema": json.dumps({})}, 1.0),
        ('{"answer": 1}', {"schema": {"required": ["answer"]}}, 0.0),  # a dict, not a JSON string
        ('{"answer": 1}', {"schema": "not json"}, 0.0),
        ('{"answer": 1}', {"schema": "[1]"}, 0.0),
        (think('```json\n{"answer":1}\n```'), SCHEMA_STRICT, 0.9),  # parsed final answer, fenced
        (think('{"answer": 1}'), SCHEMA_STRICT, 1.0),
        ("```\n{'answer': 1, 'x': 2}\n```", SCHEMA_STRICT, 0.9 * 0.9),  # fence, then a Python literal
    ],
)
def test_json_schema(completion: str, metadata: object, score: float) -> None:
    result = JsonSchemaGrader().evaluate(response=completion, metadata=metadata)
    assert result.score == pytest.approx(score, abs=1e-12)
    assert_jsonable(result)


def test_json_schema_reward_if_no_schema() -> None:
    grader = JsonSchemaGrader(reward_if_no_schema=0.25)
    result = grader.evaluate(response='{"answer": 1}', metadata={})
    assert result.score == 0.25
    assert result.metadata == {"schema_found": False}
    assert grader.evaluate(response='{"answer": 1}', metadata=SCHEMA_STRICT).score == 1.0
    for bad in (float("nan"), "0.5", True):
        with pytest.raises(InvalidParams) as err:
            JsonSchemaGrader(reward_if_no_schema=bad)
        assert err.value.param == "reward_if_no_schema"


def test_json_schema_metadata() -> None:
    result = JsonSchemaGrader().evaluate(response="{'another': 2, b'raw': 3}", metadata=SCHEMA_STRICT)
    assert result.score == pytest.approx(0.7 * 0.9)
    assert result.metadata == {
        "schema_found": True,
        "parsed_as": "python literal",
        "missing_keys": ["answer"],
        "extra_keys": ["another", "b'raw'"],
    }
    assert "x0.9" in result.reason
    fenced = JsonSchemaGrader().evaluate(response='```json\n{"answer": 1}\n```', metadata=SCHEMA_STRICT)
    assert fenced.metadata["parsed_as"] == "fenced json"
    unparsable = JsonSchemaGrader().evaluate(response="{", metadata=SCHEMA_STRICT)
    assert unparsable.metadata == {"schema_found": True, "parsed_as": None}


# --- xml_schema ----------------------------------------------------------------------------------

XXE = '<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><answer>&x;</answer>'
BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + "".join(f'<!ENTITY lol{i} "{("&lol%s;" % (i - 1 or "")) * 10}">' for i in range(1, 10))
    + "]><answer>&lol9;</answer>"
)


@pytest.mark.parametrize(
    ("completion", "metadata", "score"),
    [
        ("```xml\n<answer>ok</answer>\n```", ROOT_ANSWER, 0.9),
        ("<answer/>", {"schema": json.dumps({"root_tag": None})}, 0.5),
        ("<answer/>", {"schema": {"root_tag": "answer"}}, 0.0),  # a dict, not a JSON string
        ('<a:answer xmlns:a="urn:x"/>', ROOT_ANSWER, 0.8),  # namespaced tag is "{urn:x}answer"
        ('<answer xmlns="urn:x"/>', {"schema": json.dumps({"root_tag": "{urn:x}answer"})}, 1.0),
        ("<think>reasoning</think>\n<answer>ok</answer>", ROOT_ANSWER, 1.0),
        ("<answer>ok</answer>", ROOT_ANSWER, 1.0),
        ("```xml\n<answer>\n```", ROOT_ANSWER, 0.0),
    ],
)
def test_xml_schema(completion: str, metadata: object, score: float) -> None:
    result = XmlSchemaGrader().evaluate(response=completion, metadata=metadata)
    assert result.score == pytest.approx(score, abs=1e-12)
    assert_jsonable(result)


def test_xml_schema_reward_if_no_schema_and_metadata() -> None:
    assert XmlSchemaGrader(reward_if_no_schema=0.4).evaluate(response="<answer/>").score == 0.4
    with pytest.raises(InvalidParams):
        XmlSchemaGrader(reward_if_no_schema=float("inf"))
    fenced = XmlSchemaGrader().evaluate(response="```xml\n<wrong/>\n```", metadata=ROOT_ANSWER)
    assert fenced.metadata == {"schema_found": True, "root_tag": "wrong", "fenced": True}
    assert fenced.reason == (
        "well-formed XML with root <wrong>, expected <answer>; XML found only inside a fenced block (x0.9)"
    )


def kolibrify_xml_score(text: str) -> float:
    """What Kolibrify's xml.etree-based grader gives for root_tag "answer" (no fence involved)."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError:
        return 0.0
    return 1.0 if root.tag == "answer" else 0.8


@pytest.mark.parametrize(
    "document",
    [
        '<?xml version="1.0" encoding="UTF-8"?><answer/>',
        '<?xml version="1.0" encoding="ISO-8859-1"?><answer>é</answer>',  # str input: the declaration is moot
        "\ufeff<answer/>",
        "<!-- c --><?pi x?><answer><![CDATA[<x>]]></answer>",
        '<!DOCTYPE r [<!ENTITY e "x">]><answer>&e;</answer>',  # internal entities are fine
        '<!DOCTYPE r [<!ENTITY b "<b/>"><!ENTITY a "pre&b;">]><answer>&a;&amp;</answer>',
        '<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><answer>ok</answer>',  # declared, unused
        '<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd"><!ENTITY a "pre&x;">]><answer>&a;</answer>',
        '<!DOCTYPE r SYSTEM "file:///etc/passwd"><answer>&e;</answer>',
        '<!DOCTYPE r [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><answer/>',
        '<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><answer a="&x;"/>',
        '<!DOCTYPE r [<!ENTITY a "&b;"><!ENTITY b "&a;">]><answer>&a;</answer>',
        "<answer>&e;</answer>",
        "<answer>a & b</answer>",
        "<a:answer/>",
        "<answer/><extra/>",
        "<answer>\x01</answer>",
        "<ответ/>",
        "<a>" * 200 + "</a>" * 200,
        "",
        # expat's name characters (XML 1.0 4th edition), not the 5th edition's wider set
        "<soluție/>",
        '<a bț="1"/>',
        "<ſ/>",
        "<ｱ/>",
        "<𠀀/>",
        "<😀/>",
        "<x₂/>",
        "<answer ſ='1'/>",
        # expat accepts any version string in the declaration
        '<?xml version="2.0"?><answer/>',
        '<?xml version="1"?><answer/>',
        '<?xml version="abc"?><answer/>',
        '<?xml version=""?><answer/>',
        "<?xml version='1.0' standalone='maybe'?><answer/>",
    ],
)
def test_xml_well_formedness_matches_kolibrify(document: str) -> None:
    score = XmlSchemaGrader().evaluate(response=document, metadata=ROOT_ANSWER).score
    assert score == kolibrify_xml_score(document)


def test_xml_external_entity_is_never_read() -> None:
    secret = Path("/etc/passwd").read_text().splitlines()[0] if Path("/etc/passwd").exists() else "root:x:0:0"
    result = XmlSchemaGrader().evaluate(response=XXE, metadata=ROOT_ANSWER)
    assert result.score == kolibrify_xml_score(XXE) == 0.0
    assert "/etc/passwd" not in json.dumps(result.metadata) + result.reason
    assert secret not in json.dumps(result.metadata) + result.reason


def test_xml_billion_laughs_is_refused() -> None:
    result = XmlSchemaGrader().evaluate(response=BILLION_LAUGHS, metadata=ROOT_ANSWER)
    assert result.score == kolibrify_xml_score(BILLION_LAUGHS) == 0.0
    assert result.metadata["root_tag"] is None
    # Fenced, too: the fallback parse goes through the same guarded parser.
    fenced = XmlSchemaGrader().evaluate(response=f"```xml\n{BILLION_LAUGHS}\n```", metadata=ROOT_ANSWER)
    assert fenced.score == 0.0


def test_xml_nesting_limit() -> None:
    """D9: nesting deeper than 256 elements is not accepted, where expat goes on; 256 itself is."""
    assert MAX_XML_DEPTH == 256
    at_limit = "<answer>" + "<a>" * 255 + "</a>" * 255 + "</answer>"
    deep = "<answer>" + "<a>" * 256 + "</a>" * 256 + "</answer>"
    assert kolibrify_xml_score(deep) == kolibrify_xml_score(at_limit) == 1.0
    assert XmlSchemaGrader().evaluate(response=at_limit, metadata=ROOT_ANSWER).score == 1.0
    assert XmlSchemaGrader().evaluate(response=deep, metadata=ROOT_ANSWER).score == 0.0


@pytest.mark.parametrize(
    "template", ["<answer><{n}/></answer>", '<answer {n}="1"/>', '<answer xmlns:p="u"><p:{n}/></answer>']
)
def test_xml_name_length_limit(template: str) -> None:
    """D9: an element or attribute name over 50,000 characters is not accepted; 50,000 is."""
    assert MAX_XML_NAME_CHARS == 50_000
    at_limit, over = template.format(n="n" * 50_000), template.format(n="n" * 50_001)
    assert kolibrify_xml_score(over) == kolibrify_xml_score(at_limit) == 1.0
    assert XmlSchemaGrader().evaluate(response=at_limit, metadata=ROOT_ANSWER).score == 1.0
    assert XmlSchemaGrader().evaluate(response=over, metadata=ROOT_ANSWER).score == 0.0


_XML_PIECES = [
    "<answer>", "</answer>", "<a>", "</a>", "<a/>", "<b x='1'>", "</b>", "<?xml version='1.0'?>",
    "<?xml version='9'?>", "<!-- c -->", "<![CDATA[x]]>", "&amp;", "&e;", "&#65;", "&#0;", "text", " ", "\n",
    "<ſ/>", "<é/>", "<soluție/>", "<x₂/>", "<p:a xmlns:p='u'/>", "<a:b/>", "<!DOCTYPE r [<!ENTITY e 'x'>]>",
    "<answer a='1' a='2'/>", "<?pi x?>", "<_/>", "<-a/>", "<a.b/>", "<·/>", "\ufeff", "<",  "&",
]  # fmt: skip


@settings(max_examples=400, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(_XML_PIECES), max_size=6))
def test_xml_well_formedness_fuzz_matches_expat(pieces: list[str]) -> None:
    """Random documents from XML fragments score as Kolibrify's ET.fromstring-based grader scores them."""
    document = "".join(pieces)
    assert XmlSchemaGrader().evaluate(response=document, metadata=ROOT_ANSWER).score == kolibrify_xml_score(document)


# --- category_match ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "reference", "extra", "score"),
    [
        (think("Alpha"), "Alpha", {}, 1.0),
        ("  Alpha  ", "Alpha", {}, 1.0),  # no think block: the stripped completion is the answer
        (think("ALPHA"), "Alpha", {}, 0.8),
        (think("beta"), "Alpha", {}, 0.3),  # allowed categories compare case-insensitively
        (think("Alpha"), "", {"expected_category": "Alpha"}, 1.0),
        (think("Beta"), "Alpha", {"expected_category": "Beta"}, 0.3),  # the reference wins
        (think("Alpha"), "", {}, 0.0),
        ("", "Alpha", {}, 0.0),
        ("<think>r</think>", "Alpha", {}, 0.0),  # no answer: falls back to the completion, no match
    ],
)
def test_category_match(completion: str, reference: str, extra: dict[str, str], score: float) -> None:
    grader = CategoryMatchGrader(allowed_categories=["Alpha", "Beta"])
    assert grader.evaluate(response=completion, reference=reference, **extra).score == score


def test_category_match_params_and_metadata() -> None:
    with pytest.raises(InvalidParams) as err:
        CategoryMatchGrader()
    assert err.value.param == "allowed_categories"
    with pytest.raises(InvalidParams):
        CategoryMatchGrader(allowed_categories="Alpha")
    with pytest.raises(InvalidParams):
        CategoryMatchGrader(allowed_categories=["Alpha", 3])
    grader = CategoryMatchGrader(allowed_categories=[])
    assert grader.evaluate(response=think("Beta"), reference="Alpha").score == 0.0
    result = grader.evaluate(response=think("alpha, surely"), reference="Alpha")
    assert (result.score, result.reason, result.metadata) == (
        0.5,
        "expected category contained in a longer answer",
        {"expected": "Alpha"},
    )


# --- completion_length_cap -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "scores"),
    [
        ({"max_completion_tokens": 5}, [1.0, 1.0, 0.0, 0.0]),
        ({"max_completion_tokens": 5, "treat_missing_as_fail": False}, [1.0, 1.0, 0.0, 1.0]),
        ({"max_completion_tokens": 5, "min_reward": 0.2}, [1.0, 1.0, 0.2, 0.2]),
        ({"max_completion_tokens": 5, "min_reward": 0.2, "treat_missing_as_fail": False}, [1.0, 1.0, 0.2, 1.0]),
    ],
)
def test_completion_length_cap(params: dict[str, object], scores: list[float]) -> None:
    grader = CompletionLengthCapGrader(**params)
    counts = [4, 5.0, 6, None]  # JSON numbers arrive as floats
    assert [grader.evaluate(response="x", completion_tokens=n).score for n in counts] == scores


def test_completion_length_cap_params_and_bad_counts() -> None:
    for bad in ({}, {"max_completion_tokens": 0}, {"max_completion_tokens": -3}, {"max_completion_tokens": "5"}):
        with pytest.raises(InvalidParams) as err:
            CompletionLengthCapGrader(**bad)
        assert err.value.param == "max_completion_tokens"
    with pytest.raises(InvalidParams) as err:
        CompletionLengthCapGrader(max_completion_tokens=5, treat_missing_as_fail="false")
    assert err.value.param == "treat_missing_as_fail"
    for min_reward in (-0.1, 1.5, float("nan"), "0.5"):
        with pytest.raises(InvalidParams) as err:
            CompletionLengthCapGrader(max_completion_tokens=5, min_reward=min_reward)
        assert err.value.param == "min_reward"
    grader = CompletionLengthCapGrader(max_completion_tokens=5)
    over = grader.evaluate(completion_tokens=6.0)
    assert over.reason == "6 tokens, cap 5: over the cap"
    assert over.metadata == {"completion_tokens": 6, "max_completion_tokens": 5}
    assert grader.evaluate().reason == "no completion_tokens in the sample; counted as over the cap"


@pytest.mark.parametrize("count", ["many", True, False, "12", 9.5, -1, float("inf"), float("nan"), [3]])
def test_completion_tokens_must_be_a_whole_number(count: object) -> None:
    """D12: pydantic would turn `true` into 1 and "12" into 12, and fail the whole request on 9.5; here any
    count that is not a whole number makes that sample INVALID_SAMPLE."""
    from grpcgrade.grader import GraderError

    result = CompletionLengthCapGrader(max_completion_tokens=5).evaluate(completion_tokens=count)
    assert isinstance(result, GraderError)
    assert result.code == "INVALID_SAMPLE"
    assert "completion_tokens must be a whole number" in result.error


# --- latex_only ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ("$$5$$", 1.0),
        ("\\(5\\)", 1.0),
        ("\\[5\\]", 1.0),
        ("\\boxed{5}", 1.0),
        ("\\begin{align*}x\\\\y\\end{align*}", 1.0),
        ("$\\frac{1}{2}$\n", 1.0),
        ("\\begin{align}5\\end{aligned}", 0.0),
        (" $5$ extra", 0.0),
        ("text \\(5\\)", 0.0),
        ("five", 0.0),
    ],
)
def test_latex_only(answer: str, score: float) -> None:
    assert LatexOnlyGrader().evaluate(response=think(answer)).score == score


def test_latex_only_needs_a_final_answer() -> None:
    result = LatexOnlyGrader().evaluate(response="$5$")
    assert (result.score, result.metadata) == (0.0, {"answer_found": False})
    assert LatexOnlyGrader().evaluate(response="<think>r</think>").score == 0.0


# --- registration --------------------------------------------------------------------------------


def test_family_registers_every_grader_under_its_name() -> None:
    registered: dict[str, type] = {}

    def register(factory: type, name: str, aliases: tuple[str, ...] = ()) -> None:
        registered[name] = factory

    kolibrify.register_graders(register)
    assert registered == {
        "think_format": ThinkFormatGrader,
        "math_exact": MathExactGrader,
        "number_only": NumberOnlyGrader,
        "json_valid": JsonValidGrader,
        "json_schema": JsonSchemaGrader,
        "xml_schema": XmlSchemaGrader,
        "category_match": CategoryMatchGrader,
        "completion_length_cap": CompletionLengthCapGrader,
        "latex_only": LatexOnlyGrader,
    }
    params = {"category_match": {"allowed_categories": ["a"]}, "completion_length_cap": {"max_completion_tokens": 1}}
    for name, factory in registered.items():
        grader = get_registry().build(name, params.get(name))
        assert isinstance(grader, factory)
        assert grader.name == name
