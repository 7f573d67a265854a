"""protobuf Struct <-> Python values, without json_format's per-call overhead, and what a protobuf string or
Struct can hold made of whatever a grader returns.

JSON has one number type, so Struct numbers arrive as floats; integral ones become ints here, which is what
a grader reading the same record from a JSON file would have seen.

A grader's metadata and texts go out as they are when protobuf can hold them. What it cannot is made
representable rather than failing the response that carries the sample and its chunk: text with a lone
surrogate (which UTF-8 cannot encode) gets U+FFFD in its place, an integer past a double's range becomes
the infinity of its sign, a value of another type its `str()`, and metadata nested deeper than
`MAX_METADATA_DEPTH` is cut there to `CUT_TEXT`. (A grader's metadata has already been bounded where its
result was checked, `core/metadata.py`, cycles included; the depth cap here also covers what a conversion
makes, such as a numpy array's nested lists.)
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

from google.protobuf.struct_pb2 import NULL_VALUE, ListValue, Struct, Value

from grpcgrade.core.errors import describe, encodable
from grpcgrade.core.metadata import CONTAINER_TYPES, CUT_TEXT, MAX_METADATA_DEPTH


def value_to_py(v: Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        n = v.number_value
        return int(n) if n.is_integer() and abs(n) < 2**53 else n
    if kind == "bool_value":
        return v.bool_value
    if kind == "struct_value":
        return struct_to_dict(v.struct_value)
    if kind == "list_value":
        return list_to_py(v.list_value)
    return None


def struct_to_dict(s: Struct) -> dict[str, Any]:
    return {k: value_to_py(v) for k, v in s.fields.items()}


def list_to_py(values: ListValue) -> list[Any]:
    return [value_to_py(v) for v in values.values]


def fill_struct(target: Struct, data: Mapping[Any, Any], depth: int = 0) -> None:
    """Copy `data` into `target`, each value made representable (see the module's docstring); never raises
    for what a grader put in its metadata. Keys that are not strings become their `str()`.

    Written out rather than `Struct.update`, which raises on the values above and is slower (measured: a
    cheap grader's full-view result with two-key metadata, 2.7 against 3.1 µs)."""
    fields = target.fields
    for key, value in data.items():
        if type(key) is not str:
            key = describe(key)
        try:
            entry = fields[key]
        except ValueError:  # UnicodeEncodeError: a lone surrogate in the key
            entry = fields[encodable(key)]
        set_value(entry, value, depth)


def set_value(v: Value, obj: Any, depth: int = 0) -> None:
    """`obj` into `v`, made representable; `depth` is how deep in the metadata `v` sits."""
    kind = type(obj)
    if kind is str:
        try:
            v.string_value = obj
        except ValueError:  # UnicodeEncodeError
            v.string_value = encodable(obj)
    elif kind is bool:
        v.bool_value = obj
    elif kind is float:
        v.number_value = obj
    elif kind is int:
        v.number_value = as_double(obj)
    elif obj is None:
        v.null_value = NULL_VALUE
    elif isinstance(obj, CONTAINER_TYPES) and depth >= MAX_METADATA_DEPTH:
        v.string_value = CUT_TEXT
    elif isinstance(obj, Mapping):
        v.struct_value.SetInParent()  # present even when empty
        fill_struct(v.struct_value, obj, depth + 1)
    elif isinstance(obj, CONTAINER_TYPES):
        values = v.list_value
        values.SetInParent()
        add = values.values.add
        for item in obj:
            set_value(add(), item, depth + 1)
    else:  # a type of its own: made plain first (at the depth limit, described: no loop of conversions)
        set_value(v, _plain(obj) if depth < MAX_METADATA_DEPTH else describe(obj), depth + 1)


def as_double(n: int) -> float:
    try:
        return float(n)
    except OverflowError:  # past a double's range: the nearest double, as IEEE rounding gives
        return math.inf if n > 0 else -math.inf


def _plain(obj: Any) -> Any:
    """A value of another type as one of the types above: subclasses of bool, int, float and str (IntEnum,
    StrEnum...) as their base type, other enums as their value, numpy scalars and arrays by `tolist()`,
    anything else as its `str()`."""
    for base in (bool, int, float, str):
        if isinstance(obj, base):
            return base(obj) if base is not str else str.__str__(obj)
    if isinstance(obj, enum.Enum):
        return obj.value if type(obj.value) in (bool, int, float, str) else describe(obj.value)
    tolist = getattr(obj, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        try:
            return tolist()
        except Exception:  # noqa: BLE001 - then it is described like any other object
            pass
    return describe(obj)


def py_to_value(obj: Any) -> Value:
    v = Value()
    set_value(v, obj)
    return v
