"""The server's YAML configuration: named rewards, limits and time limits.

```yaml
grader_timeout_seconds: 30
default_reward: gsm8k     # what the HTTP face's POST /get_reward grades with (see docs/trainers.md)
http: {failure_reward: 0.0, strip_suffixes: ["<|im_end|>", "<|endoftext|>"]}
limits: {max_samples_per_batch: 100000, max_field_chars: 1000000, max_message_bytes: 67108864,
         send_timeout_seconds: 30, max_buffered_output_bytes: 268435456}
canary: {interval_seconds: 300, fail_health: false}   # see grpcgrade.core.canaries
cache: {enabled: true, max_bytes: 67108864, ttl_seconds: 3600}       # the result cache
quarantine: {enabled: true, max_bytes: 8388608, ttl_seconds: 3600}  # inputs that timed out or killed a worker
rewards:
  gsm8k:
    description: exact answer, terse output, under 200 tokens
    graders:
      - {name: math_exact, weight: 2}
      - {name: number_only}
      - {name: completion_length_cap, params: {max_completion_tokens: 200}, gate: true}
    canaries:
      - {name: empty, sample: {response: "", reference: "42"}, expect: 0}
```
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from grpcgrade.llm.limits import parse_weights
from grpcgrade.llm.settings import ModelConfig, parse_models

from . import tokens
from .canaries import (
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_TOLERANCE,
    MAX_CANARIES_PER_REWARD,
    MAX_INTERVAL_SECONDS,
    MIN_INTERVAL_SECONDS,
    Canary,
    CanarySettings,
)
from .coalesce import DEFAULT_LINGER_SECONDS, MAX_LINGER_SECONDS
from .errors import ConfigError, InvalidParams, SampleProblem
from .guard import call_guards
from .result_cache import CacheConfig, QuarantineConfig
from .rewards import Reward, SpecData
from .samples import SAMPLE_FIELDS, TEXT_FIELDS, Limits, add_extra

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
    """The HTTP/JSON face (`--http-port`): what a failed sample's reward is, which trailing special
    tokens are not part of a response, and the reward guard's defaults for requests that do not set them
    (OpenRLHF sends no options: docs/reward-guard.md)."""

    failure_reward: float = 0.0
    strip_suffixes: tuple[str, ...] = DEFAULT_STRIP_SUFFIXES
    budget_seconds: float = 0.0
    max_failure_ratio: float | None = None
    # What bounds a hostile client (grpcgrade.service.http.limits, docs/security.md): a body, far below
    # gRPC's message limit (the face's requests are one sample or one trainer batch of text), the time it
    # may take to arrive, the time a connection may take to send its request head and sit idle, and how
    # many connections may be open at once.
    max_body_bytes: int = 8 * 1024 * 1024
    body_timeout_seconds: float = 60.0
    header_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 15.0
    max_connections: int = 4096
    # The face's serving processes (grpcgrade.service.http.process): each translates HTTP into the gRPC
    # contract off the engine's process, on the same port (SO_REUSEPORT); `--http-processes` overrides.
    processes: int = 1


@dataclass
class GrpcConfig:
    """The public gRPC port's serving processes (`grpc:`)."""

    # 0: the engine's process serves the port itself. N >= 1: N face processes (grpcgrade.service.grpc_face)
    # serve it together (SO_REUSEPORT), coalescing unary calls into BatchEvaluate calls to the engine's
    # process and relaying every other call; `--grpc-processes` overrides.
    processes: int = 0
    # Who serves the port when it is not the engine's process: "python" (the face processes above) or
    # "native" (grpcgrade-grpc-face, in Go: one process using `processes` cores, 0: every core); `--grpc-face`
    # overrides. Why a Go face: a Python gRPC server spends 250-290 us of CPU a unary call (docs/performance.md).
    face: str = "python"
    # What bounds a hostile or leaking client of the public gRPC port (docs/security.md), per serving process:
    # connections open at once (each holds a descriptor and ~15 KB; without a cap, idle connections ran the
    # server out of descriptors, and then nothing else could start: a sandbox, a worker, a scrape), the time a
    # new connection may take to finish its TLS and HTTP/2 handshakes (gRPC's own default: 120 s), and how
    # long one with no call may stay open (gRPC clients reconnect by themselves on their next call).
    max_connections: int = 10_000
    handshake_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 300.0


