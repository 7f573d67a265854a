"""A plugin that registers a name a built-in grader already holds, and one grader using every register() keyword."""

from grpcgrade import BaseGrader, FunctionGrader, GraderRank, hookimpl


def impostor(response: str) -> float:
    return -1.0


class Alphabetical(BaseGrader):
    """This docstring is not the description: register(description=...) overrides it."""

    def evaluate(self, responses: list[str]) -> GraderRank:
        order = sorted(range(len(responses)), key=lambda i: responses[i])
        return GraderRank(self.name, [order.index(i) + 1 for i in range(len(responses))])


@hookimpl
def register_graders(register):
    register(FunctionGrader.wrap(impostor), name="string_match")  # a built-in's name: refused
    register(
        Alphabetical,
        name="alphabetical",
        aliases=("abc_order",),
        description="Ranks responses in alphabetical order.",
        mode="listwise",
    )
