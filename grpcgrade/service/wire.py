"""A batch chunk graded from protobuf bytes to protobuf bytes, in a worker process.

When every grader of a BatchEvaluate call can run in a worker, the server's event loop does not touch the
samples one by one: it cuts the request's own bytes into chunks of serialized samples, and a worker parses
its chunk, grades it with every grader, adds the rewards and serializes the response message. Cheap graders
then use every core as heavy ones do, for a hop per chunk instead of a pickled dict per sample.

Cutting: a serialized BatchEvaluateRequest holds each sample as one record (tag 0x12, a varint length, the
sample's bytes), and records concatenate into a valid message, so samples a..b-1 are one slice of the bytes
that arrived (`ReceivedBatch`). A request that is one chunk goes to the worker as it arrived. The bytes are
kept for the call beside the parsed message (the request is held twice, within `max_message_bytes` each),
the price of never parsing and writing a sample again to send it. A request whose samples come as
`columns` (SampleColumns) is one chunk as it arrived too; several chunks are re-cut from its columns.

Either way of sending samples is read through `Rows`, and either shape of answer (`items`, or `columns` for
RESULT_VIEW_COLUMNS) is written where the chunk is graded: the worker's answer is the response message.
That pair of translations is the service's codec, `WIRE` (see `core.codecs`): the engine sends its name
with the bytes, and a worker imports this module by it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpcgrade.core.codecs import Codec
from grpcgrade.core.errors import InvalidParams, SampleProblem
from grpcgrade.core.samples import Limits
from grpcgrade.core.work import Encoded
from grpcgrade.v1 import grading_pb2 as pb

from .convert import (
    TEXT_COLUMNS,
    column_count,
    column_rows,
    fill_columns,
    is_full,
    join_columns,
    sample_kwargs,
)
from .items import items_bytes

SAMPLE_TAG = 0x12  # field 2 (`samples`), wire type 2 (length-delimited)
#: BatchEvaluateUnaryRequest.batch and BatchEvaluateUnaryResponse.answer: field 1, length-delimited.
UNARY_TAG = 0x0A


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; IndexError past the end."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def unwrapped_batch(data: bytes) -> ReceivedBatch:
    """BatchEvaluateUnary's request deserializer: the BatchEvaluateRequest it wraps, as `ReceivedBatch`. The
    batch's bytes are taken as they are when they are the message's one field (as every protobuf library
    writes it); otherwise the message is parsed, and the batch written again."""
    if data[:1] == bytes((UNARY_TAG,)):
        try:
            length, start = _varint(data, 1)
        except IndexError:
            length, start = -1, 0
        if start + length == len(data):
            return ReceivedBatch(data[start:])
    return ReceivedBatch(pb.BatchEvaluateUnaryRequest.FromString(data).batch.SerializeToString())


def wrapped_answer(answer: bytes) -> bytes:
    """A serialized BatchEvaluateResponse as the BatchEvaluateUnaryResponse holding it."""
    return bytes((UNARY_TAG,)) + _varint_bytes(len(answer)) + answer


def sample_offsets(data: bytes) -> list[int] | None:
    """Where each sample record of a serialized BatchEvaluateRequest starts, and where the last one ends
    (n + 1 offsets), when the records are one run (as every protobuf library writes them); None when they are
    not (interleaved with other fields, or a group): the caller then re-serializes."""
    starts: list[int] = []
    append = starts.append
    end = -1  # where the run of sample records ends so far
    pos, size = 0, len(data)
    try:
        while pos < size:
            tag = data[pos]
            if tag == SAMPLE_TAG:
                if starts and pos != end:
                    return None  # a second run of samples
                byte = data[pos + 1]  # a sample's length: one varint byte up to 127, else more
                length, after = (byte, pos + 2) if byte < 0x80 else _varint(data, pos + 1)
                append(pos)
                pos = end = after + length
                continue
            key, pos = _varint(data, pos)
            kind = key & 7
            if kind == 0:
                _, pos = _varint(data, pos)
            elif kind == 1:
                pos += 8
            elif kind == 2:
                length, pos = _varint(data, pos)
                pos += length
            elif kind == 5:
                pos += 4
            else:
                return None  # groups: never written for this message
    except IndexError:
        return None
    if pos != size:
        return None
    if starts:
        starts.append(end)
    return starts


class Rows:
    """A BatchEvaluateRequest's samples, however they came: one `Sample` message each, or `columns`.

    Raises InvalidParams for a request with both, or with columns of different lengths. `required`: the
    inputs the call's graders require (`samples.requirements`), set once the graders are known; a sample
    without one of them is that sample's INVALID_SAMPLE."""

    __slots__ = ("samples", "columns", "texts", "n", "required")

    def __init__(self, message: pb.BatchEvaluateRequest) -> None:
        self.required: dict[str, str] = {}
        self.samples = message.samples
        self.columns = message.columns if message.HasField("columns") else None
        self.texts: dict[str, Any] = {}
        if self.columns is None:
            self.n = len(self.samples)
            return
        if len(self.samples):
            raise InvalidParams("columns", "a request sends its samples in `samples` or in `columns`, not both")
        self.n = column_count(self.columns)
        self.texts = {name: getattr(self.columns, name) for name in TEXT_COLUMNS if len(getattr(self.columns, name))}

    def kwargs(
        self, start: int, stop: int, limits: Limits, small: bool = False
    ) -> list[dict[str, Any] | SampleProblem]:
        """Samples start..stop-1's keyword arguments, or why each cannot be graded (see
        `convert.sample_kwargs`)."""
        required = self.required
        if self.columns is None:
            return [sample_kwargs(self.samples[i], limits, small, required) for i in range(start, stop)]
        return column_rows(self.columns, self.texts, start, stop, limits, small, required)

    def id(self, i: int) -> str:
        if self.columns is None:
            return self.samples[i].id
        ids = self.texts.get("id")
        return ids[i] if ids is not None else ""

    def ids(self) -> list[str]:
        if self.columns is None:
            return [s.id for s in self.samples]
        ids = self.texts.get("id")
        return list(ids) if ids is not None else [""] * self.n

    def text(self, names: set[str]) -> dict[str, list[str]] | None:
        """Every sample's `names` as text columns, or None when a sample has an `extra` or may lack a required
        input (graded by kwargs, which says which)."""
        needed = [name for name in self.required if name in TEXT_COLUMNS]
        if len(needed) < len(self.required):
            return None  # a required input that only `extra` can carry
        if self.columns is None:
            if any(s.HasField("extra") for s in self.samples):
                return None
            if not all(s.HasField(name) for s in self.samples for name in needed):
                return None
            return {name: [getattr(s, name) for s in self.samples] for name in names}
        if len(self.columns.extra) and any(e.fields for e in self.columns.extra):
            return None
        if not all(name in self.texts for name in needed):
            return None
        return {name: list(self.texts[name]) if name in self.texts else [""] * self.n for name in names}

    def cut(self, start: int, stop: int) -> bytes:
        """Samples start..stop-1 of a `columns` request, as a serialized request of their columns."""
        assert self.columns is not None
        part = pb.SampleColumns(**{name: column[start:stop] for name, column in self.texts.items()})
        if len(self.columns.extra):
            part.extra.extend(self.columns.extra[start:stop])
        return pb.BatchEvaluateRequest(columns=part).SerializeToString()


