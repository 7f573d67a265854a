"""What a sandboxed run is and what comes back, whichever backend runs it.

A backend (bubblewrap on this machine, or a remote SandboxFusion service) turns source code into a
`Program` once (`prepare`, which compiles where the language needs it) and runs it on one input at a time
(`execute`). Everything the program itself does becomes a `RunResult` with an `Outcome`; everything that
stops the sandbox from running it at all raises `SandboxUnavailable`, so a caller can never mistake a
broken sandbox for a wrong program.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol


class SandboxUnavailable(Exception):
    """The sandbox could not run the program (it did not start, its service failed or is overloaded).

    Graders report it as an error result (`SANDBOX_UNAVAILABLE`), never as a score.
    """


class Outcome(StrEnum):
    """How one run ended, from the program's own behaviour."""

    OK = "ok"  #: exited with status 0
    RUNTIME_ERROR = "runtime_error"  #: a non-zero exit status, or killed by a signal
    TIME_LIMIT = "time_limit"  #: ran past its wall-clock or CPU time
    MEMORY_LIMIT = "memory_limit"  #: an allocation failed at the memory limit
    OUTPUT_LIMIT = "output_limit"  #: wrote more than the output limit, or a file over the file size limit
    COMPILE_ERROR = "compile_error"  #: the source did not compile (or parse, for Python)


#: The limits no request may raise: one run's worst case stays bounded whatever a request asks for.
MAX_TIME_SECONDS = 60.0
MAX_MEMORY_MB = 4096


@dataclass(frozen=True)
class Limits:
    """One run's limits. `time_seconds` bounds both wall-clock time (from the sandbox's start to the
    program's exit, not counting the wait for a free slot) and CPU time (in whole seconds, rounded up)."""

    time_seconds: float = 5.0
    memory_mb: int = 512
    processes: int = 32  #: processes and threads the program may run at once (RLIMIT_NPROC)
    output_bytes: int = 1 << 20  #: stdout and stderr, each
    file_bytes: int = 16 << 20  #: the largest file it may write (RLIMIT_FSIZE)
    tmp_bytes: int = 64 << 20  #: the size of its private /tmp
    open_files: int = 128

    def __post_init__(self) -> None:
        if not (isinstance(self.time_seconds, (int, float)) and 0 < self.time_seconds <= MAX_TIME_SECONDS):
            raise ValueError(f"time_seconds must be in (0, {MAX_TIME_SECONDS:g}], got {self.time_seconds!r}")
        if not (isinstance(self.memory_mb, int) and 16 <= self.memory_mb <= MAX_MEMORY_MB):
            raise ValueError(f"memory_mb must be a whole number in [16, {MAX_MEMORY_MB}], got {self.memory_mb!r}")
        for name in ("processes", "output_bytes", "file_bytes", "tmp_bytes", "open_files"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")

    @property
    def cpu_seconds(self) -> int:
        return math.ceil(self.time_seconds)


#: What compilers get: more memory and time than a test run, since they run once per program.
COMPILE_LIMITS = Limits(time_seconds=20.0, memory_mb=2048, processes=64, output_bytes=64 << 20, file_bytes=64 << 20,
                        tmp_bytes=256 << 20)  # fmt: skip


@dataclass(frozen=True)
class RunResult:
    """One run: its outcome, what it wrote (decoded as UTF-8, invalid bytes replaced; cut at the output
    limit), its exit status, and its wall-clock seconds (not counting the wait for a free slot)."""

    outcome: Outcome
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: int | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Program:
    """Source made ready to run: for compiled languages the binary, else the source itself.

    `compile_result` is set (outcome COMPILE_ERROR) when the source did not compile; running such a
    program returns that result again without starting anything.
    """

    language: str
    source: str
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # sandbox path -> (content, mode)
    argv: tuple[str, ...] = ()
    compile_result: RunResult | None = None

    def failed(self, result: RunResult) -> Program:
        return replace(self, compile_result=result)


class Slots:
    """A backend's concurrency limit: at most `size` runs at once in the running event loop.

    The semaphore belongs to one loop, so it is made on first use in the running loop (the server's), not
    when the backend is built; a caller that waits here has not started its run, so its time limit has
    not started either.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def _current(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._loop is not loop:
            self._loop, self._semaphore = loop, asyncio.Semaphore(self.size)
        return self._semaphore

    async def __aenter__(self) -> None:
        await self._current().acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._current().release()


class Backend(Protocol):
    """A place to run programs. One per server process; its concurrency limit covers all its callers."""

    name: str
    max_concurrency: int

    def languages(self) -> frozenset[str]:
        """The languages this backend can run here."""
        ...

    async def prepare(self, language: str, source: str) -> Program:
        """Compile (where the language needs it) once; raises SandboxUnavailable or ValueError (language)."""
        ...

    async def execute(self, program: Program, stdin: str, limits: Limits) -> RunResult:
        """Run a prepared program on one input; raises SandboxUnavailable."""
        ...


async def run(backend: Backend, language: str, source: str, stdin: str = "", limits: Limits | None = None) -> RunResult:
    """Prepare and run once: the whole life of a one-off program."""
    program = await backend.prepare(language, source)
    return await backend.execute(program, stdin, limits or Limits())
