"""A graded chunk's `items` (BatchEvaluateResponse) written as protobuf bytes directly, for the common results.

Building the response with protobuf's Python API costs a wrapper object, a cache entry and a C call per
field: ~3 µs a json_validator full-view sample in the worker, about what grading it costs. Most results have one
shape, a score or an error with a text reason and flat metadata of texts, numbers, booleans and nulls, and
that shape's encoding is a handful of records (protobuf's wire format: a tag, a length, the bytes). This
module writes those records itself, and hands every other result (a rank, nested or exotic metadata, text
UTF-8 cannot encode, a type of its own) to `convert.fill_items`, sample by sample, whose serialized message
it joins in: serialized messages concatenate into their merge, and `items` is a repeated field, so the
bytes are one response either way.

What it writes parses to the message `fill_items` builds (a test compares them, sample shapes and edge
cases: -0.0, an absent and a zero reward, empty texts, an error without code, large integers), though not
always to the same bytes: protobuf writes a map's entries in its hash table's order, this in the dict's.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from grpcgrade.core.rewards import Result
from grpcgrade.grader import GraderError, GraderScore
from grpcgrade.v1 import grading_pb2 as pb

_pack_double = struct.Struct("<d").pack
_ZERO = bytes(8)
_ONE_BYTE = [bytes((n,)) for n in range(128)]
#: The varints below `VARINTS` made once (~0.8 MB): a chunk's indices and lengths are written from here,
#: where `_varint` took ~0.3 us for each past one byte, and a 1,024-sample chunk's indices are mostly two.
VARINTS = 1 << 14
_VARINT = [*_ONE_BYTE, *(bytes((n & 0x7F | 0x80, n >> 7)) for n in range(128, VARINTS))]

# Tags (field number << 3 | wire type) of the records written here.
_ITEM = b"\x0a"  # BatchEvaluateResponse.items = 1
_INDEX = b"\x08"  # BatchItem.index = 1 (varint)
_RESULT = b"\x12"  # BatchItem.result = 2
_ID = b"\x0a"  # EvaluateResponse.id = 1
_RESULTS = b"\x12"  # EvaluateResponse.results = 2
_REWARD = b"\x19"  # EvaluateResponse.reward = 3 (double)
_KEY, _GRADER, _SCORE, _REASON, _METADATA = b"\x0a", b"\x12", b"\x19", b"\x22", b"\x2a"
_ERROR, _CACHED = b"\x3a", b"\x40\x01"  # GraderResult.error = 7, .cached = 8 (true)
_CODE, _MESSAGE = b"\x0a", b"\x12"  # GraderError.code = 1, .message = 2
_FIELD = b"\x0a"  # Struct.fields = 1 (map entries: key = 1, value = 2)
_ENTRY_KEY, _ENTRY_VALUE = b"\x0a", b"\x12"
_NULL, _STRING = b"\x08\x00", b"\x1a"  # Value.null_value = 1, .string_value = 3
#: A map entry's value record (tag, length) and its Value of a boolean (bool_value = 4) or a number
#: (number_value = 2, a double).
_TRUE, _FALSE, _NUMBER = b"\x12\x02\x20\x01", b"\x12\x02\x20\x00", b"\x12\x09\x11"

#: Map keys' records kept by the key (a grader's metadata uses a few keys over and over), within this many.
KEYS_KEPT = 1024
_keys: dict[str, _Heads] = {}
#: Reasons' records kept by their text, as many, each of a reason up to this long (see `_reason`).
REASON_KEPT_CHARS = 200
_reasons: dict[str, bytes] = {}


class _Other(Exception):
    """A result this module does not write: `fill_items` does."""


def _varint(n: int) -> bytes:
    if n < VARINTS:
        return _VARINT[n]
    if n < 1 << 21:  # a large request's indices
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _record(tag: bytes, data: bytes) -> bytes:
    """A length-delimited record: the tag, the length as a varint, the bytes."""
    n = len(data)
    return tag + (_VARINT[n] if n < VARINTS else _varint(n)) + data


def _text(tag: bytes, text: Any) -> bytes:
    """A string field's record, absent when empty (proto3); UnicodeEncodeError for a lone surrogate, _Other
    for what is not a str. A str subclass (an error code, a StrEnum) is written as its text, as protobuf does."""
    if not isinstance(text, str):
        raise _Other
    return _record(tag, str.encode(text)) if text else b""


class _Heads(NamedTuple):
    """A metadata key's records, made once for the key: its whole map entry (as a Struct field) with the
    value true and with false, the entry's start before a number's 8 bytes, and the key's record alone
    (for a value of another type). A json_validator sample's metadata took 40% of its items' time before."""

    true: bytes
    false: bytes
    number: bytes
    key: bytes


def _field_head(entry_size: int) -> bytes:
    """A Struct field's tag and length, for a map entry of `entry_size` bytes."""
    return _FIELD + _varint(entry_size)


