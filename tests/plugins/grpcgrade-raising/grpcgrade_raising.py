"""A plugin that imports fine but fails in its hook, as one with a bug in its registration code does: after
registering one grader, which must then not be served either."""

from grpcgrade import hookimpl
from grpcgrade.grader import FunctionGrader


def registered_first(response: str) -> float:
    """1.0: registered before the plugin fails."""
    return 1.0


@hookimpl
def register_graders(register):
    register(FunctionGrader.wrap(registered_first), name="registered_first")
    raise RuntimeError("grpcgrade-raising fails on purpose")
