"""An example grpcgrade plugin: three graders that show the three shapes a grader comes in.

Copy this package (or run `grpcgrade new-plugin NAME`) to start your own.
"""

from collections.abc import Callable

from grpcgrade import BaseGrader, FunctionGrader, GraderMode, GraderRank, GraderScore, InvalidParams, hookimpl


class WordBudget(BaseGrader):
    """1.0 for a response of at most `max_words` words; over budget, `max_words / words`.

    Constructor parameters are the grader's params: a request sends `{"max_words": 20}` and the
    annotation turns the JSON number 20.0 into the int 20 (20.5 is refused with INVALID_ARGUMENT).
    """

    def __init__(self, max_words: int = 50) -> None:
        if max_words < 1:
            raise InvalidParams("max_words", "must be at least 1")
        super().__init__()
        self.max_words = max_words

    # Sync `evaluate`: the service calls it without an event loop. It is cheap, so it runs inline;
    # a grader that takes milliseconds per sample sets `heavy = True` to run in the worker processes.
    def evaluate(self, response: str) -> GraderScore:
        words = len(response.split())
        score = 1.0 if words <= self.max_words else self.max_words / words
        return GraderScore(self.name, score, f"{words} words, budget {self.max_words}")


def mentions_reference(response: str, reference: str, ignore_case: bool = True) -> float:
    """1.0 when the reference appears in the response, else 0.0."""
    if ignore_case:
        response, reference = response.casefold(), reference.casefold()
    return float(reference in response)


class ShortestFirst(BaseGrader):
    """Ranks `responses` by length in words, shortest first; ties keep their order."""

    mode = GraderMode.LISTWISE

    def evaluate(self, responses: list[str]) -> GraderRank:
        order = sorted(range(len(responses)), key=lambda i: len(responses[i].split()))
        rank = [0] * len(responses)
        for place, i in enumerate(order, start=1):
            rank[i] = place
        return GraderRank(self.name, rank)


@hookimpl
def register_graders(register: Callable[..., None]) -> None:
    register(WordBudget, name="word_budget", aliases=("word-budget",))
    register(FunctionGrader.wrap(mentions_reference), name="mentions_reference")
    register(ShortestFirst, name="shortest_first")
