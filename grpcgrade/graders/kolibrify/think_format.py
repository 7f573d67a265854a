"""Kolibrify's `reasoning_format`: partial credit for the Qwen-style `<think>...</think>` layout.

Kolibrify attaches it to every dataset with weight 1; here it is an ordinary grader named
`think_format` (OpenJudge's `reasoning_format` is a different algorithm). It reads the raw completion,
not the parsed answer, so a completion with a missing opening tag still earns partial credit.
"""

from __future__ import annotations

from typing import Any

from grpcgrade.grader import BaseGrader, GraderScore

from .parsing import CLOSE_TAG, OPEN_TAG


class ThinkFormatGrader(BaseGrader):
    """Score in [0, 1]: tags present, opening tag first, ordered tags, newline divider, a final answer."""

    def __init__(self) -> None:
        super().__init__()

    def evaluate(self, response: str = "", **kwargs: Any) -> GraderScore:
        text = (response or "").strip()
        open_idx = text.find(OPEN_TAG)
        close_idx = text.find(CLOSE_TAG)
        open_count = text.count(OPEN_TAG)
        close_count = text.count(CLOSE_TAG)
        notes: list[str] = []
        # The additions happen in Kolibrify's order so the float result is bit-identical.
        score = 0.0
        if open_idx != -1:
            score += 0.125
            if open_idx == 0:
                score += 0.125
            else:
                notes.append("<think> not at the start")
        else:
            notes.append("no <think>")

        has_answer = False
        if close_idx != -1:
            score += 0.125
            if open_idx != -1 and close_idx > open_idx:
                score += 0.125
            elif open_idx != -1:
                score -= 0.125
                notes.append("</think> before <think> (-0.125)")

            after = text[close_idx + len(CLOSE_TAG) :]
            divider = after[:1]
            if divider == " ":
                score -= 0.1
                notes.append("space instead of a newline after </think> (-0.1)")
            elif divider and not divider.isspace():
                score -= 0.1
                notes.append("text glued to </think> (-0.1)")
            has_answer = bool(after.strip())
            if has_answer:
                score += 0.5
            else:
                score -= 0.25
                notes.append("no final answer after </think> (-0.25)")
        else:
            notes.append("no </think>")

        if open_count > 1 or close_count > 1:
            extra_blocks = (open_count - 1) + (close_count - 1)
            score -= 0.15 * extra_blocks
            if extra_blocks > 0:
                notes.append(f"{extra_blocks} extra think tag(s) (-0.15 each)")

        score = max(0.0, min(score, 1.0))
        return GraderScore(
            name=self.name,
            score=score,
            reason="well-formed <think> block and final answer" if not notes else "; ".join(notes),
            metadata={
                "open_tags": open_count,
                "close_tags": close_count,
                "final_answer_present": has_answer,
            },
        )
