"""The Python grader API: what a grader is and what it returns.

It follows the seeds' grader spec (RM-Gallery / OpenJudge `BaseGrader`, `GraderScore`, `GraderRank`)
so a grader written for those libraries ports by changing its imports. Nothing here knows about gRPC:
graders are plain Python objects that the service (or a test) calls with keyword arguments.

Results are dataclasses rather than pydantic models because they cross process boundaries by the
thousand per second and must pickle cheaply.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import partial
from typing import Any

from .core.errors import ErrorCode
from .core.errors import InvalidParams as InvalidParams  # re-exported: part of the grader API


class GraderMode(StrEnum):
    """Pointwise graders score one response; listwise graders rank several (`responses`)."""

    POINTWISE = "pointwise"
    LISTWISE = "listwise"


@dataclass
class GraderScore:
    """A pointwise result. `score` is not range-checked: penalty graders return negative scores."""

    name: str
    score: float
    reason: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Set by the service on a result answered from its result cache, not graded now.
    cached: bool = field(default=False, kw_only=True, compare=False, repr=False)


@dataclass
class GraderRank:
    """A listwise result: `rank[i]` is the rank of `responses[i]`, 1 being the best."""

    name: str
    rank: list[int]
    reason: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Set by the service on a result answered from its result cache, not graded now.
    cached: bool = field(default=False, kw_only=True, compare=False, repr=False)


@dataclass
class GraderError:
    """A grader that failed on one sample: the service reports it for that sample and grader only."""

    name: str
    error: str
    reason: str = ""
    code: str = ErrorCode.GRADER_FAILED
    metadata: dict[str, Any] = field(default_factory=dict)


GraderResult = GraderScore | GraderRank | GraderError


class BaseGrader:
    """Base class of every grader.

    Implement `async aevaluate(**kwargs)` (I/O-bound graders, e.g. LLM judges) or a plain
    `evaluate(**kwargs)` (CPU-bound graders): the service then calls it without an event loop, inline
    or in a worker process. Set `heavy = True` on graders whose per-call cost (milliseconds) is worth a
    process hop per grader and chunk even beside async graders, or for a single sample.
    """

    heavy: bool = False
    mode: GraderMode = GraderMode.POINTWISE
    #: True for graders whose I/O bounds itself (per-attempt timeouts, a bounded number of retries), such
    #: as LLM judges and remote HTTP graders: the service's per-sample time limit would also count the time
    #: a sample queues for the grader's concurrency slots, so it is not applied to them.
    bounds_own_time: bool = False
    #: True for graders whose work per sample is bounded by the sample's size (a parser, a count, patterns
    #: the grader itself wrote): the server may grade a small batch of them inline, on its event loop,
    #: instead of a hop to a worker (see docs/architecture.md). Never for graders that run what a request
    #: supplies (its regular expressions, code, models) or that call out.
    bounded_cost: bool = False
    #: Optional fast path for the scores view: a method `score_column(self, response, ...)` whose parameters
    #: name text fields of the sample (query, response, reference, context), each given as the list of a
    #: chunk's values, returning one score per sample, each exactly `evaluate(...)`'s score. The service
    #: uses it where no reason or metadata is asked for; results are checked as `evaluate`'s are, and if
    #: it raises or runs past the time limit, the chunk is graded sample by sample instead.
    score_column: Callable[..., Sequence[float]] | None = None
    #: True for graders worth the result cache by default: expensive (a judge model, a sandbox, a remote
    #: service, a symbolic verifier) and giving the same result for the same inputs and params. A call may
    #: still turn the cache off (CACHE_MODE_OFF), or on for any grader (CACHE_MODE_ON).
    cache_by_default: bool = False
    #: Inputs the grader cannot grade without, beyond its parameters without a default: a sample that lacks
    #: one is that sample's INVALID_SAMPLE naming it, instead of graded as "" (two absent texts "match").
    #: Names as the grader declares them (`reference_response` is the sample's `reference`).
    required_inputs: frozenset[str] = frozenset()

    def __init__(
        self,
        name: str = "",
        mode: GraderMode | str | None = None,
        description: str = "",
        **kwargs: Any,
    ) -> None:
        # The registry names a grader it builds after its registration; the class name serves direct use.
        # `description` is shown for graders registered as instances (a Kolibrify configuration's own);
        # for registered classes and functions ListGraders shows the registration's or the docstring's.
        # Extra keyword arguments are accepted, as OpenJudge's BaseGrader does, so its graders port as they are.
        self.name = name or type(self).__name__
        self.mode = GraderMode(mode) if mode else type(self).mode
        self.description = description

    def warm_up(self) -> None:
        """Import and load what the first sample would (dictionaries, libraries): called once per process
        before the server says SERVING, so no request pays a cold start. Optional."""

    def evaluate(self, **kwargs: Any) -> GraderResult:
        raise NotImplementedError(f"{type(self).__name__} implements neither evaluate nor aevaluate")

    async def aevaluate(self, **kwargs: Any) -> GraderResult:
        return self.evaluate(**kwargs)

    @property
    def is_sync(self) -> bool:
        """True when the grader has a plain `evaluate`, so it can run without an event loop."""
        return type(self).evaluate is not BaseGrader.evaluate

    def input_names(self) -> Inputs:
        """The sample fields this grader names, whether it also takes `**kwargs` (then all of them), and
        which it requires (`required_inputs`, and its parameters without a default)."""
        inputs = declared_names(self.evaluate if self.is_sync else self.aevaluate)
        return replace(inputs, required=inputs.required | self.required_inputs)


@dataclass(frozen=True)
class Inputs:
    names: frozenset[str]
    open: bool  # the grader takes **kwargs
    #: The inputs a sample must carry (a parameter without a default, or `BaseGrader.required_inputs`).
    required: frozenset[str] = frozenset()


def declared_names(func: Callable[..., Any]) -> Inputs:
    params = inspect.signature(func).parameters.values()
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = frozenset(p.name for p in named if p.default is p.empty)
    return Inputs(frozenset(p.name for p in named), any(p.kind is p.VAR_KEYWORD for p in params), required)


def unwrapped(func: Callable[..., Any]) -> Callable[..., Any]:
    """The function under `functools.partial` layers: what names and describes a function grader made from
    a partial (a partial has no `__name__`, and its docstring is the partial class's own)."""
    while isinstance(func, partial):
        func = func.func
    return func


def _score(value: Any) -> Any:
    """A function's score as the result check takes it: an int or a float made a float (the check's fast
    path); anything else as it is, for the check to make a float or refuse (INVALID_RESULT), as it does a
    class grader's score: another real number (numpy's float32, a Fraction), an int no double holds, a
    string."""
    if isinstance(value, (int, float)):
        with contextlib.suppress(OverflowError):
            return float(value)
    return value


def to_result(name: str, mode: GraderMode, value: Any) -> GraderResult:
    """Accept what a function grader naturally returns: a result object, a number, a `(score, reason)`
    pair, or a rank list.

    Any real number is a score as it is (numpy's float32 from a float32 array, a Fraction): the result check
    makes it a float, or an INVALID_RESULT when no double holds it, as for a class grader's score. A pair's
    score and reason go to the same check (a score "0.5" is no number; a reason None is none)."""
    if isinstance(value, (GraderScore, GraderRank, GraderError)):
        return value
    if mode is GraderMode.POINTWISE:
        if isinstance(value, (float, int, numbers.Real)):  # float and int first: the ABC's check costs more
            return GraderScore(name=name, score=_score(value))
        if isinstance(value, tuple) and len(value) == 2:
            return GraderScore(name=name, score=_score(value[0]), reason=value[1])
    if mode is GraderMode.LISTWISE and isinstance(value, list):
        return GraderRank(name=name, rank=value)  # checked where it is graded: whole numbers, a permutation
    raise TypeError(f"grader {name!r} returned {type(value).__name__}, not a {mode.value} result")


class FunctionGrader(BaseGrader):
    """A grader made from a function of the sample's fields.

    The function may be sync or async and may return a `GraderScore`/`GraderRank`, a number
    (pointwise), a `(score, reason)` pair, or a rank list (listwise).
    """

    def __init__(
        self,
        func: Callable[..., Any],
        name: str = "",
        mode: GraderMode | str | None = None,
        description: str = "",
        **kwargs: Any,
    ) -> None:
        inner = unwrapped(func)
        super().__init__(
            name=name or getattr(inner, "__name__", type(inner).__name__),
            mode=mode,
            description=description or (inspect.getdoc(inner) or "").split("\n")[0],
        )
        self.func = func
        self.kwargs = kwargs  # bound extra arguments of `func` (a request's params)
        # A callable object's `__call__` may be the coroutine function (`iscoroutinefunction` of the object
        # itself says no); a partial of a coroutine function is one.
        self._async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)

    @property
    def is_sync(self) -> bool:
        return not self._async

    def evaluate(self, **kwargs: Any) -> GraderResult:
        return to_result(self.name, self.mode, self.func(**kwargs, **self.kwargs))

    async def aevaluate(self, **kwargs: Any) -> GraderResult:
        if self._async:
            return to_result(self.name, self.mode, await self.func(**kwargs, **self.kwargs))
        return self.evaluate(**kwargs)

    def input_names(self) -> Inputs:
        inputs = declared_names(self.func)
        bound = set(self.kwargs)
        return Inputs(inputs.names - bound, inputs.open, (inputs.required | self.required_inputs) - bound)

    @classmethod
    def wrap(cls, func: Callable[..., Any], **options: Any) -> Callable[..., FunctionGrader]:
        """A factory for `register`: params of the request become extra keyword arguments of `func`."""
        return partial(cls, func, **options)


def is_finite_score(value: float) -> bool:
    """Scores that reach a trainer must be real numbers: NaN or inf becomes an error result, and so does an
    int no double can hold."""
    try:
        return isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:
        return False
