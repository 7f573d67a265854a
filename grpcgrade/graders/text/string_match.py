"""String matching against a reference: exact, prefix/suffix, regex, substrings and overlap ratios.

Reference: OpenJudge `StringMatchGrader` (py-openjudge 0.2.4). The algorithm is fixed at construction;
its per-sample parameters (`pattern`, `substrings`, `bidirectional`, `case_sensitive`,
`ignore_whitespace`) come from the sample's `extra` and override the constructor's defaults, as in the
reference. With the grader's defaults every algorithm is case-insensitive, exact match included.

`regex_match` patterns arrive in requests, so they are untrusted: Python's backtracking `re` would let one
pattern such as `(a+)+$` pin a worker for minutes. Patterns are therefore parsed with Python's own parser
(CPython's internal `re._parser`, so the syntax, the group numbering and the invalid-pattern messages are
the reference's), translated from its tree to RE2 syntax and run on RE2, which matches in linear time.
The translation keeps Python's meaning where RE2's differs: `\\d`, `\\w` and `\\s` are Unicode-aware, `$`
also matches before a final newline, `\\Z` is the end of the text. What RE2 cannot do (backreferences,
lookaround, conditional and atomic groups, possessive quantifiers, repetition counts above 1000) gives the
reference's invalid-pattern result. Known remaining differences: `\\b`/`\\B` use ASCII word characters,
and a `$` inside a capture group that matches before a final newline includes that newline in the group.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from re import _constants as sre
from re import _parser as sre_parse
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.grader import BaseGrader, GraderMode, GraderScore

# Each algorithm's own parameters and their defaults, as in the reference's DEFAULT_PARAMS.
ALGORITHM_PARAMS: dict[str, dict[str, Any]] = {
    "exact_match": {"case_sensitive": True, "ignore_whitespace": False},
    "prefix_match": {"case_sensitive": True},
    "suffix_match": {"case_sensitive": True},
    "regex_match": {"pattern": "", "case_sensitive": True},
    "substring_match": {"case_sensitive": False, "bidirectional": False},
    "contains_all": {"substrings": None, "case_sensitive": False},
    "contains_any": {"substrings": None, "case_sensitive": False},
    "word_overlap": {"case_sensitive": False},
    "char_overlap": {"case_sensitive": False},
}

_MAX_CODE_POINT = 0x10FFFF

# What every algorithm returns: the score and the metadata (the reference's `details`).
_Result = tuple[float, dict[str, Any]]

# Python's `\s` for str patterns is str.isspace(); RE2's is ASCII only.
_PY_SPACE = (
    (0x09, 0x0D), (0x1C, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
)  # fmt: skip
_ASCII_SPACE = ((0x09, 0x0D), (0x20, 0x20))
_ASCII_DIGIT = ((0x30, 0x39),)
_ASCII_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
# Python's `\w` is str.isalnum() or "_": letters and numbers of every script.
_UNICODE_WORD = r"\p{L}\p{N}_"

_UNSUPPORTED = {
    sre.GROUPREF: "backreferences",
    sre.GROUPREF_EXISTS: "conditional groups",
    sre.ASSERT: "lookahead and lookbehind assertions",
    sre.ASSERT_NOT: "lookahead and lookbehind assertions",
    sre.ATOMIC_GROUP: "atomic groups",
    sre.POSSESSIVE_REPEAT: "possessive quantifiers",
}


class UnsupportedPattern(ValueError):
    """A valid Python pattern that needs backtracking, which the linear-time engine refuses to do."""


def _char(code: int) -> str:
    char = chr(code)
    return char if char.isascii() and char.isalnum() else f"\\x{{{code:X}}}"


def _ranges(ranges: Iterable[tuple[int, int]]) -> str:
    return "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges)


def _complement(ranges: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    gaps, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            gaps.append((start, lo - 1))
        start = hi + 1
    if start <= _MAX_CODE_POINT:
        gaps.append((start, _MAX_CODE_POINT))
    return gaps


def _category(code: Any, ascii_only: bool) -> str:
    """The body of an RE2 character class for a Python category (Unicode `\\W` is `_char_class`'s)."""
    if code is sre.CATEGORY_DIGIT:
        return _ranges(_ASCII_DIGIT) if ascii_only else r"\p{Nd}"
    if code is sre.CATEGORY_NOT_DIGIT:
        return _ranges(_complement(_ASCII_DIGIT)) if ascii_only else r"\P{Nd}"
    if code is sre.CATEGORY_WORD:
        return _ranges(_ASCII_WORD) if ascii_only else _UNICODE_WORD
    if code is sre.CATEGORY_NOT_WORD and ascii_only:
        return _ranges(_complement(_ASCII_WORD))
    if code is sre.CATEGORY_SPACE:
        return _ranges(_ASCII_SPACE if ascii_only else _PY_SPACE)
    if code is sre.CATEGORY_NOT_SPACE:
        return _ranges(_complement(_ASCII_SPACE if ascii_only else _PY_SPACE))
    raise UnsupportedPattern(f"character category {code} is not supported")


def _case(text: str, flags: int) -> str:
    return f"(?i:{text})" if flags & re.IGNORECASE else text


def _word_chars_except(items: list[tuple[Any, Any]]) -> str:
    """`[^\\W...]`: word characters minus `items`, for the idioms RE2 can spell (`[^\\W\\d_]` = letters)."""
    digits = underscore = True
    for item in items:
        if item == (sre.CATEGORY, sre.CATEGORY_DIGIT):
            digits = False
        elif item == (sre.LITERAL, ord("_")):
            underscore = False
        elif item != (sre.CATEGORY, sre.CATEGORY_SPACE):  # no space is a word character
            raise UnsupportedPattern(r"a negated character class combining \W with this item is not supported")
    numbers = r"\p{N}" if digits else r"\p{Nl}\p{No}"
    return f"[\\p{{L}}{numbers}{'_' if underscore else ''}]"


def _char_class(items: list[tuple[Any, Any]], flags: int) -> str:
    negate = bool(items) and items[0][0] is sre.NEGATE
    members = items[negate:]
    non_word = (sre.CATEGORY, sre.CATEGORY_NOT_WORD)
    if non_word in members and not flags & re.ASCII:
        # RE2 can only write Unicode \W as a class of its own.
        others = [item for item in members if item != non_word]
        if negate:
            return _case(_word_chars_except(others), flags)
        alternatives = [f"[^{_UNICODE_WORD}]"] + ([_char_class(others, flags)] if others else [])
        return _case(f"(?:{'|'.join(alternatives)})", flags)
    body = []
    for op, av in members:
        if op is sre.LITERAL:
            body.append(_char(av))
        elif op is sre.RANGE:
            body.append(f"{_char(av[0])}-{_char(av[1])}")
        else:
            body.append(_category(av, bool(flags & re.ASCII)))
    return _case(f"[{'^' if negate else ''}{''.join(body)}]", flags)


def _anchor(code: Any, flags: int) -> str:
    multiline = flags & re.MULTILINE
    if code is sre.AT_BEGINNING:
        return "(?m:^)" if multiline else r"\A"
    if code is sre.AT_BEGINNING_STRING:
        return r"\A"
    if code is sre.AT_END:
        return "(?m:$)" if multiline else r"(?:\n?\z)"
    if code is sre.AT_END_STRING:
        return r"\z"
    if code is sre.AT_BOUNDARY:
        return r"\b"
    if code is sre.AT_NON_BOUNDARY:
        return r"\B"
    raise UnsupportedPattern(f"anchor {code} is not supported")


def _repeat(lo: int, hi: int) -> str:
    if hi == sre.MAXREPEAT:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _emit(items: Iterable[tuple[Any, Any]], flags: int) -> str:
    """RE2 syntax for a parsed Python pattern, every flag-dependent atom spelled out explicitly."""
    out = []
    for op, av in items:
        if op is sre.LITERAL:
            out.append(_case(_char(av), flags))
        elif op is sre.NOT_LITERAL:
            out.append(_case(f"[^{_char(av)}]", flags))
        elif op is sre.IN:
            out.append(_char_class(av, flags))
        elif op is sre.CATEGORY:
            out.append(_char_class([(op, av)], flags))
        elif op is sre.ANY:
            out.append("(?s:.)" if flags & re.DOTALL else r"[^\n]")
        elif op is sre.AT:
            out.append(_anchor(av, flags))
        elif op is sre.BRANCH:
            out.append(f"(?:{'|'.join(_emit(branch, flags) for branch in av[1])})")
        elif op is sre.SUBPATTERN:
            group, add_flags, del_flags, sub = av
            inner = _emit(sub, (flags | add_flags) & ~del_flags)
            out.append(f"({inner})" if group is not None else f"(?:{inner})")
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            lo, hi, sub = av
            lazy = "?" if op is sre.MIN_REPEAT else ""
            out.append(f"(?:{_emit(sub, flags)}){_repeat(lo, hi)}{lazy}")
        else:
            feature = _UNSUPPORTED.get(op, str(op))
            raise UnsupportedPattern(f"{feature} are not supported (patterns run on the RE2 engine)")
    return "".join(out)


def to_re2(pattern: str, flags: int = 0) -> str:
    """Translate a Python pattern to RE2 syntax with the same meaning.

    Raises `re.error` where Python's `re.compile` would, and UnsupportedPattern where the pattern
    needs a backtracking feature.
    """
    parsed = sre_parse.parse(pattern, flags)
    return _emit(parsed, parsed.state.flags)


#: Characters that make a pattern more than a literal string.
_SPECIAL = frozenset("\\.^$*+?{}[]|()")


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str, case_sensitive: bool) -> tuple[Any, str | None]:
    """(compiled regex, None), or (None, the reference's error text) for an unusable pattern.

    A plain literal (no special character) cannot backtrack, so Python's own engine runs it with the
    reference's exact semantics, and ~20x cheaper to prepare than the RE2 translation; anything else runs
    on RE2. Failures are cached too, so a client repeating a bad pattern costs one parse.
    """
    if _SPECIAL.isdisjoint(pattern):
        return re.compile(pattern, 0 if case_sensitive else re.IGNORECASE), None
    import re2

    try:
        translated = to_re2(pattern, 0 if case_sensitive else re.IGNORECASE)
    except (re.error, UnsupportedPattern) as exc:
        return None, f"Invalid regex pattern: {exc}"
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(translated, options), None
    except re2.error as exc:
        message = exc.args[0] if exc.args else ""
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        return None, f"Invalid regex pattern: {message}"


