"""Which part of a completion is the program.

The rule (documented in docs/code-rewards.md):

1. the last fenced block (```` ``` ````) whose info string names the language (`python`, `py`, `cpp`,
   `c++`, `js`...), else the last fenced block with no info string;
2. a completion without any fenced block is the program as a whole;
3. a completion whose fenced blocks are all in other languages has no program (`None`).

A fence opens at the start of a line; a block still open at the end of the completion (a generation cut
off by its token budget) runs to the end, as veRL's `split("```python")[-1]` takes it. Taking the last
block matches veRL's prime_code scorer, which takes the text after the last "```python".
"""

from __future__ import annotations

import re

# An opening fence (3+ backticks, an optional info string) at the start of a line, the body, and the
# closing fence of the same length or longer, or the end of the text.
_BLOCK = re.compile(
    r"^[ \t]{0,3}(?P<fence>`{3,})[ \t]*(?P<info>[^`\n]*)\n(?P<body>.*?)(?:^[ \t]{0,3}(?P=fence)`*[ \t]*$|\Z)",
    re.MULTILINE | re.DOTALL,
)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block as (language tag in lower case, body)."""
    blocks = []
    for match in _BLOCK.finditer(text):
        info = match.group("info").strip().split()
        blocks.append((info[0].lower() if info else "", match.group("body")))
    return blocks


def extract_code(text: str, tags: frozenset[str]) -> str | None:
    """The program in a completion, by the rule above; `tags` are the language's info strings."""
    blocks = fenced_blocks(text)
    if not blocks:
        return text
    for wanted in (lambda tag: tag in tags, lambda tag: tag == ""):
        chosen = [body for tag, body in blocks if wanted(tag)]
        if chosen:
            return chosen[-1]
    return None
