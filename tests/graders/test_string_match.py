"""StringMatchGrader beyond the conformance cases: every algorithm's metadata and reason, parameter
precedence, and regex_match with Python's pattern semantics (Python's `re`, the reference's
engine, is the oracle)."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from grpcgrade.core.errors import InvalidParams
from grpcgrade.graders.patterns import compile_pattern
from grpcgrade.graders.text.string_match import StringMatchGrader


def grade(algorithm: str, reference: str, response: str, init: dict | None = None, **extra):
    return StringMatchGrader(algorithm=algorithm, **(init or {})).evaluate(
        reference_response=reference, response=response, **extra
    )


def test_unknown_algorithm_is_refused_naming_the_supported_ones():
    with pytest.raises(InvalidParams) as err:
        StringMatchGrader(algorithm="levenshtein")
    assert err.value.param == "algorithm"
    assert "Unknown self.algorithm 'levenshtein'" in str(err.value)
    assert "char_overlap, contains_all, contains_any" in str(err.value)


def test_exact_match_metadata_reason_and_call_time_overrides():
    result = grade("exact_match", "Hello World", "hello world")
    assert (result.score, result.reason) == (1.0, "Exact Match: matched")
    assert result.metadata == {
        "matched": True, "case_sensitive": False, "ignore_whitespace": False, "algorithm": "exact_match",
    }  # fmt: skip
    overridden = grade("exact_match", "Hello World", "hello world", case_sensitive=True)
    assert (overridden.score, overridden.reason) == (0.0, "Exact Match: not matched")
    assert grade("exact_match", "a b", "ab", init={"ignore_whitespace": True}).score == 1.0
    assert grade("exact_match", "a b", "ab", init={"ignore_whitespace": True}, ignore_whitespace=False).score == 0.0


def test_case_sensitive_from_init_applies_to_every_algorithm_unless_overridden():
    assert grade("prefix_match", "HELLO", "hello there", init={"case_sensitive": True}).score == 0.0
    assert grade("suffix_match", "THERE", "hello there").score == 1.0
    assert grade("substring_match", "Cat", "the cat", init={"case_sensitive": True}).score == 0.0
    assert grade("substring_match", "Cat", "the cat", init={"case_sensitive": True}, case_sensitive=False).score == 1.0


def test_prefix_suffix_metadata_and_empty_reference():
    result = grade("suffix_match", "world", "Hello World")
    assert result.reason == "Suffix Match: matched"
    assert result.metadata == {"matched": True, "case_sensitive": False, "algorithm": "suffix_match"}
    assert grade("prefix_match", "", "anything").score == 1.0
    assert grade("prefix_match", "World", "Hello World").reason == "Prefix Match: not matched"


def test_substring_match_is_one_way_unless_bidirectional():
    assert grade("substring_match", "The cat sat", "cat").score == 0.0
    result = grade("substring_match", "The cat sat", "cat", bidirectional=True)
    assert (result.score, result.reason) == (1.0, "Substring Match: found")
    assert result.metadata == {
        "matched": True, "case_sensitive": False, "bidirectional": True, "algorithm": "substring_match",
    }  # fmt: skip
    assert grade("substring_match", "dog", "The cat").reason == "Substring Match: not found"


def test_contains_all_partial_score_and_lowercased_missing_substrings():
    result = grade("contains_all", "", "The cat sat on the mat", substrings=["Cat", "DOG", "mat"])
    assert result.score == pytest.approx(2 / 3)
    assert result.reason == "Missing 1 of 3 substrings"
    assert result.metadata == {
        "matched": False,
        "num_substrings": 3,
        "contains_per_substring": [True, False, True],
        "missing_substrings": ["dog"],
        "case_sensitive": False,
        "algorithm": "contains_all",
    }
    assert grade("contains_all", "", "cat mat", substrings=["cat", "mat"]).reason == "Contains all 2 substrings"
    # Without substrings the reference itself is the one target.
    assert grade("contains_all", "mat", "cat mat").metadata["num_substrings"] == 1


def test_contains_any_metadata_keeps_case_when_case_sensitive():
    result = grade("contains_any", "", "The Cat", substrings=["dog", "Cat"], case_sensitive=True)
    assert (result.score, result.reason) == (1.0, "Contains Any: found")
    assert result.metadata["matched_substrings"] == ["Cat"]
    assert result.metadata["contains_per_substring"] == [False, True]
    assert grade("contains_any", "", "The Cat", substrings=["dog", "bird"]).reason == "Contains Any: not found"


def test_word_overlap_drops_punctuation_and_chinese_stop_words():
    result = grade("word_overlap", "The Cat, the hat!", "cat hat")
    assert result.score == pytest.approx(2 / 3)
    assert result.reason == "Word overlap ratio: 0.67"
    assert result.metadata == {
        "overlap_ratio": pytest.approx(2 / 3),
        "case_sensitive": False,
        "num_ref_words": 3,
        "num_cand_words": 2,
        "num_overlap_words": 2,
        "algorithm": "word_overlap",
    }
    # 我 and 的 are stop-words, so the reference's only word is 猫.
    chinese = grade("word_overlap", "我的猫", "猫")
    assert (chinese.score, chinese.metadata["num_ref_words"]) == (1.0, 1)
    assert grade("word_overlap", "", "anything").score == 0.0


def test_char_overlap_counts_distinct_characters_spaces_included():
    result = grade("char_overlap", "hello", "helo")
    assert (result.score, result.reason) == (1.0, "Character overlap ratio: 1.00")
    assert result.metadata == {
        "overlap_ratio": 1.0,
        "case_sensitive": False,
        "num_ref_chars": 4,
        "num_cand_chars": 4,
        "num_overlap_chars": 4,
        "algorithm": "char_overlap",
    }
    assert grade("char_overlap", "a b", "ab").score == pytest.approx(2 / 3)
    assert grade("char_overlap", "", "abc").score == 0.0


def test_word_overlap_and_regex_match_run_in_workers():
    """jieba for its cost; regex_match because a pattern may need Python's engine, which a worker's time
    limit can stop and the event loop's cannot."""
    assert StringMatchGrader(algorithm="word_overlap").heavy
    assert StringMatchGrader(algorithm="regex_match").heavy
    assert not StringMatchGrader(algorithm="exact_match").heavy


