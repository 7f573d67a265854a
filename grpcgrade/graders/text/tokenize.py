"""Word tokenisation shared by the text graders, as py-openjudge 0.2.4 does it (V-B).

Every word-level metric of the reference goes through jieba (accurate mode, HMM on), for Latin text too:
jieba keeps English words and numbers whole (`3.14` stays one token) but splits on punctuation
(`don't` becomes `don`, `'`, `t`). Scores only match the reference if we tokenise exactly like it, so
the punctuation set and the Chinese stop-word list below are the reference's, character for character.

jieba is imported lazily: loading its dictionary costs about a second, which each process that grades pays
once as it warms up (`initialize()`, from the graders' `warm_up`) rather than on the first request; a
process that only loads the plugins never loads it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import stat
import string
import tempfile
import threading
from typing import Any

# Fullwidth and CJK punctuation the reference treats as punctuation, besides ASCII string.punctuation.
CJK_PUNCTUATION: frozenset[str] = frozenset(
    "\u3001\u3002"  # 、。
    "\uff01\uff1f"  # ！？
    "\uff0c\uff1b\uff1a"  # ，；：
    "\u201c\u201d"  # “”
    "\u2018\u2019"  # ‘’
    "\u3010\u3011"  # 【】
    "\uff08\uff09"  # （）
    "\u300a\u300b"  # 《》
    "\u2026\u2014\uff5e\u00b7"  # …—～·
    "\u300c\u300d"  # 「」
    "\u300e\u300f"  # 『』
    "\u3008\u3009"  # 〈〉
    "\u3014\u3015"  # 〔〕
)

PUNCTUATION: frozenset[str] = frozenset(string.punctuation) | CJK_PUNCTUATION

# High-frequency Chinese function words. English stop-words are deliberately absent, as in the reference.
CHINESE_STOPWORDS: frozenset[str] = frozenset(
    {
        "的", "了", "在", "是", "我", "有", "和", "就", "不", "人", "都", "一", "一个", "上", "也", "很",
        "到", "说", "要", "去", "你", "会", "着", "没有", "看", "好", "自己", "这", "他", "她", "么", "那",
        "被", "从", "把", "它", "与", "及", "其", "或", "之", "而", "但", "对", "等", "能", "将", "可以",
        "已", "所", "为", "以", "这个", "那个", "什么", "怎么", "如何", "因为", "所以", "虽然", "但是",
        "如果", "应该", "可能", "没", "吗", "呢", "吧", "啊", "呀", "哦", "嗯",
    }
)  # fmt: skip

# CJK ideographs (with Extension A and compatibility forms), CJK symbols, kana and Hangul syllables.
_CJK = re.compile("[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\u3000-\u303f\u3040-\u309f\u30a0-\u30ff\uac00-\ud7af]")

_init_lock = threading.Lock()
_jieba: Any = None


def _private_cache_dir() -> str:
    """A temp dir only this user can write, for jieba's dictionary cache.

    jieba's default is a fixed file name in the shared temp dir, which it unmarshals when present: on a
    shared machine another user could plant it. One dir per user (not per process) lets worker
    processes reuse the cache instead of each leaving a 9 MB file behind.
    """
    path = os.path.join(tempfile.gettempdir(), f"grpcgrade-{os.getuid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022:
            return path
    except OSError:
        pass
    return tempfile.mkdtemp(prefix="grpcgrade-jieba-")


def initialize() -> None:
    """Load jieba's dictionary once per process, quietly: the graders' `warm_up` calls it before the process
    takes work.

    jieba otherwise loads lazily on the first cut (about a second, paid by a request) and logs the
    loading at DEBUG level through its own stderr handler.
    """
    global _jieba
    if _jieba is not None:
        return
    with _init_lock:
        if _jieba is not None:
            return
        import jieba

        jieba.setLogLevel(logging.WARNING)
        jieba.dt.tmp_dir = _private_cache_dir()
        jieba.initialize()
        _jieba = jieba


def contains_cjk(text: str) -> bool:
    """True when `text` has a Chinese, Japanese or Korean character (picks BLEU's `zh` tokeniser)."""
    return _CJK.search(text) is not None


@functools.lru_cache(maxsize=1024)
def _jieba_tokens(text: str) -> tuple[str, ...]:
    """Stripped, non-empty jieba tokens (accurate mode, HMM on) of `text`.

    Memoised because RL batches score many responses against the same reference text.
    """
    initialize()
    return tuple(token for token in (raw.strip() for raw in _jieba.cut(text, cut_all=False, HMM=True)) if token)


def is_punctuation(token: str) -> bool:
    """True for a token made only of ASCII or CJK punctuation (the reference's definition)."""
    return all(ch in PUNCTUATION for ch in token)


def word_tokenize(text: str, remove_punctuation: bool = True, remove_stopwords: bool = False) -> list[str]:
    """Words of `text` for the word-level metrics: jieba tokens, stripped, empties dropped.

    Punctuation tokens are dropped by default; `remove_stopwords` drops the Chinese stop-words (the
    reference uses it for every word metric except METEOR and ROUGE-1/2/L).
    """
    if not text:
        return []
    return [
        token
        for token in _jieba_tokens(text)
        if not (remove_punctuation and is_punctuation(token)) and not (remove_stopwords and token in CHINESE_STOPWORDS)
    ]


def smart_tokenize(text: str, lowercase: bool = False) -> list[str]:
    """jieba tokens of `text` with only whitespace removed: punctuation is kept (fuzzy token_sort_ratio)."""
    if lowercase:
        text = text.lower()
    return word_tokenize(text, remove_punctuation=False)
