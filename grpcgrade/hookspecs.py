"""The plugin hooks. Plugins implement them with `@grpcgrade.hookimpl`; the built-ins do too."""

from collections.abc import Callable

from pluggy import HookimplMarker, HookspecMarker

hookspec = HookspecMarker("grpcgrade")
hookimpl = HookimplMarker("grpcgrade")


@hookspec
def register_graders(register: Callable[..., None]) -> None:
    """Register graders: call `register(factory, name=..., aliases=(...))` once per grader."""
