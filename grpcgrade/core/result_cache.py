"""Remembered results, content-addressed: the result cache and the quarantine.

Both key an entry by what decides a result: the grader's canonical name, its params, and the sample inputs
the grader declares (`select`), hashed together (BLAKE2b, 128 bits). Both are bounded twice: each entry
lives at most `ttl_seconds`, and all entries together take at most `max_bytes` (an estimate per entry: its
result's text and metadata plus a fixed overhead); past the bound the least recently used entries go.

- The **result cache** keeps successful results only: an error (a judge that failed, a sandbox that was
  unavailable) is never stored, so the next call grades the sample again.
- The **quarantine** keeps the samples whose grading ran past the time limit (TIMEOUT) or killed a worker
  (WORKER_LOST): the next time they come, they are answered at once with the same error code instead of
  holding a worker again.

Neither is shared between processes: they live in the server process and are lost on restart, which is
also how they are cleared for good. The clocks are parameters, so tests move time without sleeping.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

from grpcgrade.grader import BaseGrader, GraderError, GraderResult, GraderScore, Inputs

from .errors import ErrorCode, encodable
from .memo import IdentityMemo
from .metadata import CONTAINER_TYPES

V = TypeVar("V")

#: What an entry costs beyond its own text: the key, the store's node, the entry and result objects.
ENTRY_OVERHEAD_BYTES = 400
#: No single entry may take more than this share of the store's bound (a huge reason would flush it).
MAX_ENTRY_SHARE = 8
#: The error codes that put a sample in quarantine.
QUARANTINE_CODES = frozenset((ErrorCode.TIMEOUT, ErrorCode.WORKER_LOST))
#: Characters of a quarantined sample's inputs kept to show it (`grpcgrade quarantine list`).
PREVIEW_CHARS = 200


class CacheMode(StrEnum):
    """A call's use of the result cache."""

    #: The server's default for each grader: on where the grader class says `cache_by_default`.
    DEFAULT = "default"
    #: Neither read nor written for this call.
    OFF = "off"
    #: Read and written for every grader of this call.
    ON = "on"


@dataclass(frozen=True)
class CacheConfig:
    """The result cache (`cache:` in `--config`)."""

    enabled: bool = True
    max_bytes: int = 64 * 1024 * 1024
    ttl_seconds: float = 3600.0


@dataclass(frozen=True)
class QuarantineConfig:
    """The quarantine (`quarantine:` in `--config`)."""

    enabled: bool = True
    max_bytes: int = 8 * 1024 * 1024
    ttl_seconds: float = 3600.0


# -- keys --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """A built grader's part of every key: its canonical name and canonical params."""

    grader: str
    params: str  # JSON, keys sorted
    digest: bytes


_scopes: IdentityMemo[BaseGrader, Scope] = IdentityMemo()


def scope_of(grader: BaseGrader, params: dict[str, Any]) -> Scope:
    """The grader's scope, computed once per built grader (the registry builds one per name and params)."""
    scope = _scopes.get(grader)
    if scope is None:
        text = json.dumps(params, sort_keys=True, default=str, ensure_ascii=False)
        digest = hashlib.blake2b(f"{grader.name}\0{text}".encode(errors="surrogatepass"), digest_size=16).digest()
        scope = _scopes.put(grader, Scope(grader.name, text, digest))
    return scope


def _content(kwargs: dict[str, Any], inputs: Inputs) -> str:
    """The inputs as canonical JSON. The sample's id is left out unless the grader names `sample_id`:
    identical completions under different ids are the duplicates worth finding."""
    if "sample_id" in kwargs and "sample_id" not in inputs.names:
        kwargs = {k: v for k, v in kwargs.items() if k != "sample_id"}
    return json.dumps(kwargs, sort_keys=True, default=repr, ensure_ascii=False, separators=(",", ":"))


def content_key(scope: Scope, kwargs: dict[str, Any], inputs: Inputs) -> bytes:
    """The key of one grader's input: `kwargs` as the grader receives it (after `select`)."""
    h = hashlib.blake2b(scope.digest, digest_size=16)
    h.update(_content(kwargs, inputs).encode(errors="surrogatepass"))
    return h.digest()


# -- the bounded store ---------------------------------------------------------------------------------


@dataclass
class _Entry(Generic[V]):
    value: V
    size: int
    expires: float
    scope: Scope


