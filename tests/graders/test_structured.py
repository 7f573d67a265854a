"""tool_call_valid (jsonschema, draft 2020-12) and xml_valid (lxml, hardened): scores, partial credit, and what
a client-sent schema or document may not do. Expected verdicts are the libraries' own rules (a draft 2020-12
keyword, libxml2's messages), stated from their specifications rather than from our output."""

from __future__ import annotations

import json

import pytest

from grpcgrade.core.errors import ErrorCode, InvalidParams
from grpcgrade.core.registry import get_registry
from grpcgrade.grader import GraderError

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def call(name: str, arguments: object) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": text}}


def tool_call_valid(**params):
    return get_registry().build("tool_call_valid", params)


def test_valid_call_scores_one():
    result = tool_call_valid().evaluate(tool_calls=[call("weather", {"city": "Paris"})], tool_definitions=[WEATHER])
    assert result.score == 1.0


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ({"unit": "C"}, "'city' is a required property"),
        ({"city": "Paris", "unit": "K"}, "is not one of"),
        ({"city": "Paris", "wind": 1}, "Additional properties"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_bad_arguments_get_half_credit(arguments, why):
    result = tool_call_valid().evaluate(tool_calls=[call("weather", arguments)], tool_definitions=[WEATHER])
    assert result.score == 0.5
    assert why in result.reason


def test_unknown_tool_scores_zero_and_credit_is_averaged():
    calls = [call("weather", {"city": "Oslo"}), call("stocks", {}), call("weather", {})]
    result = tool_call_valid().evaluate(tool_calls=calls, tool_definitions=[WEATHER])
    assert result.score == pytest.approx((1 + 0 + 0.5) / 3)
    strict = tool_call_valid(partial_credit=False).evaluate(tool_calls=calls, tool_definitions=[WEATHER])
    assert strict.score == 0.0


def test_no_calls_score_is_a_param():
    assert tool_call_valid().evaluate(tool_calls=[], tool_definitions=[WEATHER]).score == 0.0
    assert tool_call_valid(score_without_calls=1.0).evaluate(tool_calls=[], tool_definitions=[WEATHER]).score == 1.0


@pytest.mark.parametrize(
    "definitions",
    [
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"minLength": -1}}}],
        [{"function": {"parameters": {}}}],
        "weather",
    ],
)
def test_invalid_schema_or_definitions_are_invalid_sample(definitions):
    result = tool_call_valid().evaluate(tool_calls=[call("f", {})], tool_definitions=definitions)
    assert isinstance(result, GraderError)
    assert result.code == ErrorCode.INVALID_SAMPLE


def test_remote_ref_is_not_fetched():
    remote = {"name": "f", "parameters": {"$ref": "http://127.0.0.1:9/schema.json"}}
    result = tool_call_valid().evaluate(tool_calls=[call("f", {})], tool_definitions=[remote])
    # jsonschema's referencing refuses an unknown URI instead of retrieving it: the grader fails the sample
    assert isinstance(result, GraderError)


XSD = """<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="order">
    <xs:complexType><xs:sequence>
      <xs:element name="qty" type="xs:positiveInteger"/>
    </xs:sequence></xs:complexType>
  </xs:element>
</xs:schema>"""
RELAXNG = """<element name="order" xmlns="http://relaxng.org/ns/structure/1.0">
  <element name="qty"><text/></element>
</element>"""
DTD = "<!ELEMENT order (qty)>\n<!ELEMENT qty (#PCDATA)>"


def xml_valid(**params):
    return get_registry().build("xml_valid", params)


@pytest.mark.parametrize(("kind", "schema"), [("xsd", XSD), ("relaxng", RELAXNG), ("dtd", DTD)])
def test_schema_from_params(kind, schema):
    grader = xml_valid(**{kind: schema})
    assert grader.evaluate(response="<order><qty>3</qty></order>").score == 1.0
    bad = grader.evaluate(response="<order>\n<qty>3</qty>\n<extra/>\n</order>")
    assert bad.score == 0.0
    assert "line 3" in bad.reason


def test_schema_per_sample_wins_and_xsd_types_apply():
    result = xml_valid().evaluate(response="<order><qty>-2</qty></order>", xsd=XSD)
    assert result.score == 0.0
    assert "positiveInteger" in result.reason


def test_well_formedness_only_and_line_numbers():
    assert xml_valid().evaluate(response="<a><b/></a>").score == 1.0
    broken = xml_valid().evaluate(response="<a>\n<b>\n</a>")
    assert broken.score == 0.0
    assert "line 3" in broken.reason


def test_entities_are_refused():
    laughs = '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x "xxxxxxxxxx"><!ENTITY y "&x;&x;&x;">]><a>&y;</a>'
    result = xml_valid().evaluate(response=laughs)
    assert result.score == 0.0
    assert "entities" in result.reason


def test_external_entity_and_schema_includes_read_no_file(tmp_path):
    secret = tmp_path / "secret.xsd"
    secret.write_text(XSD)
    xxe = f'<!DOCTYPE a [<!ENTITY s SYSTEM "file://{secret}">]><a>&s;</a>'
    assert "positiveInteger" not in xml_valid().evaluate(response=xxe).reason
    including = (
        '<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">'
        f'<xs:include schemaLocation="file://{secret}"/></xs:schema>'
    )
    result = xml_valid().evaluate(response="<order><qty>1</qty></order>", xsd=including)
    assert isinstance(result, GraderError) and result.code == ErrorCode.INVALID_SAMPLE
    with pytest.raises(InvalidParams):
        xml_valid(xsd=including)


def test_depth_limit():
    deep = "<a>" * 40 + "</a>" * 40
    assert xml_valid(max_depth=39).evaluate(response=deep).score == 0.0
    assert xml_valid(max_depth=40).evaluate(response=deep).score == 1.0


def test_bad_schema_in_params_is_refused_and_two_schemas_are_too():
    with pytest.raises(InvalidParams):
        xml_valid(xsd="<xs:schema xmlns:xs='http://www.w3.org/2001/XMLSchema'><xs:bogus/></xs:schema>")
    with pytest.raises(InvalidParams):
        xml_valid(xsd=XSD, dtd=DTD)
