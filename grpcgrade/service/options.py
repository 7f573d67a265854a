"""What `grpcgrade serve` is told (`ServeOptions`) and what it reads from that: the configuration and the
auth tokens. Shared by the server's process and its HTTP face processes (`http.process`), which read the
same files to resolve the same rewards with the same tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from grpcgrade.core import tokens as token_counts
from grpcgrade.core.config import ServerConfig, load_config
from grpcgrade.core.errors import ConfigError, InvalidParams
from grpcgrade.core.registry import Registry


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0: no metrics endpoint
    workers: int | None = None  # None: one per core; 0: grade everything in the server process
    config: str | None = None
    kolibrify_config: str | None = None
    grace_seconds: float = 25.0
    grader_timeout_seconds: float | None = None  # None: the config's value
    auth_token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    http_host: str = "127.0.0.1"
    http_port: int | None = None  # None: no HTTP face; 0: a free port (see Service.http_port)
    http_processes: int | None = None  # None: the config's `http.processes`
    ray_address: str | None = None  # the workers as actors on this Ray cluster (core.executors_ray)
    tokenizer: str | None = None  # None: the config's `tokenizer:` (core.tokens)
    extra_options: list[tuple[str, int]] = field(default_factory=list)


def read_config(opts: ServeOptions, registry: Registry) -> ServerConfig:
    config = load_config(opts.config) if opts.config else ServerConfig()
    if opts.kolibrify_config:
        from grpcgrade.graders.kolibrify.config import load_kolibrify_config

        config = load_kolibrify_config(opts.kolibrify_config, registry, base=config)
    if opts.grader_timeout_seconds is not None:
        config.grader_timeout_seconds = opts.grader_timeout_seconds
    if opts.tokenizer:
        config.tokenizer = token_counts.normalize(opts.tokenizer)
        try:
            token_counts.load(config.tokenizer)
        except InvalidParams as exc:
            raise ConfigError(f"--tokenizer {opts.tokenizer}: {exc.reason}") from None
    return config


def read_tokens(path: str | None) -> list[str]:
    """The auth token file: one token a line; blank lines and lines starting with `#` are ignored."""
    if not path:
        return []
    lines = (line.strip() for line in Path(path).read_text().splitlines())
    tokens = [line for line in lines if line and not line.startswith("#")]
    if not tokens:
        raise ValueError(f"{path}: no token in the auth token file")
    return tokens
