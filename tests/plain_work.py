"""A plain function as an executor's item (`core.executors.Item`), for the executors' own tests: they make a
worker die, hang or report its PID with a function of their choosing, where grading sends
`core.work.WorkItem`s. Only its `task()` crosses to the worker (a picklable `Task`), so it lives here, not in
the package."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpcgrade.core.executors import Task


@dataclass(frozen=True)
class PlainWork:
    """`fn(*args)` over `size` samples, with `deadline=` when the call has one (this process's
    `time.monotonic()`; it crosses as seconds left). A one-sample item that could not be done is its error
    code; split items are not made (`split` gives none)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    size: int = 1
    timeout: float | None = None  # per sample; the watchdog allows `size` of them
    deadline: float | None = None

    def task(self) -> Task:
        left = None if self.deadline is None else self.deadline - time.monotonic()
        return Task(self.fn, self.args, left)

    def run_here(self) -> Any:
        return self.task()()

    def split(self) -> list[PlainWork]:
        return []

    def failed(self, code: str, message: str) -> Any:
        return code

    def join(self, parts: list[Any]) -> Any:
        return parts


def announce_then_sleep(path: str, seconds: float) -> None:
    """Work that says it has started (this process's PID in the file at `path`), then holds its worker."""
    with open(path + ".tmp", "w") as out:
        out.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(seconds)


def announce_then_wait(path: str, release: str) -> None:
    """Work that says it has started (as `announce_then_sleep`), then holds its worker until a file exists at
    `release` (at most an hour)."""
    announce_then_sleep(path, 0)
    end = time.monotonic() + 3600
    while not os.path.exists(release) and time.monotonic() < end:
        time.sleep(0.005)


def append_pid(path: str) -> int:
    """Work that leaves a line of its process's PID at `path` each time it runs, and returns the PID."""
    with open(path, "a") as out:
        out.write(f"{os.getpid()}\n")
    return os.getpid()
