"""Which backend this server process runs programs on, from the operator's environment.

The server's YAML configuration has no section for plugins, so the backend is chosen with environment
variables (the Deployment's `env`, or the shell that starts `grpcgrade serve`); a request never names a
backend or a URL:

| variable | default | meaning |
|---|---|---|
| `GRPCGRADE_CODE_BACKEND` | `bubblewrap` | `bubblewrap` (local sandboxes) or `sandbox_fusion` (a remote service) |
| `GRPCGRADE_CODE_SANDBOX_FUSION_URL` | | the service's URL (`.../run_code` is appended when missing) |
| `GRPCGRADE_CODE_MAX_CONCURRENCY` | CPUs (bubblewrap), 32 (sandbox_fusion) | runs at once in this process |
| `GRPCGRADE_CODE_MAX_RETRIES` | 2 | sandbox_fusion: extra attempts after a transport error, 429 or 5xx |
| `GRPCGRADE_CODE_PYTHON` | python3 in /usr/local/bin or /usr/bin | the interpreter programs run with |

A wrong value stops the plugin from loading (`grpcgrade graders` shows it failed, and why).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from .bubblewrap import BubblewrapBackend
from .sandbox import Backend

BACKEND_ENV = "GRPCGRADE_CODE_BACKEND"
URL_ENV = "GRPCGRADE_CODE_SANDBOX_FUSION_URL"
CONCURRENCY_ENV = "GRPCGRADE_CODE_MAX_CONCURRENCY"
RETRIES_ENV = "GRPCGRADE_CODE_MAX_RETRIES"
BACKENDS = ("bubblewrap", "sandbox_fusion")
DEFAULT_RETRIES = 2


def _whole(environ: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < minimum:
        raise ValueError(f"{name}={raw!r}: must be a whole number >= {minimum}")
    return int(raw)


def backend_from_env(environ: Mapping[str, str] = os.environ) -> Backend:
    """The backend the environment describes; raises ValueError naming the variable that is wrong."""
    kind = environ.get(BACKEND_ENV, "").strip() or "bubblewrap"
    concurrency = _whole(environ, CONCURRENCY_ENV, 1)
    if kind == "bubblewrap":
        return BubblewrapBackend(max_concurrency=concurrency)
    if kind == "sandbox_fusion":
        from .sandbox_fusion import SandboxFusionBackend

        url = environ.get(URL_ENV, "").strip()
        if not url:
            raise ValueError(f"{BACKEND_ENV}=sandbox_fusion needs {URL_ENV}")
        retries = _whole(environ, RETRIES_ENV, 0)
        return SandboxFusionBackend(
            url, max_concurrency=concurrency or 32, max_retries=2 if retries is None else retries
        )
    raise ValueError(f"{BACKEND_ENV}={kind!r}: must be one of {', '.join(BACKENDS)}")


_lock = threading.Lock()
_backend: Backend | None = None


def get_backend() -> Backend:
    """The process's backend, built from the environment on first use; one concurrency limit for all."""
    global _backend
    with _lock:
        if _backend is None:
            _backend = backend_from_env()
        return _backend


def set_backend(backend: Backend | None) -> None:
    """Use this backend from now on (None: the environment's again), e.g. when embedding the grader."""
    global _backend
    with _lock:
        _backend = backend
