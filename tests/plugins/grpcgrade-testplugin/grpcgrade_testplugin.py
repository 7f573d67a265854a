"""A plugin the test suite installs: class and function graders, sync and async, pointwise and listwise,
and misbehaving ones for the fault tests."""

import asyncio
import functools
import os
import signal
import time
from dataclasses import dataclass
from fractions import Fraction

from grpcgrade import BaseGrader, FunctionGrader, GraderError, GraderMode, GraderRank, GraderScore, hookimpl


class Shout(BaseGrader):
    """1.0 when the response is the reference in capitals."""

    def evaluate(self, response: str, reference: str) -> GraderScore:
        return GraderScore(self.name, float(response == reference.upper()), "shouted" if response.isupper() else "")


def longest_first(responses: list[str]) -> list[int]:
    """Ranks responses by length, longest first."""
    order = sorted(range(len(responses)), key=lambda i: -len(responses[i]))
    return [order.index(i) + 1 for i in range(len(responses))]


def odd_ranks(responses: list[str]) -> list:
    """Ranks in order, odd in the way the first response names: "floats" (1.0, 2.0...: whole numbers, as
    scipy's rankdata gives them), "fractional" (1.7, 2.2...: truncated, they would make a permutation),
    "bools" (True for 1)."""
    rank: list = list(range(1, len(responses) + 1))
    if responses[0] == "floats":
        return [float(r) for r in rank]
    if responses[0] == "fractional":
        return [r + 0.7 if r == 1 else r + 0.2 for r in rank]
    if responses[0] == "bools":
        return [True, *rank[1:]]
    return rank


class OddRanks(BaseGrader):
    """`odd_ranks` as a class grader returning a GraderRank."""

    mode = GraderMode.LISTWISE

    def evaluate(self, responses: list[str]) -> GraderRank:
        return GraderRank(self.name, odd_ranks(responses))


class Tidy(BaseGrader):
    """Ranks responses in their order, after sorting them in place and clearing every list and dict in its
    `extra` (a grader that changes its own input): what it does must not reach other graders."""

    mode = GraderMode.LISTWISE

    def evaluate(self, responses: list[str], **extra: object) -> GraderRank:
        responses.sort()
        for value in extra.values():
            if isinstance(value, (list, dict)):
                value.clear()
        return GraderRank(self.name, list(range(1, len(responses) + 1)))


@dataclass
class Mentions(BaseGrader):
    """How many of the response's words are `word`, as a fraction: a grader written as a dataclass, so its
    instances compare by their fields and have no hash (`__hash__` is None). `heavy` and `bounded` choose
    where it runs, as for `misbehave`."""

    word: str = "grpc"
    heavy: bool = False
    bounded: bool = False

    def __post_init__(self) -> None:
        super().__init__()
        self.bounded_cost = self.bounded

    def evaluate(self, response: str) -> GraderScore:
        words = response.split()
        return GraderScore(self.name, words.count(self.word) / max(len(words), 1), f"counted {self.word!r}")


def count_word(response: str, word: str = "grpc") -> float:
    """How many times `word` appears."""
    return float(response.split().count(word))


class Overlap:
    """The share of the reference's words found in the response: a callable object whose `__call__` is a
    coroutine function, registered as a function grader."""

    async def __call__(self, response: str, reference: str) -> float:
        await asyncio.sleep(0)
        words = set(reference.split())
        return len(words & set(response.split())) / max(len(words), 1)


def typed_length(response: str, kind: str = "float32"):
    """The response's length over 8, as numpy's `float32` (what a float32 array's mean gives) or a
    `Fraction`: real numbers that are not floats; or in a `(score, reason)` pair: with the reason None
    (`pair`), with the score as text (`text_pair`), or times 10**400, which no double holds (`huge_pair`)."""
    if kind == "fraction":
        return Fraction(len(response), 8)
    if kind == "pair":
        return len(response) / 8, None
    if kind == "text_pair":
        return str(len(response) / 8), "as text"
    if kind == "huge_pair":
        return len(response) * 10**400, "huge"
    import numpy

    return numpy.float32(len(response) / 8)


