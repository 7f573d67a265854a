"""The local backend: every run in a fresh bubblewrap (`bwrap`) sandbox on this machine.

Isolation is bubblewrap's, a small, well-kept setuid-free tool (Flatpak's), rather than hand-rolled
namespaces. Each run gets:

* new user, PID, network, IPC, UTS and cgroup namespaces, and no way to create further user namespaces:
  no network at all (only a loopback of its own), no view of the server's processes;
* as its whole filesystem, /usr (and the /bin, /lib symlinks into it) read-only, a minimal /dev, and a
  private /tmp of `tmp_bytes`; its files are copied in read-only under /box from memory, so nothing of
  the host's filesystem is written or even reachable;
* an empty environment (PATH, HOME, LANG only): the server's secrets are not visible;
* no capabilities, a new session, an unprivileged user: a server running as root hands the sandbox to
  `nobody` (65534) before bwrap starts (util-linux `setpriv`, with no_new_privs); otherwise it runs as the server's own unprivileged user;
* rlimits set inside the sandbox by util-linux `prlimit`: CPU seconds, memory, processes, file size, open
  files, no core dumps. RLIMIT_NPROC is counted per user namespace, so it bounds this run only;
* wall-clock time, stdout and stderr bounded here. On timeout or too much output the outer bwrap process
  is killed; its child, the sandbox's PID 1, dies with it (`--die-with-parent`), and the kernel kills
  every other process of the PID namespace: the run is killed as a whole.

A run that never reaches its program (bwrap cannot create the namespaces, a runtime is missing) raises
`SandboxUnavailable`: a line the sandbox prints just before it executes the program tells the two apart, so
nothing the program writes can make its failure look like the sandbox's, or the reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from dataclasses import dataclass

from .languages import BOX, FILE_SIZE_MARKERS, MEMORY_MARKERS, RUNTIME_PATH, Language, known_languages
from .sandbox import COMPILE_LIMITS, Limits, Outcome, Program, RunResult, SandboxUnavailable, Slots

#: The user a server running as root hands the sandbox to.
SANDBOX_UID = 65534
#: Printed by the sandbox's shell right before it executes the program: proof the sandbox started.
READY = b"grpcgrade-sandbox-ready\n"
#: How long a killed sandbox may take to go away before the run is reported as a sandbox failure.
KILL_GRACE_SECONDS = 5.0
#: How much of bwrap's own complaint goes into a SandboxUnavailable message.
MESSAGE_CHARS = 300
PRLIMIT = "/usr/bin/prlimit"
#: util-linux's setpriv: how a root server hands bwrap to SANDBOX_UID. Not Popen(user=...), which must
#: fork() where it could vfork(); a fork() runs the atfork handlers of libraries such as gRPC in the
#: child, and gRPC's crash there.
SETPRIV = "/usr/bin/setpriv"


def usable_cpus() -> int:
    """CPUs this process may run on (a container's cpuset, not the node's core count)."""
    return len(os.sched_getaffinity(0)) or 1


def _host_links() -> list[str]:
    """/bin, /lib... as they are on the host: symlinks into /usr (merged /usr) or read-only binds."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/alternatives"):  # the dynamic linker's cache, Debian's alternatives
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


@dataclass(frozen=True)
class _Exit:
    """What came out of bwrap, before any classification."""

    status: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    overflowed: bool
    seconds: float


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def classify(language: Language, done: _Exit) -> RunResult:
    """The outcome of a run that reached its program. bwrap exits 128 + n for a program killed by signal n."""
    stderr = _text(done.stderr)
    killed = done.timed_out or done.overflowed  # by us: bwrap's own status then says nothing of the program
    sig = None if killed else done.status - 128 if 128 < done.status <= 128 + 64 else None
    if done.timed_out or sig == signal.SIGXCPU:
        outcome = Outcome.TIME_LIMIT
    elif done.overflowed or sig == signal.SIGXFSZ or any(marker in stderr for marker in FILE_SIZE_MARKERS):
        outcome = Outcome.OUTPUT_LIMIT
    elif done.status == 0:
        outcome = Outcome.OK
    elif any(marker in stderr for marker in MEMORY_MARKERS):
        outcome = Outcome.MEMORY_LIMIT
    elif language.parse_failed(stderr):
        outcome = Outcome.COMPILE_ERROR
    else:
        outcome = Outcome.RUNTIME_ERROR
    return RunResult(
        outcome=outcome,
        stdout=_text(done.stdout),
        stderr=stderr,
        exit_code=None if killed or sig is not None else done.status,
        signal=sig,
        seconds=round(done.seconds, 4),
    )