class ReceivedBatch:
    """A BatchEvaluateRequest as it arrived: the parsed message, whose fields read through (`request.samples`,
    `request.view`...), and its bytes, from which whole chunks are cut without re-serializing a sample.

    It is the request deserializer of BatchEvaluate: bytes protobuf refuses raise its DecodeError as before.
    """

    __slots__ = ("message", "data", "_offsets", "_scanned", "_rows")

    def __init__(self, data: bytes) -> None:
        self.message = pb.BatchEvaluateRequest.FromString(data)
        self.data = data
        self._offsets: list[int] | None = None
        self._scanned = False
        self._rows: Rows | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.message, name)

    @property
    def rows(self) -> Rows:
        """The samples as `Rows` (made on first use: InvalidParams for a bad `columns`, which the servicer
        turns into INVALID_ARGUMENT)."""
        if self._rows is None:
            self._rows = Rows(self.message)
        return self._rows

    def samples_bytes(self, start: int, stop: int) -> bytes:
        """A serialized BatchEvaluateRequest whose samples are the request's `start`..`stop-1`."""
        rows = self.rows
        if start == 0 and stop == rows.n:
            return self.data  # the graders and the other fields travel too: the worker reads only the samples
        if rows.columns is not None:
            return rows.cut(start, stop)
        n = rows.n
        if not self._scanned:  # once per request, when it is cut into several chunks
            offsets = sample_offsets(self.data)
            self._offsets = offsets if offsets is not None and len(offsets) == n + 1 else None
            self._scanned = True
        offsets = self._offsets
        if offsets is None:
            return pb.BatchEvaluateRequest(samples=self.message.samples[start:stop]).SerializeToString()
        return self.data[offsets[start] : offsets[stop]]


