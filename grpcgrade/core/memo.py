"""Values worked out once per built grader (its declared inputs, its cache scope), kept by the grader's
identity.

A grader's own `__eq__` and `__hash__` must not decide which grader a memo answers for: a grader written as
a `@dataclass` has no hash at all (`__hash__` is None), so a `WeakKeyDictionary` raised TypeError on every
call that named it; and two graders that compare equal on some fields but were built with other params
would share one cache scope, so one would be answered with the other's results. `id()` is the identity,
and a weak reference drops the entry when its grader goes (a weak reference needs no hash).
"""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    """A map from objects, by identity, to values; an entry lives as long as its object."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[K], V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, obj: K) -> V | None:
        entry = self._entries.get(id(obj))
        # The reference check guards against an id reused by a new object after the old one's entry went.
        return entry[1] if entry is not None and entry[0]() is obj else None

    def put(self, obj: K, value: V) -> V:
        """Keep `value` for `obj` (replacing any), and return it."""
        key, entries = id(obj), self._entries

        def forget(ref: weakref.ref[K]) -> None:
            entry = entries.get(key)
            if entry is not None and entry[0] is ref:
                del entries[key]

        entries[key] = (weakref.ref(obj, forget), value)
        return value