def _key(key: Any) -> _Heads:
    heads = _keys.get(key) if type(key) is str else None
    if heads is None:
        if type(key) is not str:
            raise _Other  # `fill_struct` writes its str()
        known = _record(_ENTRY_KEY, key.encode())
        n = len(known)
        heads = _Heads(
            _field_head(n + len(_TRUE)) + known + _TRUE,
            _field_head(n + len(_FALSE)) + known + _FALSE,
            _field_head(n + len(_NUMBER) + 8) + known + _NUMBER,
            known,
        )
        if len(_keys) >= KEYS_KEPT:
            _keys.clear()
        _keys[key] = heads
    return heads


def _value(value: Any) -> bytes:
    """A flat metadata value other than a number or a boolean (`_struct` writes those) as a Value message."""
    if type(value) is str:
        return _record(_STRING, value.encode())
    if value is None:
        return _NULL
    raise _Other


def _struct(metadata: Any) -> bytes:
    """Flat metadata as a Struct's map entries (`structs.fill_struct`'s cases for them)."""
    if type(metadata) is not dict:
        raise _Other
    fields: list[bytes] = []
    append, keys, pack = fields.append, _keys, _pack_double
    for key, value in metadata.items():
        heads = keys.get(key) if type(key) is str else None
        if heads is None:
            heads = _key(key)
        kind = type(value)  # the common values' records written out: a call less for each
        if kind is bool:
            append(heads.true if value else heads.false)
        elif kind is float or kind is int:
            # an int is packed as the double float() makes of it; one past a double's range raises
            # struct.error, and its sample is written by `fill_items` (as infinity)
            append(heads.number + pack(value))
        else:
            entry = heads.key + _record(_ENTRY_VALUE, _value(value))
            append(_field_head(len(entry)) + entry)
    return b"".join(fields)


def _grader_result(prefix: bytes, result: Result, full: bool) -> bytes:
    """One GraderResult (`convert._add_result`'s encoding, for scores and errors); `prefix` is its key and
    grader's records."""
    kind = type(result)
    if kind is GraderScore:
        if type(result.score) is not float or type(result.reason) is not str:  # type: ignore[union-attr]
            raise _Other
        return _score(prefix, result, full)  # type: ignore[arg-type]
    if kind is GraderError:
        error = result.error  # type: ignore[union-attr]
        out = prefix + (_text(_REASON, result.reason or error) if full else b"")  # type: ignore[union-attr]
        if full and result.metadata:  # type: ignore[union-attr]
            out += _record(_METADATA, _struct(result.metadata))  # type: ignore[union-attr]
        return out + _record(_ERROR, _text(_CODE, result.code) + _text(_MESSAGE, error))  # type: ignore[union-attr]
    if kind is float or kind is int:  # a bare score of the column path (the scores view): no reason
        packed = _pack_double(float(result))  # type: ignore[arg-type]
        return prefix + _SCORE + packed if packed != _ZERO else prefix
    raise _Other  # a rank, a subclass


