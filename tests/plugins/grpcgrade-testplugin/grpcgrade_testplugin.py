"""A plugin the test suite installs: a class grader, a function grader with a param, a listwise one."""

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