@dataclass
class ServerConfig:
    rewards: dict[str, Reward] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    grader_timeout_seconds: float = 30.0
    #: Graders defined by the configuration itself (name -> factory), served from this process only.
    server_only_graders: dict[str, Any] = field(default_factory=dict)
    #: The chat models LLM graders may name (`models:`); see grpcgrade.llm.models.
    models: dict[str, ModelConfig] = field(default_factory=dict)
    #: Each caller's weight in every model's fair share (`callers:`); see grpcgrade.llm.limits.
    callers: dict[str, float] = field(default_factory=dict)
    #: The reward of the HTTP face's `POST /get_reward`; "" when there is none.
    default_reward: str = ""
    http: HttpConfig = field(default_factory=HttpConfig)
    grpc: GrpcConfig = field(default_factory=GrpcConfig)
    #: Every reward's canaries (`rewards.NAME.canaries`), and how they run (`canary:`).
    canaries: list[Canary] = field(default_factory=list)
    canary: CanarySettings = field(default_factory=CanarySettings)
    #: The result cache: identical (grader, params, inputs) answered from memory (see docs/reward-guard.md).
    cache: CacheConfig = field(default_factory=CacheConfig)
    #: Inputs that timed out or killed a worker, answered at once with the same error.
    quarantine: QuarantineConfig = field(default_factory=QuarantineConfig)
    #: One-sample calls of the same plan wait at most this long for each other (`core.coalesce`); 0: off.
    coalesce_linger_seconds: float = DEFAULT_LINGER_SECONDS
    #: The tokenizer length gates count with when a sample has no `completion_tokens` (`core.tokens`).
    tokenizer: str = ""


TOP_KEYS = (
    *("rewards", "limits", "grader_timeout_seconds", "models", "default_reward", "http", "grpc", "canary"),
    *("cache", "quarantine", "callers", "tokenizer", "coalesce_linger_seconds"),
)
#: The limits whose 0 means none.
ZERO_IS_NO_LIMIT = ("max_memory_bytes", "max_pending_request_bytes")
SPEC_KEYS = ("name", "params", "key", "weight", "gate")
REWARD_KEYS = ("graders", "description", "canaries", "tokenizer")
#: A canary's keys (`rewards.NAME.canaries[i]`), and the `canary:` section's.
CANARY_KEYS = ("name", "sample", "expect", "tolerance")
CANARY_SETTINGS_KEYS = ("interval_seconds", "fail_health")


def _number(value: Any, where: str, kind: type[int] | type[float], minimum: float = 0) -> Any:
    """A YAML number as `kind`, or a ConfigError naming the key path and what is allowed."""
    wanted = "a whole number" if kind is int else "a number"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (kind is int and value != int(value)):
        raise ConfigError(f"{where}: must be {wanted}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where}: must be at least {minimum:g}, got {value!r}")
    return kind(value)


def _unknown(raw: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(map(str, raw)) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(allowed)})")


def parse_spec(raw: Any, where: str) -> SpecData:
    if isinstance(raw, str):
        return SpecData(name=raw)
    if not isinstance(raw, dict) or "name" not in raw:
        raise ConfigError(f"{where}: a grader is a name or a mapping with `name` (keys: {', '.join(SPEC_KEYS)})")
    _unknown(raw, SPEC_KEYS, where)
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{where}.params: must be a mapping of parameter names to values, got {params!r}")
    weight = raw.get("weight")
    gate = raw.get("gate", False)
    if not isinstance(gate, bool):
        raise ConfigError(f"{where}.gate: must be true or false, got {gate!r}")
    return SpecData(
        name=str(raw["name"]),
        params=dict(params),
        key=str(raw.get("key") or ""),
        weight=None if weight is None else _number(weight, f"{where}.weight", float),
        gate=gate,
    )


