"""The Python client's errors: a failed call raises a `GradingError`, never grpc's `_InactiveRpcError`.

Each carries what a caller acts on: the gRPC `code()` and `details()` (it stays a `grpc.RpcError`, so code
that catches those still does), the server it talked to (`target`), and the grader or reward the server
named, when it named one. The subclasses say what to do:

- `UnknownName` (NOT_FOUND): a grader or reward the server does not have; the message lists what it has.
- `InvalidRequest` (INVALID_ARGUMENT, OUT_OF_RANGE): bad params, a bad option, a limit; fix the request.
- `FailureBudgetExceeded` (FAILED_PRECONDITION): too many failed samples for `max_failure_ratio`.
- `ServerUnavailable` (UNAVAILABLE, after the client's `unavailable_seconds` of retries): the server is
  down or unreachable; a rolling restart shorter than that is ridden out.
- `NotAuthorized` (UNAUTHENTICATED, PERMISSION_DENIED): the token.
- `GradingError` itself for the rest (DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL...).
"""

from __future__ import annotations

import re

import grpc

#: Names the server's messages quote: "unknown grader 'x'", "grader 'x', parameter ...", "reward 'x'".
_GRADER = re.compile(r"grader '([^']*)'")
_REWARD = re.compile(r"reward '([^']*)'")


class GradingError(grpc.RpcError):
    """A call that failed: `code()`, `details()`, `target` (the server), `grader` / `reward` (when known)."""

    def __init__(
        self, code: grpc.StatusCode, details: str, target: str = "", grader: str = "", reward: str = ""
    ) -> None:
        self._code, self._details = code, details
        self.target = target
        found = _GRADER.search(details)
        self.grader = grader or (found.group(1) if found else "")
        found = _REWARD.search(details)
        self.reward = reward or (found.group(1) if found else "")
        super().__init__(str(self))

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def __str__(self) -> str:
        where = f" from {self.target}" if self.target else ""
        return f"{self._code.name}{where}: {self._details}"


class UnknownName(GradingError):
    """NOT_FOUND: the server has no grader (or reward) of that name; the message lists the ones it has."""


class InvalidRequest(GradingError):
    """INVALID_ARGUMENT or OUT_OF_RANGE: a bad parameter, option or size; the message names it."""


class FailureBudgetExceeded(GradingError):
    """The server ended a call because its failed samples passed `max_failure_ratio` (FAILED_PRECONDITION).
    The message says how many failed and names the grader with the most errors and its most frequent code."""

    def __init__(self, details: str, target: str = "") -> None:
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION, details, target)


class ServerUnavailable(GradingError):
    """UNAVAILABLE after the client retried for its `unavailable_seconds`: no server answered at `target`."""


class NotAuthorized(GradingError):
    """UNAUTHENTICATED or PERMISSION_DENIED: the server wants a (different) token."""


_BY_CODE: dict[grpc.StatusCode, type[GradingError]] = {
    grpc.StatusCode.NOT_FOUND: UnknownName,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRequest,
    grpc.StatusCode.UNAVAILABLE: ServerUnavailable,
    grpc.StatusCode.UNAUTHENTICATED: NotAuthorized,
    grpc.StatusCode.PERMISSION_DENIED: NotAuthorized,
}


def typed(exc: grpc.RpcError, target: str = "") -> GradingError:
    """A grpc error as the family's member for its code (itself when it already is one)."""
    if isinstance(exc, GradingError):
        if target and not exc.target:
            exc.target = target
        return exc
    code_of, details_of = getattr(exc, "code", None), getattr(exc, "details", None)
    code = code_of() if callable(code_of) else grpc.StatusCode.UNKNOWN
    details = (details_of() if callable(details_of) else None) or str(exc)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return FailureBudgetExceeded(details, target)
    return _BY_CODE.get(code, GradingError)(code, details, target)
