"""A plugin that imports fine but fails in its hook, as one with a bug in its registration code does."""

from grpcgrade import hookimpl


@hookimpl
def register_graders(register):
    raise RuntimeError("grpcgrade-raising fails on purpose")
