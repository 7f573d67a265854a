"""grpcgrade: reward graders for RL training, served over gRPC.

The public API a grader author needs is importable from here; see docs/plugins.md.
"""

from importlib.metadata import PackageNotFoundError, version

from .core.errors import ErrorCode

try:
    __version__ = version("grpcgrade")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

#: Public names and the module each lives in, imported on first use: the clients import grpc, the grader
#: API pluggy and httpx, and a trainer with only the client installed (`pip install grpcgrade`) has neither
#: the server's dependencies nor a need for them.
_LAZY = {
    "GradingClient": "client",
    "AsyncGradingClient": "client",
    "reward_function": "integrations.trl",
    "BaseGrader": "grader",
    "FunctionGrader": "grader",
    "GraderError": "grader",
    "GraderMode": "grader",
    "GraderRank": "grader",
    "GraderScore": "grader",
    "InvalidParams": "grader",
    "hookimpl": "hookspecs",
    "ChatMessage": "llm",
    "LanguageEnum": "llm",
    "LLMGrader": "llm",
    "PromptTemplate": "llm",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'grpcgrade' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


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
