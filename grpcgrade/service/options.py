"""What `grpcgrade serve` is told (`ServeOptions`) and what it reads from that: the configuration, the
auth tokens, the TLS credentials and the public gRPC port's settings. Shared by the server's process and
its face processes (`face_process`), which read the same files to resolve the same rewards with the same
tokens, and serve the public gRPC port as the server's process does without them."""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from grpcgrade.core import tokens as token_counts
from grpcgrade.core.config import ServerConfig, load_config
from grpcgrade.core.errors import ConfigError, InvalidParams
from grpcgrade.core.registry import Registry

log = logging.getLogger("grpcgrade.service")


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
    grpc_processes: int | None = None  # None: the config's `grpc.processes`; >= 1: gRPC face processes
    grpc_face: str | None = None  # None: the config's `grpc.face` ("python" or "native": core.config.GRPC_FACES)
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


def server_credentials(opts: ServeOptions) -> grpc.ServerCredentials | None:
    """The public gRPC port's TLS credentials (None: plaintext)."""
    if not (opts.tls_cert and opts.tls_key):
        return None
    client_ca = Path(opts.tls_client_ca).read_bytes() if opts.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(Path(opts.tls_key).read_bytes(), Path(opts.tls_cert).read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def public_server_options(opts: ServeOptions, config: ServerConfig, *, shared: bool) -> list[tuple[str, int]]:
    """The gRPC server options of whoever serves the public gRPC port: the server's process (`shared`
    False: a second server on the same port fails instead of sharing it) or its gRPC face processes
    (`shared`: they listen on it together, SO_REUSEPORT)."""
    max_bytes = config.limits.max_message_bytes
    pending = config.limits.max_pending_calls  # past gRPC's own pending limit its core cancels calls (admission)
    grpc_config = config.grpc
    return [
        ("grpc.so_reuseport", 1 if shared else 0),
        # Past the cap gRPC's core closes a new connection at once, unread; one that has not finished its
        # handshakes (TLS, the HTTP/2 preface and first SETTINGS) in time is closed; so is one idle too long.
        ("grpc.max_allowed_incoming_connections", connection_cap(grpc_config.max_connections)),
        ("grpc.server_handshake_timeout_ms", _milliseconds(grpc_config.handshake_timeout_seconds)),
        ("grpc.max_connection_idle_ms", _milliseconds(grpc_config.idle_timeout_seconds)),
        ("grpc.max_receive_message_length", max_bytes),
        ("grpc.max_send_message_length", max_bytes),
        ("grpc.server.max_pending_requests", pending),
        ("grpc.server.max_pending_requests_hard_limit", pending),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.max_connection_age_ms", 30 * 60_000),  # lets L4 balancers spread long-lived clients
        ("grpc.max_connection_age_grace_ms", int(opts.grace_seconds * 1000)),
        *opts.extra_options,
    ]


#: The share of this process's open-files limit the public gRPC port's connections may take: the rest stays
#: for what the server opens itself (its workers' pipes, sandboxes, the metrics and HTTP faces' sockets).
CONNECTIONS_SHARE_OF_OPEN_FILES = 0.5


def connection_cap(configured: int) -> int:
    """`grpc.max_connections`, lowered (and logged once per process) to `CONNECTIONS_SHARE_OF_OPEN_FILES` of
    the open-files limit: connections past what the process can open would fail whatever opens a file next."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return configured
    room = max(1, int(soft * CONNECTIONS_SHARE_OF_OPEN_FILES))
    if configured > room:
        log.warning(
            "grpc.max_connections %d is more than this process can hold beside its own files (open-files limit "
            "%d): the gRPC port takes at most %d connections; raise `ulimit -n` to allow more",
            configured,
            soft,
            room,
        )
        return room
    return configured


def _milliseconds(seconds: float) -> int:
    return max(1, round(seconds * 1000))
