"""The math_verify plugin in-process. Expected values: Kolibrify's own math-verify tests (its report,
A.8) and math_verify's `parse` / `verify` called directly with Kolibrify's configuration."""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from grpcgrade_math_verify import MathVerifyGrader, final_answer, register_graders
from math_verify import LatexExtractionConfig, LatexNormalizationConfig, parse, verify

from grpcgrade import InvalidParams

KOLIBRIFY_CONFIG = [
    LatexExtractionConfig(
        try_extract_without_anchor=True,
        boxed_match_priority=0,
        normalization_config=LatexNormalizationConfig(
            basic_latex=True, units=True, malformed_operators=False, nits=False, boxed="all", equations=False
        ),
    )
]


@pytest.fixture(scope="module")
def grader() -> MathVerifyGrader:
    return MathVerifyGrader(parsing_timeout=5, verification_timeout=5)


def think(answer: str) -> str:
    return f"<think>\nreasoning\n</think>\n{answer}"


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("$5$", "$5$"),
        ("$$5$$", "$5$"),
        ("\\boxed{5}", "$5$"),
        ("$5$", "\\boxed{5}"),
        ("The answer is $$5$$", "\\boxed{5}"),
        ("The final answer is $5$.", "$5$"),
        ("After reasoning, we get $$5$$ as the result.", "$5$"),
    ],
)
def test_kolibrify_equal_cases(grader: MathVerifyGrader, answer: str, gold: str) -> None:
    result = grader.evaluate(response=think(answer), reference=gold)
    assert result.score == 1.0
    assert result.reason == "the answer equals the reference"


def test_parseable_but_wrong_is_half(grader: MathVerifyGrader) -> None:
    result = grader.evaluate(response=think("$6$"), reference="$5$")
    assert (result.score, result.reason) == (0.5, "the answer parses but differs from the reference")
    assert result.metadata == {"answer_found": True, "answer_extracted": "6", "gold_extracted": "5"}


@pytest.mark.parametrize("completion", ["", "$5$", "<think>r</think>", "r</think>\n$5$"])
def test_no_final_answer_is_zero(grader: MathVerifyGrader, completion: str) -> None:
    result = grader.evaluate(response=completion, reference="$5$")
    assert result.score == 0.0
    assert result.metadata["answer_found"] is False


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("$\\frac{1}{2}$", "$0.5$"),
        ("$\\frac{2}{4}$", "$\\frac{1}{2}$"),
        ("$x^2 + 2x + 1$", "$(x+1)^2$"),
        ("$\\{1, 2\\}$", "$\\{2, 1\\}$"),
        ("$y$", "$x$"),
        ("72", "#### 72"),  # plain numbers are not LaTeX: neither side parses
        ("$72$", "#### 72"),  # the answer parses, the reference does not
        ("no math here", "$5$"),
        ("$5$", ""),
    ],
)
def test_matches_math_verify(grader: MathVerifyGrader, answer: str, gold: str) -> None:
    gold_parsed = parse(gold, extraction_config=KOLIBRIFY_CONFIG)
    pred_parsed = parse(answer, extraction_config=KOLIBRIFY_CONFIG)
    expected = 0.5 if pred_parsed else 0.0
    if gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, strict=True):
        expected = 1.0
    assert grader.evaluate(response=think(answer), reference=gold).score == expected


def test_reference_is_the_gold_side(grader: MathVerifyGrader) -> None:
    """verify() is asymmetric: a relation matches an interval only when the prediction is the set."""
    relation, interval = "$1 < x < 2$", "$(1, 2)$"
    relation_parsed = parse(relation, extraction_config=KOLIBRIFY_CONFIG)
    interval_parsed = parse(interval, extraction_config=KOLIBRIFY_CONFIG)
    assert verify(relation_parsed, interval_parsed, strict=True)
    assert not verify(interval_parsed, relation_parsed, strict=True)
    assert grader.evaluate(response=think(interval), reference=relation).score == 1.0
    assert grader.evaluate(response=think(relation), reference=interval).score == 0.5


def test_unparsable_reference_reason(grader: MathVerifyGrader) -> None:
    result = grader.evaluate(response=think("$72$"), reference="#### 72")
    assert (result.score, result.reason) == (0.5, "the answer parses, but the reference does not")
    assert result.metadata["gold_extracted"] is None
    json.dumps(result.metadata)


