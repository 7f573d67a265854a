"""Every error the service names, defined once: the codes of per-sample error results and the exceptions
that refuse a request.

`ErrorCode` is what a trainer sees in `GraderResult.error.code` (a string on the wire, so new codes are an
additive change); plugin authors return `GraderError(..., code=ErrorCode.INVALID_SAMPLE)` instead of
spelling the string. The exceptions below are raised while a request is resolved; the service turns each
into one status (INVALID_ARGUMENT, NOT_FOUND), and the command line into one message.
"""

from __future__ import annotations

import asyncio
import difflib
import re
from enum import StrEnum
from typing import TypeVar

MAX_NAME_CHARS = 100  # a name a request chose, as an error message repeats it
MAX_DETAIL_CHARS = 500  # an error message built from request values never grows past this
#: What a grader's exception says is cut to this in its sample's error: exceptions that echo their input
#: (a whole completion, say) would otherwise make every failed sample's answer as large as its request.
MAX_ERROR_CHARS = 2000

_SURROGATES = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """`text` with each surrogate code point (which UTF-8 cannot encode, so protobuf refuses the string)
    replaced by U+FFFD, as a UTF-8 decoder does with bytes it cannot read."""
    return _SURROGATES.sub("\N{REPLACEMENT CHARACTER}", text)


def describe(obj: object, limit: int | None = None) -> str:
    """`str(obj)` made encodable (and cut to `limit` characters, then "…"), or the type's name in brackets
    when `str` itself fails (an exception whose `__str__` raises, an int past CPython's 4300 digits): an
    error's message must never fail in turn."""
    try:
        text = str(obj)
    except Exception:  # noqa: BLE001 - whatever stops the description, the type still describes it
        return f"<{type(obj).__name__}>"
    if limit is not None and len(text) > limit:
        text = text[:limit] + "\N{HORIZONTAL ELLIPSIS}"
    return encodable(text)


class ErrorCode(StrEnum):
    """Why a sample has no score from a grader. The reward of such a sample is absent (masked)."""

    #: The grader raised on this sample.
    GRADER_FAILED = "GRADER_FAILED"
    #: The sample cannot be graded: over a size limit, a reserved `extra` key, an input the grader refuses, text an
    #: HTTP face's JSON carried that UTF-8 cannot encode (a lone surrogate, `"\ud800"`).
    INVALID_SAMPLE = "INVALID_SAMPLE"
    #: The grader returned something that is not a finite score or a valid rank.
    INVALID_RESULT = "INVALID_RESULT"
    #: The sample ran past the per-sample time limit.
    TIMEOUT = "TIMEOUT"
    #: The worker process grading the sample died twice; the sample is reported, never dropped.
    WORKER_LOST = "WORKER_LOST"
    #: No worker process could take the sample: none can be kept up (each one started dies before it is
    #: ready; the health check says NOT_SERVING): nothing about the sample was judged, and grading it again
    #: once the server is SERVING may succeed.
    WORKER_UNAVAILABLE = "WORKER_UNAVAILABLE"
    #: The call was cancelled (or passed its deadline) before this sample was graded; nobody reads it.
    CANCELLED = "CANCELLED"
    #: The code sandbox could not run the sample's program (it failed to start, its service answered 5xx
    #: or was overloaded): nothing about the program was judged, and grading it again later may succeed.
    SANDBOX_UNAVAILABLE = "SANDBOX_UNAVAILABLE"
    #: The call's step budget (`budget_seconds`) ran out before this sample was graded.
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    #: The sample's time limit ran out while its judge model's provider limits held it back (its turn under
    #: `requests_per_minute`, `tokens_per_minute`, `max_concurrency`, or a 429/503's Retry-After): nothing
    #: was judged, and grading it again when the model is less busy may succeed.
    RATE_LIMITED = "RATE_LIMITED"


class InvalidParams(ValueError):
    """A construction parameter is wrong. The request is refused with INVALID_ARGUMENT naming `param`."""

    def __init__(self, param: str, message: str, grader: str = "") -> None:
        if len(param) > MAX_NAME_CHARS:
            param = param[:MAX_NAME_CHARS] + "..."
        if len(message) > MAX_DETAIL_CHARS:
            message = f"{message[:MAX_DETAIL_CHARS]}... (cut)"
        super().__init__(f"{f'grader {grader!r}, ' if grader else ''}parameter {param!r}: {message}")
        self.param, self.reason, self.grader = param, message, grader

    def of_grader(self, grader: str) -> InvalidParams:
        """This refusal (of whatever subclass), now naming the grader the params were for."""
        if not self.grader:
            self.grader = grader
            self.args = (f"grader {grader!r}, {self.args[0]}", *self.args[1:])
        return self


def _cut(name: str) -> str:
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS] + "..."


def _did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""


class UnknownGrader(LookupError):
    """No installed plugin or configuration registered this grader name (NOT_FOUND). `failed`: the plugins
    that failed to load ((name, error) pairs), named too: the grader may be one of theirs."""

    def __init__(self, name: str, known: list[str], failed: list[tuple[str, str]] | None = None) -> None:
        broken = "".join(f"; plugin {p!r} failed to load: {_cut(error)}" for p, error in failed or ())
        super().__init__(f"unknown grader {_cut(name)!r}{_did_you_mean(name, known)}{broken}")
        self.name = name


class UnknownReward(LookupError):
    """The server configuration defines no reward of this name (NOT_FOUND)."""

    def __init__(self, name: str, known: list[str]) -> None:
        if known:
            listed = f"; configured rewards: {', '.join(map(repr, known[:20]))}{' ...' if len(known) > 20 else ''}"
        else:
            listed = "; this server has no rewards configured (start it with --config FILE defining `rewards:`)"
        super().__init__(f"unknown reward {_cut(name)!r}{_did_you_mean(name, known)}{listed}")
        self.name = name