def canary_sample(raw: Any, where: str) -> dict[str, Any]:
    """A sample as a client's sample dict states it (`response`, `reference`, ...; other keys are `extra`),
    as the grader keyword arguments a call's sample becomes."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping of sample fields ({', '.join(SAMPLE_FIELDS)}, or extra keys)")
    fields: dict[str, Any] = {"sample_id": str(raw.get("id", "")), **dict.fromkeys(TEXT_FIELDS, ""), "responses": []}
    for name in TEXT_FIELDS:
        if name in raw:
            if not isinstance(raw[name], str):
                raise ConfigError(f"{where}.{name}: must be a string, got {raw[name]!r}")
            fields[name] = raw[name]
    responses = raw.get("responses", [])
    if not isinstance(responses, list) or not all(isinstance(r, str) for r in responses):
        raise ConfigError(f"{where}.responses: must be a list of strings")
    fields["responses"] = list(responses)
    try:
        add_extra(fields, {str(k): v for k, v in raw.items() if k not in SAMPLE_FIELDS})
    except SampleProblem as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return fields


def parse_canaries(raw: Any, reward: str, where: str) -> list[Canary]:
    """A reward's `canaries:` list, checked; a ConfigError names the key path and what is allowed."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: must be a list of canaries (keys: {', '.join(CANARY_KEYS)})")
    if len(raw) > MAX_CANARIES_PER_REWARD:
        raise ConfigError(f"{where}: {len(raw)} canaries, over the limit of {MAX_CANARIES_PER_REWARD} per reward")
    out: list[Canary] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{at}: a canary is a mapping (keys: {', '.join(CANARY_KEYS)})")
        _unknown(item, CANARY_KEYS, at)
        if "expect" not in item:
            raise ConfigError(f"{at}: needs `expect`, the reward the sample must get")
        if "sample" not in item:
            raise ConfigError(f"{at}: needs `sample`, the sample to grade")
        name = str(item.get("name") or i)
        if any(c.name == name for c in out):
            raise ConfigError(f"{at}.name: {name!r} is used twice in this reward")
        tolerance = _number(item.get("tolerance", DEFAULT_TOLERANCE), f"{at}.tolerance", float)
        out.append(
            Canary(
                reward,
                name,
                canary_sample(item["sample"], f"{at}.sample"),
                _number(item["expect"], f"{at}.expect", float, -math.inf),
                tolerance,
            )
        )
    return out


def parse_canary_settings(raw: Any, where: str) -> CanarySettings:
    if raw is None:
        return CanarySettings()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping (keys: {', '.join(CANARY_SETTINGS_KEYS)})")
    _unknown(raw, CANARY_SETTINGS_KEYS, where)
    interval = _number(raw.get("interval_seconds", DEFAULT_INTERVAL_SECONDS), f"{where}.interval_seconds", float)
    if not MIN_INTERVAL_SECONDS <= interval <= MAX_INTERVAL_SECONDS:
        raise ConfigError(
            f"{where}.interval_seconds: must be between {MIN_INTERVAL_SECONDS:g} and {MAX_INTERVAL_SECONDS:g}, "
            f"got {interval:g}"
        )
    fail_health = raw.get("fail_health", False)
    if not isinstance(fail_health, bool):
        raise ConfigError(f"{where}.fail_health: must be true or false, got {fail_health!r}")
    return CanarySettings(interval, fail_health)


def parse_tokenizer(raw: Any, where: str, base: Path | None) -> str:
    """A `tokenizer:` value (`core.tokens`), a relative tokenizer.json path made absolute against the config
    file's directory; loaded now, so an unusable one stops the server at start with the key path."""
    if raw is None or raw == "":
        return ""
    if not isinstance(raw, str):
        raise ConfigError(f"{where}: must be tiktoken:ENCODING or the path of a tokenizer.json, got {raw!r}")
    spec = tokens.normalize(raw, base)
    try:
        tokens.load(spec)
    except InvalidParams as exc:
        raise ConfigError(f"{where}: {exc.reason}") from None
    return spec