def _fold(text: str, case_sensitive: bool) -> str:
    return text if case_sensitive else text.lower()


def _exact_match(reference: str, response: str, case_sensitive: bool, ignore_whitespace: bool) -> _Result:
    ref, cand = _fold(reference, case_sensitive), _fold(response, case_sensitive)
    if ignore_whitespace:
        ref, cand = "".join(ref.split()), "".join(cand.split())
    matched = ref == cand
    details = {"matched": matched, "case_sensitive": case_sensitive, "ignore_whitespace": ignore_whitespace}
    return float(matched), details


def _prefix_match(reference: str, response: str, case_sensitive: bool) -> _Result:
    matched = _fold(response, case_sensitive).startswith(_fold(reference, case_sensitive))
    return float(matched), {"matched": matched, "case_sensitive": case_sensitive}


def _suffix_match(reference: str, response: str, case_sensitive: bool) -> _Result:
    matched = _fold(response, case_sensitive).endswith(_fold(reference, case_sensitive))
    return float(matched), {"matched": matched, "case_sensitive": case_sensitive}


def _regex_match(reference: str, response: str, pattern: str, case_sensitive: bool) -> _Result:
    pattern_str = pattern if pattern else reference
    regex, error = compile_pattern(pattern_str, bool(case_sensitive))
    if error is not None:
        return 0.0, {"error": error}
    match = regex.search(response)
    details = {
        "matched": match is not None,
        "pattern": pattern_str,
        "case_sensitive": case_sensitive,
        "match_groups": list(match.groups()) if match else None,
    }
    return float(match is not None), details


