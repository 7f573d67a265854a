"""Log setup, shared by the command line and the worker processes it spawns.

grpcgrade's own loggers log at the level asked for (`--log-level`); every other library's (httpx logs one
INFO line per HTTP call, so per LLM judge call) at WARNING unless asked (`--library-log-level`, or
`--log-level debug`, which means everything). A spawned worker starts with logging unset and is given the
same levels and format.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping

OWN_LOGGER = "grpcgrade"
LEVELS = ("debug", "info", "warning", "error")
LIBRARY_DEFAULT = "warning"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def logger_levels(level: str, library_level: str | None = None) -> dict[str, int]:
    """Logger name -> level: "" (the root, so every library) and grpcgrade's own."""
    own = logging.getLevelName(level.upper())
    library = logging.getLevelName((library_level or ("debug" if level == "debug" else LIBRARY_DEFAULT)).upper())
    return {"": library, OWN_LOGGER: own, "grpc": max(logging.INFO, library)}  # grpc's per-call debug chatter


def apply(levels: Mapping[str, int], formatter: logging.Formatter | None) -> None:
    """One stderr handler on the root, and the levels."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    for name, value in levels.items():
        logging.getLogger(name).setLevel(value)


def setup_logging(level: str, fmt: str, library_level: str | None = None) -> None:
    apply(logger_levels(level, library_level), JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))


def current() -> tuple[dict[str, int], logging.Formatter | None]:
    """This process's levels and format, for a worker process to copy. Only grpcgrade's formats travel: a
    formatter the host set up may not cross to another process (pytest's and some colour ones hold a
    stream, and pickling one failed the pool's start), so the workers then log in Python's default format."""
    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    if type(formatter) not in (logging.Formatter, JsonFormatter):
        formatter = None
    names = ("", OWN_LOGGER, "grpc")
    return {n: logging.getLogger(n).getEffectiveLevel() for n in names}, formatter
