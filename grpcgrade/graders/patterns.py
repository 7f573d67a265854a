"""Regular expressions that arrive in requests (`regex_match` patterns, `think_token`, `answer_token`): Python's
exact results at a bounded cost.

Users write these patterns in Python's syntax and expect Python's meaning, because the reference graders run
them with `re`. But a pattern is untrusted input, and Python's backtracking engine lets one pattern such as
`(a+)+$` run for minutes. So every pattern is parsed by Python's own parser (same syntax, same error messages,
same group numbers) and then runs on one of two engines:

- **RE2** (linear time; it cannot be made to backtrack) when the translation means exactly what Python means.
  Every single-character item (a literal under IGNORECASE, a class, `\\w`, `\\d`, `\\s`, their negations,
  `(?a)`) is written out as the explicit set of code points that *Python's own engine* matches for it under
  the pattern's flags, found by running that one item over every code point once (cached). RE2's Unicode
  tables and case folding therefore never decide anything: the i/I/İ/ı rules, the Unicode version of `\\w`
  and mixed negated classes are Python's by construction. Anchors, groups, alternation and repeats have the
  same leftmost-first meaning in both engines; `$` (not in MULTILINE) is translated only where nothing
  follows it and it is in no capturing group, where consuming a final newline cannot change any result.
- **Python's `re`** for everything else: lookaround, backreferences, conditionals, atomic groups, possessive
  quantifiers, repeats above 1000, `\\b`/`\\B` with Unicode word characters, `\\B` (Python never matches it on
  empty text), `$` followed by more pattern, and anything RE2 refuses to compile (too large). These are
  the patterns a time limit must bound: graders that may run them run **in a worker**, where the per-sample
  time limit interrupts Python's matcher (it checks for signals while it backtracks) and the pool's watchdog
  kills a worker that still does not return. A catastrophic pattern ends as `TIMEOUT` for its sample; the
  server's event loop never runs it. (Without a worker pool they run inline, bounded by the same limit.)

Why not the `regex` package and its `timeout=`: it is a different engine with its own Unicode tables and
case-folding rules, so some results would not be Python's, and running it inline would still block the event
loop for as long as its timeout.

Bounds: a pattern longer than `MAX_PATTERN_CHARS` is refused before anything is parsed or compiled, and
compiled patterns are cached within `PATTERN_CACHE_BYTES` (least recently used evicted first), so distinct
patterns from many requests cannot pile up memory. Python's `re` module cache is bypassed for the same reason.
"""

from __future__ import annotations

import _sre  # type: ignore[import-not-found]  # CPython's regex engine; typeshed has no stub for it
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from re import _compiler as sre_compile  # type: ignore[attr-defined]  # CPython's regex compiler
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

from grpcgrade.core.errors import as_value

#: Longest pattern (in characters) accepted from a request; longer ones are refused before compilation.
MAX_PATTERN_CHARS = 10_000
#: Memory the compiled-pattern cache may hold (estimated from pattern and program sizes).
PATTERN_CACHE_BYTES = 32 * 1024 * 1024
#: Memory the cache of character sets (one per distinct class under given flags) may hold.
CHAR_SET_CACHE_BYTES = 8 * 1024 * 1024
#: RE2's program memory per pattern; a pattern needing more runs on Python's engine instead.
_RE2_MAX_MEM = 8 * 1024 * 1024
#: Character sets computed by scanning every code point (~8 ms each) allowed per compilation before the
#: pattern goes to Python's engine instead, so one pattern of thousands of classes cannot stall a process.
_SCANS_PER_COMPILE = 32
#: RE2's largest counted repetition.
_RE2_MAX_REPEAT = 1000

_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)  # never in UTF-8 text, so RE2 cannot be asked about them
_TYPE_FLAGS = sre.SRE_FLAG_ASCII | sre.SRE_FLAG_LOCALE | sre.SRE_FLAG_UNICODE

#: Characters that make a pattern more than a literal string.
_SPECIAL = frozenset("\\.^$*+?{}[]|()")

Ranges = tuple[tuple[int, int], ...]


