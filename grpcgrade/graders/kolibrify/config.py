"""A Kolibrify RL dataserver configuration, served as grpcgrade rewards (`serve --kolibrify-config FILE`).

Each `datasets.<id>` becomes a reward named `<id>`: its `graders` at their `grader_weights`, Kolibrify's
always-attached reasoning-format grader (`think_format` here) at weight 1.0, and each of its
`multiplicative_graders` as a gate. Kolibrify normalises the weights (w_i / sum(w)) and multiplies by the
gates; a grpcgrade reward is prod(gates) * sum(w_i * s_i) / sum(w_i), the same number.

Grader names resolve in this order: the configuration's own `python_graders` and `external_graders`,
Kolibrify's built-in names (`reasoning_format` and `math-verify` map to `think_format` and
`math_verify`), then any grader the server has installed. A `python_graders` entry with `builtin:` is
that built-in with `init_kwargs` as its params, so it runs where the built-in runs (heavy ones in the
worker processes). Entries with `import:`/`path:` and `external_graders` are new graders: they are
registered under their key for plugin "kolibrify-config" and run in the server process, the only one
that read this file. The rest of a Kolibrify file (paths, stages, data files) is about sampling, which
the trainer does, and is ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from grpcgrade.core.config import ServerConfig
from grpcgrade.core.errors import ConfigError, InvalidParams, UnknownGrader
from grpcgrade.core.plugins import PluginInfo
from grpcgrade.core.registry import Registry
from grpcgrade.core.rewards import Reward, SpecData, number_repeats
from grpcgrade.grader import BaseGrader

from .adapters import KolibrifyGraderAdapter, is_kolibrify_grader
from .compat import kolibrify_namespace
from .parsing import is_number
from .remote_http import RemoteHttpGrader

#: Kolibrify grader names that differ from ours.
KOLIBRIFY_NAMES = {"reasoning_format": "think_format", "math-verify": "math_verify"}
#: Kolibrify attaches its reasoning-format grader to every dataset with this raw weight.
FORMAT_GRADER, FORMAT_WEIGHT = "think_format", 1.0
PLUGIN_NAME = "kolibrify-config"

DATASET_KEYS = frozenset({"path", "graders", "grader_weights", "multiplicative_graders"})
PYTHON_GRADER_KEYS = frozenset({"import", "path", "builtin", "init_kwargs"})
REMOTE_GRADER_KEYS = frozenset(
    {"type", "url", "timeout_s", "max_concurrency", "max_retries", "retry_backoff_s", "chunk_size"}
)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _names(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of grader names")
    return value


def _known_keys(body: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


def _constant(grader: BaseGrader) -> Callable[[], BaseGrader]:
    """A registry factory for a grader the configuration already built (so its errors surfaced at start)."""
    return lambda: grader


class _Loader:
    def __init__(self, path: Path, registry: Registry) -> None:
        self.path = path
        self.registry = registry
        self.specs: dict[str, SpecData] = {}  # grader names the configuration defines -> their spec
        self.graders: dict[str, BaseGrader] = {}  # the new graders among them, to register

    # -- graders the configuration defines ----------------------------------------------------------

    def _claim(self, key: Any, where: str) -> str:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{where}: a grader key must be a non-empty string, got {key!r}")
        if key in self.specs:
            raise ConfigError(f"{where}: {key!r} is defined twice (python_graders and external_graders)")
        return key

    def _register_new(self, key: str, grader: BaseGrader, where: str) -> None:
        try:
            owner = self.registry.entry(key).plugin.name
        except UnknownGrader:
            self.specs[key] = SpecData(name=key)
            self.graders[key] = grader
            return
        raise ConfigError(f"{where}: {key!r} is already the name of a grader (plugin {owner!r}); choose another key")

    def python_grader(self, key: Any, body: Any) -> None:
        key = self._claim(key, f"{self.path}: python_graders")
        where = f"{self.path}: python_graders.{key}"
        body = _mapping(body, where)
        _known_keys(body, PYTHON_GRADER_KEYS, where)
        sources = [k for k in ("import", "path", "builtin") if k in body]
        if len(sources) != 1:
            raise ConfigError(f"{where}: give exactly one of import, path or builtin")
        init_kwargs = _mapping(body.get("init_kwargs"), f"{where}.init_kwargs")
        if sources == ["builtin"]:
            builtin = body["builtin"]
            name = KOLIBRIFY_NAMES.get(builtin, builtin) if isinstance(builtin, str) else builtin
            self.specs[key] = SpecData(name=self._resolve(name, f"{where}.builtin"), params=dict(init_kwargs), key=key)
            try:
                self.registry.build(self.specs[key].name, self.specs[key].params)
            except (InvalidParams, TypeError) as exc:
                raise ConfigError(f"{where}.init_kwargs: {exc}") from exc
            return
        reference = body[sources[0]]
        target = self._load(key, sources[0], reference, where)
        self._register_new(key, self._instantiate(target, init_kwargs, reference, where), where)

    def _load(self, key: str, source: str, reference: Any, where: str) -> Any:
        if not isinstance(reference, str) or ":" not in reference:
            example = "pkg.module:Attr" if source == "import" else "file.py:Attr"
            raise ConfigError(f"{where}.{source}: must be {example!r}, got {reference!r}")
        location, attr = reference.rsplit(":", 1)
        try:
            with kolibrify_namespace():
                if source == "import":
                    module = importlib.import_module(location)
                else:
                    module = self._exec_file(key, location, where)
        except ConfigError:
            raise
        except Exception as exc:  # any failure of user code at import time is a configuration error
            raise ConfigError(f"{where}: loading {reference!r} failed: {type(exc).__name__}: {exc}") from exc
        if not hasattr(module, attr):
            raise ConfigError(f"{where}: {location!r} has no attribute {attr!r}")
        return getattr(module, attr)

    def _exec_file(self, key: str, location: str, where: str) -> Any:
        """Load a grader file the way Kolibrify does: relative to the configuration's directory."""
        file = (self.path.parent / location).resolve()
        if not file.is_file():
            raise ConfigError(f"{where}.path: no file {str(file)!r}")
        module_name = f"_kolibrify_user_grader_{key}"
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise ConfigError(f"{where}.path: {str(file)!r} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look their module up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        return module

    @staticmethod
    def _instantiate(target: Any, init_kwargs: dict[str, Any], reference: str, where: str) -> BaseGrader:
        """A class (or factory) is called with init_kwargs; an instance is used as it is, as in Kolibrify."""
        is_instance = not isinstance(target, type) and (isinstance(target, BaseGrader) or is_kolibrify_grader(target))
        if is_instance:
            if init_kwargs:
                raise ConfigError(f"{where}: {reference!r} is an instance, so it takes no init_kwargs")
            grader = target
        elif callable(target):
            try:
                grader = target(**init_kwargs)
            except Exception as exc:
                raise ConfigError(f"{where}: {reference}(**init_kwargs) failed: {type(exc).__name__}: {exc}") from exc
        else:
            raise ConfigError(f"{where}: {reference!r} is a {type(target).__name__}, not a grader")
        if isinstance(grader, BaseGrader):
            return grader
        if is_kolibrify_grader(grader):
            return KolibrifyGraderAdapter(grader, description=f"Kolibrify python grader {reference}")
        raise ConfigError(
            f"{where}: {reference!r} gave a {type(grader).__name__}, which is neither a Kolibrify Grader "
            "(an async grade_batch method) nor a grpcgrade BaseGrader"
        )

    def external_grader(self, key: Any, body: Any) -> None:
        key = self._claim(key, f"{self.path}: external_graders")
        where = f"{self.path}: external_graders.{key}"
        body = _mapping(body, where)
        if body.get("type") != "remote_http":
            raise ConfigError(f"{where}.type: unsupported external grader type {body.get('type')!r} (only remote_http)")
        _known_keys(body, REMOTE_GRADER_KEYS, where)
        if "url" not in body:
            raise ConfigError(f"{where}: url is required")
        try:
            grader = RemoteHttpGrader(**{k: v for k, v in body.items() if k != "type"})
        except InvalidParams as exc:
            raise ConfigError(f"{where}.{exc.param}: {exc}") from exc
        self._register_new(key, grader, where)

    # -- datasets -----------------------------------------------------------------------------------

    def _resolve(self, name: Any, where: str) -> str:
        """An installed grader's canonical name, or a ConfigError naming the closest ones."""
        try:
            return self.registry.entry(name).name
        except (UnknownGrader, TypeError):
            known = [*self.specs, *KOLIBRIFY_NAMES, *(e.name for e in self.registry.entries)]
            close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            install = "; install grpcgrade-math-verify" if name == "math_verify" else ""
            raise ConfigError(f"{where}: unknown grader {name!r}{hint}{install}") from None

    def spec(self, name: str, where: str) -> SpecData:
        if name in self.specs:
            return self.specs[name]
        canonical = self._resolve(KOLIBRIFY_NAMES.get(name, name), where)
        return SpecData(name=canonical, key=name if name != canonical else "")

    def dataset(self, dataset_id: str, body: Any) -> Reward:
        where = f"{self.path}: datasets.{dataset_id}"
        body = _mapping(body, where)
        _known_keys(body, DATASET_KEYS, where)
        names = _names(body.get("graders"), f"{where}.graders")
        weights = body.get("grader_weights") or []
        if not isinstance(weights, list) or len(weights) != len(names):
            count = len(weights) if isinstance(weights, list) else "no list of"
            raise ConfigError(f"{where}: {len(names)} graders but {count} grader_weights; give one weight per grader")
        specs = []
        for i, (name, weight) in enumerate(zip(names, weights, strict=True)):
            if not is_number(weight) or not math.isfinite(weight):
                raise ConfigError(f"{where}.grader_weights[{i}]: weight of {name!r} must be a number, got {weight!r}")
            specs.append(dataclasses.replace(self.spec(name, f"{where}.graders[{i}]"), weight=float(weight)))
        specs.append(SpecData(name=self._resolve(FORMAT_GRADER, where), weight=FORMAT_WEIGHT))
        total = sum(s.weight or 0.0 for s in specs)
        # Kolibrify refuses a sum <= 0 too (its normalised weights would divide by it); past a double's range,
        # every reward would be inf / inf
        if not 0 < total < math.inf:
            raise ConfigError(
                f"{where}.grader_weights: with the format grader's {FORMAT_WEIGHT:g} the weights sum to {total:g}; "
                "the sum must be a finite number > 0"
            )
        for i, name in enumerate(_names(body.get("multiplicative_graders"), f"{where}.multiplicative_graders")):
            specs.append(dataclasses.replace(self.spec(name, f"{where}.multiplicative_graders[{i}]"), gate=True))
        description = f"Kolibrify dataset {dataset_id} ({self.path.name}): " + ", ".join(
            f"{s.label}" + (" (gate)" if s.gate else f" x{s.weight:g}") for s in specs
        )
        return Reward(str(dataset_id), number_repeats(specs, keyed_too=True), description)


def load_kolibrify_config(path: str | Path, registry: Registry, base: ServerConfig) -> ServerConfig:
    """`base` plus one reward per Kolibrify dataset; the configuration's own graders join `registry`."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    raw = _mapping(raw, f"{path}: the top level")
    loader = _Loader(path, registry)
    for key, body in _mapping(raw.get("python_graders"), f"{path}: python_graders").items():
        loader.python_grader(key, body)
    for key, body in _mapping(raw.get("external_graders"), f"{path}: external_graders").items():
        loader.external_grader(key, body)
    datasets = _mapping(raw.get("datasets"), f"{path}: datasets")
    if not datasets:
        raise ConfigError(f"{path}: no datasets, so no reward to serve")
    rewards = dict(base.rewards)
    for dataset_id, body in datasets.items():
        if str(dataset_id) in rewards:
            raise ConfigError(f"{path}: datasets.{dataset_id}: a reward of that name is already configured")
        rewards[str(dataset_id)] = loader.dataset(str(dataset_id), body)

    plugin = PluginInfo(name=PLUGIN_NAME, distribution=str(path.resolve()), version="")
    local = dict(base.server_only_graders)
    for key, grader in loader.graders.items():
        factory = _constant(grader)
        description = getattr(grader, "description", "") or f"grader {key!r} of {path.name}"
        registry.add(plugin, factory, name=key, description=description)
        local[key] = factory
    return dataclasses.replace(base, rewards=rewards, server_only_graders=local)
