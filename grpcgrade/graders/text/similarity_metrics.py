"""The similarity algorithms behind SimilarityGrader, as py-openjudge 0.2.4 computes them.

Each metric returns `(score, details)`; details become the result's metadata, and a details dict with
an `"error"` key means the reference's "score 0 with an error" outcome. Metrics that need a prepared
scorer (sacrebleu BLEU/CHRF, RougeScorer) take it as an argument: the grader builds and caches those,
since building them costs more than scoring one short pair.

Word-level metrics tokenise with `tokenize.word_tokenize` (jieba). Which ones drop the Chinese
stop-words is the reference's choice, kept as is: all except METEOR and ROUGE-1/2/L.
"""

from __future__ import annotations

import functools
import importlib
import math
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from .tokenize import smart_tokenize, word_tokenize

Details = dict[str, Any]

_import_lock = threading.Lock()
_imported: set[str] = set()


def import_alone(module: str) -> None:
    """Import `module` (NLTK's, or rouge_score's, which imports NLTK) once per process, one thread at a time.

    NLTK's modules import one another in cycles, and its first import takes seconds (SciPy). Two threads
    grading a first sample each (a caller's thread pool, Ray actor threads) used to import it at once and
    deadlock on Python's per-module import locks, which importlib breaks by raising `_DeadlockError` in one
    or handing it a partly initialised module ("partially initialized module 'nltk' has no attribute
    'data'"): in 12 of 12 fresh interpreters where four threads first used BLEU, GLEU, METEOR and ROUGE
    together. Under this lock the first import runs alone; later calls return at once."""
    if module in _imported:
        return
    with _import_lock:
        if module not in _imported:
            importlib.import_module(module)
            _imported.add(module)


def _words(text: str) -> list[str]:
    return word_tokenize(text, remove_punctuation=True, remove_stopwords=True)


def _ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


# ---------------------------------------------------------------------------------------------------
# BLEU family and chrF
# ---------------------------------------------------------------------------------------------------


def make_bleu(max_ngram_order: int, smooth_method: str, effective_order: bool, tokenize: str) -> Any:
    from sacrebleu.metrics import BLEU

    return BLEU(
        max_ngram_order=max_ngram_order,
        smooth_method=smooth_method,
        effective_order=effective_order,
        tokenize=tokenize,
    )


def bleu(scorer: Any, reference: str, response: str) -> tuple[float, Details]:
    """Corpus BLEU of one pair, as a fraction clamped to [0, 1]."""
    try:
        result = scorer.corpus_score([response], [[reference]])
    except Exception as exc:  # the reference turns any sacrebleu failure into score 0 + error
        return 0.0, {"error": str(exc)}
    details = {
        "precisions": [p / 100.0 for p in result.precisions],
        "bp": result.bp,
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
        "ratio": result.sys_len / result.ref_len if result.ref_len > 0 else 0,
        "raw_score": result.score,
    }
    return max(0.0, min(1.0, result.score / 100.0)), details


@functools.cache
def _smoothing() -> Any:
    import_alone("nltk.translate.bleu_score")
    from nltk.translate.bleu_score import SmoothingFunction

    return SmoothingFunction()


def sentence_bleu(
    reference: str, response: str, weights: tuple[float, ...], smoothing_function: int
) -> tuple[float, Details]:
    import_alone("nltk.translate.bleu_score")
    from nltk.translate.bleu_score import sentence_bleu as nltk_sentence_bleu

    references = [_words(reference)]
    smoother = getattr(_smoothing(), f"method{smoothing_function}")
    try:
        score = nltk_sentence_bleu(references, _words(response), weights=weights, smoothing_function=smoother)
    except Exception as exc:  # score 0 + error, as the reference
        return 0.0, {"error": str(exc)}
    details = {"weights": list(weights), "smoothing_method": smoothing_function, "num_references": 1}
    return float(score), details


