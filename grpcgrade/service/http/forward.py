"""The HTTP faces' link to the engine: `link.EngineLink`, whose failed engine calls are HTTP answers
(`unavailable`: the engine's process refusing (RESOURCE_EXHAUSTED, its retry hint) or unreachable
(restarting, draining) is 503 with Retry-After, anything else 502, never a made-up reward), and the bound
on how deep a sample's values may nest to travel in the contract (`too_deep`).
"""

from __future__ import annotations

import math
from typing import Any

import grpc
from aiohttp import web

from grpcgrade.core.errors import CANNOT_GRADE

from .. import link
from ..link import FORWARD_PIECE, Metadata
from ..overload import PUSHBACK_KEY

__all__ = ["FORWARD_PIECE", "MAX_VALUE_LEVELS", "NESTING", "UNREACHABLE_RETRY_SECONDS", "EngineLink", "too_deep"]

#: How deep a value in a sample's `extra` (or one entry of an agent input) may nest, in protobuf messages:
#: what a BatchEvaluateRequest carries under protobuf's parsing depth of 100 (measured), a JSON list being
#: two messages (Value, ListValue) and an object three (Value, Struct, its map entry): 48 lists, or 32
#: objects. A face refuses a deeper one as its sample's problem: the engine's process could not parse the
#: call, and every other sample of it would fail too.
MAX_VALUE_LEVELS = 97
#: That bound in a message's words.
NESTING = "at most 48 lists or 32 objects deep"
#: The retry hint of a 503 for an engine that did not answer (seconds).
UNREACHABLE_RETRY_SECONDS = 1

#: gRPC statuses that mean "not now" (the engine's process refused, restarts or drains): 503.
_UNAVAILABLE = frozenset((grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE))


def too_deep(value: Any) -> bool:
    """Whether `value`, as a Sample's `extra` value or one entry of an agent input, nests deeper than
    protobuf parses (`MAX_VALUE_LEVELS`): a list costs two message levels, an object three (its map entry)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > MAX_VALUE_LEVELS:
            return True
        if isinstance(item, dict):
            stack.extend((child, level + 3) for child in item.values() if isinstance(child, dict | list | tuple))
            if item and level + 3 > MAX_VALUE_LEVELS:
                return True
        elif isinstance(item, list | tuple):
            stack.extend((child, level + 2) for child in item if isinstance(child, dict | list | tuple))
            if item and level + 2 > MAX_VALUE_LEVELS:
                return True
    return False


def unavailable(code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> web.HTTPException:
    """An engine call that failed, in HTTP words: its refusal or absence 503 with a retry hint (the
    engine's own when it gave one), anything else 502 naming the status; never a reward."""
    if code in _UNAVAILABLE:
        hint = UNREACHABLE_RETRY_SECONDS
        for key, value in trailing:
            if key == PUSHBACK_KEY and str(value).isdigit():
                hint = max(1, math.ceil(int(value) / 1000))
        text = details or "the grading engine is not reachable"
        if code is grpc.StatusCode.UNAVAILABLE and not text.startswith(CANNOT_GRADE):  # else the engine's refusal
            text = f"the grading engine is not reachable now ({text}); retry"
        return web.HTTPServiceUnavailable(text=text, headers={"Retry-After": str(hint)})
    return web.HTTPBadGateway(text=f"the grading engine answered {code.name}: {details}")


class EngineLink(link.EngineLink):
    """The link as the HTTP faces use it: an engine call that failed is an HTTP answer (`unavailable`)."""

    def failed(self, code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> BaseException:
        return unavailable(code, details, trailing)
