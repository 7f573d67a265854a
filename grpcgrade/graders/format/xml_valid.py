"""`xml_valid`: is the response well-formed XML, valid against an XSD, RelaxNG or DTD schema when one is given?

lxml (libxml2) does the parsing and validating: the three schema languages with one library and error
messages that carry line numbers. Documents and schemas come from clients, so every parser here is
hardened: no network, no file or other resource outside the text itself (a resolver refuses every
`xs:include`, `xs:import`, RelaxNG `include`/`externalRef` and external DTD), no entity expansion (a document
declaring entities is refused outright: billion laughs and external entities never start), libxml2's own
depth and text-size limits kept (no `huge_tree`), and this grader's `max_depth` and `max_schema_chars` on
top. It runs in a worker under the per-sample time limit.

The schema comes from the params (`xsd`, `relaxng` or `dtd`, one at most, compiled once per grader) or, per
sample, from the `extra` key of the same name, which wins. Without any, only well-formedness is checked.
Score 1.0 when valid, 0.0 when not, the reason listing the first errors with their lines; a schema that does
not compile is a refused request (params) or the sample's INVALID_SAMPLE (per sample).
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

from lxml import etree  # type: ignore[import-untyped]  # lxml-stubs lags lxml 6's signatures

from grpcgrade.core.errors import ErrorCode, InvalidParams
from grpcgrade.grader import BaseGrader, GraderError, GraderScore

SCHEMA_KINDS = ("xsd", "relaxng", "dtd")
#: Errors listed in a reason (the count is given in full).
MAX_LISTED_ERRORS = 5
#: Per-sample schemas compiled and kept per grader (a batch often shares one).
SCHEMA_CACHE_SIZE = 16

#: etree.XMLSchema, etree.RelaxNG or etree.DTD (lxml is untyped here).
Validator = Any


class _RefuseAll(etree.Resolver):
    """Every external resource a document or schema names is refused: the text is all there is."""

    def resolve(self, url: Any, pubid: Any, context: Any) -> Any:
        raise etree.XMLSyntaxError(f"external resource {url!r} refused", 0, 0, 0)


def hardened_parser() -> etree.XMLParser:
    parser = etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        attribute_defaults=False,
        huge_tree=False,
        decompress=False,
    )
    parser.resolvers.add(_RefuseAll())
    return parser


class XmlProblem(ValueError):
    """A document or schema lxml cannot take; the message names the line."""


def _where(error: Any) -> str:
    return f"line {error.line}, column {error.column}: {error.message}"


def _depth(root: Any) -> int:
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node)
    return deepest


def parse_document(text: str, max_depth: int) -> Any:
    """The document's tree; XmlProblem when it is not well-formed, declares entities or nests too deep."""
    try:
        tree = etree.parse(io.BytesIO(text.encode("utf-8")), hardened_parser())
    except etree.XMLSyntaxError as exc:
        raise XmlProblem(f"not well-formed XML: line {exc.lineno}, column {exc.offset}: {exc.msg}") from None
    dtd = tree.docinfo.internalDTD
    if dtd is not None and any(True for _ in dtd.iterentities()):
        raise XmlProblem("the document declares entities, which are refused")
    depth = _depth(tree.getroot())
    if depth > max_depth:
        raise XmlProblem(f"the document nests {depth} elements deep, over max_depth={max_depth}")
    return tree


def compile_schema(kind: str, text: str, max_chars: int) -> Validator:
    """A validator from schema text; XmlProblem naming the line when it does not compile."""
    if len(text) > max_chars:
        raise XmlProblem(f"{kind} schema has {len(text)} characters, over max_schema_chars={max_chars}")
    try:
        if kind == "dtd":
            if "<!ENTITY" in text:
                raise XmlProblem("dtd: entity declarations are refused")
            return etree.DTD(io.StringIO(text))
        root = etree.fromstring(text.encode("utf-8"), hardened_parser())
        return etree.XMLSchema(root) if kind == "xsd" else etree.RelaxNG(root)
    except etree.XMLSyntaxError as exc:
        raise XmlProblem(f"{kind} schema is not well-formed: line {exc.lineno}: {exc.msg}") from None
    except (etree.XMLSchemaParseError, etree.RelaxNGParseError, etree.DTDParseError) as exc:
        errors = [_where(e) for e in exc.error_log] or [str(exc)]
        raise XmlProblem(f"{kind} schema does not compile: " + "; ".join(errors[:MAX_LISTED_ERRORS])) from None


def _given(values: dict[str, Any], where: str) -> tuple[str, str] | None:
    present = [(k, v) for k, v in values.items() if v]
    if len(present) > 1:
        raise XmlProblem(f"{where}: give one schema of {', '.join(SCHEMA_KINDS)}, not {len(present)}")
    if present and not isinstance(present[0][1], str):
        raise XmlProblem(f"{where}: the {present[0][0]} schema must be text")
    return present[0] if present else None


class XmlValidGrader(BaseGrader):
    """1.0 when the response is well-formed XML that the schema (params or per sample) accepts, else 0.0."""

    def __init__(
        self, xsd: str = "", relaxng: str = "", dtd: str = "", max_depth: int = 256, max_schema_chars: int = 1_000_000
    ) -> None:
        super().__init__()
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise InvalidParams("max_depth", "must be a positive whole number")
        self.max_depth = max_depth
        self.max_schema_chars = max_schema_chars
        self._cache: OrderedDict[tuple[str, str], Validator] = OrderedDict()
        given = None
        try:
            given = _given({"xsd": xsd, "relaxng": relaxng, "dtd": dtd}, "params")
            self.validator = compile_schema(*given, max_schema_chars) if given else None
        except XmlProblem as exc:
            raise InvalidParams(given[0] if given else "xsd", str(exc)) from None

    def _sample_validator(self, kind: str, text: str) -> Validator:
        key = (kind, text)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = compile_schema(kind, text, self.max_schema_chars)
            if len(self._cache) > SCHEMA_CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return found

    def evaluate(  # type: ignore[override]
        self, response: str, xsd: Any = None, relaxng: Any = None, dtd: Any = None
    ) -> GraderScore | GraderError:
        try:
            given = _given({"xsd": xsd, "relaxng": relaxng, "dtd": dtd}, "sample")
            validator = self._sample_validator(*given) if given else self.validator
        except XmlProblem as exc:
            return GraderError(self.name, str(exc), code=ErrorCode.INVALID_SAMPLE)
        try:
            tree = parse_document(response, self.max_depth)
        except XmlProblem as exc:
            return GraderScore(self.name, 0.0, str(exc), {"well_formed": False, "errors": [str(exc)]})
        if validator is None:
            return GraderScore(self.name, 1.0, "well-formed XML", {"well_formed": True, "errors": []})
        if validator.validate(tree):
            return GraderScore(self.name, 1.0, "valid", {"well_formed": True, "errors": []})
        errors = [_where(e) for e in validator.error_log]
        listed = "; ".join(errors[:MAX_LISTED_ERRORS])
        return GraderScore(
            self.name, 0.0, f"{len(errors)} schema errors: {listed}", {"well_formed": True, "errors": errors}
        )
