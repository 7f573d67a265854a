"""grpcgrade: reward graders for RL training, served over gRPC.

The public API a grader author needs is importable from here; see docs/plugins.md.
"""

from importlib.metadata import PackageNotFoundError, version

from .core.errors import ErrorCode
from .grader import (
    BaseGrader,
    FunctionGrader,
    GraderError,
    GraderMode,
    GraderRank,
    GraderScore,
    InvalidParams,
)
from .hookspecs import hookimpl
from .llm import ChatMessage, LanguageEnum, LLMGrader, PromptTemplate

try:
    __version__ = version("grpcgrade")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

_CLIENT_NAMES = ("GradingClient", "AsyncGradingClient", "reward_function")


def __getattr__(name: str) -> object:
    """The clients import grpc; graders and worker processes do not pay for that unless they ask."""
    if name in _CLIENT_NAMES:
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'grpcgrade' has no attribute {name!r}")


__all__ = [
    "AsyncGradingClient",
    "GradingClient",
    "reward_function",
    "BaseGrader",
    "ErrorCode",
    "FunctionGrader",
    "GraderError",
    "GraderMode",
    "GraderRank",
    "GraderScore",
    "InvalidParams",
    "LLMGrader",
    "PromptTemplate",
    "LanguageEnum",
    "ChatMessage",
    "hookimpl",
    "__version__",
]