def test_regex_is_a_case_insensitive_search_by_default_with_groups():
    result = grade("regex_match", r"(\d{3})-(\d{4})(x)?", "Call 123-4567 now")
    assert (result.score, result.reason) == (1.0, "Regex Match: matched")
    assert result.metadata == {
        "matched": True,
        "pattern": r"(\d{3})-(\d{4})(x)?",
        "case_sensitive": False,
        "match_groups": ["123", "4567", None],
        "algorithm": "regex_match",
    }
    assert grade("regex_match", "HELLO", "say hello").score == 1.0
    assert grade("regex_match", "HELLO", "say hello", case_sensitive=True).score == 0.0
    json.dumps(result.metadata)


def test_regex_pattern_parameter_wins_over_the_reference_and_empty_pattern_matches():
    result = grade("regex_match", "nomatch", "abc", pattern="b")
    assert (result.score, result.metadata["pattern"]) == (1.0, "b")
    empty = grade("regex_match", "", "anything")
    assert (empty.score, empty.metadata["match_groups"]) == (1.0, [])


def test_invalid_regex_gives_the_references_message():
    with pytest.raises(re.error) as python_error:
        re.compile("[invalid(")
    result = grade("regex_match", "[invalid(", "test")
    assert result.score == 0.0
    assert result.reason == f"Invalid regex pattern: {python_error.value}"
    assert result.metadata == {"error": f"Invalid regex pattern: {python_error.value}"}