def gleu(reference: str, response: str, min_len: int, max_len: int) -> tuple[float, Details]:
    import_alone("nltk.translate.gleu_score")
    from nltk.translate.gleu_score import sentence_gleu

    hypothesis = _words(response)
    try:
        score = sentence_gleu([_words(reference)], hypothesis, min_len=min_len, max_len=max_len)
    except Exception as exc:  # score 0 + error, as the reference
        return 0.0, {"error": str(exc)}
    details = {"min_len": min_len, "max_len": max_len, "num_references": 1, "response_length": len(hypothesis)}
    return float(score), details


def make_chrf(char_order: int, beta: float) -> Any:
    from sacrebleu.metrics import CHRF

    return CHRF(char_order=char_order, beta=beta)  # type: ignore[arg-type]  # annotated int; any beta > 0 works


def chrf(scorer: Any, reference: str, response: str, char_order: int, beta: float) -> tuple[float, Details]:
    """chrF of one pair as a fraction; not clamped (the reference does not clamp it either).

    The reference calls `corpus_score([response], [[reference]])`. For two texts, `sentence_score(response,
    [reference])` extracts the same one pair's statistics and gives them to the same `_aggregate_and_compute`,
    so the same score, without a corpus's checks: 0.5-1.5% of chrF's time (measured), which a batch on
    every core pays against the bare loop. Anything but two texts goes the reference's way, whose checks
    (and their messages) a sentence's differ from."""
    try:
        if type(response) is str and type(reference) is str:
            result = scorer.sentence_score(response, [reference])
        else:
            result = scorer.corpus_score([response], [[reference]])
    except Exception as exc:  # score 0 + error, as the reference
        return 0.0, {"error": str(exc)}
    return result.score / 100.0, {"char_order": char_order, "beta": beta, "raw_score": result.score}


# ---------------------------------------------------------------------------------------------------
# METEOR (decision D5: never downloads; WordNet synonyms only when the data is installed)
# ---------------------------------------------------------------------------------------------------


class _NoSynonyms:
    """Stands in for WordNet when its data is missing: METEOR then matches exact words and stems only."""

    @staticmethod
    def synsets(word: str) -> list[Any]:
        return []


@functools.cache
def wordnet() -> tuple[Any, bool]:
    """The WordNet reader to give METEOR and whether it is real.

    Only looks in NLTK's data path (which includes $NLTK_DATA); the reference's `nltk.download()` on
    every call is what made it slow and network-dependent.
    """
    import_alone("nltk.corpus")
    from nltk.corpus import wordnet as nltk_wordnet

    try:
        with _import_lock:  # NLTK's lazy corpus loader swaps its own class as it loads: not thread-safe either
            nltk_wordnet.ensure_loaded()
    except (LookupError, OSError):
        return _NoSynonyms(), False
    return nltk_wordnet, True


def meteor(reference: str, response: str, alpha: float, beta: float, gamma: float) -> tuple[float, Details]:
    import_alone("nltk.translate.meteor_score")
    from nltk.translate.meteor_score import meteor_score

    reader, has_wordnet = wordnet()
    tokens = word_tokenize(response, remove_punctuation=True)
    try:
        score = meteor_score(
            [word_tokenize(reference, remove_punctuation=True)],
            tokens,
            wordnet=reader,
            alpha=alpha,
            beta=beta,
            gamma=gamma,
        )
    except Exception as exc:  # score 0 + error, as the reference
        return 0.0, {"error": str(exc)}
    return float(score), {"alpha": alpha, "beta": beta, "gamma": gamma, "wordnet": has_wordnet}


# ---------------------------------------------------------------------------------------------------
# ROUGE
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 16)
def _stem(token: str) -> str:
    """Porter stem (which also lower-cases): pure and costly, so memoised across calls."""
    return _porter().stem(token)


@functools.cache
def _porter() -> Any:
    import_alone("nltk.stem.porter")
    from nltk.stem.porter import PorterStemmer

    return PorterStemmer()


