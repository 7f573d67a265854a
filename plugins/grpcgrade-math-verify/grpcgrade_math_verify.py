"""grpcgrade plugin: Kolibrify's `math-verify` grader (kolibrify/rl_dataserver/graders.py at 1695107).

It lives outside grpcgrade because HF `math-verify` brings sympy and an ANTLR runtime. Only the final
answer (after `</think>`) is graded, never the whole completion, and both sides are read as LaTeX.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

from grpcgrade import BaseGrader, GraderMode, GraderScore, InvalidParams, hookimpl

_OPEN_TAG = "<think>"
_CLOSE_TAG = "</think>"


def final_answer(completion: str) -> str | None:
    """Kolibrify's split: the stripped text after the first `</think>`, if a `<think>` precedes it.

    grpcgrade's Kolibrify family has the same function, but a plugin may only rely on grpcgrade's
    public API, so the few lines are repeated here.
    """
    text = completion.strip()
    start = text.find(_OPEN_TAG)
    end = text.find(_CLOSE_TAG)
    if start == -1 or end == -1 or end <= start:
        return None
    return text[end + len(_CLOSE_TAG) :].strip() or None


def _whole_seconds(param: str, value: float) -> int:
    """math-verify's timeouts are `signal.alarm` seconds: Kolibrify passes `int(value)`.

    Kolibrify also accepts None or 0 (no timeout at all); a shared service refuses them, since one
    pathological expression would then hang a worker for good.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise InvalidParams(param, "must be a number of seconds, at least 1")
    return int(value)


@contextlib.contextmanager
def _outer_alarm_kept() -> Iterator[None]:
    """Hold the caller's SIGALRM timer while math-verify uses the same timer, then give it back.

    grpcgrade (like other hosts) bounds each sample with a periodic ITIMER_REAL tick and its own handler.
    math-verify's timeouts install their handler and only then call `signal.alarm`: a host tick landing
    between the two would run math-verify's handler, which raises its TimeoutException (a BaseException)
    outside math-verify's own `try`. A parse then "times out" at once (a wrong score), and math-verify's
    handler stays installed, to fire later in the host's code. So the host's timer is stopped for the
    duration (math-verify bounds its own calls meanwhile), its handler is put back whatever happened, and
    the timer is re-armed with the time it had left.
    """
    handler = signal.getsignal(signal.SIGALRM)
    remaining, interval = signal.setitimer(signal.ITIMER_REAL, 0)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)  # nothing of math-verify's may fire under the host's handler
        if signal.getsignal(signal.SIGALRM) is not handler:
            signal.signal(signal.SIGALRM, handler)
        if remaining or interval:  # a periodic timer can read 0 left the instant it fires
            left = remaining - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), interval)


def _extracted_text(parsed: list[Any]) -> str | None:
    """The matched source text math-verify keeps next to the sympy value (cheap and safe to report)."""
    return next((item for item in parsed if isinstance(item, str)), None)


class MathVerifyGrader(BaseGrader):
    """0.0 no parsable answer, 0.5 the answer parses as LaTeX math, 1.0 it also equals the reference.

    The reference is the gold side of `verify` (math-verify is not symmetric) and is parsed with the
    same LaTeX-only extraction; a plain `72` reference therefore never parses and caps scores at 0.5,
    exactly as in Kolibrify.

    math-verify enforces its timeouts with SIGALRM, so it only runs on a process's main thread; the
    grader is `heavy`, which puts it in the service's worker processes, where that holds.
    """

    heavy = True
    cache_by_default = True  # symbolic parsing and verification: milliseconds per sample, deterministic

    def __init__(self, parsing_timeout: float = 2, verification_timeout: float = 2) -> None:
        self.parsing_timeout = _whole_seconds("parsing_timeout", parsing_timeout)
        self.verification_timeout = _whole_seconds("verification_timeout", verification_timeout)
        super().__init__(
            name="math_verify",
            mode=GraderMode.POINTWISE,
            description="Kolibrify math-verify: the LaTeX final answer equals the reference (HF math-verify)",
        )
        from math_verify import LatexExtractionConfig, LatexNormalizationConfig, parse, verify

        self._parse = parse
        self._verify = verify
        self._extraction_config = [
            LatexExtractionConfig(
                try_extract_without_anchor=True,
                boxed_match_priority=0,
                normalization_config=LatexNormalizationConfig(
                    basic_latex=True,
                    units=True,
                    malformed_operators=False,
                    nits=False,
                    boxed="all",
                    equations=False,
                ),
            )
        ]

    def _parse_latex(self, text: str) -> list[Any]:
        return self._parse(
            text,
            extraction_config=self._extraction_config,
            parsing_timeout=self.parsing_timeout,
            raise_on_error=False,
        )

    def evaluate(self, response: str = "", reference: str = "", **kwargs: Any) -> GraderScore:
        answer = final_answer(response or "")
        if answer is None:
            return GraderScore(
                name=self.name,
                score=0.0,
                reason="no final answer after </think>",
                metadata={"answer_found": False, "answer_extracted": None, "gold_extracted": None},
            )
        with _outer_alarm_kept():
            gold = self._parse_latex(reference or "")
            pred = self._parse_latex(answer)
            equal = bool(gold and pred) and self._verify(
                gold,
                pred,
                strict=True,
                timeout_seconds=self.verification_timeout,
                raise_on_error=False,
            )
        if equal:
            score, reason = 1.0, "the answer equals the reference"
        elif not pred:
            score, reason = 0.0, "no LaTeX math could be parsed from the final answer"
        elif not gold:
            score, reason = 0.5, "the answer parses, but the reference does not"
        else:
            score, reason = 0.5, "the answer parses but differs from the reference"
        return GraderScore(
            name=self.name,
            score=score,
            reason=reason,
            metadata={
                "answer_found": True,
                "answer_extracted": _extracted_text(pred),
                "gold_extracted": _extracted_text(gold),
            },
        )


@hookimpl
def register_graders(register):  # type: ignore[no-untyped-def]
    register(MathVerifyGrader, name="math_verify", aliases=("math-verify",))