@pytest.mark.parametrize(
    ("pattern", "text"),
    [(r"(a)\1", "aab"), (r"a(?=b)", "aab"), (r"(?<!a)b", "cb"), (r"(?>a)", "aab"), (r"a*+b", "aab"),
     (r"(a)?(?(1)b|c)", "ab"), ("a{1001}", "a" * 1001), (r"(?P<n>\w)(?P=n)", "xyy")],
)  # fmt: skip
def test_patterns_needing_backtracking_give_pythons_result(pattern, text):
    expected = re.search(pattern, text)
    assert expected is not None  # each case matches in Python; the old engine said "not supported", 0.0
    result = grade("regex_match", pattern, text, case_sensitive=True)
    assert result.score == 1.0
    assert result.metadata["match_groups"] == list(expected.groups())


def test_catastrophic_backtracking_pattern_runs_on_the_linear_engine():
    assert compile_pattern("(a+)+$", re.IGNORECASE).engine == "re2"
    result = grade("regex_match", "(a+)+$", "a" * 40 + "!")
    assert (result.score, result.metadata["match_groups"]) == (0.0, None)


def test_compiled_patterns_and_failures_are_cached():
    assert compile_pattern(r"\d+x") is compile_pattern(r"\d+x")
    assert compile_pattern(r"\d+x") is not compile_pattern(r"\d+x", re.IGNORECASE)
    with pytest.raises(re.error) as first:
        compile_pattern("(")
    with pytest.raises(re.error) as second:
        compile_pattern("(")
    assert first.value is second.value


PATTERNS = [
    r"\d+", r"\D+", r"\w+", r"\W+", r"\s+", r"\S+", r"[\d\s]+", r"[^\d\s]+", r"[\W\d]+", r"[^\W\d_]+",
    r"[^\W_]+", r"^yes$", r"(\d+)$", r"(?m)^b$", r"(?s)a.b", r"a.b", r"\Aab\Z", r"x{,2}y", r"(?x) a b # c",
    r"答案[:：]\s*(\w+)", r"[[:alpha:]]+", r"\N{BULLET}", r"\u00e9", r"[\b]", r"\012", r"(?i:AB)c", r"(?-i:A)b",
    r"(?a)\w+", r"(?a)[^\W]+", r"(a)|(b)", r"(|a)", r"(?:ab)*?c", r"[^a]", r"[^-a]+", r"[$^.*+?(){}|\\]+",
    r"[Ａ-Ｚ]+", r"(?i)straße", r"$", r"(?m)$", r"^", r"\\d", r"\x41+",
]  # fmt: skip
TEXTS = [
    "", "call 123-4567", "x 42\n", "yes\n", "yes", "a\nb\nc", "a\tb\u3000c\xa0d", "答案： 北京", "答案:abc",
    "é•", "\x08", "\n", "AB c", "abC", "a\nb", "ＡＢＣ", "١٢٣ ²", "xxy", "straße STRASSE", "$^", "-a", "\\d 5",
    "abc_12 Ⅻ", "AAb",
]  # fmt: skip


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(("pattern", "case_sensitive"), list(itertools.product(PATTERNS, (True, False))))
def test_regex_semantics_follow_python_re(pattern, case_sensitive):
    python = re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)
    for text in TEXTS:
        expected = python.search(text)
        result = grade("regex_match", pattern, text, case_sensitive=case_sensitive)
        assert result.score == float(expected is not None), (pattern, text)
        assert result.metadata["match_groups"] == (list(expected.groups()) if expected else None), (pattern, text)


def test_python_unicode_whitespace_is_what_backslash_s_means():
    spaces = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())
    assert grade("regex_match", r"^\s+$", spaces, case_sensitive=True).score == 1.0
    assert grade("regex_match", r"\S", spaces, case_sensitive=True).score == 0.0


def test_literal_patterns_keep_python_semantics():
    """A pattern with no special character runs on Python's engine: exactly the reference's answers."""
    for pattern, text in [("straße", "STRASSE"), ("Kelvin", "\u212aelvin"), ("ſ", "S"), ("答案", "答案：42")]:
        for case_sensitive in (True, False):
            flags = 0 if case_sensitive else re.IGNORECASE
            regex = compile_pattern(pattern, flags)
            assert (regex.search(text) is not None) == bool(re.compile(pattern, flags).search(text))