async def attentive(response: str) -> float:
    """1.0, after a turn of the event loop: an async grader, which the server runs in its own loop."""
    await asyncio.sleep(0)
    return 1.0


async def napper(response: str) -> float:
    """1.0; for the response "hang", only after an hour: an async grader that stalls (a judge that never
    answers), for the step budget's tests."""
    if response == "hang":
        await asyncio.sleep(3600)
    return 1.0


def tool_call_names(tool_calls: list | None = None, expected: str = "") -> float:
    """1.0 when the sample's `extra.tool_calls` name exactly the functions in `expected` (comma-separated)."""
    names = [call["function"]["name"] for call in tool_calls or []]
    return float(",".join(names) == expected)


def id_number(sample_id: str = "") -> float:
    """The sample's id read as a number: shows which id reached the grader."""
    return float(sample_id)


@hookimpl
def register_graders(register):
    register(Shout, name="shout")
    register(FunctionGrader.wrap(count_word), name="count_word")
    register(Mentions, name="mentions")
    register(FunctionGrader.wrap(functools.partial(count_word, word="rpc")), name="count_rpc")
    register(FunctionGrader.wrap(Overlap()), name="overlap")
    register(FunctionGrader.wrap(typed_length), name="typed_length")
    register(FunctionGrader.wrap(longest_first, mode=GraderMode.LISTWISE), name="longest_first")
    register(OddRanks, name="odd_ranks")
    register(FunctionGrader.wrap(odd_ranks, mode=GraderMode.LISTWISE), name="odd_ranks_fn")
    register(Tidy, name="tidy")
    register(Sleepy, name="sleepy")
    register(Misbehave, name="misbehave")
    register(FunctionGrader.wrap(attentive), name="attentive")
    register(FunctionGrader.wrap(napper), name="napper")
    register(FunctionGrader.wrap(tool_call_names), name="tool_call_names")
    register(FunctionGrader.wrap(id_number), name="id_number")
    register(Warmed, name="warmed")


class Warmed(BaseGrader):
    """Says which processes warmed it up (`warm_up`): each appends its pid as a line to the file named by
    $GRPCGRADE_TEST_WARMED, when that is set. While the file named by $GRPCGRADE_TEST_WARM_EXIT exists, a
    process that warms it exits at once (status 3): workers that die as they start."""

    def warm_up(self) -> None:
        gate = os.environ.get("GRPCGRADE_TEST_WARM_EXIT")
        if gate and os.path.exists(gate):
            os._exit(3)
        path = os.environ.get("GRPCGRADE_TEST_WARMED")
        if path:
            with open(path, "a") as out:
                out.write(f"{os.getpid()}\n")

    def evaluate(self, response: str) -> GraderScore:
        return GraderScore(self.name, 1.0)


class Sleepy(BaseGrader):
    """Keeps a core busy for `seconds` per sample: a slow grader for deadline, cancellation and drain tests."""

    def __init__(self, seconds: float = 0.05, heavy: bool = True) -> None:
        super().__init__()
        self.seconds = seconds
        self.heavy = heavy

    def evaluate(self, response: str) -> GraderScore:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return GraderScore(self.name, 1.0)


class SlowToDescribe(Exception):
    """An error whose message takes `seconds` to build: recording it outlasts a short time limit."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def __str__(self) -> str:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return "slow to describe"


class Unsayable(Exception):
    """An error whose message cannot be read: its `str()` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no words")


class LibraryTimeout(BaseException):
    """What some libraries raise instead of an Exception (math-verify's TimeoutException is one)."""