def test_final_answer_split() -> None:
    assert final_answer(" <think>a</think>\n b ") == "b"
    assert final_answer("<think>a</think>") is None
    assert final_answer("</think>b<think>") is None


@pytest.mark.parametrize(("value", "seconds"), [(1, 1), (2.9, 2), (10.0, 10)])
def test_timeouts_are_whole_seconds(value: float, seconds: int) -> None:
    grader = MathVerifyGrader(parsing_timeout=value, verification_timeout=value)
    assert (grader.parsing_timeout, grader.verification_timeout) == (seconds, seconds)


@pytest.mark.parametrize("param", ["parsing_timeout", "verification_timeout"])
@pytest.mark.parametrize("value", [0, 0.5, -1, None, True, float("nan")])
def test_timeouts_that_would_disable_the_alarm_are_refused(param: str, value: object) -> None:
    with pytest.raises(InvalidParams) as err:
        MathVerifyGrader(**{param: value})
    assert err.value.param == param


def test_off_the_main_thread_math_verify_refuses(grader: MathVerifyGrader) -> None:
    """SIGALRM timeouts need the main thread; math-verify says so rather than hanging."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            grader.evaluate(response=think("$5$"), reference="$5$")
        except BaseException as exc:  # recorded for the assertion below
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert len(errors) == 1 and isinstance(errors[0], ValueError)


def test_host_time_limit_survives_math_verify(grader: MathVerifyGrader) -> None:
    """math-verify's own alarms must not cancel the SIGALRM timer a host (grpcgrade) armed."""
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: None)
    signal.setitimer(signal.ITIMER_REAL, 600)
    try:
        assert grader.evaluate(response=think("$5$"), reference="$5$").score == 1.0
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert remaining > 0
        assert signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_registration() -> None:
    calls: list[tuple[object, str, tuple[str, ...]]] = []
    register_graders(lambda factory, name, aliases=(): calls.append((factory, name, aliases)))
    assert calls == [(MathVerifyGrader, "math_verify", ("math-verify",))]
    assert MathVerifyGrader.heavy is True
    assert MathVerifyGrader().name == "math_verify"


def test_plugin_imports_only_the_public_api() -> None:
    source = Path(__file__).resolve().parents[1] / "grpcgrade_math_verify.py"
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom):
            modules.add(node.module or "")
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    assert {module for module in modules if module.split(".")[0] == "grpcgrade"} == {"grpcgrade"}


HOST_TICKS = r"""
import json, signal
from grpcgrade_math_verify import MathVerifyGrader

grader = MathVerifyGrader(parsing_timeout=5, verification_timeout=5)
ticks, scores, kept = [], [], True
signal.signal(signal.SIGALRM, lambda signum, frame: ticks.append(signum))
host = signal.getsignal(signal.SIGALRM)
signal.setitimer(signal.ITIMER_REAL, 0.00002, 0.00002)  # far faster than grpcgrade's 5-100 ms ticks
for k in range(1, 201):
    reply = grader.evaluate(response=f"<think>x</think>$\\frac{{{k}}}{{7}}$", reference=f"${k}/7$")
    scores.append(reply.score)
    kept = kept and signal.getsignal(signal.SIGALRM) is host and signal.getitimer(signal.ITIMER_REAL)[1] > 0
signal.setitimer(signal.ITIMER_REAL, 0)
print(json.dumps({"scores": scores, "kept": kept, "ticks": len(ticks)}))
"""


def test_a_host_tick_never_reaches_math_verify_and_math_verify_never_outlives_its_call() -> None:
    """A host (grpcgrade's worker: one thread) ticking every 20 µs: no tick may land between math-verify
    installing its handler and arming its alarm, where it would raise math-verify's TimeoutException (a
    false "timeout", so a wrong score, or a BaseException escaping the grader), and the host's handler and
    timer are back after every call. Before the fix, a run of 200 samples broke here within a few."""
    out = subprocess.run([sys.executable, "-c", HOST_TICKS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run = json.loads(out.stdout)
    assert run["scores"] == [1.0] * 200
    assert run["kept"] and run["ticks"] > 0  # the host's timer ran between the calls, with its handler
