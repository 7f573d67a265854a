"""The HTTP faces' codec: a chunk's samples as rows of keyword arguments, its answer as results, in pickles.

The HTTP faces parse their framework's JSON into samples' keyword arguments (each face its own way), so
there is no request encoding to cut as the gRPC service cuts its protobuf (`wire`); what they gain from a
codec is the same path: a batch goes to the engine as whole chunks of every grader (`core.codecs`), and a
small one of graders of bounded cost is graded inline, its size being known from its encoding. The rows
travel as one pickle (what the worker's pipe would carry anyway), unusable samples as their
`SampleProblem`; the answer comes back as the results and rewards, which `answer` reads for the face.

A worker imports this module by the codec's name: it holds nothing but the codec (no aiohttp, no grpc).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

from grpcgrade.core.codecs import Codec
from grpcgrade.core.errors import SampleProblem
from grpcgrade.core.work import Encoded
from grpcgrade.grader import GraderResult

Columns = list[list[GraderResult]]


class _Rows:
    """Decoded rows (`codecs.Decoded`): read sample by sample only (the faces' answers carry whole results,
    which a column of scores does not)."""

    __slots__ = ("rows", "n")

    def __init__(self, rows: list[dict[str, Any] | SampleProblem]) -> None:
        self.rows = rows
        self.n = len(rows)

    def kwargs(self) -> list[dict[str, Any] | SampleProblem]:
        return self.rows

    def text(self, names: set[str]) -> dict[str, list[str]] | None:
        return None


class RowsCodec(Codec):
    """See the module docstring; `options` is unused."""

    name = f"{__name__}:ROWS"

    def decode(self, data: bytes, options: Any, required: dict[str, str]) -> _Rows:
        return _Rows(pickle.loads(data))

    def encode(
        self,
        decoded: Any,
        start: int,
        labels: Sequence[tuple[str, str]],
        columns: Sequence[Sequence[Any]],
        rewards: Sequence[float | None],
        options: Any,
    ) -> bytes:
        return pickle.dumps(([list(c) for c in columns], list(rewards)), protocol=pickle.HIGHEST_PROTOCOL)

    def cut(self, data: bytes, start: int, stop: int) -> bytes:
        return pickle.dumps(pickle.loads(data)[start:stop], protocol=pickle.HIGHEST_PROTOCOL)

    def concat(self, parts: Sequence[bytes]) -> bytes:
        answers = [self.answer(part) for part in parts]
        columns = [[r for results, _ in answers for r in results[j]] for j in range(len(answers[0][0]))]
        return pickle.dumps((columns, [v for _, values in answers for v in values]), protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def answer(data: bytes) -> tuple[Columns, list[float | None]]:
        """An encoded answer's results (`columns[j][k]`: grader j, sample k) and rewards."""
        columns, rewards = pickle.loads(data)
        return columns, rewards


#: The codec the HTTP faces' batches travel in.
ROWS = RowsCodec()


def encoded(rows: list[dict[str, Any] | SampleProblem]) -> Encoded:
    """Samples' keyword arguments (or why each is unusable) in the rows codec."""
    return Encoded(ROWS.name, pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))
