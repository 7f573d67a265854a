"""Generated regular expressions and texts for comparing the service's regex_match with Python's `re`
(used by the grader-level and the over-the-wire property tests)."""

from __future__ import annotations

import re

from hypothesis import strategies as st

ATOMS = [
    "a", "b", "A", "i", "I", "İ", "ı", "k", "K", "s", "ſ", "é", "北", "_", "1", "٣", " ", r"\n", ".", r"\w", r"\W",
    r"\d", r"\D", r"\s", r"\S", r"\b", r"\B", "^", "$", r"\A", r"\Z", "[a-c]", "[^a]", r"[^\Wa]", r"[\W\d]",
    r"[^\W\d_]", "[İı]", r"[^\s\d]", "[A-Z]", r"\1", "(?P=g)",
]  # fmt: skip
QUANTIFIERS = ["", "", "", "*", "+", "?", "{2}", "{1,3}", "*?", "+?", "??", "{0,}", "*+", "{1002}"]


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map("|".join),
        inner.map(lambda x: f"({x})"),
        inner.map(lambda x: f"(?:{x})"),
        inner.map(lambda x: f"(?P<g>{x})"),
        inner.map(lambda x: f"(?={x})"),
        inner.map(lambda x: f"(?!{x})"),
        inner.map(lambda x: f"(?>{x})"),
        st.tuples(inner, st.sampled_from(QUANTIFIERS)).map("".join),
    )


PATTERNS = st.tuples(
    st.sampled_from(["", "", "(?i)", "(?a)", "(?m)", "(?s)", "(?ai)", "(?mi)"]),
    st.recursive(st.sampled_from(ATOMS), _extend, max_leaves=8),
).map("".join)
TEXTS = st.text(alphabet="abAiIİık Kſé北_1٣\n\u212a", max_size=12)


def check_against_python(pattern: str, text: str, case_sensitive: bool, result: dict) -> None:
    flags = 0 if case_sensitive else re.IGNORECASE
    try:
        expected = re.compile(pattern, flags)
    except re.error as exc:
        assert (result["score"], result["reason"]) == (0.0, f"Invalid regex pattern: {exc}")
        return
    match = expected.search(text)
    assert result["score"] == float(match is not None)
    assert result["metadata"]["match_groups"] == (list(match.groups()) if match else None)