class PatternTooLong(ValueError):
    """A request's pattern exceeds MAX_PATTERN_CHARS; it is refused rather than compiled."""

    def __init__(self, length: int) -> None:
        super().__init__(f"pattern of {length} characters exceeds the limit of {MAX_PATTERN_CHARS}")


class _NeedsPython(Exception):
    """Internal: the pattern has something RE2 cannot do with Python's exact meaning."""


class ByteBoundedCache:
    """A least-recently-used map whose entries' estimated sizes sum to at most `budget` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: Any, cost: int) -> None:
        if cost > self.budget:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= old[1]
            self._items[key] = (value, cost)
            self.used += cost
            while self.used > self.budget:
                _, (_, evicted) = self._items.popitem(last=False)
                self.used -= evicted

    def __len__(self) -> int:
        return len(self._items)


# -- character sets, as Python's engine decides them ----------------------------------------------------------

_all_chars: str | None = None
_all_lock = threading.Lock()


def _every_code_point() -> str:
    """Every code point RE2 can see (all but surrogates), as one string; built once per process (~0.15 s)."""
    global _all_chars
    with _all_lock:
        if _all_chars is None:
            low, high = _SURROGATES
            _all_chars = "".join(map(chr, (*range(low), *range(high + 1, _MAX_CODE_POINT + 1))))
        return _all_chars


def warm_up() -> None:
    """Build the code-point table and the common classes' sets now (~0.2 s), so the first pattern a process
    sees does not pay for them inside its time limit: the warm-up (`BaseGrader.warm_up`) of the graders
    that take patterns. It runs Python's engine only (RE2 is C++, and a thread inside it when the process
    exits aborts it)."""
    scanner = _Scanner()
    for source in (r"\w", r"\W", r"\d", r"\s"):
        for flags in (0, sre.SRE_FLAG_IGNORECASE):
            parsed = sre_parse.parse(source, flags)
            for op, av in parsed.data:
                scanner.char_set(op, av, parsed.state.flags)


def _runs_to_ranges(runs: Iterable[Any]) -> Ranges:
    """Code point ranges from the matches of `item+` over `_every_code_point()` (which skips surrogates)."""
    gap = _SURROGATES[1] - _SURROGATES[0] + 1
    out: list[tuple[int, int]] = []
    for match in runs:
        start, end = match.span()
        low, high = (start, end - 1) if start < _SURROGATES[0] else (start + gap, end - 1 + gap)
        if start < _SURROGATES[0] <= end - 1:  # the run spans the skipped surrogates
            out += [(start, _SURROGATES[0] - 1), (_SURROGATES[1] + 1, end - 1 + gap)]
        else:
            out.append((low, high))
    return tuple(out)


_char_sets = ByteBoundedCache(CHAR_SET_CACHE_BYTES)


class _Scanner:
    """Computes the set of characters one single-character item matches, counting the scans it pays for."""

    def __init__(self) -> None:
        self.scans = 0

    def char_set(self, op: Any, av: Any, flags: int) -> Ranges:
        if op in (sre.LITERAL, sre.NOT_LITERAL) and (
            not flags & sre.SRE_FLAG_IGNORECASE or not _iscased(av, flags)
        ):  # exact comparison in Python's compiler too
            single = ((av, av),) if not _SURROGATES[0] <= av <= _SURROGATES[1] else ()
            return single if op is sre.LITERAL else _complement(single)
        key = (op, repr(av), flags & (sre.SRE_FLAG_IGNORECASE | _TYPE_FLAGS))
        found = _char_sets.get(key)
        if found is None:
            if self.scans >= _SCANS_PER_COMPILE:
                raise _NeedsPython("too many distinct character classes")
            self.scans += 1
            state = sre_parse.State()
            state.flags = flags
            item = sre_parse.SubPattern(state, [(op, av)])
            runs = sre_parse.SubPattern(state, [(sre.MAX_REPEAT, (1, sre.MAXREPEAT, item))])
            found = _runs_to_ranges(sre_compile.compile(runs, flags).finditer(_every_code_point()))
            _char_sets.put(key, found, 64 + 32 * len(found))
        return found


def _iscased(code: int, flags: int) -> bool:
    return _sre.ascii_iscased(code) if flags & sre.SRE_FLAG_ASCII else _sre.unicode_iscased(code)


def _complement(ranges: Ranges) -> Ranges:
    gaps, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            gaps.append((start, lo - 1))
        start = hi + 1
    if start <= _MAX_CODE_POINT:
        gaps.append((start, _MAX_CODE_POINT))
    low, high = _SURROGATES
    out: list[tuple[int, int]] = []
    for lo, hi in gaps:  # drop the surrogates, which no UTF-8 text holds
        if hi < low or lo > high:
            out.append((lo, hi))
        else:
            if lo < low:
                out.append((lo, low - 1))
            if hi > high:
                out.append((high + 1, hi))
    return tuple(out)


def _re2_char(code: int) -> str:
    return f"\\x{{{code:X}}}"


def _re2_set(ranges: Ranges) -> str:
    if not ranges:
        return f"[^\\x00-{_re2_char(_MAX_CODE_POINT)}]"  # matches nothing
    body = "".join(_re2_char(lo) if lo == hi else f"{_re2_char(lo)}-{_re2_char(hi)}" for lo, hi in ranges)
    return f"[{body}]"


# -- structure ------------------------------------------------------------------------------------------------


def _combine_flags(flags: int, add: int, remove: int) -> int:
    if add & _TYPE_FLAGS:
        flags &= ~_TYPE_FLAGS
    return (flags | add) & ~remove


def _anchor(code: Any, flags: int, final: bool) -> str:
    multiline = flags & sre.SRE_FLAG_MULTILINE
    if code is sre.AT_BEGINNING:
        return "(?m:^)" if multiline else r"\A"
    if code is sre.AT_BEGINNING_STRING:
        return r"\A"
    if code is sre.AT_END:
        if multiline:
            return "(?m:$)"
        if final:  # nothing follows and no group sees it: consuming the final newline changes nothing
            return r"(?:\n?\z)"
        raise _NeedsPython("$ followed by more pattern")
    if code is sre.AT_END_STRING:
        return r"\z"
    if code is sre.AT_BOUNDARY and flags & sre.SRE_FLAG_ASCII:
        return r"\b"  # ASCII word characters in both engines
    raise _NeedsPython(f"anchor {code}")


def _repeat(lo: int, hi: int) -> str:
    if lo > _RE2_MAX_REPEAT or (hi != sre.MAXREPEAT and hi > _RE2_MAX_REPEAT):
        raise _NeedsPython("repeat count above RE2's limit")
    if hi == sre.MAXREPEAT:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _emit(items: Any, flags: int, final: bool, captured: bool, scanner: _Scanner) -> str:
    """RE2 syntax for a parsed Python pattern. `final`: nothing in the pattern can follow these items;
    `captured`: they are inside a capturing group."""
    out = []
    last = len(items) - 1
    for index, (op, av) in enumerate(items):
        at_end = final and index == last
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.IN):
            out.append(_re2_set(scanner.char_set(op, av, flags)))
        elif op is sre.ANY:
            out.append(r"(?s:.)" if flags & sre.SRE_FLAG_DOTALL else r"[^\n]")
        elif op is sre.AT:
            out.append(_anchor(av, flags, at_end and not captured))
        elif op is sre.BRANCH:
            out.append(f"(?:{'|'.join(_emit(b, flags, at_end, captured, scanner) for b in av[1])})")
        elif op is sre.SUBPATTERN:
            group, add, remove, sub = av
            inner = _emit(sub, _combine_flags(flags, add, remove), at_end, captured or group is not None, scanner)
            out.append(f"({inner})" if group is not None else f"(?:{inner})")
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            lo, hi, sub = av
            if hi > 1 and _captures(sub) and _nullable(sub):
                # Python runs one more, empty, iteration that resets the groups inside; RE2 does not
                raise _NeedsPython("a repeated group that can match the empty string")
            lazy = "?" if op is sre.MIN_REPEAT else ""
            out.append(f"(?:{_emit(sub, flags, False, captured, scanner)}){_repeat(lo, hi)}{lazy}")
        else:  # backreferences, lookaround, conditionals, atomic groups, possessive repeats
            raise _NeedsPython(str(op))
    return "".join(out)


def _nullable(items: Any) -> bool:
    """Can these (translatable) items match the empty string?"""
    for op, av in items:
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.IN, sre.ANY):
            return False
        if op is sre.BRANCH and not any(_nullable(branch) for branch in av[1]):
            return False
        if op is sre.SUBPATTERN and not _nullable(av[3]):
            return False
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) and av[0] > 0 and not _nullable(av[2]):
            return False
    return True


def _captures(items: Any) -> bool:
    """Is there a capturing group among these items?"""
    for op, av in items:
        if op is sre.SUBPATTERN and (av[0] is not None or _captures(av[3])):
            return True
        if op is sre.BRANCH and any(_captures(branch) for branch in av[1]):
            return True
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) and _captures(av[2]):
            return True
    return False


def to_re2(pattern: str, flags: int = 0) -> str | None:
    """RE2 syntax meaning exactly what Python means by `pattern`, or None when only Python's engine can run
    it. Raises `re.error` (Python's message) for an invalid pattern."""
    parsed = sre_parse.parse(pattern, flags)
    try:
        return _emit(parsed.data, parsed.state.flags, True, False, _Scanner())
    except _NeedsPython:
        return None


# -- compiled patterns ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    """A compiled request pattern. `bounded`: its search runs in linear time (RE2, or a case-sensitive
    literal, which Python searches with a precomputed overlap table); otherwise a time limit must bound it."""

    source: str
    flags: int
    engine: str  # "re2" or "python"
    bounded: bool
    _regex: Any

    def search(self, text: str) -> tuple[str | None, ...] | None:
        """The groups of the first match (Python's `re.search(...).groups()`), or None for no match."""
        regex = self._regex
        if self.engine == "re2" and _has_surrogates(text):  # only Python strings built outside gRPC
            regex = sre_compile.compile(self.source, self.flags)
        match = regex.search(text)
        return None if match is None else tuple(match.groups())


def _has_surrogates(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_patterns = ByteBoundedCache(PATTERN_CACHE_BYTES)


def compile_pattern(pattern: str, flags: int = 0) -> Pattern:
    """The pattern compiled for the engine that gives Python's result; raises `re.error` with Python's message
    for an invalid pattern and PatternTooLong above MAX_PATTERN_CHARS. Results (errors included) are cached."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternTooLong(len(pattern))
    key = (pattern, flags)
    cached = _patterns.get(key)
    if cached is None:
        cached = _compile(pattern, flags)
        _patterns.put(key, cached, sys.getsizeof(pattern) + _footprint(cached))
    if isinstance(cached, Exception):
        raise cached
    return cached


def _footprint(compiled: Pattern | Exception) -> int:
    """Estimated bytes held: Python's compiled code (its `__sizeof__` counts it), or RE2's program."""
    if isinstance(compiled, Exception):
        return 256
    if compiled.engine == "re2":
        return 1024 + 64 * compiled._regex.programsize + 4 * len(compiled._regex.pattern)
    return sys.getsizeof(compiled._regex)


def _compile(pattern: str, flags: int) -> Pattern | Exception:
    import re

    if _SPECIAL.isdisjoint(pattern) and not flags & sre.SRE_FLAG_IGNORECASE:
        return Pattern(pattern, flags, "python", True, sre_compile.compile(pattern, flags))
    try:
        translated = to_re2(pattern, flags)
    except re.error as exc:
        return as_value(exc)  # cached: without the frames of its compiling
    if translated is not None:
        import re2

        options = re2.Options()
        options.log_errors = False
        options.max_mem = _RE2_MAX_MEM
        try:
            return Pattern(pattern, flags, "re2", True, re2.compile(translated, options))
        except re2.error:
            pass  # too large for RE2's budget: Python's engine, under the time limit
    try:
        return Pattern(pattern, flags, "python", False, sre_compile.compile(pattern, flags))
    except re.error as exc:
        return as_value(exc)
