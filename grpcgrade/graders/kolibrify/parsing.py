"""How Kolibrify's dataserver reads a completion before any grader sees it.

Kolibrify splits every completion into (reasoning, final answer) once, with plain `str.find` on the
first `<think>` and the first `</think>`; graders then read the final answer, the raw completion, or
the answer with the completion as fallback. The schema graders also share the record's
`metadata.schema` convention (a JSON *string*) and the fenced-code-block fallback. Keeping these here
means every grader of the family agrees on them, as they do in Kolibrify.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from grpcgrade.core.errors import SampleProblem
from grpcgrade.grader import GraderScore

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"

_FENCED_BLOCK_RE = re.compile(r"```[\w-]*\n(.*?)```", flags=re.DOTALL)

# Kolibrify's number pattern (math_exact, number_only): no thousands separators, no exponents, so
# "1,072" is two numbers and "72.0" is not "72".
NUMBER_RE = re.compile(r"[-+]?\d*\.\d+|[-+]?\d+")


def split_think(completion: str) -> tuple[str | None, str | None]:
    """(reasoning, final answer), each None when empty; (None, None) unless `<think>` precedes `</think>`.

    Both parts are None when either tag is missing, which is why a completion whose `<think>` was
    pre-filled by the chat template scores 0 on every answer grader: Kolibrify does the same.
    """
    text = completion.strip()
    start = text.find(OPEN_TAG)
    end = text.find(CLOSE_TAG)
    if start == -1 or end == -1 or end <= start:
        return None, None
    reasoning = text[start + len(OPEN_TAG) : end].strip()
    answer = text[end + len(CLOSE_TAG) :].strip()
    return reasoning or None, answer or None


def final_answer(completion: str) -> str | None:
    """The text after `</think>`, or None when the completion does not parse (see `split_think`)."""
    return split_think(completion)[1]


NO_ANSWER = "no final answer after </think>"


def no_answer(name: str, **metadata: Any) -> GraderScore:
    """Kolibrify's answer graders score 0 when the completion has no `<think>...</think>` answer part."""
    return GraderScore(name=name, score=0.0, reason=NO_ANSWER, metadata={"answer_found": False, **metadata})


def answer_or_completion(completion: str) -> str:
    """The final answer when there is one, else the whole completion (the schema and category graders)."""
    return final_answer(completion) or completion


def record_schema(metadata: Any) -> Mapping[str, Any] | None:
    """The record's `metadata.schema`, which Kolibrify only honours as a JSON string holding an object.

    A dict (not a string) or undecodable JSON counts as no schema at all, as in Kolibrify.
    """
    if not isinstance(metadata, Mapping):
        return None
    schema_json = metadata.get("schema")
    if not isinstance(schema_json, str):
        return None
    try:
        schema = json.loads(schema_json)
    except json.JSONDecodeError:
        return None
    return schema if isinstance(schema, Mapping) else None


def fenced_block(text: str) -> str | None:
    """The stripped body of the first ```lang fenced block, or None when there is none."""
    match = _FENCED_BLOCK_RE.search(text)
    return match.group(1).strip() if match else None


def is_number(value: Any) -> bool:
    """A JSON number as params and extras carry it (a bool is not one, though Python says so)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def token_count(value: Any) -> int | None:
    """A sample's `completion_tokens` (D12): None when absent, else a whole number of tokens (`10.0` is 10,
    since Struct numbers are doubles). Anything else (`true`, `"12"`, `9.5`, a negative count) raises
    SampleProblem: that sample is INVALID_SAMPLE and the rest of the batch is graded."""
    if value is None:
        return None
    if is_number(value) and math.isfinite(value) and float(value).is_integer() and value >= 0:
        return int(value)
    raise SampleProblem(f"completion_tokens must be a whole number of tokens, got {value!r}")
