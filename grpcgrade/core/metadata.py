"""A result's metadata bounded in depth, so that whatever a grader put there can travel.

Metadata goes to the trainer as a protobuf Struct, to the result cache, and from a worker process back to
the server as a pickle. Nesting past the limits of those (protobuf parsers stop at 100 message levels,
Python's pickle and recursive walks at the interpreter's recursion limit), or a dict that holds itself,
would fail the answer of the sample's whole chunk. `bounded` cuts such metadata where it goes too deep or
comes back to itself, to `CUT_TEXT`; flat metadata, the common case, is left as it is at the cost of one
look at its values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: How deep metadata nests (dicts and lists within each other) before what is below is cut to `CUT_TEXT`.
#: Python's protobuf parser reads a BatchEvaluateResponse whose metadata holds 33 levels of dicts, not 34
#: (each level is two message levels, Struct and Value, inside the response's own five); 16 leaves room.
MAX_METADATA_DEPTH = 16
CUT_TEXT = "<nested too deeply>"

SCALAR_TYPES = frozenset((str, int, float, bool, type(None)))  # what metadata values are when flat
CONTAINER_TYPES = (Mapping, list, tuple, set, frozenset)  # what nests


def is_flat(metadata: Mapping[Any, Any]) -> bool:
    """Whether no value of `metadata` is itself a container (then there is nothing to bound)."""
    return SCALAR_TYPES.issuperset(map(type, metadata.values()))  # one C loop: this runs for every result


def bounded(metadata: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of `metadata` whose dicts and lists (tuples and sets become lists) go at most
    `MAX_METADATA_DEPTH` deep and never hold themselves: past that, or where one comes back, `CUT_TEXT`."""
    return _copy_mapping(metadata, 0, (id(metadata),))


def _copy_mapping(data: Mapping[Any, Any], depth: int, within: tuple[int, ...]) -> dict[Any, Any]:
    return {key: _copy(value, depth, within) for key, value in data.items()}


def _copy(value: Any, depth: int, within: tuple[int, ...]) -> Any:
    if type(value) in SCALAR_TYPES or not isinstance(value, CONTAINER_TYPES):
        return value
    if depth >= MAX_METADATA_DEPTH or id(value) in within:
        return CUT_TEXT
    inner = (*within, id(value))
    if isinstance(value, Mapping):
        return _copy_mapping(value, depth + 1, inner)
    return [_copy(item, depth + 1, inner) for item in value]
