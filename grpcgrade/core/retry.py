"""HTTP services the server does not control (remote graders, LLM judges): backoff, how much of an answer
is read, and what of their error answers may be shown.

Exponential backoff with jitter so a burst of failing samples does not retry in lockstep, never sooner
than the service's Retry-After, never longer than a cap. An error answer's body goes into the sample's
error message, cut short and with credentials taken out: some endpoints echo the request, headers and
API key included, in their error pages.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping

#: The largest answer read from such a service (a judgment, a pair of embeddings, a chunk's rewards are far
#: smaller); past it the answer is an error, read no further.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: How much of an error answer's body an error message repeats.
ERROR_EXCERPT_CHARS = 300
REDACTED = "[redacted]"
# An Authorization header or a bearer token, wherever an echo puts it (a header line, JSON, a query string).
_CREDENTIALS = re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?(?:[a-z]+\s+)?|bearer\s+)[^\s\"',;&]+")


def error_excerpt(body: str, secrets: Iterable[str] = ()) -> str:
    """The start of an error answer's body, fit for an error message: the given secrets (the API key) and
    any Authorization value or bearer token replaced by `[redacted]`."""
    for secret in secrets:
        if secret:
            body = body.replace(secret, REDACTED)
    body = _CREDENTIALS.sub(lambda m: m.group(1) + REDACTED, body)
    return body[:ERROR_EXCERPT_CHARS]


#: The longest pause between two attempts, whatever the backoff or a Retry-After header says.
MAX_BACKOFF_SECONDS = 30.0


def is_transient(status: int) -> bool:
    """Worth retrying: the service is overloaded (429) or failing (5xx); other 4xx will fail again."""
    return status == 429 or status >= 500


def retry_after(headers: Mapping[str, str]) -> float | None:
    """A Retry-After header in seconds; its HTTP-date form is rare on these APIs and ignored."""
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except ValueError:
        return None


def backoff(attempt: int, base: float, after: float | None = None) -> float:
    """The pause before retry `attempt` (0-based): base * 2^attempt jittered to 50-100 %, at least `after`."""
    delay = min(base * 2**attempt, MAX_BACKOFF_SECONDS)
    return min(MAX_BACKOFF_SECONDS, max(after or 0.0, random.uniform(delay / 2, delay)))
