"""The local backend: every run in a fresh bubblewrap (`bwrap`) sandbox on this machine.

Isolation is bubblewrap's, a small, well-kept setuid-free tool (Flatpak's), rather than hand-rolled
namespaces. Each run gets:

* new user, PID, network, IPC, UTS and cgroup namespaces, and no way to create further user namespaces
  (a seccomp filter, `seccomp.py`, which also works in a container):
  no network at all (only a loopback of its own), no view of the server's processes;
* as its whole filesystem, read-only, only what its runtime needs of the host's /usr (`mounts.py`: the
  shared libraries, the runtime and the directories it reads) with the /bin, /lib symlinks into it, a
  minimal /dev, and a private /tmp of `tmp_bytes`; its files are copied in read-only under /box from
  memory, so nothing else of the host's filesystem is written or even reachable;
* an empty environment (PATH, HOME, TMPDIR, LANG only): the server's secrets are not visible;
* no capabilities, no_new_privs, a new session, an unprivileged user: a server running as root hands the
  sandbox to `nobody` (65534) before bwrap starts (util-linux `setpriv`); otherwise it runs as the
  server's own unprivileged user;
* rlimits set inside the sandbox by util-linux `prlimit`: CPU seconds, memory, processes, file size, open
  files, no POSIX message queues, no core dumps. RLIMIT_NPROC is counted per user namespace, so it bounds
  this run only;
* a seccomp filter refusing the calls that make memory no rlimit counts (`syscalls.py`: memfd_create,
  System V shared memory and message queues): with RLIMIT_AS/RLIMIT_DATA per process, /tmp's size and a
  read-only /dev (no /dev/shm to fill), every kind of memory a run can take is bounded;
* wall-clock time, stdout and stderr bounded here. On timeout or too much output the sandbox's PID 1 is
  killed, and the kernel kills every other process of the PID namespace with it: the run is killed as a
  whole (`process.py`). bwrap itself dies with the server (a parent-death signal), and the sandbox with
  bwrap (`--die-with-parent`), so a killed server leaves no sandbox behind.

A run that never reaches its program (bwrap cannot create the namespaces, a runtime is missing, the server
is out of file descriptors, libseccomp is missing) raises
`SandboxUnavailable`: a line the sandbox prints just before it executes the program tells the two apart, so
nothing the program writes can make its failure look like the sandbox's, or the reverse.
"""

from __future__ import annotations

import os
import shutil
import signal
from dataclasses import replace

from .languages import BOX, FILE_SIZE_MARKERS, MEMORY_MARKERS, RUNTIME_PATH, Language, known_languages
from .mounts import binds
from .process import Exit, StuckSandbox, run_process
from .sandbox import COMPILE_LIMITS, Limits, Outcome, Program, RunResult, SandboxUnavailable, Slots
from .seccomp import no_user_namespaces
from .syscalls import SeccompMissing, filter_program