def _substring_match(reference: str, response: str, case_sensitive: bool, bidirectional: bool) -> _Result:
    ref, cand = _fold(reference, case_sensitive), _fold(response, case_sensitive)
    matched = ref in cand or (bool(bidirectional) and cand in ref)
    details = {"matched": matched, "case_sensitive": case_sensitive, "bidirectional": bidirectional}
    return float(matched), details


def _containment(reference: str, response: str, substrings: Any, case_sensitive: bool) -> tuple[list[str], list[bool]]:
    """The target substrings (the reference when `substrings` is missing or empty) and which occur."""
    targets = [_fold(s, case_sensitive) for s in (substrings if substrings else [reference])]
    cand = _fold(response, case_sensitive)
    return targets, [target in cand for target in targets]


def _contains_all(reference: str, response: str, substrings: Any, case_sensitive: bool) -> _Result:
    targets, contains = _containment(reference, response, substrings, case_sensitive)
    details = {
        "matched": all(contains),
        "num_substrings": len(targets),
        "contains_per_substring": contains,
        "missing_substrings": [s for s, c in zip(targets, contains, strict=True) if not c],
        "case_sensitive": case_sensitive,
    }
    return (sum(contains) / len(contains) if contains else 0.0), details


def _contains_any(reference: str, response: str, substrings: Any, case_sensitive: bool) -> _Result:
    targets, contains = _containment(reference, response, substrings, case_sensitive)
    details = {
        "matched": any(contains),
        "num_substrings": len(targets),
        "contains_per_substring": contains,
        "matched_substrings": [s for s, c in zip(targets, contains, strict=True) if c],
        "case_sensitive": case_sensitive,
    }
    return float(any(contains)), details


