"""Kolibrify's `latex_only`: the final answer is nothing but one LaTeX math expression."""

from __future__ import annotations

import re
from typing import Any

from grpcgrade.grader import BaseGrader, GraderScore

from .parsing import final_answer, no_answer

# The whole answer is one delimited expression: $$..$$, $..$, \[..\], \(..\) or \boxed{..}.
_DELIMITED_RE = re.compile(r"^(?:\$\$.*\$\$|\$.*\$|\\\[.*\\\]|\\\(.*\\\)|\\boxed\{.*\})$", flags=re.DOTALL)
# ... or one \begin{env} ... \end{env} environment.
_ENVIRONMENT_RE = re.compile(r"^\\begin\{([a-zA-Z*]+)\}.*?\\end\{\1\}$", flags=re.DOTALL)


class LatexOnlyGrader(BaseGrader):
    """1.0 when the stripped final answer matches one of the two LaTeX-only patterns, else 0.0.

    A heuristic, as in Kolibrify: `$5$ and $6$` passes (one `$...$` span), text around it fails.
    """

    def __init__(self) -> None:
        super().__init__()

    def evaluate(self, response: str = "", **kwargs: Any) -> GraderScore:
        answer = final_answer(response or "")
        if answer is None:
            return no_answer(self.name)
        ok = _DELIMITED_RE.match(answer) is not None or _ENVIRONMENT_RE.match(answer) is not None
        return GraderScore(
            name=self.name,
            score=1.0 if ok else 0.0,
            reason="the final answer is only LaTeX" if ok else "the final answer has text outside LaTeX",
            metadata={"answer_found": True},
        )
