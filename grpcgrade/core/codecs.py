"""Codecs: how a chunk's samples travel to where they are graded, and how its answer comes back, as bytes.

A service that receives samples already serialized (the gRPC service: protobuf) need not turn each into a
Python dict on the event loop only to pickle it again for a worker: it hands the engine its samples in its
own encoding, and the worker decodes them, grades them with every grader of the call and encodes the answer
in the form the service sends, so the event loop forwards it as it is. A codec is that pair of translations
for one protocol; the engine and the executors know codecs only through this interface (no protobuf here).

A codec is named by where it lives, `"module:attribute"`: a worker process or a Ray actor, which has its own
registry and imports nothing of the server's on its own, imports the module by that name the first time a
work item names it (`codec_named`). The service defines its codecs as module attributes and passes their
names with its samples (`work.Encoded`).
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Sequence
from typing import Any, Protocol

from grpcgrade.grader import GraderResult

from .errors import SampleProblem
from .rewards import Result


class Decoded(Protocol):
    """A chunk's samples as a codec decoded them: `n` samples, read as keyword arguments or as text columns."""

    @property
    def n(self) -> int: ...

    def kwargs(self) -> list[dict[str, Any] | SampleProblem]:
        """Each sample's keyword arguments, or the reason it cannot be graded (see `samples.Limits`)."""
        ...

    def text(self, names: set[str]) -> dict[str, list[str]] | None:
        """Every sample's `names` as text columns, or None when the chunk must be read sample by sample (a
        sample with fields only keyword arguments carry, a field that may be over the limits, an answer
        that needs more than scores)."""
        ...


class Codec(abc.ABC):
    """One protocol's encoding of a chunk's samples and of its answer. `options` is whatever the codec needs
    besides the bytes (picklable: it travels with them), e.g. the answer's view and the sample limits."""

    #: Where the codec lives, "module:attribute": what a work item names it by.
    name: str

    @abc.abstractmethod
    def decode(self, data: bytes, options: Any, required: dict[str, str]) -> Decoded:
        """The samples of `data`; `required` is the inputs the call's graders require (`samples.requirements`),
        a sample lacking one being that sample's INVALID_SAMPLE."""

    @abc.abstractmethod
    def encode(
        self,
        decoded: Decoded,
        start: int,
        labels: Sequence[tuple[str, str]],
        columns: Sequence[Sequence[Result | GraderResult]],
        rewards: Sequence[float | None],
        options: Any,
    ) -> bytes:
        """The answer for `decoded`'s samples (the request's `start`...): `columns[j][k]` grader j's result for
        sample k (a bare score where the chunk was graded as columns), `labels[j]` its (key, grader name)."""

    @abc.abstractmethod
    def cut(self, data: bytes, start: int, stop: int) -> bytes:
        """Samples `start`..`stop-1` of `data` (positions within it), encoded as `data` is: how a chunk is split
        to find the sample at fault when its process died."""

    @abc.abstractmethod
    def concat(self, parts: Sequence[bytes]) -> bytes:
        """The answers of consecutive parts of a chunk as one answer."""


_codecs: dict[str, Codec] = {}


def codec_named(name: str) -> Codec:
    """The codec called `name` ("module:attribute"), its module imported on first use in this process."""
    codec = _codecs.get(name)
    if codec is None:
        module, _, attribute = name.partition(":")
        found = getattr(importlib.import_module(module), attribute)
        if not isinstance(found, Codec):
            raise TypeError(f"{name} is not a codec")
        codec = _codecs[name] = found
    return codec