class _RougeTokenizer:
    """rouge_score tokenizer of the reference: jieba words, then Porter on every token when stemming.

    rouge_score's own tokenizer drops every non-ASCII character (so CJK scores 0) and stems only tokens
    longer than three characters; the reference replaced it with this one.
    """

    def __init__(self, use_stemmer: bool) -> None:
        self.use_stemmer = use_stemmer

    def tokenize(self, text: str) -> list[str]:
        tokens = word_tokenize(text, remove_punctuation=True)
        return [_stem(t) for t in tokens] if self.use_stemmer else tokens


#: The largest dynamic-programming table rougeLsum may build (rouge_score keeps it whole, to backtrack).
MAX_LCS_TABLE_CELLS = 4_000_000


def lcs_score(target: list[str], prediction: list[str]) -> Any:
    """rouge_score's rougeL `Score` for two token lists, with the LCS length from rapidfuzz's bit-parallel
    `LCSseq` (O(min(n, m)) memory) instead of rouge_score's full n x m table of Python ints."""
    from rapidfuzz.distance import LCSseq

    import_alone("rouge_score.scoring")  # imported when the grader is built (`_Rouge`), not per sample
    from rouge_score import scoring

    if not target or not prediction:
        return scoring.Score(precision=0, recall=0, fmeasure=0)
    length = LCSseq.similarity(target, prediction)
    precision, recall = length / len(prediction), length / len(target)
    return scoring.Score(precision=precision, recall=recall, fmeasure=scoring.fmeasure(precision, recall))


class _Rouge:
    """rouge_score's RougeScorer, with rougeL computed in linear memory and rougeLsum's table bounded."""

    def __init__(self, rouge_types: tuple[str, ...], use_stemmer: bool) -> None:
        import_alone("rouge_score.rouge_scorer")  # imports NLTK: seconds, paid here and not in a sample
        from rouge_score.rouge_scorer import RougeScorer

        self.tokenizer = _RougeTokenizer(use_stemmer)
        self.lcs = "rougeL" in rouge_types
        self.summary = "rougeLsum" in rouge_types
        others = [t for t in rouge_types if t != "rougeL"]
        self.scorer = RougeScorer(others, use_stemmer=False, tokenizer=self.tokenizer) if others else None

    def score(self, target: str, prediction: str) -> dict[str, Any]:
        if self.summary:  # rouge_score's table grows with the product of the texts' lengths
            cells = len(self.tokenizer.tokenize(target)) * len(self.tokenizer.tokenize(prediction))
            if cells > MAX_LCS_TABLE_CELLS:
                raise ValueError(
                    f"rougeLsum would build a table of {cells} cells, over the limit of {MAX_LCS_TABLE_CELLS}; "
                    "use rougeL, which has no such limit"
                )
        scores = self.scorer.score(target, prediction) if self.scorer is not None else {}
        if self.lcs:
            scores["rougeL"] = lcs_score(self.tokenizer.tokenize(target), self.tokenizer.tokenize(prediction))
        return scores


def make_rouge(rouge_types: tuple[str, ...], use_stemmer: bool) -> Any:
    return _Rouge(rouge_types, use_stemmer)


def rouge(
    scorer: Any, reference: str, response: str, rouge_types: list[str], use_stemmer: bool, score_key: str
) -> tuple[float, Details]:
    """Mean over `rouge_types` of the chosen ROUGE component."""
    scores = scorer.score(reference, response)
    per_type = {t: getattr(scores[t], score_key) for t in rouge_types}
    details = {**per_type, "rouge_types": list(rouge_types), "use_stemmer": use_stemmer, "score_key": score_key}
    return sum(per_type.values()) / len(per_type), details


