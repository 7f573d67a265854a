"""SimilarityGrader beyond the conformance file: parameters, resolution order, metadata, D5/D6, edge cases.

Expected values come from the research report, hand calculation, or the underlying libraries
(sacrebleu, nltk, scikit-learn, rapidfuzz) called here directly.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from grpcgrade.core.errors import InvalidParams
from grpcgrade.core.registry import get_registry
from grpcgrade.graders.text import similarity_metrics as metrics
from grpcgrade.graders.text.similarity import ALGORITHM_DEFAULTS, SimilarityGrader
from grpcgrade.graders.text.tokenize import word_tokenize

REF = "the cat is on the mat"
RESP = "the cat sat on the mat"
ZH_REF = "机器学习是人工智能的一个重要分支。"
ZH_RESP = "机器学习是人工智能的分支。"


def score(algorithm: str, response: str = RESP, reference: str = REF, init=None, **call) -> float:
    grader = SimilarityGrader(algorithm=algorithm, **(init or {}))
    return grader.evaluate(response=response, reference_response=reference, **call).score


# --- construction -----------------------------------------------------------------------------------


def test_registered_identity() -> None:
    grader = get_registry().build("similarity")
    assert isinstance(grader, SimilarityGrader)
    assert grader.name == "similarity"
    assert grader.algorithm == "bleu"
    assert SimilarityGrader.heavy is True


@pytest.mark.parametrize(
    ("params", "bad"),
    [
        ({"algorithm": "bleurt"}, "algorithm"),
        ({"algorithm": "fuzzy_match", "method": "nope"}, "method"),
        ({"algorithm": "sentence_bleu", "smoothing_function": 8}, "smoothing_function"),
        ({"algorithm": "sentence_bleu", "weights": (0, 0)}, "weights"),
        ({"algorithm": "sentence_bleu", "weights": ()}, "weights"),
        ({"algorithm": "bleu", "max_ngram_order": 0}, "max_ngram_order"),
        ({"algorithm": "bleu", "max_ngram_order": 2.5}, "max_ngram_order"),
        ({"algorithm": "bleu", "smooth_method": "laplace"}, "smooth_method"),
        ({"algorithm": "bleu", "tokenize": "whitespace"}, "tokenize"),
        ({"algorithm": "cosine", "ngram_range": (2, 1)}, "ngram_range"),
        ({"algorithm": "cosine", "ngram_range": (1, 2, 3)}, "ngram_range"),
        ({"algorithm": "cosine", "max_features": 0}, "max_features"),
        ({"algorithm": "rouge", "rouge_types": ["rouge0"]}, "rouge_types"),
        ({"algorithm": "rouge", "rouge_types": "rouge1"}, "rouge_types"),
        ({"algorithm": "rouge1", "score_key": "f2"}, "score_key"),
        ({"algorithm": "rouge3", "score_type": "f1"}, "score_type"),
        ({"algorithm": "rouge3", "n": 0}, "n"),
        ({"algorithm": "meteor", "alpha": 1.5}, "alpha"),
        ({"algorithm": "chrf", "beta": -1.0}, "beta"),
        ({"algorithm": "fuzzy_match", "threshold": float("nan")}, "threshold"),
        ({"algorithm": "f1_score", "normalize": "yes"}, "normalize"),
        ({"algorithm": "jaccard", "use_ngrams": 1}, "use_ngrams"),
        ({"algorithm": "bleu", "case_sensitive": None}, "case_sensitive"),
    ],
)
def test_invalid_constructor_params_are_refused_by_name(params: dict, bad: str) -> None:
    with pytest.raises(InvalidParams) as info:
        SimilarityGrader(**params)
    assert info.value.param == bad


def test_unknown_algorithm_message_lists_the_supported_ones() -> None:
    with pytest.raises(InvalidParams, match="jaccard") as info:
        SimilarityGrader(algorithm="nope")
    assert "'nope'" in str(info.value)


def test_json_shaped_params_are_coerced() -> None:
    # A JSON number is a float and a JSON array a list, both at construction and per sample.
    assert score("bleu", init={"max_ngram_order": 2.0}) == pytest.approx(0.7071067811865471, abs=1e-12)
    assert score("bleu", max_ngram_order=2.0) == pytest.approx(0.7071067811865471, abs=1e-12)
    assert score("cosine", init={"ngram_range": [1, 1]}) == score("cosine", ngram_range=(1, 1))
    assert score("sentence_bleu", init={"weights": [0.5, 0.5]}) == score("sentence_bleu", weights=[0.5, 0.5])


def test_params_of_other_algorithms_are_checked_then_ignored() -> None:
    assert score("bleu", init={"threshold": 0.1, "n": 7}) == pytest.approx(0.3799178428257963, abs=1e-12)


# --- parameter resolution order ---------------------------------------------------------------------


def test_constructor_params_beat_per_sample_params() -> None:
    # Verified on the reference: init threshold=0.9 beats call threshold=0.5.
    grader = SimilarityGrader(algorithm="fuzzy_match", threshold=0.9)
    result = grader.evaluate(response=RESP, reference_response=REF, threshold=0.5)
    assert result.metadata["threshold"] == 0.9
    assert result.metadata["matched"] is True  # ratio 0.9302
    result = SimilarityGrader(algorithm="fuzzy_match", threshold=0.95).evaluate(
        response=RESP, reference_response=REF, threshold=0.5
    )
    assert result.metadata["matched"] is False


def test_per_sample_params_apply_when_the_constructor_left_them_unset() -> None:
    grader = SimilarityGrader(algorithm="fuzzy_match")
    result = grader.evaluate(response=RESP, reference_response=REF, threshold=0.95)
    assert (result.metadata["threshold"], result.metadata["matched"]) == (0.95, False)
    result = grader.evaluate(response=RESP, reference_response=REF)
    assert (result.metadata["threshold"], result.metadata["matched"]) == (0.8, True)


def test_normalize_and_use_stemmer_lose_to_per_sample_values() -> None:
    grader = SimilarityGrader(algorithm="f1_score", normalize=False)
    assert grader.evaluate(response="hello world", reference_response="Hello World").score == 0.0
    assert grader.evaluate(response="hello world", reference_response="Hello World", normalize=True).score == 1.0
    grader = SimilarityGrader(algorithm="rouge1", use_stemmer=False)
    assert grader.evaluate(response="the cat", reference_response="The Cat").score == 0.0
    result = grader.evaluate(response="the cat", reference_response="The Cat", use_stemmer=True)
    assert (result.score, result.metadata["use_stemmer"]) == (1.0, True)


def test_case_sensitive_has_no_effect_as_in_the_reference() -> None:
    assert score("f1_score", "hello world", "Hello World", init={"case_sensitive": True}) == 1.0
    assert score("fuzzy_match", "Hello World", "hello world", init={"case_sensitive": False}) == pytest.approx(18 / 22)


def test_per_sample_algorithm_and_unrelated_fields_are_ignored() -> None:
    grader = SimilarityGrader(algorithm="jaccard")
    result = grader.evaluate(
        response=RESP, reference_response=REF, algorithm="bleu", query="q", context="c", responses=[], method="nope"
    )
    assert result.score == pytest.approx(4 / 6)
    assert result.metadata["algorithm"] == "jaccard"


@pytest.mark.parametrize(
    ("algorithm", "call"),
    [
        ("fuzzy_match", {"method": "nope"}),
        ("bleu", {"max_ngram_order": 0.5}),
        ("bleu", {"tokenize": "bogus"}),
        ("sentence_bleu", {"smoothing_function": 9}),
        ("cosine", {"max_features": -1}),
        ("rouge", {"rouge_types": []}),
    ],
)
def test_invalid_per_sample_params_raise_value_error_naming_them(algorithm: str, call: dict) -> None:
    grader = SimilarityGrader(algorithm=algorithm)
    (name,) = call
    with pytest.raises(ValueError, match=repr(name)) as info:
        grader.evaluate(response=RESP, reference_response=REF, **call)
    assert not isinstance(info.value, InvalidParams)


# --- scorer reuse -----------------------------------------------------------------------------------


def test_bleu_scorers_are_built_once_per_distinct_params(monkeypatch) -> None:
    built = []
    original = metrics.make_bleu

    def counting(*args):
        built.append(args)
        return original(*args)

    monkeypatch.setattr(metrics, "make_bleu", counting)
    grader = SimilarityGrader(algorithm="bleu")
    assert built == [(4, "exp", True, "13a")]
    for _ in range(3):
        grader.evaluate(response=RESP, reference_response=REF)
        grader.evaluate(response=RESP, reference_response=REF, max_ngram_order=2)
        grader.evaluate(response=ZH_RESP, reference_response=ZH_REF)
    assert built == [(4, "exp", True, "13a"), (2, "exp", True, "13a"), (4, "exp", True, "zh")]


def test_rouge_scorers_are_reused(monkeypatch) -> None:
    built = []
    original = metrics.make_rouge
    monkeypatch.setattr(metrics, "make_rouge", lambda *a: built.append(a) or original(*a))
    grader = SimilarityGrader(algorithm="rouge")
    grader.evaluate(response=RESP, reference_response=REF)
    grader.evaluate(response=RESP, reference_response=REF, use_stemmer=False)
    grader.evaluate(response=RESP, reference_response=REF, use_stemmer=False)
    assert built == [(("rouge1", "rouge2", "rougeL"), True), (("rouge1", "rouge2", "rougeL"), False)]


# --- BLEU family and chrF against the libraries -------------------------------------------------------


@pytest.mark.parametrize("smooth_method", ["exp", "floor", "add-k", "none"])
@pytest.mark.parametrize("effective_order", [True, False])
def test_bleu_matches_sacrebleu(smooth_method: str, effective_order: bool) -> None:
    from sacrebleu.metrics import BLEU

    resp, ref = "the cat", "the cat sat on the mat"
    expected = BLEU(smooth_method=smooth_method, effective_order=effective_order).corpus_score([resp], [[ref]])
    result = SimilarityGrader(smooth_method=smooth_method, effective_order=effective_order).evaluate(
        response=resp, reference_response=ref
    )
    assert result.score == pytest.approx(min(1.0, expected.score / 100), abs=1e-12)
    assert result.metadata["bp"] == pytest.approx(expected.bp)
    assert result.metadata["precisions"] == pytest.approx([p / 100 for p in expected.precisions])


def test_bleu_metadata_and_reason() -> None:
    result = SimilarityGrader().evaluate(response=RESP, reference_response=REF)
    assert result.reason == "BLEU score: 0.3799"
    # exp smoothing: the first order without matches counts 1 / (2 * total) = 1/6.
    assert result.metadata["precisions"] == pytest.approx([5 / 6, 3 / 5, 1 / 4, 1 / 6])
    assert (result.metadata["sys_len"], result.metadata["ref_len"], result.metadata["ratio"]) == (6, 6, 1.0)
    assert result.metadata["raw_score"] == pytest.approx(37.99178428257963)
    assert (result.metadata["tokenize"], result.metadata["algorithm"]) == ("13a", "bleu")
    assert result.metadata["bp"] == 1.0
    assert SimilarityGrader().evaluate(response="cat", reference_response="cat").score == 1.0


def test_bleu_auto_tokenizer_uses_zh_for_cjk_text_d6() -> None:
    from sacrebleu.metrics import BLEU

    expected = BLEU(tokenize="zh").corpus_score([ZH_RESP], [[ZH_REF]]).score / 100
    result = SimilarityGrader().evaluate(response=ZH_RESP, reference_response=ZH_REF)
    assert result.score == pytest.approx(expected, abs=1e-12)
    assert result.metadata["tokenize"] == "zh"
    # The reference's fixed 13a tokeniser, still available, scores the Chinese pair 0.
    assert score("bleu", ZH_RESP, ZH_REF, init={"tokenize": "13a"}) == 0.0
    assert score("bleu", ZH_RESP, ZH_REF, tokenize="13a") == 0.0
    # CJK on either side is enough.
    assert SimilarityGrader().evaluate(response="hello", reference_response="你好").metadata["tokenize"] == "zh"


def test_bleu_accepts_other_sacrebleu_tokenizers() -> None:
    from sacrebleu.metrics import BLEU

    expected = BLEU(tokenize="char").corpus_score([RESP], [[REF]]).score / 100
    assert score("bleu", init={"tokenize": "char"}) == pytest.approx(expected, abs=1e-12)


def test_bleu_library_failure_is_the_reference_score_zero_error(monkeypatch) -> None:
    from sacrebleu.metrics import BLEU

    def boom(self, hypotheses, references):
        raise RuntimeError("sacrebleu broke")

    monkeypatch.setattr(BLEU, "corpus_score", boom)
    result = SimilarityGrader().evaluate(response=RESP, reference_response=REF)
    assert (result.score, result.reason, result.metadata) == (0.0, "sacrebleu broke", {"error": "sacrebleu broke"})


@pytest.mark.parametrize(("weights", "smoothing"), [((0.25,) * 4, 1), ((0.5, 0.5), 0), ((1 / 3,) * 3, 7), ((1.0,), 4)])
def test_sentence_bleu_matches_nltk(weights: tuple, smoothing: int) -> None:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    smoother = getattr(SmoothingFunction(), f"method{smoothing}")
    expected = sentence_bleu([REF.split()], RESP.split(), weights=weights, smoothing_function=smoother)
    result = SimilarityGrader(algorithm="sentence_bleu", weights=weights, smoothing_function=smoothing).evaluate(
        response=RESP, reference_response=REF
    )
    assert result.score == pytest.approx(expected, abs=1e-12)
    assert result.metadata == {
        "weights": list(weights),
        "smoothing_method": smoothing,
        "num_references": 1,
        "algorithm": "sentence_bleu",
    }
    assert result.reason == f"Sentence BLEU: {expected:.4f}"


def test_gleu_matches_nltk_and_reports_lengths() -> None:
    from nltk.translate.gleu_score import sentence_gleu

    expected = sentence_gleu([REF.split()], RESP.split(), min_len=2, max_len=3)
    result = SimilarityGrader(algorithm="gleu", min_len=2, max_len=3).evaluate(response=RESP, reference_response=REF)
    assert result.score == pytest.approx(expected, abs=1e-12)
    assert result.metadata == {
        "min_len": 2,
        "max_len": 3,
        "num_references": 1,
        "response_length": 6,
        "algorithm": "gleu",
    }
    assert result.reason == f"GLEU score: {expected:.4f}"


def test_chrf_matches_sacrebleu_unclamped() -> None:
    from sacrebleu.metrics import CHRF

    expected = CHRF(char_order=3, beta=1).corpus_score([RESP], [[REF]]).score
    result = SimilarityGrader(algorithm="chrf", char_order=3, beta=1.0).evaluate(response=RESP, reference_response=REF)
    assert result.score == pytest.approx(expected / 100, abs=1e-12)
    assert result.metadata == {"char_order": 3, "beta": 1.0, "raw_score": pytest.approx(expected), "algorithm": "chrf"}


def test_chrf_per_sample_params_then_the_graders_own() -> None:
    """A sample naming chrF's parameters is scored with them, and the next one without any with the grader's
    own (its scorer kept apart from per-sample ones); a constructor's parameter beats a sample's."""
    from sacrebleu.metrics import CHRF

    def expected(order: int, beta: float) -> float:
        return CHRF(char_order=order, beta=beta).corpus_score([RESP], [[REF]]).score

    grader = SimilarityGrader(algorithm="chrf")
    result = grader.evaluate(response=RESP, reference_response=REF, char_order=3, beta=1.0)
    assert result.metadata == {
        "char_order": 3,
        "beta": 1.0,
        "raw_score": pytest.approx(expected(3, 1)),
        "algorithm": "chrf",
    }
    result = grader.evaluate(response=RESP, reference_response=REF, query="q")
    assert result.metadata == {
        "char_order": 6,
        "beta": 2.0,
        "raw_score": pytest.approx(expected(6, 2)),
        "algorithm": "chrf",
    }
    assert (result.score, result.reason) == (pytest.approx(expected(6, 2) / 100), f"CHRF score: {result.score:.4f}")
    fixed = SimilarityGrader(algorithm="chrf", char_order=4)
    assert fixed.evaluate(response=RESP, reference_response=REF, char_order=2).metadata["raw_score"] == pytest.approx(
        expected(4, 2)
    )


# --- METEOR (D5) --------------------------------------------------------------------------------------


class _Lemma:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


class _Synset:
    def __init__(self, *names: str) -> None:
        self._lemmas = [_Lemma(n) for n in names]

    def lemmas(self) -> list[_Lemma]:
        return self._lemmas


class _TinyWordNet:
    """METEOR looks up Porter stems; "puss" and "cat" are their own stems."""

    @staticmethod
    def synsets(word: str) -> list[_Synset]:
        return [_Synset("puss", "cat", "true_cat")] if word in ("puss", "cat") else []


def test_meteor_without_wordnet_matches_exact_and_stems_offline(monkeypatch) -> None:
    import nltk
    from nltk.translate.meteor_score import meteor_score

    def no_network(*args, **kwargs):
        raise AssertionError("METEOR must not download anything")

    monkeypatch.setattr(nltk, "download", no_network)
    monkeypatch.setattr(metrics, "wordnet", lambda: (metrics._NoSynonyms(), False))
    result = SimilarityGrader(algorithm="meteor").evaluate(response="the kitty sits here", reference_response=REF)
    expected = meteor_score([REF.split()], ["the", "kitty", "sits", "here"], wordnet=metrics._NoSynonyms())
    assert result.score == pytest.approx(expected, abs=1e-12)
    assert result.score > 0  # the reference scores 0 with an error here when WordNet is missing
    assert result.metadata == {"alpha": 0.9, "beta": 3.0, "gamma": 0.5, "wordnet": False, "algorithm": "meteor"}


def test_meteor_uses_wordnet_synonyms_when_installed(monkeypatch) -> None:
    from nltk.translate.meteor_score import meteor_score

    monkeypatch.setattr(metrics, "wordnet", lambda: (_TinyWordNet(), True))
    result = SimilarityGrader(algorithm="meteor", alpha=0.5, gamma=0.2).evaluate(
        response="the puss is on the mat", reference_response=REF
    )
    expected = meteor_score(
        [REF.split()], ["the", "puss", "is", "on", "the", "mat"], wordnet=_TinyWordNet(), alpha=0.5, gamma=0.2
    )
    assert result.score == pytest.approx(expected, abs=1e-12)
    assert result.metadata["wordnet"] is True
    monkeypatch.setattr(metrics, "wordnet", lambda: (metrics._NoSynonyms(), False))
    assert score("meteor", "the puss is on the mat", init={"alpha": 0.5, "gamma": 0.2}) < result.score


def test_wordnet_detection_reports_what_nltk_finds() -> None:
    from nltk.corpus import wordnet

    metrics.wordnet.cache_clear()
    try:
        wordnet.ensure_loaded()
        installed = True
    except LookupError:
        installed = False
    assert metrics.wordnet()[1] is installed
    assert score("meteor", REF, REF) == pytest.approx(0.9976851851851852, abs=1e-12)


# --- ROUGE --------------------------------------------------------------------------------------------


def test_rouge_metadata_reason_and_mean_over_types() -> None:
    result = SimilarityGrader(algorithm="rouge").evaluate(response=RESP, reference_response=REF)
    assert result.metadata["rouge1"] == pytest.approx(5 / 6)
    assert result.metadata["rouge2"] == pytest.approx(3 / 5)
    assert result.metadata["rougeL"] == pytest.approx(5 / 6)
    assert result.score == pytest.approx((5 / 6 + 3 / 5 + 5 / 6) / 3)
    assert result.metadata["rouge_types"] == ["rouge1", "rouge2", "rougeL"]
    assert (result.metadata["use_stemmer"], result.metadata["score_key"]) == (True, "fmeasure")
    assert result.reason == f"ROUGE score: {result.score:.4f}"
    assert SimilarityGrader(algorithm="rougeL").evaluate(response=RESP, reference_response=REF).reason == (
        "ROUGEL score: 0.8333"
    )


def test_rouge_stems_every_token_and_handles_chinese() -> None:
    # Porter on every token: "cats" -> "cat", "running" -> "run" (rouge_score's own stems only len > 3).
    assert score("rouge1", "cats running", "cat run") == 1.0
    assert score("rouge1", "cats running", "cat run", init={"use_stemmer": False}) == 0.0
    # rouge1 of the Chinese pair (report: 0.857): 6 response words all in the 8 reference words.
    assert score("rouge1", ZH_RESP, ZH_REF) == pytest.approx(2 * 1 * 0.75 / 1.75)


def test_rouge_per_sample_types_and_score_key() -> None:
    grader = SimilarityGrader(algorithm="rouge")
    result = grader.evaluate(response="the cat", reference_response=REF, rouge_types=["rouge1"], score_key="recall")
    assert result.score == pytest.approx(2 / 6)
    assert result.metadata["rouge_types"] == ["rouge1"]
    assert "rouge2" not in result.metadata
    result = grader.evaluate(response=RESP, reference_response=REF, rouge_types=["rougeLsum"])
    assert result.score == pytest.approx(5 / 6)


def test_rouge_n_metadata_and_reason() -> None:
    result = SimilarityGrader(algorithm="rouge4", score_type="precision").evaluate(
        response="a b c d e", reference_response="a b c d e f"
    )
    assert result.score == 1.0
    assert result.metadata == {
        "precision": 1.0,
        "recall": 2 / 3,
        "fmeasure": 0.8,
        "overlap_count": 2,
        "reference_count": 3,
        "response_count": 2,
        "n": 4,
        "score_type": "precision",
        "algorithm": "rouge4",
    }
    assert result.reason == "ROUGE-4 precision: 1.0000"
    result = SimilarityGrader(algorithm="rouge_ngram").evaluate(response="a b", reference_response="a b c", n=2)
    assert result.reason == f"ROUGE-2 fmeasure: {2 * 0.5 / 1.5:.4f}"


# --- token F1, fuzzy, edit distance ---------------------------------------------------------------------


def test_f1_counts_multisets_and_reports_details() -> None:
    result = SimilarityGrader(algorithm="f1_score").evaluate(
        response="hello hello world", reference_response="hello world world"
    )
    assert result.score == pytest.approx(2 / 3)
    assert result.metadata == {
        "precision": 2 / 3,
        "recall": 2 / 3,
        "f1_score": pytest.approx(2 / 3),
        "common_tokens": 2,
        "algorithm": "f1_score",
    }
    assert result.reason == "F1 score: 0.6667 (P=0.667, R=0.667)"


@pytest.mark.parametrize(
    ("response", "reference", "expected"),
    [("", "", 1.0), ("", "hello", 0.0), ("hello", "", 0.0), ("foo", "bar", 0.0), ("的 了", "。", 1.0)],
)
def test_f1_degenerate_paths_only_report_precision_and_recall(response: str, reference: str, expected: float) -> None:
    result = SimilarityGrader(algorithm="token_f1").evaluate(response=response, reference_response=reference)
    assert result.score == expected
    assert result.metadata == {"precision": expected, "recall": expected, "algorithm": "token_f1"}


def test_fuzzy_ratio_is_indel_based_and_case_sensitive() -> None:
    from rapidfuzz import fuzz

    assert score("fuzzy_match", "Hello World", "hello world") == pytest.approx(18 / 22)
    assert score("fuzzy_match", "kitten", "sitting") == pytest.approx(fuzz.ratio("kitten", "sitting") / 100)


def test_partial_ratio_uses_the_reference_windows_not_rapidfuzz() -> None:
    # Only same-length windows of the longer string: "abcd" vs the one window "xabc" = 1 - 2/8.
    assert score("fuzzy_match", "abcd", "xabc", method="partial_ratio") == pytest.approx(0.75)
    assert score("fuzzy_match", "xabc", "abcd", method="partial_ratio") == pytest.approx(0.75)
    assert score("fuzzy_match", "bc", "abcd", method="partial_ratio") == 1.0
    assert score("fuzzy_match", "", "", method="partial_ratio") == 1.0
    assert score("fuzzy_match", "", "abc", method="partial_ratio") == 0.0
    # The best window, checked against a brute force of the definition.
    from rapidfuzz.distance import Indel

    short, long = "quick brwn fx", "the quick brown fox jumps over"
    best = max(Indel.normalized_similarity(short, long[i : i + len(short)]) for i in range(len(long) - len(short) + 1))
    assert score("fuzzy_match", short, long, method="partial_ratio") == pytest.approx(best, abs=1e-12)


def test_token_sort_ratio_keeps_punctuation_tokens() -> None:
    # ", hello world" (13 chars) vs "hello world" (11): indel distance 2.
    assert score("fuzzy_match", "world, hello", "hello world", method="token_sort_ratio") == pytest.approx(22 / 24)


def test_fuzzy_metadata_and_reason() -> None:
    result = SimilarityGrader(algorithm="fuzzy_match", method="partial_ratio", threshold=0.99).evaluate(
        response="quick brown fox", reference_response="the quick brown fox jumps"
    )
    assert result.metadata == {
        "method": "partial_ratio",
        "threshold": 0.99,
        "matched": True,
        "algorithm": "fuzzy_match",
    }
    assert result.reason == "Fuzzy match (partial_ratio): 1.0000 (matched)"
    result = SimilarityGrader(algorithm="fuzzy_match").evaluate(response="abc", reference_response="xyz")
    assert result.reason == "Fuzzy match (ratio): 0.0000 (not matched)"


def test_edit_distance_variants() -> None:
    result = SimilarityGrader(algorithm="edit_distance").evaluate(response="sitting", reference_response="kitten")
    assert result.score == pytest.approx(1 - 3 / 7)
    assert result.metadata == {
        "raw_distance": 3,
        "max_length": 7,
        "normalize_by_length": True,
        "algorithm": "edit_distance",
    }
    assert result.reason == "Edit distance similarity: 0.5714 (distance=3)"
    assert score("edit_distance", "", "", init={"normalize_by_length": False}) == 1.0
    assert score("edit_distance", "abc", "", normalize_by_length=False) == 0.25


# --- cosine and jaccard ---------------------------------------------------------------------------------


def _sklearn_cosine(a: str, b: str, ngram_range=(1, 2), max_features=None) -> float:
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(
        tokenizer=lambda t: word_tokenize(t, remove_stopwords=True),
        ngram_range=ngram_range,
        max_features=max_features,
        token_pattern=None,
    )
    try:
        rows = vectorizer.fit_transform([a, b]).toarray()
    except ValueError:  # empty vocabulary
        return 0.0
    norms = math.hypot(*rows[0]) * math.hypot(*rows[1])
    return 0.0 if norms == 0 else max(0.0, min(1.0, float(rows[0] @ rows[1]) / norms))


COSINE_PAIRS = [
    (RESP, REF),
    (ZH_RESP, ZH_REF),
    ("The Quick brown fox, the QUICK dog!", "a quick brown dog jumps over the lazy fox"),
    ("machine learning and artificial intelligence", "AI and ML technologies"),
    ("a a a b b c", "c c b a d d e"),
    ("Hello 世界, hello world 世界", "世界 hello"),
    ("的 了 。", "something else"),
    ("", ""),
]


@pytest.mark.parametrize(("a", "b"), COSINE_PAIRS)
@pytest.mark.parametrize(
    ("ngram_range", "max_features"), [((1, 2), None), ((1, 1), None), ((2, 3), None), ((1, 2), 3), ((1, 3), 1)]
)
def test_tfidf_cosine_matches_scikit_learn(a: str, b: str, ngram_range: tuple, max_features: int | None) -> None:
    expected = _sklearn_cosine(a, b, ngram_range, max_features)
    got = score("cosine", a, b, init={"ngram_range": ngram_range, "max_features": max_features})
    assert got == pytest.approx(expected, abs=1e-12)


def test_cosine_term_counts_and_metadata() -> None:
    # Counts over {the:2, cat, sat|is, on, mat}: dot = 4+1+1+1 = 7, norms sqrt(8) each.
    result = SimilarityGrader(algorithm="cosine", use_tfidf=False).evaluate(response=RESP, reference_response=REF)
    assert result.score == pytest.approx(7 / 8)
    assert result.metadata == {"use_tfidf": False, "ngram_range": [1, 2], "algorithm": "cosine"}
    assert result.reason == "COSINE score: 0.8750"
    assert score("cosine", "", "", init={"use_tfidf": False}) == 0.0


def test_jaccard_metadata_and_the_both_empty_quirk() -> None:
    result = SimilarityGrader(algorithm="jaccard").evaluate(response=RESP, reference_response=REF)
    assert result.metadata == {"use_ngrams": False, "n": None, "algorithm": "jaccard"}
    result = SimilarityGrader(algorithm="jaccard", use_ngrams=True, n=3).evaluate(
        response="a b c d", reference_response="b c d e"
    )
    assert result.score == pytest.approx(1 / 3)
    assert result.metadata == {"use_ngrams": True, "n": 3, "algorithm": "jaccard"}
    # Both texts shorter than n: no n-grams on either side, which the reference scores 1.0.
    result = SimilarityGrader(algorithm="jaccard", use_ngrams=True, n=3).evaluate(
        response="a b", reference_response="c"
    )
    assert result.score == 1.0
    assert result.metadata == {"use_ngrams": True, "algorithm": "jaccard"}


# --- empty inputs and serialisation -------------------------------------------------------------------------

BOTH_EMPTY_ONE = {"f1_score", "token_f1", "jaccard", "fuzzy_match", "edit_distance"}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_DEFAULTS))
def test_empty_inputs(algorithm: str) -> None:
    # Report: empty response -> 0 everywhere; both empty -> 1 for f1/jaccard/fuzzy/edit, else 0.
    assert score(algorithm, "", REF) == 0.0
    assert score(algorithm, "", "") == (1.0 if algorithm in BOTH_EMPTY_ONE else 0.0)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_DEFAULTS))
def test_metadata_is_json_and_names_the_algorithm(algorithm: str) -> None:
    result = SimilarityGrader(algorithm=algorithm).evaluate(response=ZH_RESP, reference_response=ZH_REF)
    assert json.loads(json.dumps(result.metadata))["algorithm"] == algorithm
    assert isinstance(result.score, float)


# --- first use from several threads ------------------------------------------------------------------

#: A fresh process as a server or a caller's thread pool is: the registry built (the text graders' warm-up
#: threads started), then four threads each grading a first sample with an algorithm that imports NLTK.
FIRST_USE = """
import json, sys, threading
from grpcgrade.core.registry import get_registry

registry = get_registry()
response, reference, *algorithms = sys.argv[1:]
start = threading.Barrier(len(algorithms))
out = {}

def grade(algorithm):
    start.wait()
    try:
        grader = registry.build("similarity", {"algorithm": algorithm})
        result = grader.evaluate(response=response, reference_response=reference)
        out[algorithm] = [result.score, result.metadata.get("error")]
    except BaseException as exc:
        out[algorithm] = [None, f"{type(exc).__name__}: {exc}"]

threads = [threading.Thread(target=grade, args=(a,)) for a in algorithms]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out))
"""


def test_threads_first_using_nltk_at_once_all_get_their_scores() -> None:
    """NLTK's modules import one another in cycles: two threads importing them at once deadlocked on
    Python's import locks and one got `_DeadlockError` or a partly initialised module (every fresh process
    of this test failed so, before `similarity_metrics.import_alone`). Real interpreters, several times."""
    algorithms = ["sentence_bleu", "gleu", "meteor", "rouge"]
    expected = {a: [score(a), None] for a in algorithms}  # this process: one thread, one at a time
    for _ in range(4):
        run = subprocess.run(
            [sys.executable, "-c", FIRST_USE, RESP, REF, *algorithms], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout.strip().splitlines()[-1]) == expected