def _overlap(ref_units: set[str], cand_units: set[str], case_sensitive: bool, unit: str) -> _Result:
    overlap = len(ref_units & cand_units)
    score = overlap / len(ref_units) if ref_units else 0.0
    details = {
        "overlap_ratio": score,
        "case_sensitive": case_sensitive,
        f"num_ref_{unit}": len(ref_units),
        f"num_cand_{unit}": len(cand_units),
        f"num_overlap_{unit}": overlap,
    }
    return score, details


def _word_overlap(reference: str, response: str, case_sensitive: bool) -> _Result:
    """Recall of the reference's words: jieba words without punctuation or Chinese stop-words."""
    from .tokenize import word_tokenize

    def words(text: str) -> set[str]:
        return set(word_tokenize(_fold(text, case_sensitive), remove_punctuation=True, remove_stopwords=True))

    return _overlap(words(reference), words(response), case_sensitive, "words")


def _char_overlap(reference: str, response: str, case_sensitive: bool) -> _Result:
    ref, cand = _fold(reference, case_sensitive), _fold(response, case_sensitive)
    return _overlap(set(ref), set(cand), case_sensitive, "chars")


_COMPUTE = {
    "exact_match": _exact_match,
    "prefix_match": _prefix_match,
    "suffix_match": _suffix_match,
    "regex_match": _regex_match,
    "substring_match": _substring_match,
    "contains_all": _contains_all,
    "contains_any": _contains_any,
    "word_overlap": _word_overlap,
    "char_overlap": _char_overlap,
}


def _reason(algorithm: str, score: float, details: dict[str, Any]) -> str:
    title = algorithm.replace("_", " ").title()
    if algorithm in ("exact_match", "prefix_match", "suffix_match", "regex_match"):
        return f"{title}: {'matched' if details['matched'] else 'not matched'}"
    if algorithm in ("substring_match", "contains_any"):
        return f"{title}: {'found' if details['matched'] else 'not found'}"
    if algorithm == "contains_all":
        total = details["num_substrings"]
        if details["matched"]:
            return f"Contains all {total} substrings"
        return f"Missing {len(details['missing_substrings'])} of {total} substrings"
    kind = "Word" if algorithm == "word_overlap" else "Character"
    return f"{kind} overlap ratio: {score:.2f}"


class StringMatchGrader(BaseGrader):
    """Scores a response by one string-matching algorithm against the reference (1/0 or a ratio)."""

    def __init__(
        self,
        case_sensitive: bool = False,
        ignore_whitespace: bool = False,
        algorithm: str = "exact_match",
    ) -> None:
        super().__init__(
            name="string_match",
            mode=GraderMode.POINTWISE,
            description="Unified string matching grader",
        )
        if algorithm not in _COMPUTE:
            raise InvalidParams(
                "algorithm",
                f"Unknown self.algorithm '{algorithm}'. Supported algorithms: {', '.join(sorted(_COMPUTE))}",
            )
        self.case_sensitive = case_sensitive
        self.ignore_whitespace = ignore_whitespace
        self.algorithm = algorithm
        # Only jieba word segmentation costs enough to be worth a worker process.
        self.heavy = algorithm == "word_overlap"

    def evaluate(self, reference_response: str = "", response: str = "", **kwargs: Any) -> GraderScore:
        params = dict(ALGORITHM_PARAMS[self.algorithm])
        params["case_sensitive"] = self.case_sensitive
        if "ignore_whitespace" in params:
            params["ignore_whitespace"] = self.ignore_whitespace
        params.update((key, kwargs[key]) for key in params.keys() & kwargs.keys())

        score, details = _COMPUTE[self.algorithm](reference_response, response, **params)
        if "error" in details:
            return GraderScore(name=self.name, score=0.0, reason=details["error"], metadata=details)
        return GraderScore(
            name=self.name,
            score=score,
            reason=_reason(self.algorithm, score, details),
            metadata={**details, "algorithm": self.algorithm},
        )
