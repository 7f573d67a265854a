"""Kolibrify's `xml_schema`: the answer is well-formed XML whose root tag is `metadata.schema.root_tag`.

Kolibrify parses with `xml.etree` (expat). This parses with lxml under a locked-down parser: no
network, no DTD loading, no entity substitution, libxml2's default size and depth limits and its
entity-amplification guard. Results match expat for the documents graders see; where they part:

* a reference to an external or undeclared entity is not resolved by either parser. Expat then
  rejects the document ("undefined entity"), so the same rejection is applied here (an XXE payload
  scores as malformed, and nothing is ever read from disk or network);
* a billion-laughs document fails in both (entity amplification limit);
* nesting deeper than 256 elements is refused (libxml2's limit without `huge_tree`), where expat
  would go on; so is an XML declaration of a version other than 1.x, which expat ignores.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from grpcgrade.grader import GraderScore

from .json_graders import RELAXED_PARSE_PENALTY, SchemaGrader
from .parsing import answer_or_completion, fenced_block, record_schema

# Entity references left in an internal entity's replacement text (character references were
# already replaced when the DTD was read); the five predefined entities are always defined.
_ENTITY_REF_RE = re.compile(r"&([^\s&;#][^\s&;]*);")
_PREDEFINED_ENTITIES = frozenset({"lt", "gt", "amp", "quot", "apos"})


@cache
def _lxml() -> Any:
    """lxml.etree and a hardened parser, loaded on first use to keep server start-up fast."""
    from lxml import etree

    parser = etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        huge_tree=False,
        # Text arrives as str, which expat reads as UTF-8 whatever the XML declaration says.
        encoding="utf-8",
    )
    return etree, parser


def _entities_all_internal(root: Any, etree: Any) -> bool:
    """True when every entity reference resolves, through internal declarations only.

    lxml keeps references unexpanded; expat expands internal entities and fails on any reference it
    cannot expand (external, or undeclared), including ones nested in an internal entity's text.
    """
    pending = [node.name for node in root.iter(etree.Entity)]
    if not pending:
        return True
    dtd = root.getroottree().docinfo.internalDTD
    internal = {} if dtd is None else {e.name: e.content for e in dtd.iterentities() if e.system_url is None}
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or name in _PREDEFINED_ENTITIES:
            continue
        if name not in internal:
            return False
        seen.add(name)
        pending.extend(_ENTITY_REF_RE.findall(internal[name] or ""))
    return True


def parse_xml(text: str) -> Any | None:
    """The root element of `text` (stripped), or None when it is not well-formed XML."""
    etree, parser = _lxml()
    try:
        root = etree.fromstring(text.strip().encode("utf-8"), parser)
    except etree.XMLSyntaxError:
        return None
    return root if _entities_all_internal(root, etree) else None


class XmlSchemaGrader(SchemaGrader):
    """0.5 for well-formed XML, 0.8 for a wrong root tag, 1.0 for the right one; x0.9 if fenced."""

    def __init__(self, reward_if_no_schema: float = 0.0) -> None:
        super().__init__(
            name="xml_schema",
            description="Kolibrify xml_schema: the answer is well-formed XML with the schema's root tag",
            reward_if_no_schema=reward_if_no_schema,
        )

    def evaluate(self, response: str = "", metadata: Any = None, **kwargs: Any) -> GraderScore:
        schema = record_schema(metadata)
        if schema is None:
            return self.no_schema_result()
        text = answer_or_completion(response or "")
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
        score, reason = _root_score(root.tag, schema)
        if penalty != 1.0:
            reason += f"; XML found only inside a fenced block (x{RELAXED_PARSE_PENALTY})"
        return GraderScore(
            name=self.name,
            score=score * penalty,
            reason=reason,
            metadata={"schema_found": True, "root_tag": root.tag, "fenced": penalty != 1.0},
        )


def _root_score(tag: str, schema: Mapping[str, Any]) -> tuple[float, str]:
    expected = schema.get("root_tag")
    if not isinstance(expected, str):
        return 0.5, "well-formed XML; the schema names no root_tag"
    if tag != expected:
        return 0.8, f"well-formed XML with root <{tag}>, expected <{expected}>"
    return 1.0, f"well-formed XML with root <{tag}>"
