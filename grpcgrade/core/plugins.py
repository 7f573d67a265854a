"""Plugin loading: the built-in grader families and every installed `grpcgrade` entry point.

pluggy's own `load_setuptools_entrypoints` stops at the first plugin that fails to import, so the loop
here guards each entry point (and each plugin's `register_graders` call) on its own: one broken package
is logged, listed as failed, and skipped; the server and every other plugin go on.

`GRPCGRADE_LOAD_PLUGINS=a,b` restricts third-party plugins to those distributions or entry-point names
(empty: none). `GRPCGRADE_TRACE_PLUGINS=1` prints every hook call, as datasette's tracing does.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import pluggy

from grpcgrade import __version__, hookspecs

log = logging.getLogger(__name__)

GROUP = "grpcgrade"
#: The built-in plugins (name -> module), registered through the same hook as third-party ones.
DEFAULT_PLUGINS = {
    "format": "grpcgrade.graders.format",
    "text": "grpcgrade.graders.text",
    "kolibrify": "grpcgrade.graders.kolibrify",
    "llm": "grpcgrade.graders.llm",
    "openai": "grpcgrade.graders.openai",
    "agent": "grpcgrade.graders.agent",
}


#: Plugin statuses (ListGraders' PluginInfo.status, the grpcgrade_plugin_info metric's `status` label).
LOADED = "loaded"  # every grader it registered is served
FAILED = "failed"  # it raised while loading or registering: none of its graders is served (see `error`)
CLASHED = "clashed"  # loaded, but a grader name it registered was taken by an earlier plugin (see `error`)


@dataclass
class PluginInfo:
    """What `grpcgrade graders` and ListGraders show about one plugin."""

    name: str
    distribution: str
    version: str
    status: str = LOADED
    error: str = ""
    graders: list[str] = field(default_factory=list)


@dataclass
class LoadedPlugin:
    info: PluginInfo
    module: object | None


def _wanted(ep_name: str, dist_name: str) -> bool:
    allow = os.environ.get("GRPCGRADE_LOAD_PLUGINS")
    if allow is None:
        return True
    names = {n.strip().lower() for n in allow.split(",") if n.strip()}
    return ep_name.lower() in names or dist_name.lower() in names


def make_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    if os.environ.get("GRPCGRADE_TRACE_PLUGINS"):
        pm.trace.root.setwriter(lambda msg: print(msg, end="", file=sys.stderr))
        pm.enable_tracing()
    return pm


def load_plugins(pm: pluggy.PluginManager) -> list[LoadedPlugin]:
    """Register the built-ins, then each wanted entry point; never raises for a plugin's fault."""
    loaded: list[LoadedPlugin] = []
    for name, modname in DEFAULT_PLUGINS.items():
        info = PluginInfo(name=name, distribution="grpcgrade", version=__version__)
        loaded.append(_register(pm, info, lambda m=modname: importlib.import_module(m)))
    for ep in entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist else ep.name
        if not _wanted(ep.name, dist) or pm.has_plugin(ep.name):
            continue
        info = PluginInfo(name=ep.name, distribution=dist, version=ep.dist.version if ep.dist else "")
        loaded.append(_register(pm, info, ep.load))
    return loaded


def _register(pm: pluggy.PluginManager, info: PluginInfo, load: object) -> LoadedPlugin:
    try:
        module = load()  # type: ignore[operator]
        pm.register(module, name=info.name)
        pm.check_pending()
    except Exception as exc:  # a plugin's import-time fault must not stop the service
        if pm.has_plugin(info.name):
            pm.unregister(name=info.name)
        info.status, info.error = FAILED, f"{type(exc).__name__}: {exc}"
        log.error("plugin %s (%s) failed to load: %s", info.name, info.distribution, info.error)
        return LoadedPlugin(info, None)
    return LoadedPlugin(info, module)