def items_bytes(
    indices: Sequence[int],
    ids: Sequence[str],
    labels: list[tuple[str, str]],
    columns: Sequence[Sequence[Result]],
    rewards: Sequence[float | None],
    full: bool,
) -> bytes:
    """A serialized BatchEvaluateResponse of a graded chunk's `items`: what `convert.fill_items` builds with the
    same arguments, serialized (see the module docstring).

    Each item's records go into one list as they are, joined once at the end: an item's lengths are summed
    from its parts' rather than measured on bytes joined for it (a concatenation copies every byte before
    it; five of them made a full-view item)."""
    prefixes = [_text(_KEY, key) + _text(_GRADER, name) for key, name in labels]
    out: list[bytes] = []
    extend = out.extend
    one = len(columns) == 1
    if one:
        (prefix,) = prefixes
        (column,) = columns
    pack, varints, known, varint = _pack_double, _VARINT, VARINTS, _varint
    for k, (index, sample_id, reward) in enumerate(zip(indices, ids, rewards, strict=True)):
        try:
            if one:
                body = _grader_result(prefix, column[k], full)
            else:
                body = b"".join(
                    [_record(_RESULTS, _grader_result(p, c[k], full)) for p, c in zip(prefixes, columns, strict=True)]
                )
            head = _record(_ID, sample_id.encode()) if sample_id else b""
        except (_Other, UnicodeEncodeError, OverflowError, struct.error):  # struct.error: an int past a double
            out.append(_by_protobuf(index, sample_id, labels, [c[k] for c in columns], reward, full))
            continue
        n = len(body)
        # EvaluateResponse: [id] results (one grader: its record; several: their records already) [reward]
        if one:
            lead = varints[n] if n < known else varint(n)
            size = len(head) + 1 + len(lead) + n
        else:
            lead = b""
            size = len(head) + n
        tail = _REWARD + pack(reward) if reward is not None else b""
        size += len(tail)
        # BatchItem: [index] result
        at = (_INDEX + (varints[index] if index < known else varint(index))) if index else b""
        result = varints[size] if size < known else varint(size)
        whole = len(at) + 1 + len(result) + size
        extend(
            (
                _ITEM,
                varints[whole] if whole < known else varint(whole),
                at,
                _RESULT,
                result,
                head,
                _RESULTS if one else b"",
                lead,
                body,
                tail,
            )
        )
    return b"".join(out)


def _score(prefix: bytes, result: GraderScore, full: bool) -> bytes:
    """A GraderScore with a float score and a str reason."""
    packed = _pack_double(result.score)
    score = _SCORE + packed if packed != _ZERO else b""
    if not full:
        return prefix + score + _CACHED if result.cached else prefix + score
    reason = result.reason
    if reason:
        text = _reasons.get(reason)
        if text is None:
            text = _reason(reason)
    else:
        text = b""
    metadata = result.metadata
    if metadata:
        data = _struct(metadata)
        n = len(data)
        fields = _METADATA + (_VARINT[n] if n < VARINTS else _varint(n)) + data
    else:
        fields = b""
    return b"".join((prefix, score, text, fields, _CACHED if result.cached else b""))


def _reason(reason: str) -> bytes:
    """A reason's record, kept by its text when short (a grader's reasons are mostly a few texts), within
    `KEYS_KEPT` of them; UnicodeEncodeError for a lone surrogate."""
    text = _record(_REASON, reason.encode())
    if len(reason) > REASON_KEPT_CHARS:
        return text
    if len(_reasons) >= KEYS_KEPT:
        _reasons.clear()
    _reasons[reason] = text
    return text


def _by_protobuf(
    index: int, sample_id: str, labels: list[tuple[str, str]], results: list[Result], reward: float | None, full: bool
) -> bytes:
    """One sample's item as `convert.fill_items` builds it, serialized: a result this module does not write."""
    from .convert import fill_items

    message = pb.BatchEvaluateResponse()
    fill_items(message.items, [index], [sample_id], labels, [[r] for r in results], [reward], full)
    return message.SerializeToString()