class BoundedStore(Generic[V]):
    """A least-recently-used map with a time to live and a bound in bytes. Single-threaded (the server's
    event loop); the metrics thread only reads the counts."""

    def __init__(self, max_bytes: int, ttl_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.ttl = ttl_seconds
        self.clock = clock
        self.bytes = 0
        self._entries: OrderedDict[bytes, _Entry[V]] = OrderedDict()
        self._per_scope: Counter[bytes] = Counter()

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, scope: Scope) -> bool:
        """Whether any entry (perhaps expired) belongs to this grader and params."""
        return self._per_scope[scope.digest] > 0

    def get(self, key: bytes) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: bytes, value: V, size: int, scope: Scope) -> bool:
        """Store `value` (replacing any entry of the key); False when it is too large to keep."""
        size += ENTRY_OVERHEAD_BYTES
        if size > self.max_bytes // MAX_ENTRY_SHARE:
            return False
        if key in self._entries:
            self._drop(key)
        self._entries[key] = _Entry(value, size, self.clock() + self.ttl, scope)
        self._per_scope[scope.digest] += 1
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def _drop(self, key: bytes) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.size
        self._per_scope[entry.scope.digest] -= 1
        if not self._per_scope[entry.scope.digest]:
            del self._per_scope[entry.scope.digest]

    def purge(self) -> None:
        """Drop every expired entry."""
        now = self.clock()
        for key in [k for k, e in self._entries.items() if e.expires <= now]:
            self._drop(key)

    def items(self) -> Iterator[tuple[bytes, _Entry[V]]]:
        """The live entries, least recently used first."""
        self.purge()
        yield from list(self._entries.items())

    def clear(self, grader: str = "") -> int:
        """Drop every entry, or only `grader`'s; how many were dropped."""
        keys = [k for k, e in self._entries.items() if not grader or e.scope.grader == grader]
        for key in keys:
            self._drop(key)
        return len(keys)


def result_bytes(result: GraderResult) -> int:
    """An estimate of what a stored result holds beyond the fixed overhead."""
    size = len(result.reason) + len(result.name)
    if result.metadata:
        size += 2 * _held_bytes(result.metadata, set())
    if not isinstance(result, GraderScore | GraderError):
        size += 8 * len(result.rank) + 56
    return size


def _held_bytes(obj: Any, seen: set[int]) -> int:
    """About what `obj` takes as JSON: whatever a grader put in its metadata (a dict holding itself, an int
    too long for `str`), each container counted once."""
    if isinstance(obj, str):
        return len(obj) + 2
    if isinstance(obj, int):
        return obj.bit_length() // 3 + 1  # its decimal digits, about
    if obj is None or isinstance(obj, float):
        return 8
    if isinstance(obj, CONTAINER_TYPES):
        if id(obj) in seen:
            return 8
        seen.add(id(obj))
        if isinstance(obj, Mapping):
            return 2 + sum(_held_bytes(k, seen) + _held_bytes(v, seen) + 2 for k, v in obj.items())
        return 2 + sum(_held_bytes(v, seen) + 1 for v in obj)
    return sys.getsizeof(obj)


class ResultCache(BoundedStore[GraderResult]):
    """Successful results, stored marked `cached=True` so a hit is handed on as it is."""

    def store(self, key: bytes, result: GraderResult, scope: Scope) -> GraderResult | None:
        """Keep a success; the marked copy that hits will get, or None when nothing was kept."""
        if isinstance(result, GraderError):
            return None
        marked = dataclasses.replace(result, cached=True)
        return marked if self.put(key, marked, result_bytes(result), scope) else None


@dataclass
class Quarantined:
    """A sample in quarantine: the code and message it failed with, when (wall clock), a preview of its
    inputs, and how many times it was answered from here."""

    code: str
    message: str
    since: float
    expires: float
    preview: str
    limit: float | None = None  # a TIMEOUT's time limit: a call with a longer one grades the input again
    hits: int = 0


class Quarantine(BoundedStore[Quarantined]):
    """Samples that ran past the time limit or killed a worker, and are answered at once from here."""

    def __init__(
        self,
        max_bytes: int,
        ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(max_bytes, ttl_seconds, clock)
        self.wall_clock = wall_clock

    def add(
        self,
        key: bytes,
        error: GraderError,
        scope: Scope,
        kwargs: dict[str, Any],
        inputs: Inputs,
        limit: float | None = None,
    ) -> None:
        """Quarantine an input that failed with `error`; `limit`: the time limit a TIMEOUT ran past."""
        preview = encodable(_content(kwargs, inputs))  # HTTP bodies can carry lone surrogates; protobuf cannot
        if len(preview) > PREVIEW_CHARS:
            preview = preview[:PREVIEW_CHARS] + "..."
        message = error.error[: 2 * PREVIEW_CHARS]
        now = self.wall_clock()
        limit = limit if error.code == ErrorCode.TIMEOUT else None
        entry = Quarantined(error.code, message, now, now + self.ttl, preview, limit)
        self.put(key, entry, len(preview) + len(message) + len(scope.params), scope)

    def answer(self, key: bytes, grader: str, limit: float | None = None) -> GraderError | None:
        """The quarantined sample's error, or None when the sample is not in quarantine (or timed out under
        a shorter time limit than the call's `limit`: then it is graded again)."""
        entry = self.get(key)
        if entry is None or (entry.limit is not None and (limit is None or limit > entry.limit)):
            return None
        entry.hits += 1
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.since))
        message = (
            f"quarantined since {since} ({entry.message}): this input, grader and params are answered at once "
            f"with {entry.code}, not graded, until the entry expires ({self.ttl:g} s after) or "
            "`grpcgrade quarantine clear` removes it"
            + (f"; a call with a time limit over {entry.limit:g} s grades it again" if entry.limit else "")
        )
        return GraderError(grader, message, code=entry.code)
