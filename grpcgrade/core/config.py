"""The server's YAML configuration: named rewards, limits and time limits.

```yaml
grader_timeout_seconds: 30
default_reward: gsm8k     # what the HTTP face's POST /get_reward grades with (see docs/trainers.md)
http: {failure_reward: 0.0, strip_suffixes: ["<|im_end|>", "<|endoftext|>"]}
limits: {max_samples_per_batch: 100000, max_field_chars: 1000000, max_message_bytes: 67108864}
rewards:
  gsm8k:
    description: exact answer, terse output, under 200 tokens
    graders:
      - {name: math_exact, weight: 2}
      - {name: number_only}
      - {name: completion_length_cap, params: {max_completion_tokens: 200}, gate: true}
```
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpcgrade.llm.models import ModelConfig, parse_models

from .errors import ConfigError
from .rewards import Reward, SpecData
from .samples import Limits

#: Special tokens the HTTP face strips from the end of a response (OpenRLHF decodes its query with
#: `skip_special_tokens=False`, so the end-of-turn or end-of-text token is still there): the end tokens of
#: the common chat templates (ChatML/Qwen, Llama 3, Llama 2/Mistral, Gemma, Phi-3, DeepSeek, gpt-oss).
DEFAULT_STRIP_SUFFIXES = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "</s>",
    "<end_of_turn>",
    "<eos>",
    "<|end|>",
    "<｜end▁of▁sentence｜>",
    "<|return|>",
)


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP/JSON face (`--http-port`): what a failed sample's reward is, and which trailing special
    tokens are not part of a response."""

    failure_reward: float = 0.0
    strip_suffixes: tuple[str, ...] = DEFAULT_STRIP_SUFFIXES


@dataclass
class ServerConfig:
    rewards: dict[str, Reward] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    grader_timeout_seconds: float = 30.0
    #: Graders defined by the configuration itself (name -> factory), served from this process only.
    server_only_graders: dict[str, Any] = field(default_factory=dict)
    #: The chat models LLM graders may name (`models:`); see grpcgrade.llm.models.
    models: dict[str, ModelConfig] = field(default_factory=dict)
    #: The reward of the HTTP face's `POST /get_reward`; "" when there is none.
    default_reward: str = ""
    http: HttpConfig = field(default_factory=HttpConfig)


def parse_spec(raw: Any, where: str) -> SpecData:
    if isinstance(raw, str):
        return SpecData(name=raw)
    if not isinstance(raw, dict) or "name" not in raw:
        raise ConfigError(f"{where}: a grader is a name or a mapping with `name`")
    unknown = set(raw) - {"name", "params", "key", "weight", "gate"}
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (allowed: name, params, key, weight, gate)")
    weight = raw.get("weight")
    return SpecData(
        name=str(raw["name"]),
        params=dict(raw.get("params") or {}),
        key=str(raw.get("key") or ""),
        weight=None if weight is None else float(weight),
        gate=bool(raw.get("gate", False)),
    )


def parse_config(data: dict[str, Any], source: str = "config") -> ServerConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    unknown = set(data) - {"rewards", "limits", "grader_timeout_seconds", "models", "default_reward", "http"}
    if unknown:
        raise ConfigError(f"{source}: unknown key {sorted(unknown)[0]!r}")
    limit_names = {f.name for f in dataclasses.fields(Limits)}
    raw_limits = data.get("limits") or {}
    bad = set(raw_limits) - limit_names
    if bad:
        raise ConfigError(f"{source}: unknown limit {sorted(bad)[0]!r} (allowed: {', '.join(sorted(limit_names))})")
    rewards = {}
    for name, body in (data.get("rewards") or {}).items():
        body = {"graders": body} if isinstance(body, list) else body
        if not isinstance(body, dict) or not body.get("graders"):
            raise ConfigError(f"{source}: reward {name!r} needs a list of graders")
        specs = [parse_spec(g, f"{source}: reward {name!r}, grader {i}") for i, g in enumerate(body["graders"])]
        rewards[str(name)] = Reward(str(name), specs, str(body.get("description", "")))
    try:
        models = parse_models(data.get("models"))
    except ValueError as exc:
        raise ConfigError(f"{source}: models: {exc}") from exc
    default_reward = str(data.get("default_reward") or "")
    if default_reward and default_reward not in rewards:
        raise ConfigError(f"{source}: default_reward {default_reward!r} is not one of the rewards")
    timeout = data.get("grader_timeout_seconds", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ConfigError(f"{source}: grader_timeout_seconds must be a positive number of seconds, got {timeout!r}")
    return ServerConfig(
        default_reward=default_reward,
        http=parse_http(data.get("http"), source),
        rewards=rewards,
        limits=Limits(**{k: int(v) for k, v in raw_limits.items()}),
        grader_timeout_seconds=float(timeout),
        models=models,
    )


def parse_http(raw: Any, source: str) -> HttpConfig:
    if raw is None:
        return HttpConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: http must be a mapping")
    unknown = set(raw) - {"failure_reward", "strip_suffixes"}
    if unknown:
        raise ConfigError(
            f"{source}: http: unknown key {sorted(unknown)[0]!r} (allowed: failure_reward, strip_suffixes)"
        )
    suffixes = raw.get("strip_suffixes", DEFAULT_STRIP_SUFFIXES)
    if not isinstance(suffixes, list | tuple) or not all(isinstance(x, str) and x for x in suffixes):
        raise ConfigError(f"{source}: http: strip_suffixes must be a list of non-empty strings")
    try:
        failure = float(raw.get("failure_reward", 0.0))
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: http: failure_reward must be a number") from None
    if not math.isfinite(failure):
        raise ConfigError(f"{source}: http: failure_reward must be finite")
    return HttpConfig(failure_reward=failure, strip_suffixes=tuple(suffixes))


def load_config(path: str | Path) -> ServerConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return parse_config(data, str(path))
