"""Reading a judge's answer: the seeds' structured output, `{score, reason}` or `{rank, reason}`.

Models wrap JSON in ```json fences, explain themselves before or after it, or think out loud first, so the
answer is the last top-level JSON object in the text that has the wanted field. Anything else (no such
object, a score that is not a number or is outside the grader's range, a rank that is not a permutation)
raises JudgeOutputError, which the service reports as that sample's error result, never as a score.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_DECODER = json.JSONDecoder()
_EXCERPT = 200
#: Where a JSON object can start: a brace, blanks, then a key's quote or the closing brace.
_OBJECT_START = re.compile(r"\{[ \t\n\r]*[\"}]")
#: The characters the failed decoding tries of one answer may scan: this many (~40 ms), plus...
SCAN_FLOOR = 64 * 1024 * 1024
#: ...this many per character of the answer.
SCAN_FACTOR = 16
#: What an object decoded costs beyond its characters, in characters scanned (~2 us).
OBJECT_COST = 2048


class JudgeOutputError(ValueError):
    """The judge answered, but not with a usable judgment."""


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 3] + "..."


def json_objects(text: str) -> list[dict[str, Any]]:
    """The top-level JSON objects in `text`, in order (one inside another is not listed separately).

    Read on the server's event loop, from a text the graded response can shape (a judge may quote it), so
    its cost is bounded: decoding is tried only where an object can start (`{`, blanks, then `"` or `}`),
    and the tries may scan at most `SCAN_FLOOR` + `SCAN_FACTOR` x its length characters (a failure's error
    also counts the lines before it; an object found counts `OBJECT_COST` more), past which the answer is
    refused. Tried at every `{` without a bound, 16 kB of `{` took 0.18 s and 144 kB of `{"a": 1, ` 1 s:
    the time grew with the square of the length."""
    found = []
    budget = SCAN_FLOOR + SCAN_FACTOR * len(text)
    start = _OBJECT_START.search(text)
    while start is not None:
        pos = start.start()
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except RecursionError:
            raise JudgeOutputError("the judge's answer is nested too deeply to read") from None
        except ValueError as exc:  # not JSON here (or an integer past CPython's 4,300 digits: scanned to the end)
            budget -= exc.pos if isinstance(exc, json.JSONDecodeError) else len(text)
            start = _OBJECT_START.search(text, pos + 1)
        else:
            budget -= end - pos + OBJECT_COST
            found.append(value)
            start = _OBJECT_START.search(text, end)
        if budget < 0:
            raise JudgeOutputError("the judge's answer holds too many JSON objects, or broken ones, to read")
    return found


def find_answer(text: str, key: str) -> dict[str, Any]:
    """The last JSON object in the answer that has `key`."""
    candidates = [obj for obj in json_objects(text) if key in obj]
    if not candidates:
        raise JudgeOutputError(f"the judge's answer has no JSON object with {key!r}: {_excerpt(text)!r}")
    return candidates[-1]


def _reason(answer: dict[str, Any]) -> str:
    reason = answer.get("reason", "")
    return reason if isinstance(reason, str) else json.dumps(reason, ensure_ascii=False)


def parse_score(text: str, score_range: tuple[float, float] | None = None) -> tuple[float, str]:
    """(score, reason) from a pointwise answer, the score checked against the inclusive `score_range`."""
    answer = find_answer(text, "score")
    score = answer["score"]
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise JudgeOutputError(f"the judge's score is not a number: {score!r}")
    if score_range is not None and not score_range[0] <= score <= score_range[1]:
        low, high = score_range
        raise JudgeOutputError(f"the judge's score {score!r} is outside the range {low:g}..{high:g}")
    return float(score), _reason(answer)


def parse_rank(text: str, n: int) -> tuple[list[int], str]:
    """(rank, reason) from a listwise answer: rank[i] is the rank of response i+1, a permutation of 1..n."""
    answer = find_answer(text, "rank")
    rank = answer["rank"]
    if not isinstance(rank, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in rank):
        raise JudgeOutputError(f"the judge's rank is not a list of integers: {rank!r}")
    if sorted(rank) != list(range(1, n + 1)):
        raise JudgeOutputError(f"the judge's rank {rank} is not a permutation of 1..{n}")
    return rank, _reason(answer)
