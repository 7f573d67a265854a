"""grpcgrade: reward graders for RL training, served over gRPC.

The public API a grader author needs is importable from here; see README "Writing a grader plugin".
"""

from importlib.metadata import PackageNotFoundError, version

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

try:
    __version__ = version("grpcgrade")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

__all__ = [
    "BaseGrader",
    "FunctionGrader",
    "GraderError",
    "GraderMode",
    "GraderRank",
    "GraderScore",
    "InvalidParams",
    "hookimpl",
    "__version__",
]
