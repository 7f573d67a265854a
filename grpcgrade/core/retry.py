"""Backoff for HTTP services the server does not control (remote graders, LLM judges).

Exponential with jitter so a burst of failing samples does not retry in lockstep, never sooner than the
service's Retry-After, never longer than a cap.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

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