def rouge_ngram(reference: str, response: str, n: int, score_type: str) -> tuple[float, Details]:
    """ROUGE-N over jieba words without stop-words (the reference's own, for n >= 3)."""
    ref_counts = Counter(_ngrams(_words(reference), n))
    resp_counts = Counter(_ngrams(_words(response), n))
    overlap = sum((ref_counts & resp_counts).values())
    ref_total = sum(ref_counts.values())
    resp_total = sum(resp_counts.values())
    precision = overlap / resp_total if resp_total else 0.0
    recall = overlap / ref_total if ref_total else 0.0
    fmeasure = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    values = {"precision": precision, "recall": recall, "fmeasure": fmeasure}
    details = {
        **values,
        "overlap_count": overlap,
        "reference_count": ref_total,
        "response_count": resp_total,
        "n": n,
        "score_type": score_type,
    }
    return values[score_type], details


# ---------------------------------------------------------------------------------------------------
# Token overlap, edit distances, vector and set similarities
# ---------------------------------------------------------------------------------------------------


def f1_score(reference: str, response: str, normalize: bool) -> tuple[float, Details]:
    """SQuAD-style token F1 over multisets of words."""
    if normalize:
        reference, response = reference.lower().strip(), response.lower().strip()
    resp_tokens = _words(response)
    ref_tokens = _words(reference)
    if not resp_tokens or not ref_tokens:
        both_empty = not resp_tokens and not ref_tokens
        return (1.0, {"precision": 1.0, "recall": 1.0}) if both_empty else (0.0, {"precision": 0.0, "recall": 0.0})
    common = sum((Counter(resp_tokens) & Counter(ref_tokens)).values())
    if common == 0:
        return 0.0, {"precision": 0.0, "recall": 0.0}
    precision = common / len(resp_tokens)
    recall = common / len(ref_tokens)
    f1 = 2 * precision * recall / (precision + recall)
    return f1, {"precision": precision, "recall": recall, "f1_score": f1, "common_tokens": common}


FUZZY_METHODS = ("ratio", "partial_ratio", "token_sort_ratio")


def _ratio(a: str, b: str, score_cutoff: float = 0.0) -> float:
    """python-Levenshtein's `ratio`: 1 - indel distance / total length (a substitution costs 2)."""
    from rapidfuzz.distance import Indel

    return Indel.normalized_similarity(a, b, score_cutoff=score_cutoff)


def partial_ratio(s1: str, s2: str) -> float:
    """Best `ratio` of the shorter string against every window of the same length in the longer one.

    This is the reference's own definition, not rapidfuzz's `fuzz.partial_ratio` (which also tries
    windows hanging over either end and so scores differently).
    """
    if not s1 or not s2:
        return 1.0 if s1 == s2 else 0.0
    shorter, longer = (s1, s2) if len(s1) <= len(s2) else (s2, s1)
    m = len(shorter)
    best = 0.0
    for i in range(len(longer) - m + 1):
        # With the best so far as cutoff rapidfuzz returns 0 early for windows that cannot beat it.
        best = max(best, _ratio(shorter, longer[i : i + m], score_cutoff=best))
        if best == 1.0:
            break
    return best


def fuzzy_match(reference: str, response: str, method: str, threshold: float) -> tuple[float, Details]:
    if method == "ratio":
        score = _ratio(response, reference)
    elif method == "partial_ratio":
        score = partial_ratio(response, reference)
    elif method == "token_sort_ratio":
        score = _ratio(" ".join(sorted(smart_tokenize(response))), " ".join(sorted(smart_tokenize(reference))))
    else:
        raise ValueError(f"Unknown method: {method}. Use 'ratio', 'partial_ratio', or 'token_sort_ratio'")
    return score, {"method": method, "threshold": threshold, "matched": score >= threshold}


def edit_distance(reference: str, response: str, normalize_by_length: bool) -> tuple[float, Details]:
    from rapidfuzz.distance import Levenshtein

    distance = Levenshtein.distance(response, reference)
    max_len = max(len(response), len(reference))
    # Without normalisation (or for two empty strings) the score is 1 / (1 + distance).
    score = 1.0 - distance / max_len if normalize_by_length and max_len > 0 else 1.0 / (1.0 + distance)
    details = {"raw_distance": distance, "max_length": max_len, "normalize_by_length": normalize_by_length}
    return max(0.0, min(1.0, score)), details


