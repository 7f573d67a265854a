"""The fenced examples of a page in docs/, so tests can run every example the page shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(page: str, language: str) -> list[str]:
    """The page's fenced blocks in `language`, in order."""
    text = (DOCS / page).read_text()
    return [body for lang, body in _FENCE.findall(text) if lang == language]


def run_python(code: str, page: str) -> str:
    """Run an example script; returns what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOCS / page), "exec"), {"__name__": "__doc_example__"})
    return out.getvalue()