class Misbehave(BaseGrader):
    """Misbehaves when the response says so: "hang" (a Python loop), "hang_in_c" (a sleep that the
    time-limit signal cannot interrupt), "die" (the process is killed), "nan", "base_exception" (raises a
    library's BaseException, not an Exception), "slow_error" (raises at
    once an error whose message takes 0.5 s to build), "swallow" (runs 2 s, catching every `Exception`
    on the way, as a grader with a fallback score does), "long:N" (a reason of N characters), "pid..."
    (scores the grading process's id: shows where it ran), "surrogate" (a reason and a metadata string holding
    a lone surrogate, which UTF-8 cannot encode), "huge_number" (metadata with an integer past a double's
    range), "deep" / "deeper" (metadata nested 200 / 5,000 dicts deep: past
    Python's recursion limit), "cycle" (metadata holding itself, three times),
    "unsayable" (raises an exception whose `str()` raises), "huge_score" (scores an int past a double's
    range), "reason_none" / "reason_int" / "metadata_list" (a result with a field of the wrong type),
    "error_odd" (returns a GraderError whose message is an int and whose code is None), "loud:N" (raises
    an error whose message is N characters), "fraction" (scores `Fraction(1, 2)`: a real number, not a
    float), "text_score" (scores the string "1.0"); else scores 1.0.
    `column=True` also offers the scores view's `score_column`, misbehaving the same way; it scores "which"
    2.0 (breaking its contract on purpose), so a test sees which of the two answered.
    `bounded=True` claims a bounded cost (falsely, on purpose): small batches are then graded inline.
    `build="base_exception"` raises that BaseException while the grader is built."""

    def __init__(self, heavy: bool = True, column: bool = False, bounded: bool = False, build: str = "") -> None:
        if build == "base_exception":  # a library failing while the grader is built
            raise LibraryTimeout("a library's own timeout, building the grader")
        super().__init__()
        self.heavy = heavy
        self.bounded_cost = bounded
        if column:
            self.score_column = self._scores

    def _scores(self, response: list) -> list:
        return [2.0 if text == "which" else self.evaluate(text).score for text in response]

    def evaluate(self, response: str) -> GraderScore:
        if response == "hang":
            while True:
                pass
        if response == "hang_in_c":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        if response == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if response == "nan":
            return GraderScore(self.name, float("nan"))
        if response == "base_exception":
            raise LibraryTimeout("a library's own timeout")
        if response == "slow_error":
            raise SlowToDescribe(0.5)
        if response == "swallow":
            end = time.perf_counter() + 2.0
            while time.perf_counter() < end:
                try:
                    time.sleep(0.001)
                except Exception:  # noqa: S112 - the point: a grader that swallows what it should not
                    continue
            return GraderScore(self.name, 0.0, "fallback score")
        if response.startswith("pid"):
            return GraderScore(self.name, float(os.getpid()))
        if response == "surrogate":
            return GraderScore(self.name, 1.0, "bad \udc80 text", {"echo": "\ud800", "ok": 1})
        if response == "huge_number":
            return GraderScore(self.name, 1.0, "huge", {"digits": 10**400, "nested": {"n": -(10**400)}, "ok": 1})
        if response in ("deep", "deeper"):
            metadata: dict = {}
            inner = metadata
            for _ in range(200 if response == "deep" else 5000):
                inner["in"] = {}
                inner = inner["in"]
            return GraderScore(self.name, 1.0, response, metadata)
        if response == "cycle":  # holding itself three times: expanded, it would never end
            metadata = {}
            metadata.update({"in": metadata, "also": [metadata, metadata]})
            return GraderScore(self.name, 1.0, response, metadata)
        if response == "reason_none":
            return GraderScore(self.name, 1.0, None, None)  # type: ignore[arg-type]
        if response == "reason_int":
            return GraderScore(self.name, 1.0, 5)  # type: ignore[arg-type]
        if response == "metadata_list":
            return GraderScore(self.name, 1.0, "", [1, 2])  # type: ignore[arg-type]
        if response == "error_odd":
            return GraderError(self.name, 404, code=None)  # type: ignore[arg-type]
        if response == "huge_score":
            return GraderScore(self.name, 10**400)
        if response == "unsayable":
            raise Unsayable
        if response == "fraction":
            return GraderScore(self.name, Fraction(1, 2))  # type: ignore[arg-type]
        if response == "text_score":
            return GraderScore(self.name, "1.0")  # type: ignore[arg-type]
        if response.startswith("loud:"):
            raise ValueError("e" * int(response[5:]))
        if response.startswith("long:"):
            return GraderScore(self.name, 1.0, "long:" + "r" * int(response[5:]))
        return GraderScore(self.name, 1.0)
