"""`BatchScores`: a batch's results as columns, what `batch_scores` returns and a trainer reads.

The server answers RESULT_VIEW_COLUMNS with packed columns per streamed message (`ResultColumns`); a chunk's
rows are usually one contiguous run of samples, so each column lands in the table with one slice assignment
and no Python object per sample. A server older than that view answers `items`; they are read into the same
table, so a caller never sees which one answered.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from .v1 import grading_pb2 as pb


class MalformedAnswer(RuntimeError):
    """The server's answer does not hold together (a column of the wrong length, a row out of range): the
    call's results are not trusted, rather than read as scores."""


class BatchScores:
    """One entry per sample, in input order.

    - `rewards[i]`: sample i's reward; None where it is absent because a grader of the combination failed
      (mask the sample, never read it as 0).
    - `scores[key][i]`: the grader's score; None where it failed, with the error in `errors[key][i]`.
    - `cached[key]`: the samples whose result came from the server's result cache.
    - `graders[key]`: the registered grader name behind each key, in the request's order.
    - `unsent[i]`: why sample i was never sent, for a sample the client cannot write into a request (a lone
      surrogate in a text...): its reward and scores are None, as for a failed grader.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.unsent: dict[int, str] = {}
        self.rewards: list[float | None] = [None] * n
        self.scores: dict[str, list[float | None]] = {}
        self.errors: dict[str, dict[int, pb.GraderError]] = {}
        self.cached: dict[str, list[int]] = {}
        self.graders: dict[str, str] = {}
        self._answered = bytearray(n)

    def __len__(self) -> int:
        return self.n

    @property
    def masked(self) -> int:
        """How many samples have no reward."""
        return self.rewards.count(None)

    def _column(self, key: str, grader: str) -> list[float | None]:
        column = self.scores.get(key)
        if column is None:
            column = self.scores[key] = [None] * self.n
            self.errors[key], self.cached[key], self.graders[key] = {}, [], grader
        return column

    def add(self, start: int, messages: Iterable[pb.BatchEvaluateResponse]) -> int:
        """Place the rows of streamed messages answering the samples from `start` on; how many there were."""
        count = 0
        for message in messages:
            if message.HasField("columns"):
                count += self._add_columns(start, message.columns)
            else:
                count += self._add_items(start, message.items)
        return count

    def _add_columns(self, start: int, columns: pb.ResultColumns) -> int:
        m = len(columns.indices)
        if not m:
            return 0
        rows = [start + i for i in columns.indices]
        if min(rows) < 0 or max(rows) >= self.n:
            raise MalformedAnswer(f"the server answered sample {max(rows)} of a batch of {self.n}")
        a = rows[0]
        contiguous = rows == list(range(a, a + m))
        rewards: list[float | None] = list(columns.rewards) if len(columns.rewards) else [None] * m
        if len(rewards) != m:
            raise MalformedAnswer(f"{len(rewards)} rewards for {m} rows")
        for row in columns.reward_absent_rows:
            rewards[_row(row, m)] = None
        if not math.isfinite(sum(r for r in rewards if r is not None)):  # never a NaN or inf reward
            rewards = [r if r is not None and math.isfinite(r) else None for r in rewards]
        self._put(self.rewards, rows, contiguous, rewards)
        for col in columns.scores:
            target = self._column(col.key, col.grader)
            values: list[float | None] = list(col.scores)
            if len(values) != m or len(col.error_rows) != len(col.errors):
                raise MalformedAnswer(f"grader {col.key!r}: {len(values)} scores for {m} rows")
            errors = self.errors[col.key]
            for row, error in zip(col.error_rows, col.errors, strict=True):
                values[_row(row, m)] = None
                errors[rows[row]] = error
            self.cached[col.key].extend(rows[_row(row, m)] for row in col.cached_rows)
            self._put(target, rows, contiguous, values)
        if contiguous:
            self._answered[a : a + m] = b"\x01" * m
        else:
            for i in rows:
                self._answered[i] = 1
        return m

    @staticmethod
    def _put(target: list[Any], rows: list[int], contiguous: bool, values: Sequence[Any]) -> None:
        if contiguous:
            target[rows[0] : rows[0] + len(rows)] = values
        else:
            for i, value in zip(rows, values, strict=True):
                target[i] = value

    def _add_items(self, start: int, items: Iterable[pb.BatchItem]) -> int:
        count = 0
        for item in items:
            i = start + item.index
            if not 0 <= i < self.n:
                raise MalformedAnswer(f"the server answered sample {i} of a batch of {self.n}")
            result = item.result
            reward = result.reward if result.HasField("reward") else None
            self.rewards[i] = reward if reward is not None and math.isfinite(reward) else None
            for r in result.results:
                key = r.key or r.grader
                column = self._column(key, r.grader)
                if r.HasField("error"):
                    column[i] = None
                    self.errors[key][i] = r.error
                else:
                    column[i] = None if r.rank or not math.isfinite(r.score) else r.score
                    if r.cached:
                        self.cached[key].append(i)
            self._answered[i] = 1
            count += 1
        return count

    def spread(self, rows: Sequence[int], n: int, unsent: dict[int, str]) -> BatchScores:
        """This table, which answered `rows` of a batch of `n` samples, as that batch's table: the samples not
        sent (`unsent`, by index, with why) have no reward and no scores."""
        out = BatchScores(n)
        out.unsent = dict(unsent)
        out._answered[:] = b"\x01" * n
        for j, i in enumerate(rows):
            out.rewards[i] = self.rewards[j]
        for key, column in self.scores.items():
            target = out._column(key, self.graders[key])
            for j, i in enumerate(rows):
                target[i] = column[j]
            out.errors[key] = {rows[j]: error for j, error in self.errors[key].items()}
            out.cached[key] = [rows[j] for j in self.cached[key]]
        return out

    def check(self) -> BatchScores:
        """Every sample must have come back; a gap is the server's bug, never silently a None."""
        missing = self._answered.find(0)
        if missing >= 0:
            raise RuntimeError(
                f"server returned no result for {self._answered.count(0)} samples (first index {missing})"
            )
        for cached in self.cached.values():
            cached.sort()
        return self


def _row(row: int, m: int) -> int:
    if not 0 <= row < m:
        raise MalformedAnswer(f"row {row} of a message of {m} rows")
    return row
