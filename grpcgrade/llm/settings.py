"""The operator's settings for one chat model (`models:` in the YAML, or the environment's "default"),
checked when the configuration is read.

A request names a model (grader param `model`), never a URL or a key: the endpoints, keys and limits come
only from here, so a request cannot aim the server at an arbitrary host. Models come from:

* the `models:` section, a list of mappings with `name` or a mapping name -> settings;
* a model named "default" from the environment when `GRPCGRADE_LLM_MODEL` is set (the endpoint's model id):
  base URL `OPENAI_BASE_URL` (else OpenAI's), key `OPENAI_API_KEY`. A configured "default" wins.

Plain data: the HTTP client (`chat`) is built from a `ModelConfig`, and the process's set of clients
(`models`) from both, so this module imports neither.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

DEFAULT_MODEL = "default"
MODEL_ENV = "GRPCGRADE_LLM_MODEL"
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"


@dataclass
class ModelConfig:
    """One OpenAI-compatible endpoint. `base_url` ends where `/chat/completions` is appended (`.../v1`)."""

    name: str
    base_url: str
    model: str
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)  # read from `api_key_env` once, at start
    max_concurrency: int = 16
    requests_per_minute: float = 0.0  # the provider's limit for this key; 0: none
    tokens_per_minute: float = 0.0  # prompt and completion tokens together; 0: none
    timeout_seconds: float = 60.0
    max_retries: int = 2
    retry_backoff_seconds: float = 0.5  # the first retry's delay; doubles each retry, with jitter
    price_per_million_input_tokens: float = 0.0  # for the cost estimate (grpcgrade_judge_cost_total)
    price_per_million_output_tokens: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)  # e.g. {temperature: 0, max_tokens: 512}


_SETTINGS = {f.name for f in fields(ModelConfig)} - {"name", "api_key"}
_RATES = (
    "requests_per_minute",
    "tokens_per_minute",
    "price_per_million_input_tokens",
    "price_per_million_output_tokens",
)
_RESERVED_BODY = frozenset({"model", "messages", "stream", "n"})


def _number(name: str, raw: Mapping[str, Any], key: str, kind: type[int] | type[float]) -> Any:
    value = raw.get(key, getattr(ModelConfig, key))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise ValueError(f"model {name!r}: {key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def parse_model(name: str, raw: Any) -> ModelConfig:
    """One model's settings, checked; raises ValueError naming the model and the setting."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"model {name!r}: settings must be a mapping")
    unknown = sorted(set(raw) - _SETTINGS)
    if unknown:
        raise ValueError(f"model {name!r}: unknown setting {unknown[0]!r} (allowed: {', '.join(sorted(_SETTINGS))})")
    base_url = str(raw.get("base_url") or "")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"model {name!r}: base_url must be an http(s) URL, got {base_url!r}")
    key_env = str(raw.get("api_key_env") or "") or None
    api_key = os.environ.get(key_env) if key_env else None
    if key_env and not api_key:
        raise ValueError(f"model {name!r}: environment variable {key_env!r} (api_key_env) is not set")
    extra_body = raw.get("extra_body") or {}
    if not isinstance(extra_body, Mapping):
        raise ValueError(f"model {name!r}: extra_body must be a mapping")
    clash = sorted(_RESERVED_BODY.intersection(extra_body))
    if clash:
        raise ValueError(f"model {name!r}: extra_body may not set {clash[0]!r}")
    config = ModelConfig(
        name=name,
        base_url=base_url,
        model=str(raw.get("model") or name),
        api_key_env=key_env,
        api_key=api_key,
        max_concurrency=_number(name, raw, "max_concurrency", int),
        requests_per_minute=_number(name, raw, "requests_per_minute", float),
        tokens_per_minute=_number(name, raw, "tokens_per_minute", float),
        timeout_seconds=_number(name, raw, "timeout_seconds", float),
        max_retries=_number(name, raw, "max_retries", int),
        retry_backoff_seconds=_number(name, raw, "retry_backoff_seconds", float),
        price_per_million_input_tokens=_number(name, raw, "price_per_million_input_tokens", float),
        price_per_million_output_tokens=_number(name, raw, "price_per_million_output_tokens", float),
        extra_body=dict(extra_body),
    )
    if config.max_concurrency < 1:
        raise ValueError(f"model {name!r}: max_concurrency must be at least 1")
    if not (math.isfinite(config.timeout_seconds) and config.timeout_seconds > 0):
        raise ValueError(f"model {name!r}: timeout_seconds must be a positive number")
    if config.max_retries < 0 or not (0 <= config.retry_backoff_seconds < math.inf):
        raise ValueError(f"model {name!r}: max_retries and retry_backoff_seconds must not be negative")
    for key in _RATES:
        value = getattr(config, key)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"model {name!r}: {key} must be a number >= 0 (0: no limit / no price), got {value!r}")
    return config


def parse_models(data: Any) -> dict[str, ModelConfig]:
    """The `models:` section: a list of mappings with `name`, or a mapping name -> settings."""
    if not data:
        return {}
    if isinstance(data, Mapping):
        items = [(str(name), body) for name, body in data.items()]
    elif isinstance(data, list):
        items = []
        for i, body in enumerate(data):
            if not isinstance(body, Mapping) or not body.get("name"):
                raise ValueError(f"model {i}: a mapping with `name` is required")
            items.append((str(body["name"]), {k: v for k, v in body.items() if k != "name"}))
    else:
        raise ValueError("`models` must be a list or a mapping")
    out: dict[str, ModelConfig] = {}
    for name, body in items:
        if name in out:
            raise ValueError(f"model {name!r} is defined twice")
        out[name] = parse_model(name, body)
    return out


def env_models() -> dict[str, ModelConfig]:
    """The "default" model the environment describes, if it names one."""
    model = os.environ.get(MODEL_ENV)
    if not model:
        return {}
    base_url = os.environ.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE_URL
    key_env = "OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY") else None
    return {DEFAULT_MODEL: parse_model(DEFAULT_MODEL, {"base_url": base_url, "model": model, "api_key_env": key_env})}
