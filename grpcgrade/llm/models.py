"""The chat models LLM graders may call, looked up by name: one shared client (`chat.ChatModel`) per model
the operator configured (`settings`), so a model's provider limits pace every grader that names it.

The HTTP client (aiohttp) is imported on the first lookup, so processes that never build an LLM grader
(worker processes, `import grpcgrade`) do not pay for it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from grpcgrade.core.errors import InvalidParams

from .settings import DEFAULT_MODEL as DEFAULT_MODEL
from .settings import MODEL_ENV
from .settings import ModelConfig as ModelConfig
from .settings import env_models as env_models
from .settings import parse_model as parse_model
from .settings import parse_models as parse_models
from .usage import USAGE

if TYPE_CHECKING:
    from .chat import ChatModel


_lock = threading.Lock()
_configs: dict[str, ModelConfig] | None = None
_clients: dict[str, ChatModel] = {}
#: Clients a later `configure` replaced, still holding an open HTTP session: closed by `close_clients`.
_retired: list[ChatModel] = []
_weights: dict[str, float] = {}


def configure(models: Mapping[str, ModelConfig], callers: Mapping[str, float] | None = None) -> None:
    """Set the process's models: these, plus the environment's "default" unless they define one; and the
    callers' weights in each model's fair share (`callers:`; a caller not named has weight 1).

    The clients of the models it replaces are kept, not dropped, until `close_clients` closes them on their
    loop: a judgment may still be in flight on one (a grader built before holds it), and aiohttp's session
    can only be closed on the loop that opened it."""
    global _configs, _weights
    with _lock:
        _configs = {**env_models(), **models}
        _weights = dict(callers or {})
        USAGE.configure(_weights)
        _retired.extend(c for c in _clients.values() if c.is_open())
        _clients.clear()


def _current() -> dict[str, ModelConfig]:
    global _configs
    if _configs is None:  # used without a server (a script, a test): the environment alone
        _configs = env_models()
    return _configs


def get_model(name: str) -> ChatModel:
    """The shared client of a configured model (one concurrency limit per model), or InvalidParams."""
    with _lock:
        configs = _current()
        config = configs.get(name)
        if config is None:
            known = ", ".join(repr(n) for n in sorted(configs)) or f"none (configure `models:` or set {MODEL_ENV})"
            raise InvalidParams("model", f"no model named {name!r} is configured; configured models: {known}")
        client = _clients.get(name)
        if client is None:
            from .chat import ChatModel

            client = _clients[name] = ChatModel(config, _weights)
        return client


async def close_clients() -> None:
    """Close every model's HTTP client (its pooled connections to the endpoint), those `configure` replaced
    included, on the loop that opened them: a stopping server does so after its drain, when no judgment is
    in flight any more, instead of leaving open sessions to the garbage collector at exit (aiohttp's
    "Unclosed client session"). A replaced client another loop opened waits for that loop's call."""
    with _lock:
        clients = [*_clients.values(), *_retired]
    for client in clients:
        await client.aclose()
    with _lock:
        _retired[:] = [c for c in _retired if c.is_open()]