#: The user a server running as root hands the sandbox to.
SANDBOX_UID = 65534
#: Printed by the sandbox's shell right before it executes the program: proof the sandbox started.
READY = b"grpcgrade-sandbox-ready\n"
#: How much of bwrap's own complaint goes into a SandboxUnavailable message.
MESSAGE_CHARS = 300
#: What a sandbox that cannot start needs, said in its SandboxUnavailable message.
CONTAINER_HINT = (
    "in a container, the sandbox needs seccomp and AppArmor unconfined (docker/podman run --security-opt "
    "seccomp=unconfined --security-opt apparmor=unconfined; Kubernetes: seccompProfile and appArmorProfile "
    "Unconfined); see docs/deploy.md"
)
PRLIMIT = "/usr/bin/prlimit"
#: util-linux's setpriv starts bwrap: with a parent-death signal, so the sandbox dies with the server even
#: when the server is killed, and for a root server as SANDBOX_UID. Not Popen(user=...), which must fork()
#: where it could vfork(): a fork() runs the atfork handlers of libraries such as gRPC in the child, and
#: gRPC's crash there.
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


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def classify(language: Language, done: Exit) -> RunResult:
    """The outcome of a run that reached its program. bwrap exits 128 + n for a program killed by signal n."""
    stderr = _text(done.stderr)
    killed = done.timed_out or done.overflowed  # by us: bwrap's own status then says nothing of the program
    status = done.status or 0  # set: a run without one raised SandboxUnavailable before this
    sig = None if killed else status - 128 if 128 < status <= 128 + 64 else None
    if done.timed_out or sig == signal.SIGXCPU:
        outcome = Outcome.TIME_LIMIT
    elif done.overflowed or sig == signal.SIGXFSZ or any(marker in stderr for marker in FILE_SIZE_MARKERS):
        outcome = Outcome.OUTPUT_LIMIT
    elif status == 0:
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
        exit_code=None if killed or sig is not None else status,
        signal=sig,
        seconds=round(done.seconds, 4),
    )


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("grpcgrade-code")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _kept(made: list[int], fd: int) -> int:
    made.append(fd)
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
        self._binds = {name: binds(lang.needs) for name, lang in self._languages.items()}
        self._as_root = os.geteuid() == 0
        self._seccomp = no_user_namespaces()

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
        self,
        command: tuple[str, ...],
        files: dict[str, tuple[int, int]],
        limits: Limits,
        lang: Language,
        info: int,
        seccomp: tuple[int, ...],
    ) -> list[str]:
        """The bwrap command line; `files` maps each sandbox path to (an fd holding its content, its mode);
        `seccomp` are fds each holding a filter (the kernel applies them all: the strictest answer wins)."""
        assert self._bwrap is not None
        memory = limits.memory_mb << 20
        argv = [
            self._bwrap,
            "--unshare-all",
            "--unshare-user",
            *(arg for fd in seccomp for arg in ("--add-seccomp-fd", str(fd))),
            "--die-with-parent",
            "--info-fd", str(info),
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
            *self._binds.get(lang.name, ()),
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
            "--msgqueue=0",
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
    ) -> Exit:
        if self._bwrap is None:
            raise SandboxUnavailable("bubblewrap (bwrap) is not installed on this server (Debian: bubblewrap)")
        made: list[int] = []
        try:  # out of fds or memory here is the server's trouble, not the program's
            fds = {path: (_kept(made, _memfd(data)), mode) for path, (data, mode) in files.items()}
            seccomp = tuple(_kept(made, _memfd(program)) for program in (self._seccomp, filter_program()))
            info_read, info_write = (_kept(made, fd) for fd in os.pipe())
        except (OSError, SeccompMissing) as exc:
            for fd in made:
                os.close(fd)
            raise SandboxUnavailable(f"the sandbox could not be prepared: {exc}") from exc
        try:  # run_process owns and closes every one of these fds
            argv = self._argv(command, fds, limits, lang, info_write, seccomp)
            user = [f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups"] if self._as_root else []
            argv = [SETPRIV, "--pdeathsig=SIGKILL", *user, "--no-new-privs", "--", *argv]
            output_limits = (limits.output_bytes + len(READY), limits.output_bytes)
            passed = [fd for fd, _ in fds.values()] + [info_write, *seccomp]
            done = await run_process(argv, passed, info_read, stdin, output_limits, limits.time_seconds)
        except OSError as exc:
            raise SandboxUnavailable(f"bwrap could not be started: {exc}") from exc
        except StuckSandbox as exc:
            raise SandboxUnavailable(str(exc)) from exc
        if not done.stdout.startswith(READY) or done.status is None:
            said = _text(done.stderr)[:MESSAGE_CHARS].strip() or "no message"
            reason = "did not start in time" if done.timed_out else f"failed to start (status {done.status}): {said}"
            raise SandboxUnavailable(f"the sandbox {reason}; {CONTAINER_HINT}")
        return replace(done, stdout=done.stdout[len(READY) :])
