"""Kolibrify's `xml_schema`: the answer is well-formed XML whose root tag is `metadata.schema.root_tag`.

Kolibrify parses with `xml.etree.ElementTree.fromstring`, that is with expat, so this parses with the very
same parser (the standard library's C `XMLParser`, same namespace handling, same "undefined entity" rule):
every well-formedness decision (which characters may start or continue a name, what an XML declaration may
say, entities) is expat's by construction. What differs is only what is kept and two safety limits (D9):

* nothing is built: the parser's target keeps the root tag and the current depth, and drops text, so an
  entity-expansion document cannot grow memory (expat's own amplification guard also refuses a billion-laughs
  document, as it does for Kolibrify);
* nothing is ever read from disk or network: the standard library never fetches external entities, and a
  reference to one is an "undefined entity" error, as it is for Kolibrify;
* nesting deeper than `MAX_XML_DEPTH` elements, or an element or attribute name longer than
  `MAX_XML_NAME_CHARS`, is not accepted (scored as XML that does not parse), where expat would go on.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from grpcgrade.grader import GraderScore

from .json_graders import RELAXED_PARSE_PENALTY, SchemaGrader
from .parsing import answer_or_completion, fenced_block

#: D9: deepest element nesting accepted.
MAX_XML_DEPTH = 256
#: D9: longest element or attribute name accepted (local part, in characters).
MAX_XML_NAME_CHARS = 50_000


class _OverLimit(Exception):
    """The document passes a D9 safety limit: treated as XML that does not parse."""


class _RootOnly:
    """An ElementTree parser target that keeps only the root tag, enforcing the depth and name limits."""

    def __init__(self) -> None:
        self.depth = 0
        self.root: str | None = None

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        self.depth += 1
        if self.depth > MAX_XML_DEPTH:
            raise _OverLimit(f"nested deeper than {MAX_XML_DEPTH} elements")
        names = [tag, *attrib]
        if any(len(name.rpartition("}")[2]) > MAX_XML_NAME_CHARS for name in names):
            raise _OverLimit(f"a name longer than {MAX_XML_NAME_CHARS} characters")
        if self.root is None:
            self.root = tag

    def end(self, tag: str) -> None:
        self.depth -= 1

    def data(self, text: str) -> None:
        pass

    def close(self) -> str | None:
        return self.root


def parse_xml(text: str) -> str | None:
    """The root tag of `text` (stripped) as `ET.fromstring(text.strip()).tag` gives it, or None when
    `ET.fromstring` refuses the text or it passes a D9 limit."""
    parser = ET.XMLParser(target=_RootOnly())
    try:
        parser.feed(text.strip())
        return parser.close()  # type: ignore[return-value]  # the target's close(): the root tag
    except (ET.ParseError, _OverLimit):
        return None


class XmlSchemaGrader(SchemaGrader):
    """0.5 for well-formed XML, 0.8 for a wrong root tag, 1.0 for the right one; x0.9 if fenced."""

    def against(self, response: str, schema: Mapping[str, Any]) -> GraderScore:
        text = answer_or_completion(response)
        root, penalty = parse_xml(text), 1.0
        if root is None and (candidate := fenced_block(text)):
            root, penalty = parse_xml(candidate), RELAXED_PARSE_PENALTY
        if root is None:
            return GraderScore(
                name=self.name,
                score=0.0,
                reason="the answer is not well-formed XML",
                metadata={"schema_found": True, "root_tag": None, "fenced": False},
            )
        score, reason = _root_score(root, schema)
        if penalty != 1.0:
            reason += f"; XML found only inside a fenced block (x{RELAXED_PARSE_PENALTY})"
        return GraderScore(
            name=self.name,
            score=score * penalty,
            reason=reason,
            metadata={"schema_found": True, "root_tag": root, "fenced": penalty != 1.0},
        )


def _root_score(tag: str, schema: Mapping[str, Any]) -> tuple[float, str]:
    expected = schema.get("root_tag")
    if not isinstance(expected, str):
        return 0.5, "well-formed XML; the schema names no root_tag"
    if tag != expected:
        return 0.8, f"well-formed XML with root <{tag}>, expected <{expected}>"
    return 1.0, f"well-formed XML with root <{tag}>"
