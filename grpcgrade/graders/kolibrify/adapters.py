"""Kolibrify graders as grpcgrade graders: a sample becomes a `GraderInput`, a `GradeResult` a score.

A Kolibrify `Grader` grades a whole batch in one `grade_batch` call, so the adapter is a batch grader
(`aevaluate_batch`, one `grade_batch` per chunk). A grpcgrade sample carries Kolibrify's fields as:

| Kolibrify                         | grpcgrade sample                                        |
|-----------------------------------|---------------------------------------------------------|
| `sample_id`                       | `Sample.id` (the `sample_id` grader input)              |
| `record["prompt"]`                | `query`                                                 |
| `record["answer"]`                | `reference`                                             |
| `record[k]` (metadata, system_prompt, expected_category, ...) | `extra[k]`                  |
| `completion`                      | `response`                                              |
| `reasoning`, `answer`             | parsed from `response` the Kolibrify way                |
| `completion_tokens`, `completion_index` | `extra.completion_tokens`, `extra.completion_index` |

Results are paired with inputs as decision K1 says (`place_results`): by `sample_id` (and
`completion_index` when the result has one) when that identifies each result's sample, else by position
with the count checked. A sample left without a usable result gets an error result of its own; the other
samples of the batch keep their scores.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

from grpcgrade.core.errors import ErrorCode, SampleProblem
from grpcgrade.grader import BaseGrader, GraderError, GraderResult, GraderScore
from grpcgrade.graders.kolibrify.compat import GraderInput

from .parsing import is_number, split_think, token_count

#: Grader inputs that are not part of Kolibrify's dataset record.
_NOT_RECORD = frozenset(
    {"query", "response", "reference", "context", "responses", "sample_id", "completion_tokens", "completion_index"}
)


class KolibrifyGrader(Protocol):
    async def grade_batch(self, inputs: Sequence[Any]) -> Sequence[Any]: ...


class BatchFailure(Exception):
    """A whole `grade_batch` call failed; `code` is the error code every sample of the call reports."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def is_kolibrify_grader(obj: Any) -> bool:
    """Kolibrify checks `isinstance(obj, Grader)`; any object with an async `grade_batch` is accepted here."""
    return inspect.iscoroutinefunction(getattr(obj, "grade_batch", None))


def _whole(value: Any) -> Any:
    """Struct numbers arrive as floats; Kolibrify's token counts and indices are ints."""
    return int(value) if is_number(value) and float(value).is_integer() else value


def grader_input(kwargs: dict[str, Any]) -> GraderInput:
    """Kolibrify's view of one sample (see the table in the module docstring)."""
    completion = kwargs.get("response") or ""
    reasoning, answer = split_think(completion)
    record = {k: v for k, v in kwargs.items() if k not in _NOT_RECORD}
    record["prompt"] = kwargs.get("query", "")
    record["answer"] = kwargs.get("reference", "")
    return GraderInput(
        sample_id=str(kwargs.get("sample_id") or ""),
        record=record,
        completion=completion,
        reasoning=reasoning,
        answer=answer,
        completion_tokens=token_count(kwargs.get("completion_tokens")),
        completion_index=_whole(kwargs.get("completion_index")),
    )


def _by_id(inputs: Sequence[GraderInput], results: Sequence[Any]) -> list[list[Any]] | None:
    """Each input's results found by id, or None when the ids cannot say which sample a result is for.

    That is the case when two inputs share (sample_id, completion_index), when a result has no
    sample_id, or when a result without completion_index names a sample_id several inputs share (a GRPO
    group): Kolibrify services may rely on order there, as Kolibrify itself does.
    """
    exact: dict[tuple[str, Any], int] = {}
    by_sample: defaultdict[str, list[int]] = defaultdict(list)
    for pos, item in enumerate(inputs):
        key = (item.sample_id, item.completion_index)
        if key in exact:
            return None
        exact[key] = pos
        by_sample[item.sample_id].append(pos)
    placed: list[list[Any]] = [[] for _ in inputs]
    for result in results:
        sample_id = getattr(result, "sample_id", None)
        index = getattr(result, "completion_index", None)
        if sample_id is None:
            return None
        place: int | None
        if index is None:
            candidates = by_sample.get(str(sample_id), [])
            if len(candidates) > 1:
                return None
            place = candidates[0] if candidates else None
        else:
            place = exact.get((str(sample_id), _whole(index)))
        if place is not None:  # a result for a sample that was not asked about is dropped
            placed[place].append(result)
    return placed


