"""OpenJudge's deterministic code graders (py-openjudge 0.2.4, `openjudge/graders/code/`), score for score:
`syntax_check` (Python's own parser), `code_style` (indentation and snake_case names) and
`patch_similarity` (difflib's ratio).

The fenced-block pattern is the reference's, quirks included: ```` ```py ```` does not open a block, and a
closing fence can open the next one. `syntax_check` parses with this interpreter's grammar (3.11, as the
reference cases were computed), and takes 0.5 off when any block fails, so its range is [−0.5, 1].
`patch_similarity` is CPython's `difflib.SequenceMatcher(...).ratio()` itself, with its default `autojunk`:
a port would not give the same numbers on long references.
"""

from __future__ import annotations

import ast
import difflib
import re
from typing import Any

from grpcgrade.grader import BaseGrader, GraderScore

CODE_BLOCK = re.compile(r"```(?:python)?\s*\n(.*?)\n\s*```", re.DOTALL)
_FUNCTION = re.compile(r"def\s+([a-zA-Z_][a-zA-Z0-9_]*)\s*\(")
_VARIABLE = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*=")
_SNAKE_CASE = re.compile(r"^[a-z_][a-z0-9_]*$")


class SyntaxCheckGrader(BaseGrader):
    """valid blocks / all blocks, minus 0.5 when any fenced Python block fails to parse; 0.0 without blocks."""

    def __init__(self) -> None:
        super().__init__()

    def evaluate(self, response: str) -> GraderScore:  # type: ignore[override]
        blocks = CODE_BLOCK.findall(response)
        if not blocks:
            return GraderScore(
                name=self.name,
                score=0.0,
                reason="No code blocks found to check",
                metadata={"code_blocks": [], "syntax_errors": []},
            )
        errors: list[dict[str, Any]] = []
        for i, code in enumerate(blocks):
            try:
                ast.parse(code.strip())
            except SyntaxError as exc:
                errors.append({"block": i, "error": str(exc), "line": exc.lineno, "offset": exc.offset})
        valid = len(blocks) - len(errors)
        score = valid / len(blocks) - (0.5 if errors else 0.0)
        return GraderScore(
            name=self.name,
            score=score,
            reason=f"Syntax check: {valid}/{len(blocks)} blocks valid, {len(errors)} errors",
            metadata={
                "code_blocks": blocks,
                "valid_blocks": valid,
                "total_blocks": len(blocks),
                "syntax_errors": errors,
            },
        )


def _indentation(code: str) -> tuple[bool, str]:
    kind = None
    for line in code.split("\n"):
        if line.strip() and len(line) - len(line.lstrip()) > 0:
            this = "spaces" if line.startswith(" ") else "tabs" if line.startswith("\t") else None
            if this is None:
                continue  # another Unicode space: the reference looks at neither
            if kind is None:
                kind = this
            elif kind != this:
                return False, "Mixed indentation types (spaces and tabs)"
    return True, "Consistent indentation"


def _naming(code: str) -> tuple[float, str]:
    names = _FUNCTION.findall(code) + _VARIABLE.findall(code)
    if not names:
        return 1.0, "No names to check"
    good = sum(1 for name in names if _SNAKE_CASE.match(name))
    return good / len(names), f"Naming convention: {good}/{len(names)} names follow snake_case"


class CodeStyleGrader(BaseGrader):
    """The mean over fenced Python blocks of 0.5 for consistent indentation (no spaces and tabs mixed) plus
    0.5 × the share of snake_case names (`def` names and anything before an `=`); 0.0 without blocks."""

    def __init__(self) -> None:
        super().__init__()

    def evaluate(self, response: str) -> GraderScore:  # type: ignore[override]
        blocks = CODE_BLOCK.findall(response)
        if not blocks:
            return GraderScore(
                name=self.name, score=0.0, reason="No code blocks found to check style", metadata={"code_blocks": []}
            )
        total = 0.0
        details: list[str] = []
        for i, code in enumerate(blocks):
            indent_ok, indent_note = _indentation(code)
            naming, naming_note = _naming(code)
            total += (0.5 if indent_ok else 0.0) + naming * 0.5
            details += [f"Block {i}: {indent_note}", f"Block {i}: {naming_note}"]
        average = total / len(blocks)
        return GraderScore(
            name=self.name,
            score=average,
            reason=f"Code style score: {average:.3f}; " + "; ".join(details),
            metadata={"code_blocks": blocks, "average_score": average, "details": details},
        )


class PatchSimilarityGrader(BaseGrader):
    """difflib's SequenceMatcher ratio of the response and the reference, character by character."""

    def __init__(self) -> None:
        super().__init__()

    def evaluate(self, response: str, reference_response: str) -> GraderScore:  # type: ignore[override]
        matcher = difflib.SequenceMatcher(None, response, reference_response)
        similarity = matcher.ratio()
        return GraderScore(
            name=self.name,
            score=similarity,
            reason=f"Patch similarity: {similarity:.3f} based on sequence matching",
            metadata={"similarity": similarity, "opcodes": [list(op) for op in matcher.get_opcodes()]},
        )
