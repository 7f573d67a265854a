"""The grader registry: names to factories, and factories plus params to grader instances.

The host owns the `register` callback (the llm / datasette pattern), so it keeps a taken name with its first
owner, refuses a grader it could not pass fields to, records which plugin registered what, and can grow
keyword arguments without breaking plugins. Graders are built once per distinct (name, params) and reused;
a bounded cache keeps hostile requests from growing it forever.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from grpcgrade.grader import BaseGrader, FunctionGrader, GraderMode, unwrapped

from .errors import InvalidParams, UnknownGrader
from .params import MAX_PARAMS_BYTES, ParamInfo, coerce_value, describe_params, signature_source
from .plugins import CLASHED, FAILED, LOADED, LoadedPlugin, PluginInfo, load_plugins, make_manager

log = logging.getLogger(__name__)

#: The built-grader cache's budget, counted in the bytes of the params the graders were built from (a
#: grader holds about that much: its params, and what it compiled from them).
CACHE_BYTES = 32 * 1024 * 1024


@dataclass
class GraderEntry:
    name: str
    factory: Callable[..., BaseGrader]
    plugin: PluginInfo
    aliases: tuple[str, ...] = ()
    description: str = ""
    mode: GraderMode = GraderMode.POINTWISE
    params: list[ParamInfo] = field(default_factory=list)
    open_params: bool = False  # the factory takes **kwargs, so unknown names cannot be refused up front
    mode_given: bool = False  # register(..., mode=...) overrides what the built grader says
    hints: dict[str, Any] = field(default_factory=dict)


class Registry:
    """Everything the plugins registered, plus a cache of built graders."""

    def __init__(
        self, loaded: list[LoadedPlugin], pm: Any, cache_size: int = 1024, cache_bytes: int = CACHE_BYTES
    ) -> None:
        self.plugins = [lp.info for lp in loaded]
        self._entries: dict[str, GraderEntry] = {}
        self._canonical: dict[str, str] = {}
        self._cache: OrderedDict[tuple[str, str], BaseGrader] = OrderedDict()
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self._held = 0  # the cache's keys' bytes: the params each cached grader was built from
        self._lock = threading.Lock()
        by_name = {lp.info.name: lp.info for lp in loaded if lp.module is not None}
        for impl in pm.hook.register_graders.get_hookimpls():  # registration order: built-ins first
            info = by_name.get(impl.plugin_name)
            if info is None:
                continue
            others = [p for p in pm.get_plugins() if p is not impl.plugin]
            try:  # one plugin per call, so a fault stays its own; through pluggy, so tracing sees it
                pm.subset_hook_caller("register_graders", others)(register=functools.partial(self._register, info))
            except Exception as exc:  # a plugin's fault stays with that plugin
                info.status, info.error = FAILED, f"{type(exc).__name__}: {exc}"
                log.error("plugin %s failed in register_graders: %s", info.name, info.error)
                self._withdraw(info)

    def _withdraw(self, plugin: PluginInfo) -> None:
        """A failed plugin's graders are not served, including those it registered before it failed: a
        half-registered plugin is not one its author tested."""
        for name in plugin.graders:
            entry = self._entries.pop(name)
            for n in (name, *entry.aliases):
                del self._canonical[n]
        plugin.graders.clear()

    def _register(
        self,
        plugin: PluginInfo,
        factory: Callable[..., BaseGrader],
        *,
        name: str,
        aliases: tuple[str, ...] | list[str] = (),
        description: str | None = None,
        mode: GraderMode | str | None = None,
    ) -> None:
        taken = [n for n in (name, *aliases) if n in self._canonical]
        if taken:
            owner = self._entries[self._canonical[taken[0]]].plugin.name
            msg = f"grader name {taken[0]!r} is already registered by plugin {owner!r}"
            log.warning("plugin %s: %s; keeping the first", plugin.name, msg)
            plugin.error = f"{plugin.error}; {msg}" if plugin.error else msg
            if plugin.status == LOADED:
                plugin.status = CLASHED
            return
        refused = _keyword_problem(factory)
        if refused:
            raise TypeError(f"grader {name!r}: {refused}")
        params, open_params, hints = describe_params(factory)
        doc_source = unwrapped(signature_source(factory)[0]) if isinstance(factory, functools.partial) else factory
        entry = GraderEntry(
            name=name,
            factory=factory,
            plugin=plugin,
            aliases=tuple(aliases),
            description=description or (inspect.getdoc(doc_source) or "").split("\n\n")[0].replace("\n", " "),
            mode=GraderMode(mode) if mode else _declared_mode(factory),
            mode_given=mode is not None,
            params=params,
            open_params=open_params,
            hints=hints,
        )
        self._entries[name] = entry
        for n in (name, *aliases):
            self._canonical[n] = name
        plugin.graders.append(name)

    def add(self, plugin: PluginInfo, factory: Callable[..., BaseGrader], *, name: str, **options: Any) -> None:
        """Register a grader from outside any plugin (a configuration file's own graders)."""
        if plugin not in self.plugins:
            self.plugins.append(plugin)
        self._register(plugin, factory, name=name, **options)
        if name not in self._entries or self._entries[name].factory is not factory:
            raise ValueError(plugin.error or f"could not register grader {name!r}")

    # -- lookup ---------------------------------------------------------------------------------------

    @property
    def entries(self) -> list[GraderEntry]:
        return list(self._entries.values())

    def entry(self, name: str) -> GraderEntry:
        canonical = self._canonical.get(name)
        if canonical is None:
            failed = [(p.name, p.error) for p in self.plugins if p.status == FAILED]
            raise UnknownGrader(name, list(self._canonical), failed)
        return self._entries[canonical]

    def coerce(self, entry: GraderEntry, params: dict[str, Any]) -> dict[str, Any]:
        known = {p.name for p in entry.params}
        if not entry.open_params:
            unknown = sorted(set(params) - known)
            if unknown:
                allowed = ", ".join(sorted(known)) or "none"
                raise InvalidParams(unknown[0], f"unknown parameter of grader {entry.name!r}; allowed: {allowed}")
        missing = [p.name for p in entry.params if p.required and p.name not in params]
        if missing:
            raise InvalidParams(missing[0], f"required by grader {entry.name!r}")
        return {k: coerce_value(k, v, entry.hints.get(k)) for k, v in params.items()}

    def build(self, name: str, params: dict[str, Any] | None = None) -> BaseGrader:
        """The grader for (name, params), built on first use. Raises UnknownGrader or InvalidParams."""
        entry = self.entry(name)
        params = params or {}
        key = (entry.name, json.dumps(params, sort_keys=True, default=str))
        if len(key[1]) > MAX_PARAMS_BYTES:
            raise InvalidParams(
                "params",
                f"the params of grader {entry.name!r} take {len(key[1])} bytes as JSON, over the limit "
                f"of {MAX_PARAMS_BYTES}",
            )
        with self._lock:
            grader = self._cache.get(key)
            if grader is not None:
                self._cache.move_to_end(key)
                return grader
        kwargs = self.coerce(entry, params)
        try:
            grader = entry.factory(**kwargs)
        except InvalidParams:
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidParams(_guess_param(str(exc), kwargs), str(exc)) from exc
        if not isinstance(grader, BaseGrader):
            raise TypeError(f"factory of grader {entry.name!r} returned {type(grader).__name__}, not a grader")
        grader.name = entry.name
        if entry.mode_given:
            grader.mode = entry.mode
        with self._lock:
            if key not in self._cache:
                self._held += len(key[1])
            self._cache[key] = grader
            while len(self._cache) > self._cache_size or self._held > self._cache_bytes:
                (_, old), _ = self._cache.popitem(last=False)
                self._held -= len(old)
        return grader


def _declared_mode(factory: Callable[..., Any]) -> GraderMode:
    """Listwise graders say so in a class attribute or their defaults; peek without building."""
    if isinstance(factory, functools.partial) and factory.keywords.get("mode"):
        return GraderMode(factory.keywords["mode"])
    if isinstance(factory, type):
        return GraderMode(getattr(factory, "mode", GraderMode.POINTWISE))
    try:
        default = inspect.signature(factory).parameters.get("mode")
    except (TypeError, ValueError):
        default = None
    if default is not None and default.default not in (inspect.Parameter.empty, None):
        return GraderMode(default.default)
    return GraderMode.POINTWISE


def _keyword_problem(factory: Callable[..., Any]) -> str:
    """A parameter of the grader's params or of its `evaluate` that only a position can fill, named (or "").
    Params and sample fields are passed by keyword, so such a parameter never gets one: without a default
    every call fails, with one the grader silently grades its default (`def evaluate(self, response="", /)`
    would score the empty string for every sample)."""
    cls = factory.func if isinstance(factory, functools.partial) else factory
    functions: list[tuple[Callable[..., Any], bool]] = [(factory, False)]  # (function, is a method)
    if isinstance(cls, type) and issubclass(cls, FunctionGrader) and isinstance(factory, functools.partial):
        functions = [(factory.args[0], False)] if factory.args else []
    elif isinstance(cls, type):
        methods = [cls.__init__]  # type: ignore[misc]  # the class's own, as `signature_source` reads it
        if issubclass(cls, BaseGrader):
            inherited = (BaseGrader.evaluate, BaseGrader.aevaluate)
            methods += [m for m in (cls.evaluate, cls.aevaluate) if m not in inherited]
        functions = [(m, True) for m in methods]
    for func, method in functions:  # a method's first parameter is `self`
        try:
            params = list(inspect.signature(func).parameters.values())
        except (TypeError, ValueError):  # a builtin without a signature: nothing to see
            continue
        for p in params[1:] if method else params:
            if p.kind is p.POSITIONAL_ONLY:
                where = getattr(func, "__qualname__", type(func).__name__)
                return (
                    f"parameter {p.name!r} of {where} is positional-only, but sample fields and params are "
                    "passed by keyword, so it would never get one"
                )
    return ""


def _guess_param(message: str, kwargs: dict[str, Any]) -> str:
    for name in kwargs:
        if repr(name) in message or f" {name}" in message:
            return name
    return "params"


def warm(registry: Registry, names: Collection[str] | None = None) -> None:
    """Every grader (or those of `names`) that builds with its default params, built and warmed up
    (`BaseGrader.warm_up`) in this process: the first request then pays no import or dictionary load. Each
    process that grades calls it once before it takes work (a worker as it starts, the server's process
    before it says SERVING for what it grades itself); a process that only loads the registry (a face,
    `grpcgrade graders`) does not, and pays nothing for graders it never runs."""
    for entry in registry.entries:
        if names is not None and entry.name not in names:
            continue
        try:
            registry.build(entry.name, {}).warm_up()
        except Exception as exc:  # a grader that needs params, or cannot warm: its first sample pays
            log.debug("not warmed: grader %s: %s", entry.name, exc)


_registry: Registry | None = None
_registry_lock = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry, loading plugins on first use (in the server and in each worker)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            pm = make_manager()
            _registry = Registry(load_plugins(pm), pm)
        return _registry
