"""What a running sample knows about its call without being handed it: who called, and its time limit.

Graders are called with a sample's fields only, yet an LLM judge needs two things about the call to pace
it against its model's limits: the **caller** (a trainer or experiment names itself, see
`CALLER_HEADER`), whose share of each model's capacity it spends, and the sample's **time limit**, within
which a rate-limited judgment may still be retried. The service sets the caller where a call arrives; the
grading loop sets the time limit per sample. Both are context variables, so each asyncio task (a call, a
sample) sees its own, and nothing is passed through the graders' signatures.
"""

from __future__ import annotations

import re
from contextvars import ContextVar

#: The gRPC metadata key and HTTP header by which a caller names itself (HTTP headers ignore case).
CALLER_HEADER = "x-grpcgrade-caller"
#: The caller of a call that names none.
DEFAULT_CALLER = "default"
MAX_CALLER_CHARS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9._:/@+=-]")

#: The caller of the call whose sample is being graded.
CALLER: ContextVar[str] = ContextVar("grpcgrade_caller", default=DEFAULT_CALLER)
#: The running sample's time limit in seconds (None: none), for graders that bound their own time.
SAMPLE_TIME_LIMIT: ContextVar[float | None] = ContextVar("grpcgrade_sample_time_limit", default=None)


def caller_name(raw: str | bytes | None) -> str:
    """A caller's name as given, made fit for a metric label and a log line: safe characters only, at most
    `MAX_CALLER_CHARS`; empty or absent is `DEFAULT_CALLER`."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    name = _UNSAFE.sub("_", (raw or "").strip()[:MAX_CALLER_CHARS])
    return name or DEFAULT_CALLER