class WireCodec(Codec):
    """The gRPC service's codec (`codecs`): a chunk's samples as a serialized BatchEvaluateRequest (a slice of
    the request's own bytes, see `ReceivedBatch.samples_bytes`), its answer as a serialized
    BatchEvaluateResponse in the request's view, written in the worker and forwarded as it is. `options` is
    `(view, limits)`."""

    name = f"{__name__}:WIRE"

    def decode(self, data: bytes, options: tuple[int, Limits], required: dict[str, str]) -> WireSamples:
        view, limits = options
        return WireSamples(data, view, limits, required)

    def encode(
        self,
        decoded: Any,
        start: int,
        labels: Sequence[tuple[str, str]],
        columns: Sequence[Sequence[Any]],
        rewards: Sequence[float | None],
        options: tuple[int, Limits],
    ) -> bytes:
        view = options[0]
        indices = range(start, start + decoded.n)
        if view != pb.RESULT_VIEW_COLUMNS:
            return items_bytes(indices, decoded.rows.ids(), list(labels), columns, rewards, is_full(view))
        out = pb.BatchEvaluateResponse()
        fill_columns(out.columns, indices, list(labels), columns, rewards)
        return out.SerializeToString()

    def cut(self, data: bytes, start: int, stop: int) -> bytes:
        return ReceivedBatch(data).samples_bytes(start, stop)

    def concat(self, parts: Sequence[bytes]) -> bytes:
        """Serialized messages of items concatenate into their merge: the items of all parts, in order.
        Columns are joined row after row (a concatenation would merge them wrongly)."""
        messages = [pb.BatchEvaluateResponse.FromString(data) for data in parts]
        if any(m.HasField("columns") for m in messages):
            return pb.BatchEvaluateResponse(columns=join_columns([m.columns for m in messages])).SerializeToString()
        return b"".join(parts)


#: The codec the gRPC service's whole chunks travel in.
WIRE = WireCodec()


class WireSamples:
    """A chunk's samples as the worker reads them from a serialized BatchEvaluateRequest (`codecs.Decoded`)."""

    __slots__ = ("rows", "n", "small", "full", "limits")

    def __init__(self, data: bytes, view: int, limits: Limits, required: dict[str, str]) -> None:
        self.rows = Rows(pb.BatchEvaluateRequest.FromString(data))
        self.rows.required = required
        self.n = self.rows.n
        self.limits = limits
        self.full = is_full(view)
        # No field of a sample holds more characters than the chunk has bytes: one comparison clears them all.
        self.small = len(data) <= limits.max_field_chars

    def kwargs(self) -> list[dict[str, Any] | SampleProblem]:
        return self.rows.kwargs(0, self.n, self.limits, self.small)

    def text(self, names: set[str]) -> dict[str, list[str]] | None:
        """Text columns only for the scores view of a chunk no field of which can be over the limits."""
        if self.full or not self.small:
            return None
        return self.rows.text(names)


def encoded(request: ReceivedBatch, start: int, stop: int, view: int, limits: Limits) -> Encoded:
    """The request's samples `start`..`stop-1` in the wire codec, answered in `view`."""
    return Encoded(WIRE.name, request.samples_bytes(start, stop), (view, limits))
