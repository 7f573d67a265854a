"""OpenAI's grader JSON run locally: the six grader types, OpenAI's templating, and the multi formula.

OpenAI's graders (reinforcement fine-tuning, Evals) are a widely written reward format; this family runs those
configs unchanged as the `openai_grader` grader (param `grader`). The HTTP face of the same graders, OpenAI's
`/v1/fine_tuning/alpha/graders/{run,validate}`, is `grpcgrade.service.http.openai_graders`.
"""

from grpcgrade.hookspecs import hookimpl

from .grader import openai_grader


@hookimpl
def register_graders(register):
    register(openai_grader, name="openai_grader")