class ConfigError(ValueError):
    """A configuration file is wrong; the message names the file and the key."""


class ClusterUnreachable(ConnectionError):
    """`serve --ray ADDRESS`: nothing answers at the Ray cluster's address (`address`)."""

    def __init__(self, address: str, why: str) -> None:
        super().__init__(f"no Ray cluster answers there ({why})")
        self.address = address


class PortUnavailable(OSError):
    """An address the server was told to listen on cannot be bound; `option` is the ServeOptions field
    (port, metrics_port, http_port), which the command line names as its flag."""

    def __init__(self, option: str, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {reason}")
        self.option, self.host, self.port = option, host, port


class SampleProblem(ValueError):
    """This sample cannot be graded at all; every grader reports it as INVALID_SAMPLE."""


class UnsendableSample(Exception):  # noqa: N818 - named for what it is; raised as one of the two below
    """A sample a client cannot write into a request (a lone surrogate in a text, a value `extra` cannot
    carry...): raised before any server sees it, as `UnsendableValue` or `UnsendableType`, which are also
    the ValueError or TypeError the client has always raised for it. `index`: the sample's place in its
    batch (None for a sample sent alone). A trainer's integration catches this one to mask the sample."""

    index: int | None = None


class UnsendableValue(UnsendableSample, ValueError):
    """A sample with a value of the right type the client cannot send (see `UnsendableSample`)."""


class UnsendableType(UnsendableSample, TypeError):
    """A sample, or a value in it, of a type the client cannot send (see `UnsendableSample`)."""


Kept = TypeVar("Kept", bound=BaseException)


def as_value(exc: Kept) -> Kept:
    """`exc` without its traceback, to be kept as a value (a sample's problem, a pattern that does not
    compile). A traceback holds the frames the exception passed through and their locals (the sample's
    texts); where one of those frames also holds the list the exception is kept in, that is a reference
    cycle only the garbage collector frees, which a serving process runs seldom: an HTTP face process
    grew by the 8 MB texts of every rejected sample (1.4 GB after nine rounds of 16 posts)."""
    exc.__traceback__ = None
    return exc


class GraderTimeout(BaseException):
    """Raised inside a grader whose sample ran past the time limit.

    A `BaseException`, like `KeyboardInterrupt`: a grader's own `except Exception` (a fallback score, a
    retry) must not turn the timeout into a score; only the grading loop catches it.
    """


class GraderRateLimited(BaseException):
    """Raised inside a grader whose sample's time limit ran out while its model's provider limits held it
    back: the sample is answered RATE_LIMITED. A `BaseException` for the reason given at `GraderTimeout`."""


class GraderCancelled(BaseException):
    """Raised inside a grader whose call was cancelled or ran past its deadline: nobody waits for the result."""


class GraderOverBudget(BaseException):
    """Raised inside a grader whose sample was running when its call's step budget ran out: the sample is
    answered BUDGET_EXCEEDED. A `BaseException` for the reason given at `GraderTimeout`."""


#: What a grading loop lets through instead of recording it as a sample's result: a cancelled call's
#: unwinding and the interpreter's own exits. Any other exception a grader raises, a library's
#: `BaseException` included (math-verify's TimeoutException is one), is that sample's error, never the
#: end of its chunk or its call.
NOT_A_RESULT: tuple[type[BaseException], ...] = (
    GraderCancelled,
    KeyboardInterrupt,
    SystemExit,
    GeneratorExit,
    asyncio.CancelledError,
)


class TooManyFailures(Exception):
    """A call's failures passed its failure budget (`max_failure_ratio`): the call ends with
    FAILED_PRECONDITION; the message names the grader with the most errors and its most frequent code."""


#: How a refusal for load begins (`Overloaded`): the request log leaves these out (they are counted).
OVERLOADED = "server busy"
#: How a refusal begins while the server's workers cannot grade (`CannotGrade`).
CANNOT_GRADE = "no worker can grade"


class Refused(Exception):
    """A call refused at once as it arrives, before any of it is graded, for the server's state and not for
    anything in the request: sending it again later (or to another replica) may succeed, after
    `retry_after` seconds. The faces answer HTTP 503 with Retry-After; gRPC's status is the subclass's."""

    retry_after: float


class Overloaded(Refused):
    """The server holds as much as its admission limits allow (`limits.max_concurrent_calls`,
    `max_queued_samples`, `max_memory_bytes`): the call is refused at once, before any work, with
    RESOURCE_EXHAUSTED (HTTP 503) and `retry_after` seconds as the retry hint; `limit` names the limit."""

    def __init__(self, limit: str, message: str, retry_after: float) -> None:
        super().__init__(f"{OVERLOADED}: {message} (limits.{limit}); retry in {retry_after:g} s")
        self.limit, self.retry_after = limit, retry_after


class CannotGrade(Refused):
    """The server's workers cannot grade: every process started in a worker's place dies before it is ready
    (a plugin that kills its process, a module missing from the workers' path; on Ray, also no actor up for
    a while). The health check says NOT_SERVING, and a call is refused at once with UNAVAILABLE (HTTP 503),
    which gRPC's retry policy sends again, to another replica when there is one, rather than held until
    its deadline. `why` is what the executor last saw."""

    def __init__(self, why: str, retry_after: float) -> None:
        super().__init__(f"{CANNOT_GRADE}: {why}; retry in {retry_after:g} s")
        self.retry_after = retry_after
