"""Expected scores computed with the libraries the graders stand on, for the tests that check graders'
results over a real server: never copied from the service's own output."""

from __future__ import annotations

import json


def json_score(text: str) -> float:
    """`json_validator`'s score: 1.0 when Python's `json` parses the text, else 0.0."""
    try:
        json.loads(text)
    except ValueError:
        return 0.0
    return 1.0
