"""The plugin hooks. Plugins implement them with `@grpcgrade.hookimpl`; the built-ins do too."""

from pluggy import HookimplMarker, HookspecMarker

hookspec = HookspecMarker("grpcgrade")
hookimpl = HookimplMarker("grpcgrade")


@hookspec
def register_graders(register):  # untyped: the signature plugin authors write, as the docs show it
    """Register graders: call `register(factory, name=..., aliases=(...))` once per grader."""
