"""What several of this plugin's test files share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from grpcgrade_code import Backend, set_backend
from grpcgrade_code.bubblewrap import BubblewrapBackend


@contextmanager
def backend_in_use(backend: Backend) -> Iterator[Backend]:
    """The process's backend is `backend` inside the block, the environment's again after it."""
    set_backend(backend)
    try:
        yield backend
    finally:
        set_backend(None)


def broken_backend() -> BubblewrapBackend:
    """A real bubblewrap backend whose bwrap exits at once: no sandbox ever starts."""
    return BubblewrapBackend(bwrap="/usr/bin/false")
