"""SimilarityGrader: one grader, many reference-based text similarity metrics (OpenJudge's `similarity`).

Behaviour follows py-openjudge 0.2.4, including its parameter resolution, which users rely on when
they move configurations over: per algorithm, the defaults; then the constructor's `normalize` and
`use_stemmer`; then per-sample values (sample `extra` keys named like a parameter); then every other
parameter given to the constructor, which therefore wins over per-sample values. `case_sensitive` is
accepted and, as in the reference, affects nothing.

Deliberate differences (decisions D5, D6): METEOR never downloads NLTK data, and BLEU takes a
`tokenize` parameter whose default `auto` uses sacrebleu's `zh` tokeniser for CJK text (the
reference's fixed `13a` scores every Chinese pair 0). Invalid parameter values, which the reference
often turns into a silent fallback, are refused: at construction with InvalidParams, per sample with
a ValueError naming the parameter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.core.params import shown
from grpcgrade.grader import BaseGrader, GraderScore

from . import similarity_metrics as m
from .tokenize import contains_cjk

_SCORE_COMPONENTS = ("fmeasure", "precision", "recall")

# Per algorithm: its parameters and their defaults (the reference's DEFAULT_PARAMS, plus D6's `tokenize`).
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "bleu": {"max_ngram_order": 4, "smooth_method": "exp", "effective_order": True, "tokenize": "auto"},
    "sentence_bleu": {"weights": (0.25, 0.25, 0.25, 0.25), "smoothing_function": 1},
    "gleu": {"min_len": 1, "max_len": 4},
    "chrf": {"char_order": 6, "beta": 2.0},
    "meteor": {"alpha": 0.9, "beta": 3.0, "gamma": 0.5},
    "rouge": {"rouge_types": ["rouge1", "rouge2", "rougeL"], "use_stemmer": True, "score_key": "fmeasure"},
    "rouge1": {"rouge_types": ["rouge1"], "use_stemmer": True, "score_key": "fmeasure"},
    "rouge2": {"rouge_types": ["rouge2"], "use_stemmer": True, "score_key": "fmeasure"},
    "rougeL": {"rouge_types": ["rougeL"], "use_stemmer": True, "score_key": "fmeasure"},
    "rouge_ngram": {"n": 3, "score_type": "fmeasure"},
    "rouge3": {"n": 3, "score_type": "fmeasure"},
    "rouge4": {"n": 4, "score_type": "fmeasure"},
    "rouge5": {"n": 5, "score_type": "fmeasure"},
    "f1_score": {"normalize": True},
    "token_f1": {"normalize": True},
    "fuzzy_match": {"method": "ratio", "threshold": 0.8},
    "edit_distance": {"normalize_by_length": True},
    "cosine": {"use_tfidf": True, "ngram_range": (1, 2), "max_features": None},
    "jaccard": {"use_ngrams": False, "n": 2},
}

# Metrics that need no prepared scorer, called as metric(reference, response, **params).
_PLAIN_METRICS: dict[str, Callable[..., tuple[float, m.Details]]] = {
    "sentence_bleu": m.sentence_bleu,
    "gleu": m.gleu,
    "meteor": m.meteor,
    "rouge_ngram": m.rouge_ngram,
    "rouge3": m.rouge_ngram,
    "rouge4": m.rouge_ngram,
    "rouge5": m.rouge_ngram,
    "f1_score": m.f1_score,
    "token_f1": m.f1_score,
    "fuzzy_match": m.fuzzy_match,
    "edit_distance": m.edit_distance,
    "cosine": m.cosine,
    "jaccard": m.jaccard,
}

_ROUGE_N_ALGORITHMS = frozenset({"rouge_ngram", "rouge3", "rouge4", "rouge5"})
_ROUGE_TYPE = re.compile(r"rouge[1-9]|rougeL|rougeLsum")
_MAX_CACHED_SCORERS = 32


# ---------------------------------------------------------------------------------------------------
# Parameter checking. Values may come from JSON (per-sample `extra`), where every number is a float and
# every tuple a list, so checkers coerce as well as validate. They raise ValueError saying what is allowed.
# ---------------------------------------------------------------------------------------------------


def _as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {shown(value)}")
    return value


def _as_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {shown(value)}")
    return float(value)


def _int_checker(minimum: int, maximum: int | None = None) -> Callable[[Any], int]:
    allowed = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"

    def check(value: Any) -> int:
        try:
            number = _as_number(value)
        except ValueError:
            number = math.nan
        if not number.is_integer() or number < minimum or (maximum is not None and number > maximum):
            raise ValueError(f"must be {allowed}, got {shown(value)}")
        return int(number)

    return check


def _float_checker(minimum: float, maximum: float = math.inf) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        number = _as_number(value)
        if not minimum <= number <= maximum:
            raise ValueError(f"must be a number from {minimum} to {maximum}, got {shown(value)}")
        return number

    return check


def _choice_checker(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {shown(value)}")
        return value

    return check


def _as_sequence(value: Any, what: str) -> Sequence[Any]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"must be a non-empty list of {what}, got {shown(value)}")
    return value


def _weights(value: Any) -> tuple[float, ...]:
    weights = tuple(_as_number(w) for w in _as_sequence(value, "n-gram weights"))
    if len(weights) > MAX_ORDER:
        raise ValueError(f"at most {MAX_ORDER} n-gram weights, got {len(weights)}")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {shown(value)}")
    return weights


def _ngram_range(value: Any) -> tuple[int, int]:
    bounds = tuple(_int_checker(1, MAX_ORDER)(v) for v in _as_sequence(value, "two n-gram sizes"))
    if len(bounds) != 2 or bounds[0] > bounds[1]:
        raise ValueError(f"must be [min_n, max_n] with 1 <= min_n <= max_n, got {shown(value)}")
    return bounds[0], bounds[1]


def _rouge_types(value: Any) -> list[str]:
    types = list(_as_sequence(value, "ROUGE types"))
    if len(types) > MAX_ORDER:
        raise ValueError(f"at most {MAX_ORDER} ROUGE types, got {len(types)}")
    if not all(isinstance(t, str) and _ROUGE_TYPE.fullmatch(t) for t in types):
        raise ValueError(f"must list types among rouge1..rouge9, rougeL, rougeLsum; got {shown(value)}")
    return types


def _max_features(value: Any) -> int | None:
    return None if value is None else _int_checker(1, 1_000_000)(value)


def _tokenize(value: Any) -> str:
    from sacrebleu.metrics import BLEU

    return _choice_checker("auto", *BLEU.TOKENIZERS)(value)


# Upper bounds: each sizes per-sample work and memory (n-gram tables, sacrebleu's statistics), and the
# published metrics use single digits (BLEU 4, chrF 6, ROUGE-N up to 9).
MAX_ORDER = 20
_CHECKERS: dict[str, Callable[[Any], Any]] = {
    "max_ngram_order": _int_checker(1, MAX_ORDER),
    "smooth_method": _choice_checker("exp", "floor", "add-k", "none"),
    "effective_order": _as_bool,
    "tokenize": _tokenize,
    "weights": _weights,
    "smoothing_function": _int_checker(0, 7),
    "min_len": _int_checker(1, MAX_ORDER),
    "max_len": _int_checker(1, MAX_ORDER),
    "char_order": _int_checker(1, MAX_ORDER),
    "beta": _float_checker(0.0, 1000.0),
    "alpha": _float_checker(0.0, 1.0),
    "gamma": _float_checker(0.0, 1.0),
    "rouge_types": _rouge_types,
    "use_stemmer": _as_bool,
    "score_key": _choice_checker(*_SCORE_COMPONENTS),
    "n": _int_checker(1, MAX_ORDER),
    "score_type": _choice_checker(*_SCORE_COMPONENTS),
    "normalize": _as_bool,
    "method": _choice_checker(*m.FUZZY_METHODS),
    "threshold": _as_number,
    "normalize_by_length": _as_bool,
    "use_tfidf": _as_bool,
    "ngram_range": _ngram_range,
    "max_features": _max_features,
    "use_ngrams": _as_bool,
}

# Constructor arguments that per-sample values override (all the other parameters override per-sample values).
_WEAK_PARAMS = ("normalize", "use_stemmer")


class SimilarityGrader(BaseGrader):
    """Similarity of `response` to `reference_response` by one algorithm fixed at construction.

    Algorithm-specific parameters default to None, meaning "the algorithm's default": `beta` and `n`
    have different defaults in different algorithms, and only explicitly given ones must beat
    per-sample values. Parameters that the chosen algorithm does not use are checked and ignored.
    """

    #: Compares the response with the reference: a sample without either is INVALID_SAMPLE, not a match of
    #: two empty texts.
    required_inputs = frozenset(("response", "reference_response"))

    heavy = True

    def __init__(
        self,
        algorithm: str = "bleu",
        normalize: bool = True,
        case_sensitive: bool = False,
        use_stemmer: bool = True,
        max_ngram_order: int | None = None,
        smooth_method: str | None = None,
        effective_order: bool | None = None,
        tokenize: str | None = None,
        weights: tuple | None = None,
        smoothing_function: int | None = None,
        min_len: int | None = None,
        max_len: int | None = None,
        char_order: int | None = None,
        beta: float | None = None,
        alpha: float | None = None,
        gamma: float | None = None,
        rouge_types: list | None = None,
        score_key: str | None = None,
        n: int | None = None,
        score_type: str | None = None,
        method: str | None = None,
        threshold: float | None = None,
        normalize_by_length: bool | None = None,
        use_tfidf: bool | None = None,
        ngram_range: tuple | None = None,
        max_features: int | None = None,
        use_ngrams: bool | None = None,
    ) -> None:
        # Taken before any other local exists: the explicitly given algorithm parameters.
        given = {k: v for k, v in locals().items() if k in _CHECKERS and k not in _WEAK_PARAMS and v is not None}
        super().__init__()
        if algorithm not in ALGORITHM_DEFAULTS:
            raise InvalidParams(
                "algorithm",
                f"unknown algorithm {algorithm!r}; supported: {', '.join(sorted(ALGORITHM_DEFAULTS))}",
            )
        self.algorithm = algorithm
        self.normalize = _checked_init("normalize", normalize)
        self.case_sensitive = _checked_init("case_sensitive", case_sensitive, _as_bool)
        self.use_stemmer = _checked_init("use_stemmer", use_stemmer)
        self._overrides = {name: _checked_init(name, value) for name, value in given.items()}

        defaults = dict(ALGORITHM_DEFAULTS[algorithm])
        for name in _WEAK_PARAMS:
            if name in defaults:
                defaults[name] = getattr(self, name)
        self._param_names = frozenset(defaults)
        self._params = {**defaults, **{k: v for k, v in self._overrides.items() if k in defaults}}
        self._scorers: dict[tuple[Any, ...], Any] = {}
        try:
            self._prepare(self._params, "", "")
        except ValueError as exc:
            raise InvalidParams("tokenize", str(exc)) from None
        # chrF with the grader's own parameters (no per-sample ones): its scorer, taken once, not looked up
        # per sample (`_chrf_result`); and the scores view of a chunk without a result object per sample.
        self._chrf: Any = None
        if algorithm == "chrf":
            self._chrf = self._prepare(self._params, "", "")[0]
            self.score_column = self._chrf_column

    def _chrf_column(self, response: Sequence[str], reference: Sequence[str]) -> list[float]:
        """`evaluate`'s chrF scores for a chunk: about 2% of chrF's time is the result object, reason and
        metadata per sample, which the scores view does not send. sacrebleu's `sentence_score` gives one
        pair's statistics to the same `_aggregate_and_compute` as `evaluate`'s one-pair `corpus_score`
        (the reference's call), so the same score, without `corpus_score`'s checks of a corpus (about 1.5%
        faster, measured). A failure raises, and the chunk is then graded sample by sample (each failure
        its own score-0 result)."""
        score = self._chrf.sentence_score
        return [score(r, [ref]).score / 100.0 for r, ref in zip(response, reference, strict=True)]

    def warm_up(self) -> None:
        """jieba's dictionary (about a second) and the common metric libraries, loaded before the first
        request. NLTK (sentence BLEU, GLEU, METEOR, and rouge_score, which imports it) waits for its first
        use: it imports SciPy, seconds that every server start would pay for rarely used algorithms."""
        import rapidfuzz.distance  # noqa: F401
        import sacrebleu.metrics  # noqa: F401

        from .tokenize import initialize

        initialize()

    def evaluate(self, response: str = "", reference_response: str = "", **kwargs: Any) -> GraderScore:
        if self._chrf is not None and self._param_names.isdisjoint(kwargs):
            return self._chrf_result(self._chrf, reference_response, response, self._params)
        params = self._resolve(kwargs)
        metric = _PLAIN_METRICS.get(self.algorithm)
        if metric is not None:
            score, details = metric(reference_response, response, **params)
        elif self.algorithm == "chrf":
            return self._chrf_result(self._prepare(params, "", "")[0], reference_response, response, params)
        else:
            score, details = self._prepared_metric(reference_response, response, params)
        return self._result(score, details)

    def _chrf_result(self, scorer: Any, reference: str, response: str, params: dict[str, Any]) -> GraderScore:
        """chrF's result for one pair. Apart so that the common case (the grader's own parameters, its scorer
        taken once) skips the per-sample parameter resolution and scorer look-up: evaluate's own work, the
        result and its reason included, went from 3.3 to 2.6 us a sample (measured with a stand-in scorer)."""
        score, details = m.chrf(scorer, reference, response, params["char_order"], params["beta"])
        return self._result(score, details)

    def _result(self, score: float, details: m.Details) -> GraderScore:
        if "error" in details:  # the reference's score-0 outcome for a library failure: no "algorithm" key
            return GraderScore(name=self.name, score=0.0, reason=details["error"], metadata=details)
        return GraderScore(
            name=self.name,
            score=float(score),
            reason=self._reason(score, details),
            metadata={**details, "algorithm": self.algorithm},
        )

    def _resolve(self, call: dict[str, Any]) -> dict[str, Any]:
        """The parameters for one sample: per-sample values lose only to explicit constructor ones."""
        names = (self._param_names & call.keys()) - self._overrides.keys()
        if not names:
            return self._params
        params = dict(self._params)
        for name in names:
            try:
                params[name] = _CHECKERS[name](call[name])
            except ValueError as exc:
                raise ValueError(f"parameter {name!r}: {exc}") from None
        return params

    def _scorer(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """A cached scorer: per-sample parameters rarely vary, and building one costs more than a call."""
        scorer = self._scorers.get(key)
        if scorer is None:
            if len(self._scorers) >= _MAX_CACHED_SCORERS:
                self._scorers.clear()
            scorer = self._scorers[key] = build()
        return scorer

    def _prepare(self, params: dict[str, Any], reference: str, response: str) -> tuple[Any, str | None]:
        """The scorer (and, for BLEU, the tokeniser name) the algorithm needs for these params and texts."""
        if self.algorithm == "bleu":
            tok = params["tokenize"]
            if tok == "auto":
                tok = "zh" if contains_cjk(reference) or contains_cjk(response) else "13a"
            args = (params["max_ngram_order"], params["smooth_method"], params["effective_order"], tok)
            try:
                return self._scorer(("bleu", *args), lambda: m.make_bleu(*args)), tok
            except Exception as exc:  # sacrebleu tokenisers may need extras (MeCab, sentencepiece models)
                raise ValueError(f"sacrebleu cannot use tokenizer {tok!r}: {exc}") from exc
        if self.algorithm == "chrf":
            order, beta = params["char_order"], params["beta"]
            return self._scorer(("chrf", order, beta), lambda: m.make_chrf(order, beta)), None
        if "rouge_types" in params:
            key = (tuple(params["rouge_types"]), params["use_stemmer"])
            return self._scorer(("rouge", *key), lambda: m.make_rouge(*key)), None
        return None, None

    def _prepared_metric(self, reference: str, response: str, params: dict[str, Any]) -> tuple[float, m.Details]:
        try:
            scorer, tok = self._prepare(params, reference, response)
        except ValueError as exc:
            raise ValueError(f"parameter 'tokenize': {exc}") from None
        if self.algorithm == "bleu":
            score, details = m.bleu(scorer, reference, response)
            return score, details if "error" in details else {**details, "tokenize": tok}
        return m.rouge(scorer, reference, response, params["rouge_types"], params["use_stemmer"], params["score_key"])

    def _reason(self, score: float, details: m.Details) -> str:
        algorithm = self.algorithm
        if algorithm in ("f1_score", "token_f1"):
            return f"F1 score: {score:.4f} (P={details['precision']:.3f}, R={details['recall']:.3f})"
        if algorithm == "fuzzy_match":
            matched = "matched" if details["matched"] else "not matched"
            return f"Fuzzy match ({details['method']}): {score:.4f} ({matched})"
        if algorithm == "edit_distance":
            return f"Edit distance similarity: {score:.4f} (distance={details['raw_distance']})"
        if algorithm in _ROUGE_N_ALGORITHMS:
            return f"ROUGE-{details['n']} {details['score_type']}: {score:.4f}"
        if algorithm == "sentence_bleu":
            return f"Sentence BLEU: {score:.4f}"
        return f"{algorithm.upper()} score: {score:.4f}"


def _checked_init(name: str, value: Any, check: Callable[[Any], Any] | None = None) -> Any:
    try:
        return (check or _CHECKERS[name])(value)
    except ValueError as exc:
        raise InvalidParams(name, str(exc)) from None


__all__ = ["ALGORITHM_DEFAULTS", "SimilarityGrader"]