def parse_config(data: dict[str, Any], source: str = "config", base: Path | None = None) -> ServerConfig:
    """The configuration, checked; a ConfigError names the file, the key path (`rewards.gsm8k.graders[0]
    .weight`) and what is allowed there. `base`: the directory relative paths are read from (the file's)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping (keys: {', '.join(TOP_KEYS)})")
    _unknown(data, TOP_KEYS, source)
    limit_names = tuple(f.name for f in dataclasses.fields(Limits))
    raw_limits = data.get("limits") or {}
    if not isinstance(raw_limits, dict):
        raise ConfigError(f"{source}: limits: must be a mapping (keys: {', '.join(limit_names)})")
    _unknown(raw_limits, limit_names, f"{source}: limits")
    kinds = {f.name: f.type for f in dataclasses.fields(Limits)}  # "int" or "float" (postponed annotations)
    limits = Limits(
        **{
            k: _number(v, f"{source}: limits.{k}", float, 0.001)
            if kinds[k] == "float"
            else _number(v, f"{source}: limits.{k}", int, 0 if k in ZERO_IS_NO_LIMIT else 1)
            for k, v in raw_limits.items()
        }
    )
    raw_rewards = data.get("rewards") or {}
    if not isinstance(raw_rewards, dict):
        raise ConfigError(f"{source}: rewards: must be a mapping of reward names to rewards")
    rewards = {}
    canaries: list[Canary] = []
    for key, body in raw_rewards.items():
        name, where = str(key), f"{source}: rewards.{key}"
        if key is None or not name:  # no call can name it: a request's empty `reward` asks for none
            raise ConfigError(f"{source}: rewards: a reward needs a name, got {key!r}")
        if name in rewards:  # YAML's 5 and "5", one name in every request
            raise ConfigError(f"{where}: a second reward named {name!r}")
        body = {"graders": body} if isinstance(body, list) else body
        if not isinstance(body, dict) or not body.get("graders"):
            raise ConfigError(f"{where}: needs a list of graders (`graders:`, or the list itself)")
        _unknown(body, REWARD_KEYS, where)
        if not isinstance(body["graders"], list):
            raise ConfigError(f"{where}.graders: must be a list of graders")
        specs = [parse_spec(g, f"{where}.graders[{i}]") for i, g in enumerate(body["graders"])]
        tokenizer = parse_tokenizer(body.get("tokenizer"), f"{where}.tokenizer", base)
        rewards[name] = Reward(name, specs, str(body.get("description", "")), tokenizer)
        canaries.extend(parse_canaries(body.get("canaries"), name, f"{where}.canaries"))
    try:
        models = parse_models(data.get("models"))
    except ValueError as exc:
        raise ConfigError(f"{source}: models: {exc}") from exc
    try:
        callers = parse_weights(data.get("callers"))
    except ValueError as exc:
        raise ConfigError(f"{source}: callers: {exc}") from exc
    default_reward = str(data.get("default_reward") or "")
    if default_reward and default_reward not in rewards:
        raise ConfigError(f"{source}: default_reward {default_reward!r} is not one of the rewards")
    timeout = data.get("grader_timeout_seconds", 30.0)
    linger = data.get("coalesce_linger_seconds", DEFAULT_LINGER_SECONDS)
    linger = _number(linger, f"{source}: coalesce_linger_seconds", float)
    if linger > MAX_LINGER_SECONDS:
        raise ConfigError(f"{source}: coalesce_linger_seconds: at most {MAX_LINGER_SECONDS:g}, got {linger!r}")
    return ServerConfig(
        default_reward=default_reward,
        http=parse_http(data.get("http"), source),
        grpc=parse_grpc(data.get("grpc"), source),
        rewards=rewards,
        limits=limits,
        grader_timeout_seconds=_number(timeout, f"{source}: grader_timeout_seconds", float, 0.001),
        models=models,
        callers=callers,
        canaries=canaries,
        canary=parse_canary_settings(data.get("canary"), f"{source}: canary"),
        cache=parse_store(data.get("cache"), CacheConfig, f"{source}: cache"),
        quarantine=parse_store(data.get("quarantine"), QuarantineConfig, f"{source}: quarantine"),
        coalesce_linger_seconds=linger,
        tokenizer=parse_tokenizer(data.get("tokenizer"), f"{source}: tokenizer", base),
    )


def parse_http(raw: Any, source: str) -> HttpConfig:
    if raw is None:
        return HttpConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: http must be a mapping")
    allowed = ("failure_reward", "strip_suffixes", "budget_seconds", "max_failure_ratio", *HTTP_BOUNDS)
    unknown = set(raw) - set(allowed)
    if unknown:
        raise ConfigError(f"{source}: http: unknown key {sorted(unknown)[0]!r} (allowed: {', '.join(allowed)})")
    suffixes = raw.get("strip_suffixes", DEFAULT_STRIP_SUFFIXES)
    if not isinstance(suffixes, list | tuple) or not all(isinstance(x, str) and x for x in suffixes):
        raise ConfigError(f"{source}: http: strip_suffixes must be a list of non-empty strings")
    try:
        failure = float(raw.get("failure_reward", 0.0))
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: http: failure_reward must be a number") from None
    if not math.isfinite(failure):
        raise ConfigError(f"{source}: http: failure_reward must be finite")
    budget, ratio = raw.get("budget_seconds", 0.0), raw.get("max_failure_ratio")
    try:
        if isinstance(budget, bool) or not isinstance(budget, int | float):
            raise InvalidParams("budget_seconds", f"must be a number of seconds, got {budget!r}")
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, int | float)):
            raise InvalidParams("max_failure_ratio", f"must be a number, got {ratio!r}")
        call_guards(float(budget), None if ratio is None else float(ratio), 0, 0.0)
    except InvalidParams as exc:
        raise ConfigError(f"{source}: http: {exc}") from None
    bounds: dict[str, Any] = {}
    for key, kind in HTTP_BOUNDS.items():
        if key in raw:
            bounds[key] = _number(raw[key], f"{source}: http: {key}", kind, 1 if kind is int else 0.001)
    if bounds.get("processes", 1) > MAX_HTTP_PROCESSES:
        raise ConfigError(f"{source}: http: processes must be at most {MAX_HTTP_PROCESSES}")
    return HttpConfig(
        failure_reward=failure,
        strip_suffixes=tuple(suffixes),
        budget_seconds=float(budget),
        max_failure_ratio=None if ratio is None else float(ratio),
        **bounds,
    )


#: The most face processes of one face a server starts (each a Python process of its own: ~60 MB).
MAX_HTTP_PROCESSES = 64
MAX_GRPC_PROCESSES = MAX_HTTP_PROCESSES


#: Who may serve the public gRPC port beside the engine's process (`grpc.face`).
GRPC_FACES = ("python", "native")


def parse_grpc(raw: Any, source: str) -> GrpcConfig:
    """`grpc: {processes: N, face: python|native, ...}` (N: 0 to MAX_GRPC_PROCESSES; the bounds: GRPC_BOUNDS)."""
    if raw is None:
        return GrpcConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: grpc must be a mapping")
    _unknown(raw, ("processes", "face", *GRPC_BOUNDS), f"{source}: grpc")
    processes = raw.get("processes", 0)
    if isinstance(processes, bool) or not isinstance(processes, int) or not 0 <= processes <= MAX_GRPC_PROCESSES:
        raise ConfigError(f"{source}: grpc: processes must be a whole number from 0 to {MAX_GRPC_PROCESSES}")
    face = raw.get("face", "python")
    if face not in GRPC_FACES:
        raise ConfigError(f"{source}: grpc: face must be one of {', '.join(GRPC_FACES)}, not {face!r}")
    bounds: dict[str, Any] = {}
    for key, (kind, least, most) in GRPC_BOUNDS.items():
        if key in raw:
            bounds[key] = _number(raw[key], f"{source}: grpc: {key}", kind, least)
            if bounds[key] > most:
                raise ConfigError(f"{source}: grpc: {key}: must be at most {most:,}, got {raw[key]!r}")
    return GrpcConfig(processes=processes, face=face, **bounds)


#: The public gRPC port's bounds on hostile clients: each a number of this type within these bounds (gRPC
#: takes them as C ints, of milliseconds for the times: a day is well within).
GRPC_BOUNDS: dict[str, tuple[type[int] | type[float], float, int]] = {
    "max_connections": (int, 1, 1_000_000),
    "handshake_timeout_seconds": (float, 0.001, 86_400),
    "idle_timeout_seconds": (float, 0.001, 86_400),
}


#: The HTTP face's bounds on hostile clients, each a positive number of this type.
HTTP_BOUNDS: dict[str, type[int] | type[float]] = {
    "max_body_bytes": int,
    "body_timeout_seconds": float,
    "header_timeout_seconds": float,
    "idle_timeout_seconds": float,
    "max_connections": int,
    "processes": int,
}


def load_config(path: str | Path) -> ServerConfig:
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as stream:  # a stream, not a string: YAML's errors name the file
            data = yaml.safe_load(stream) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return parse_config(data, str(path), path.resolve().parent)


StoreConfig = TypeVar("StoreConfig", CacheConfig, QuarantineConfig)


def parse_store(raw: Any, kind: type[StoreConfig], where: str) -> StoreConfig:
    """`cache:` or `quarantine:`: `enabled` (true/false), `max_bytes` (a whole number), `ttl_seconds`."""
    if raw is None:
        return kind()
    names = tuple(f.name for f in dataclasses.fields(kind))
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping (keys: {', '.join(names)})")
    _unknown(raw, names, where)
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}.enabled: must be true or false, got {enabled!r}")
    default = kind()
    return kind(
        enabled=enabled,
        max_bytes=_number(raw.get("max_bytes", default.max_bytes), f"{where}.max_bytes", int, 1),
        ttl_seconds=_number(raw.get("ttl_seconds", default.ttl_seconds), f"{where}.ttl_seconds", float, 0.001),
    )
