"""protobuf Struct <-> Python values, without json_format's per-call overhead.

JSON has one number type, so Struct numbers arrive as floats; integral ones become ints here, which is what
a grader reading the same record from a JSON file would have seen.
"""

from __future__ import annotations

import json
import math
from typing import Any

from google.protobuf.struct_pb2 import NULL_VALUE, ListValue, Struct, Value


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
        return [value_to_py(x) for x in v.list_value.values]
    return None


def struct_to_dict(s: Struct) -> dict[str, Any]:
    return {k: value_to_py(v) for k, v in s.fields.items()}


def _plain(obj: Any) -> Any:
    """Anything a grader put in metadata, made JSON-shaped (tuples, sets, enums, numpy scalars...)."""
    return json.loads(json.dumps(obj, default=_fallback, allow_nan=True))


def _fallback(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return getattr(obj, "value", None) if hasattr(obj, "value") else str(obj)


def fill_struct(target: Struct, data: dict[str, Any]) -> None:
    """Copy `data` into `target`; values protobuf cannot hold are converted rather than failing the call."""
    if not data:
        return
    try:
        target.update(data)
    except (ValueError, TypeError, AttributeError):
        target.Clear()
        target.update(_plain(data))


def py_to_value(obj: Any) -> Value:
    v = Value()
    if obj is None:
        v.null_value = NULL_VALUE
    elif isinstance(obj, bool):
        v.bool_value = obj
    elif isinstance(obj, (int, float)):
        v.number_value = float(obj) if math.isfinite(obj) or isinstance(obj, float) else 0.0
    elif isinstance(obj, str):
        v.string_value = obj
    elif isinstance(obj, dict):
        fill_struct(v.struct_value, obj)
    elif isinstance(obj, (list, tuple)):
        lv = ListValue()
        lv.extend(_plain(list(obj)))
        v.list_value.CopyFrom(lv)
    else:
        v.string_value = str(obj)
    return v