def _cosine(v1: Mapping[Any, float], v2: Mapping[Any, float]) -> float:
    norm1 = math.sqrt(sum(x * x for x in v1.values()))
    norm2 = math.sqrt(sum(x * x for x in v2.values()))
    if norm1 == 0 or norm2 == 0:
        return 0.0
    dot = sum(x * v2[t] for t, x in v1.items() if t in v2)
    return max(0.0, min(dot / (norm1 * norm2), 1.0))


def _sklearn_word_ngrams(tokens: list[str], ngram_range: tuple[int, int]) -> list[str]:
    """scikit-learn's word n-grams: space-joined; with max n == 1 the tokens whatever min n is."""
    min_n, max_n = ngram_range
    if max_n == 1:
        return tokens
    terms = list(tokens) if min_n == 1 else []
    for n in range(max(min_n, 2), min(max_n, len(tokens)) + 1):
        terms.extend(" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return terms


def _limit_features(vocabulary: list[str], totals: list[float], max_features: int) -> list[str]:
    """The `max_features` most frequent terms, ties broken exactly as scikit-learn does.

    scikit-learn keeps `argsort(-totals)[:max_features]` over the alphabetically sorted vocabulary with
    numpy's default (unstable) sort; calling the same numpy sort on the same array keeps the same terms.
    """
    import numpy as np

    keep = np.argsort(-np.asarray(totals, dtype=np.float64))[:max_features]
    return [vocabulary[i] for i in keep]


def tfidf_cosine(text1: str, text2: str, ngram_range: tuple[int, int], max_features: int | None) -> float:
    """Cosine of the two rows of scikit-learn's default TfidfVectorizer fitted on [text1, text2].

    Defaults reproduced: lower-casing before tokenising, raw counts, smooth idf
    ln((1 + n_docs) / (1 + df)) + 1, L2-normalised rows. An empty vocabulary scores 0 (scikit-learn
    raises there and the reference catches it).
    """
    counts = [Counter(_sklearn_word_ngrams(_words(t.lower()), ngram_range)) for t in (text1, text2)]
    vocabulary = sorted(counts[0].keys() | counts[1].keys())
    if not vocabulary:
        return 0.0
    if max_features is not None and len(vocabulary) > max_features:
        totals = [float(counts[0][t] + counts[1][t]) for t in vocabulary]
        vocabulary = _limit_features(vocabulary, totals, max_features)
    n_docs = len(counts)
    idf = {t: math.log((1 + n_docs) / (1 + sum(t in c for c in counts))) + 1.0 for t in vocabulary}
    rows = []
    for c in counts:
        weights = {t: c[t] * idf[t] for t in vocabulary if t in c}
        norm = math.sqrt(sum(w * w for w in weights.values()))
        rows.append({t: w / norm for t, w in weights.items()} if norm else {})
    return _cosine(rows[0], rows[1])


def cosine(
    reference: str, response: str, use_tfidf: bool, ngram_range: tuple[int, int], max_features: int | None
) -> tuple[float, Details]:
    if use_tfidf:
        score = tfidf_cosine(response, reference, ngram_range, max_features)
    else:
        score = _cosine(Counter(_words(response)), Counter(_words(reference)))
    return score, {"use_tfidf": use_tfidf, "ngram_range": list(ngram_range)}


def jaccard(reference: str, response: str, use_ngrams: bool, n: int) -> tuple[float, Details]:
    resp_words, ref_words = _words(response), _words(reference)
    resp_set = set(_ngrams(resp_words, n)) if use_ngrams else set(resp_words)
    ref_set = set(_ngrams(ref_words, n)) if use_ngrams else set(ref_words)
    if not resp_set and not ref_set:
        return 1.0, {"use_ngrams": use_ngrams}
    score = len(resp_set & ref_set) / len(resp_set | ref_set)
    return score, {"use_ngrams": use_ngrams, "n": n if use_ngrams else None}
