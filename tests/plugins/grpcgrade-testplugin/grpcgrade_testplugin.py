"""A plugin the test suite installs: a class grader, a function grader with a param, a listwise one."""

import os
import signal
import time

from grpcgrade import BaseGrader, FunctionGrader, GraderMode, GraderScore, hookimpl


class Shout(BaseGrader):
    """1.0 when the response is the reference in capitals."""

    def evaluate(self, response: str, reference: str) -> GraderScore:
        return GraderScore(self.name, float(response == reference.upper()), "shouted" if response.isupper() else "")


def longest_first(responses: list[str]) -> list[int]:
    """Ranks responses by length, longest first."""
    order = sorted(range(len(responses)), key=lambda i: -len(responses[i]))
    return [order.index(i) + 1 for i in range(len(responses))]


def count_word(response: str, word: str = "grpc") -> float:
    """How many times `word` appears."""
    return float(response.split().count(word))


@hookimpl
def register_graders(register):
    register(Shout, name="shout")
    register(FunctionGrader.wrap(count_word), name="count_word")
    register(FunctionGrader.wrap(longest_first, mode=GraderMode.LISTWISE), name="longest_first")
    register(Sleepy, name="sleepy")
    register(Misbehave, name="misbehave")


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


class Misbehave(BaseGrader):
    """Misbehaves when the response says so: "hang" (a Python loop), "hang_in_c" (a sleep that the
    time-limit signal cannot interrupt), "die" (the process is killed), "nan"; else scores 1.0."""

    def __init__(self, heavy: bool = True) -> None:
        super().__init__()
        self.heavy = heavy

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
        return GraderScore(self.name, 1.0)