async def _drain(stream: asyncio.StreamReader, limit: int, overflow: asyncio.Event) -> bytes:
    """Read to EOF, keeping the first `limit` bytes; past them, signal `overflow` and discard the rest."""
    kept = bytearray()
    while chunk := await stream.read(1 << 16):
        if overflow.is_set():
            continue
        room = limit - len(kept)
        kept += chunk[:room]
        if len(chunk) > room:
            overflow.set()
    return bytes(kept)


async def _feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    """Write stdin and close it; a program that exits without reading it all is its own business."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            stream.write(data)
            await stream.drain()
        stream.close()
        await stream.wait_closed()


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("grpcgrade-code")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class BubblewrapBackend:
    """Runs programs on this machine, each in its own bubblewrap sandbox, `max_concurrency` at once."""

    name = "bubblewrap"

    def __init__(
        self,
        max_concurrency: int | None = None,
        languages: dict[str, Language] | None = None,
        bwrap: str | None = None,
    ) -> None:
        self.max_concurrency = max_concurrency or usable_cpus()
        self._languages = languages if languages is not None else known_languages()
        self._bwrap = bwrap or shutil.which("bwrap")
        self._slots = Slots(self.max_concurrency)
        self._links = _host_links()
        self._as_root = os.geteuid() == 0

    def languages(self) -> frozenset[str]:
        return frozenset(name for name, lang in self._languages.items() if os.access(lang.runtime, os.X_OK))

    def language(self, name: str) -> Language:
        lang = self._languages.get(name)
        if lang is None:
            raise ValueError(f"unknown language {name!r}; known: {', '.join(sorted(self._languages))}")
        if not os.access(lang.runtime, os.X_OK):
            raise SandboxUnavailable(f"no {name} runtime on this server ({lang.runtime} is missing)")
        return lang

    async def prepare(self, language: str, source: str) -> Program:
        lang = self.language(language)
        files = {lang.source_path(): (source.encode("utf-8", errors="surrogatepass"), 0o444)}
        if not lang.compiled:
            return Program(language, source, files)
        async with self._slots:
            done = await self._sandboxed(lang.compile_argv(), files, b"", COMPILE_LIMITS, lang)
        result = classify(lang, done)
        if result.outcome is not Outcome.OK:
            failed = RunResult(Outcome.COMPILE_ERROR, stderr=result.stderr, exit_code=result.exit_code,
                               signal=result.signal, seconds=result.seconds)  # fmt: skip
            return Program(language, source).failed(failed)
        return Program(language, source, {f"{BOX}/main": (done.stdout, 0o555)})

    async def execute(self, program: Program, stdin: str, limits: Limits) -> RunResult:
        if program.compile_result is not None:
            return program.compile_result
        lang = self.language(program.language)
        data = stdin.encode("utf-8", errors="surrogatepass")
        async with self._slots:  # the time limit starts once a slot is free and the sandbox starts
            done = await self._sandboxed(lang.run_argv(limits), program.files, data, limits, lang)
        return classify(lang, done)

    # -- one sandbox --------------------------------------------------------------------------------

    def _argv(
        self, command: tuple[str, ...], files: dict[str, tuple[int, int]], limits: Limits, lang: Language
    ) -> list[str]:
        """The bwrap command line; `files` maps each sandbox path to (an fd holding its content, its mode)."""
        assert self._bwrap is not None
        memory = limits.memory_mb << 20
        argv = [
            self._bwrap,
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--cap-drop", "ALL",
            "--hostname", "sandbox",
            "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_UID),
            "--clearenv",
            "--setenv", "PATH", f"{RUNTIME_PATH}:/bin",
            "--setenv", "HOME", "/tmp",
            "--setenv", "TMPDIR", "/tmp",
            "--setenv", "LANG", "C.UTF-8",
            "--ro-bind", "/usr", "/usr",
            *self._links,
            "--dev", "/dev",
            "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
            "--dir", BOX,
        ]  # fmt: skip
        for path, (fd, mode) in files.items():
            argv += ["--perms", f"{mode:04o}", "--ro-bind-data", str(fd), path]
        argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--"]
        argv += [
            PRLIMIT,
            f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
            f"--{lang.memory_rlimit}={memory}",
            f"--stack={min(lang.stack_mb, limits.memory_mb) << 20}",
            f"--nproc={limits.processes}",
            f"--fsize={limits.file_bytes}",
            f"--nofile={limits.open_files}",
            "--core=0",
            "--",
            "/bin/sh", "-c", f'printf "{READY.decode().strip()}\\n" && exec "$@"', "sh",
            *command,
        ]  # fmt: skip
        return argv

    async def _sandboxed(
        self,
        command: tuple[str, ...],
        files: dict[str, tuple[bytes, int]],
        stdin: bytes,
        limits: Limits,
        lang: Language,
    ) -> _Exit:
        if self._bwrap is None:
            raise SandboxUnavailable("bubblewrap (bwrap) is not installed on this server (Debian: bubblewrap)")
        fds: dict[str, tuple[int, int]] = {}
        try:
            for path, (data, mode) in files.items():
                fds[path] = (_memfd(data), mode)
            argv = self._argv(command, fds, limits, lang)
            if self._as_root:
                uid = str(SANDBOX_UID)
                argv = [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--", *argv]
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    pass_fds=tuple(fd for fd, _ in fds.values()),
                    env={},
                    start_new_session=True,
                )
            except OSError as exc:
                raise SandboxUnavailable(f"bwrap could not be started: {exc}") from exc
        finally:
            for fd, _ in fds.values():
                os.close(fd)
        return await self._supervise(proc, stdin, limits)

    async def _supervise(self, proc: asyncio.subprocess.Process, stdin: bytes, limits: Limits) -> _Exit:
        started = time.perf_counter()
        overflow = asyncio.Event()
        assert proc.stdin and proc.stdout and proc.stderr
        feeder = asyncio.create_task(_feed(proc.stdin, stdin))
        out = asyncio.create_task(_drain(proc.stdout, limits.output_bytes + len(READY), overflow))
        err = asyncio.create_task(_drain(proc.stderr, limits.output_bytes, overflow))
        overflowed = asyncio.create_task(overflow.wait())
        timed_out = False
        try:
            try:
                async with asyncio.timeout(limits.time_seconds):
                    await asyncio.wait({asyncio.gather(out, err), overflowed}, return_when=asyncio.FIRST_COMPLETED)
                    if not overflow.is_set():
                        await proc.wait()
            except TimeoutError:
                timed_out = True
            seconds = time.perf_counter() - started
            if proc.returncode is None:
                _kill(proc)
            try:
                async with asyncio.timeout(KILL_GRACE_SECONDS):
                    await asyncio.wait({out, err})
                    status = await proc.wait()
            except TimeoutError as exc:
                message = f"the sandbox did not stop within {KILL_GRACE_SECONDS:g} s of being killed"
                raise SandboxUnavailable(message) from exc
        finally:
            if proc.returncode is None:  # cancelled (the caller gave up): the run must not outlive it
                _kill(proc)
            for task in (feeder, out, err, overflowed):
                task.cancel()
        stdout, stderr = out.result(), err.result()
        if not stdout.startswith(READY):
            said = _text(stderr)[:MESSAGE_CHARS].strip() or "no message"
            reason = "did not start in time" if timed_out else f"failed to start (status {status}): {said}"
            raise SandboxUnavailable(f"the sandbox {reason.strip()}")
        return _Exit(status, stdout[len(READY) :], stderr, timed_out, overflow.is_set(), seconds)


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