def _score(name: str, item: GraderInput, found: list[Any]) -> GraderResult:
    if not found:
        return GraderError(
            name, f"the grader returned no result for sample {item.sample_id!r}", code=ErrorCode.INVALID_RESULT
        )
    if len(found) > 1:
        return GraderError(
            name,
            f"the grader returned {len(found)} results for sample {item.sample_id!r}",
            code=ErrorCode.INVALID_RESULT,
        )
    raw: Any = getattr(found[0], "reward", None)
    try:
        reward = float(raw)  # what Kolibrify applies to a remote grader's reward
    except (TypeError, ValueError):
        reward = math.nan
    if not math.isfinite(reward):
        return GraderError(
            name, f"the grader returned reward {raw!r}, not a finite number", code=ErrorCode.INVALID_RESULT
        )
    return GraderScore(name=name, score=reward)


def place_results(name: str, inputs: Sequence[GraderInput], results: Sequence[Any]) -> list[GraderResult]:
    """One result per input: matched by id when the ids allow it, else by position (decision K1)."""
    placed = _by_id(inputs, results)
    if placed is None:
        if len(results) != len(inputs):
            error = GraderError(
                name,
                f"the grader returned {len(results)} results for {len(inputs)} samples, and no sample_id "
                "tells which is which",
                code=ErrorCode.INVALID_RESULT,
            )
            return [error] * len(inputs)
        return [_positional(name, item, result) for item, result in zip(inputs, results, strict=True)]
    return [_score(name, item, found) for item, found in zip(inputs, placed, strict=True)]


def _positional(name: str, item: GraderInput, result: Any) -> GraderResult:
    """The result in the sample's position, unless it says it is for another sample."""
    sample_id = getattr(result, "sample_id", None)
    if sample_id is not None and str(sample_id) != item.sample_id:
        return GraderError(
            name,
            f"the result in the place of sample {item.sample_id!r} is for {sample_id!r}",
            code=ErrorCode.INVALID_RESULT,
        )
    return _score(name, item, [result])


class KolibrifyGraderAdapter(BaseGrader):
    """A Kolibrify `Grader` run by the engine: one `grade_batch` per chunk of at most `chunk_size`.

    The chunks of a batch run concurrently; a chunk whose call raises gives every sample of that chunk
    an error result (the `BatchFailure` code, else GRADER_FAILED) and leaves the other chunks alone.
    """

    def __init__(self, grader: KolibrifyGrader, chunk_size: int | None = None, description: str = "") -> None:
        super().__init__(name=type(grader).__name__, description=description)
        self.grader = grader
        self.chunk_size = chunk_size

    async def aevaluate(self, **kwargs: Any) -> GraderResult:
        (result,) = await self.aevaluate_batch([kwargs])
        return result

    async def aevaluate_batch(self, batch: list[dict[str, Any]]) -> list[GraderResult]:
        inputs: list[GraderInput] = []
        refused: dict[int, GraderResult] = {}  # samples Kolibrify's record validation refuses (D12)
        for index, kwargs in enumerate(batch):
            try:
                inputs.append(grader_input(kwargs))
            except SampleProblem as exc:
                refused[index] = GraderError(self.name, str(exc), code=ErrorCode.INVALID_SAMPLE)
        size = self.chunk_size or len(inputs) or 1
        parts = await asyncio.gather(*(self._grade(inputs[i : i + size]) for i in range(0, len(inputs), size)))
        graded = iter([result for part in parts for result in part])
        return [refused[index] if index in refused else next(graded) for index in range(len(batch))]

    async def _grade(self, inputs: list[GraderInput]) -> list[GraderResult]:
        try:
            results = await self.grader.grade_batch(inputs)
        except BatchFailure as exc:
            return [GraderError(self.name, str(exc), code=exc.code)] * len(inputs)
        except Exception as exc:  # the grader's fault, reported for its samples only (decision D7)
            return [GraderError(self.name, f"{type(exc).__name__}: {exc}")] * len(inputs)
        if not isinstance(results, Sequence):
            message = f"grade_batch returned {type(results).__name__}, not a list of GradeResult"
            return [GraderError(self.name, message, code=ErrorCode.INVALID_RESULT)] * len(inputs)
        return place_results(self.name, inputs, results)
