"""String matching against a reference: exact, prefix/suffix, regex, substrings and overlap ratios.

Reference: OpenJudge `StringMatchGrader` (py-openjudge 0.2.4). The algorithm is fixed at construction;
its per-sample parameters (`pattern`, `substrings`, `bidirectional`, `case_sensitive`,
`ignore_whitespace`) come from the sample's `extra` and override the constructor's defaults, as in the
reference. With the grader's defaults every algorithm is case-insensitive, exact match included.

`regex_match` patterns arrive in requests, so they are untrusted. They run as `graders.patterns` arranges:
Python's exact result for every valid Python pattern, on RE2 where that is provably the same, else on
Python's engine under the per-sample time limit. Because a pattern (one per sample) may need Python's engine,
the regex_match grader runs in a worker, where that limit can stop it; a catastrophic pattern is a TIMEOUT
for its sample. A pattern over `MAX_PATTERN_CHARS` is that sample's INVALID_SAMPLE error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from grpcgrade.core.errors import ErrorCode, InvalidParams
from grpcgrade.grader import BaseGrader, GraderError, GraderResult, GraderScore

from ..patterns import PatternTooLong, compile_pattern
from ..patterns import warm_up as warm_patterns
from .tokenize import initialize, word_tokenize

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

# What every algorithm returns: the score and the metadata (the reference's `details`).
_Result = tuple[float, dict[str, Any]]


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
    try:
        regex = compile_pattern(pattern_str, 0 if case_sensitive else re.IGNORECASE)
    except re.error as exc:
        return 0.0, {"error": f"Invalid regex pattern: {exc}"}
    groups = regex.search(response)
    details = {
        "matched": groups is not None,
        "pattern": pattern_str,
        "case_sensitive": case_sensitive,
        "match_groups": list(groups) if groups is not None else None,
    }
    return float(groups is not None), details


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

    def words(text: str) -> set[str]:
        return set(word_tokenize(_fold(text, case_sensitive), remove_punctuation=True, remove_stopwords=True))

    return _overlap(words(reference), words(response), case_sensitive, "words")


def _char_overlap(reference: str, response: str, case_sensitive: bool) -> _Result:
    ref, cand = _fold(reference, case_sensitive), _fold(response, case_sensitive)
    return _overlap(set(ref), set(cand), case_sensitive, "chars")


_COMPUTE: dict[str, Callable[..., _Result]] = {
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


#: Algorithms that read what to look for from the sample's own `pattern` / `substrings` when it has them.
_OWN_TARGETS = frozenset(name for name, params in ALGORITHM_PARAMS.items() if {"pattern", "substrings"} & params.keys())


class StringMatchGrader(BaseGrader):
    """Scores a response by one string-matching algorithm against the reference (1/0 or a ratio)."""

    #: Compares the response with the reference: a sample without either is INVALID_SAMPLE, not a match of
    #: two empty texts.
    required_inputs = frozenset(("response", "reference_response"))

    def __init__(
        self,
        case_sensitive: bool = False,
        ignore_whitespace: bool = False,
        algorithm: str = "exact_match",
    ) -> None:
        super().__init__()
        if algorithm not in _COMPUTE:
            raise InvalidParams(
                "algorithm",
                f"Unknown self.algorithm '{algorithm}'. Supported algorithms: {', '.join(sorted(_COMPUTE))}",
            )
        self.case_sensitive = case_sensitive
        self.ignore_whitespace = ignore_whitespace
        self.algorithm = algorithm
        # jieba word segmentation costs enough to be worth a worker process; a regex_match pattern (one per
        # sample) may need Python's backtracking engine, which only a worker's time limit can stop.
        self.heavy = algorithm in ("word_overlap", "regex_match")
        if algorithm in _OWN_TARGETS:  # the sample's `pattern` / `substrings` may stand in for the reference
            self.required_inputs = frozenset(("response",))

    def warm_up(self) -> None:
        """What any algorithm's first sample would load: jieba's dictionary (word_overlap, ~0.7 s) and the
        code-point table regex_match's character classes are computed from (~0.3 s)."""
        initialize()
        warm_patterns()

    def evaluate(self, reference_response: str = "", response: str = "", **kwargs: Any) -> GraderResult:
        params = dict(ALGORITHM_PARAMS[self.algorithm])
        params["case_sensitive"] = self.case_sensitive
        if "ignore_whitespace" in params:
            params["ignore_whitespace"] = self.ignore_whitespace
        params.update((key, kwargs[key]) for key in params.keys() & kwargs.keys())

        try:
            score, details = _COMPUTE[self.algorithm](reference_response, response, **params)
        except PatternTooLong as exc:
            return GraderError(self.name, f"regex_match {exc}", code=ErrorCode.INVALID_SAMPLE)
        if "error" in details:
            return GraderScore(name=self.name, score=0.0, reason=details["error"], metadata=details)
        return GraderScore(
            name=self.name,
            score=score,
            reason=_reason(self.algorithm, score, details),
            metadata={**details, "algorithm": self.algorithm},
        )
