"""The built-in LLM judges, registered like every other built-in grader family."""

from grpcgrade.hookspecs import hookimpl

from .correctness import LLMCorrectnessGrader
from .rank import LLMRankGrader
from .rubric import LLMRubricGrader


@hookimpl
def register_graders(register):
    register(LLMRubricGrader, name="llm_rubric")
    register(LLMCorrectnessGrader, name="llm_correctness")
    register(LLMRankGrader, name="llm_rank")
