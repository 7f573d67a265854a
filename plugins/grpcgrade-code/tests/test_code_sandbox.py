"""The bubblewrap sandbox against hostile programs: each one's outcome, and nothing of the host reached.

These run real bwrap sandboxes (Debian's bubblewrap, installed by .ci/run) through the public API. The
host side of each check is looked at from here: the file a program tried to write does not exist, the
socket it tried to reach saw no connection, no process of the run is left.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpcgrade_code
import pytest
from grpcgrade_code import Limits, Outcome, RunResult, SandboxUnavailable, run
from grpcgrade_code.bubblewrap import BubblewrapBackend
from grpcgrade_code.languages import known_languages

import grpcgrade

LIMITS = Limits(time_seconds=2.0, memory_mb=256)
SHORT = 0.5  # seconds: the limit of the runs meant to hit it
SECRET_NAME, SECRET = "GRPCGRADE_TEST_SECRET", "sandbox-must-not-see-this"


@pytest.fixture(scope="module")
def backend() -> BubblewrapBackend:
    return BubblewrapBackend(max_concurrency=4)


def go(backend: BubblewrapBackend, code: str, stdin: str = "", language: str = "python", **limits: object) -> RunResult:
    chosen = Limits(**{**LIMITS.__dict__, **limits}) if limits else LIMITS  # type: ignore[arg-type]
    return asyncio.run(run(backend, language, code, stdin, chosen))


def sandbox_processes() -> list[int]:
    """Processes on this machine running a sandboxed program (its source is always under /box)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"/box/main" in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_correct_program(backend: BubblewrapBackend) -> None:
    result = go(backend, "print(input()[::-1])", "stressed\n")
    assert (result.outcome, result.stdout, result.exit_code) == (Outcome.OK, "desserts\n", 0)


def test_a_runtime_error(backend: BubblewrapBackend) -> None:
    result = go(backend, "print('before')\n1 / 0")
    assert result.outcome is Outcome.RUNTIME_ERROR and result.exit_code == 1
    assert result.stdout == "before\n" and "ZeroDivisionError" in result.stderr


def test_a_syntax_error_is_a_compile_error(backend: BubblewrapBackend) -> None:
    result = go(backend, "def f(:\n    pass")
    assert result.outcome is Outcome.COMPILE_ERROR and "SyntaxError" in result.stderr


def test_an_infinite_loop_hits_the_time_limit(backend: BubblewrapBackend) -> None:
    result = go(backend, "while True:\n    pass", time_seconds=SHORT)
    assert result.outcome is Outcome.TIME_LIMIT and result.exit_code is None


def test_a_sleep_past_the_wall_limit(backend: BubblewrapBackend) -> None:
    result = go(backend, "import time\nprint('zzz', flush=True)\ntime.sleep(30)", time_seconds=SHORT)
    assert (result.outcome, result.stdout) == (Outcome.TIME_LIMIT, "zzz\n")


def test_a_fork_bomb_is_capped_and_killed_as_a_whole(backend: BubblewrapBackend) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = go(backend, bomb, time_seconds=SHORT)
    assert result.outcome is Outcome.TIME_LIMIT
    assert sandbox_processes() == []  # every fork went with the sandbox


def test_children_do_not_outlive_a_program_that_exits(backend: BubblewrapBackend) -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    result = go(backend, code)
    assert (result.outcome, result.stdout) == (Outcome.OK, "parent done\n")
    assert sandbox_processes() == []


def test_the_process_limit_counts_this_run_only(backend: BubblewrapBackend) -> None:
    code = (
        "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time; time.sleep(5)\n"
    )
    code += "        n += 1\nexcept OSError:\n    print(n)"
    result = go(backend, code, processes=8)
    assert result.outcome is Outcome.OK
    assert 0 < int(result.stdout) < 8  # the sandbox's PID 1 and the program itself count too


def test_a_memory_bomb(backend: BubblewrapBackend) -> None:
    for code in ("x = bytearray(10**10)", "x = []\nwhile True:\n    x.append(bytearray(10**7))"):
        result = go(backend, code, time_seconds=20)  # ends at the memory limit, long before this
        assert result.outcome is Outcome.MEMORY_LIMIT, result.stderr


def test_a_gigabyte_of_output_stops_at_the_output_limit(backend: BubblewrapBackend) -> None:
    code = "import sys\nchunk = 'x' * 65536\nfor _ in range(16384):\n    sys.stdout.write(chunk)"
    result = go(backend, code, output_bytes=1 << 20)
    assert result.outcome is Outcome.OUTPUT_LIMIT
    assert result.stdout == "x" * (1 << 20)


def test_a_file_over_the_size_limit(backend: BubblewrapBackend) -> None:
    result = go(backend, "open('/tmp/big', 'wb').write(b'x' * (4 << 20))", file_bytes=1 << 20)
    assert result.outcome is Outcome.OUTPUT_LIMIT


WRITE_EVERYWHERE = """
import sys
for path in sys.stdin.read().split():
    try:
        with open(path, "w") as f:
            f.write("pwned")
        print(path, "written")
    except OSError as e:
        print(path, type(e).__name__)
"""


def test_only_tmp_is_writable(backend: BubblewrapBackend, tmp_path: Path) -> None:
    host_file = tmp_path / "outside.txt"
    targets = ["/tmp/mine", "/box/x", "/usr/x", "/x", "/etc/passwd", "/dev/shm/x", str(host_file)]
    result = go(backend, WRITE_EVERYWHERE, "\n".join(targets))
    verdicts = dict(line.split() for line in result.stdout.splitlines())
    assert verdicts.pop("/tmp/mine") == "written"
    assert all(v in ("OSError", "PermissionError", "FileNotFoundError") for v in verdicts.values()), verdicts
    assert not host_file.exists()


def test_the_server_environment_and_files_are_invisible(
    backend: BubblewrapBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_NAME, SECRET)
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    code = (
        "import os, sys\nprint(sorted(os.environ))\n"
        "for path in sys.stdin.read().split():\n"
        "    try:\n        print(open(path).read())\n    except OSError as e:\n        print(type(e).__name__)"
    )
    paths = [str(secret_file), "/proc/1/environ", f"/proc/{os.getpid()}/environ", "/etc/hostname", "/root/.bashrc"]
    result = go(backend, code, "\n".join(paths))
    assert result.outcome is Outcome.OK
    assert SECRET not in result.stdout and SECRET_NAME not in result.stdout
    names = set(eval(result.stdout.splitlines()[0]))  # the program's own print of a list of names
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD", "LC_CTYPE"}
    assert result.stdout.splitlines()[1:] == ["FileNotFoundError"] * len(paths)


def test_no_network(backend: BubblewrapBackend) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        code = (
            "import socket, sys\n"
            "for host, port in [('127.0.0.1', int(sys.stdin.read())), ('1.1.1.1', 53)]:\n"
            "    try:\n        socket.create_connection((host, port), timeout=2)\n        print('connected')\n"
            "    except OSError as e:\n        print(type(e).__name__)"
        )
        result = go(backend, code, str(port))
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing from the sandbox reached the host's loopback
    assert result.stdout.split() == ["ConnectionRefusedError", "OSError"]  # its own loopback; no route out


def test_killing_its_parent_or_the_server_reaches_nothing(backend: BubblewrapBackend) -> None:
    code = (
        "import os, signal, sys\n"
        "for pid in (os.getppid(), int(sys.stdin.read()), -1):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n        print(pid, 'sent')\n"
        "    except OSError as e:\n        print(pid, type(e).__name__)\n"
        "print('still here')"
    )
    result = go(backend, code, str(os.getpid()))
    assert result.outcome is Outcome.OK
    lines = result.stdout.splitlines()
    assert lines[0] == "1 sent"  # its parent is the sandbox's PID 1, which ignores it
    assert lines[1:] == [f"{os.getpid()} ProcessLookupError", "-1 ProcessLookupError", "still here"]
    assert go(backend, "print('next')").stdout == "next\n"  # and the next run is fine


def test_the_limits_are_set_inside(backend: BubblewrapBackend) -> None:
    code = (
        "import resource as r\n"
        "for name in ('CPU', 'AS', 'NPROC', 'FSIZE', 'NOFILE', 'CORE'):\n"
        "    print(name, *r.getrlimit(getattr(r, 'RLIMIT_' + name)))"
    )
    result = go(backend, code, time_seconds=1.5, memory_mb=300, processes=16, file_bytes=12345, open_files=64)
    limits = {
        name: (int(soft), int(hard)) for name, soft, hard in (line.split() for line in result.stdout.splitlines())
    }
    assert limits == {
        "CPU": (2, 3),  # whole seconds, rounded up; SIGXCPU first, then SIGKILL
        "AS": (300 << 20, 300 << 20),
        "NPROC": (16, 16),
        "FSIZE": (12345, 12345),
        "NOFILE": (64, 64),
        "CORE": (0, 0),
    }


def test_an_unprivileged_user_without_capabilities(backend: BubblewrapBackend) -> None:
    code = "import os\nprint(os.getuid(), os.getgid())\nprint(open('/proc/self/status').read())"
    result = go(backend, code)
    assert result.stdout.splitlines()[0] == "65534 65534"
    assert "FileNotFoundError" in result.stderr  # not even /proc is there


def test_seen_from_the_host_the_sandbox_is_unprivileged(backend: BubblewrapBackend) -> None:
    """A root server hands the sandbox to nobody; any other server's is its own user. No capabilities."""

    async def watch() -> dict[str, str]:
        running = asyncio.create_task(run(backend, "python", "import time\ntime.sleep(1)", "", LIMITS))
        while not (pids := sandbox_processes()):
            await asyncio.sleep(0.02)
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pids[0]}/status").read_text().splitlines())
        await running
        return {k: v.split() for k, v in status.items()}

    status = asyncio.run(watch())
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    assert status["Uid"] == [str(uid)] * 4
    assert status["CapEff"] == status["CapPrm"] == ["0000000000000000"]
    assert status["NoNewPrivs"] == ["1"]


def test_waiting_for_a_slot_is_not_run_time() -> None:
    """One slot, three programs of 0.8 s each under a 2 s limit: none times out while it waits. Were the wait
    counted, the third would end past 2.4 s. Each program's own 0.8 s leaves 1.2 s for a sandbox's start on a
    loaded machine (0.4 s under 1 s left 0.6 s, and timed out under a loaded suite)."""
    single = BubblewrapBackend(max_concurrency=1)
    limits = Limits(time_seconds=2.0)

    async def three() -> list[RunResult]:
        runs = [run(single, "python", "import time\ntime.sleep(0.8)\nprint('ok')", "", limits) for _ in range(3)]
        return await asyncio.gather(*runs)

    assert [r.outcome for r in asyncio.run(three())] == [Outcome.OK] * 3


def test_a_cpp_crash_is_a_runtime_error_with_its_signal(backend: BubblewrapBackend) -> None:
    crash = go(backend, "#include <cstdlib>\nint main() { std::abort(); }", language="cpp")
    assert (crash.outcome, crash.signal, crash.exit_code) == (Outcome.RUNTIME_ERROR, 6, None)


def test_javascript_programs(backend: BubblewrapBackend) -> None:
    echo = "const s = require('fs').readFileSync(0, 'utf8'); console.log(s.trim().toUpperCase());"
    assert go(backend, echo, "shout", language="javascript").stdout == "SHOUT\n"
    bomb = go(backend, "const a = []; while (true) a.push(new Array(1e6).fill(1.5));", language="javascript")
    assert bomb.outcome is Outcome.MEMORY_LIMIT


def test_a_program_cannot_pass_itself_off_as_a_sandbox_failure(backend: BubblewrapBackend) -> None:
    result = go(backend, "import sys\nsys.stderr.write('bwrap: Creating new namespace failed\\n')\nsys.exit(1)")
    assert result.outcome is Outcome.RUNTIME_ERROR


AS_SERVICE_USER = """
import asyncio, os
from grpcgrade_code import Limits, run
from grpcgrade_code.bubblewrap import BubblewrapBackend
backend = BubblewrapBackend()
ok = asyncio.run(run(backend, "python", "import os\\nprint(os.getuid())", "", Limits()))
loop = asyncio.run(run(backend, "python", "while True:\\n    pass", "", Limits(time_seconds=0.5)))
print(os.getuid(), ok.outcome.value, ok.stdout.strip(), loop.outcome.value)
"""


def test_a_server_running_as_an_unprivileged_user_sandboxes_too() -> None:
    """The image's case: the server is uid 10001, not root. When these tests run as root, a server is
    started as 10001 (with the sandbox's Python and this venv's packages, readable by anyone)."""
    site = {str(Path(m.__file__).resolve().parents[1]) for m in (grpcgrade, grpcgrade_code, pytest)}
    prefix = ["/usr/bin/setpriv", "--reuid=10001", "--regid=10001", "--clear-groups", "--"] if os.geteuid() == 0 else []
    python = known_languages()["python"].runtime
    env = {"PYTHONPATH": os.pathsep.join(sorted(site)), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*prefix, python, "-c", AS_SERVICE_USER], env=env, capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    uid = 10001 if os.geteuid() == 0 else os.geteuid()
    assert done.stdout.split() == [str(uid), "ok", "65534", "time_limit"]


SURVIVOR = """
import asyncio
from grpcgrade_code import Limits, run
from grpcgrade_code.bubblewrap import BubblewrapBackend
asyncio.run(run(BubblewrapBackend(), "python", "import time\\ntime.sleep(60)", "", Limits(time_seconds=60)))
"""


def test_a_killed_server_leaves_no_sandbox_behind() -> None:
    server = subprocess.Popen([sys.executable, "-c", SURVIVOR])
    try:
        deadline = time.monotonic() + 30
        while not sandbox_processes():
            assert server.poll() is None and time.monotonic() < deadline, "the sandbox never started"
            time.sleep(0.05)
    finally:
        server.kill()
        server.wait()
    deadline = time.monotonic() + 10  # the kernel tears the namespaces down right away; this only bounds it
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == []


@pytest.mark.parametrize("bwrap", ["/usr/bin/false", "/nonexistent/bwrap"])
def test_a_sandbox_that_cannot_start_is_unavailable_not_a_result(bwrap: str) -> None:
    broken = BubblewrapBackend(bwrap=bwrap)
    with pytest.raises(SandboxUnavailable):
        asyncio.run(run(broken, "python", "print(1)", "", LIMITS))


#: issue 33's program: anonymous in-memory files of 15 MiB (under the file size limit), up to the
#: open-files limit, in 4 processes: gigabytes that RLIMIT_AS never counts.
MEMFD_HOG = """
import os
for _ in range(3):
    if os.fork() == 0:
        break
total = 0
for _ in range(120):
    fd = os.memfd_create("hog")
    os.ftruncate(fd, 15 << 20)
    os.pwrite(fd, b"x" * (15 << 20), 0)
    total += 15
print("held", total, "MiB", flush=True)
"""

SYSV_SHM_HOG = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
made = 0
for _ in range(64):
    if libc.shmget(0, 64 << 20, 0o1600) < 0:  # IPC_PRIVATE, IPC_CREAT | 0600
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    made += 64
print("made", made, "MiB", flush=True)
"""


@pytest.mark.parametrize("code", [MEMFD_HOG, SYSV_SHM_HOG], ids=["memfd_create", "shmget"])
def test_memory_that_is_not_heap_is_a_memory_limit(backend: BubblewrapBackend, code: str) -> None:
    """Before the seccomp filter the memfd program held 4 x 1.8 GB of host memory under a 256 MB limit."""
    result = go(backend, code, time_seconds=10, open_files=128)
    assert result.outcome is Outcome.MEMORY_LIMIT, (result.outcome, result.stdout, result.stderr[-500:])
    assert "held" not in result.stdout and "made" not in result.stdout


SEEN = """
import os
for path in ("/usr", "/usr/bin", "/usr/share", "/usr/local", "/usr/src", "/usr/sbin", "/usr/bin/bwrap",
             "/usr/bin/apt", "/usr/bin/sh", "/usr/bin/prlimit"):
    print(path, os.path.exists(path))
"""


def test_only_what_the_runtimes_need_of_usr_is_there(backend: BubblewrapBackend) -> None:
    result = go(backend, SEEN)
    assert result.outcome is Outcome.OK, result.stderr
    seen = dict(line.rsplit(" ", 1) for line in result.stdout.splitlines())
    for path in ("/usr/share", "/usr/src", "/usr/sbin", "/usr/bin/bwrap", "/usr/bin/apt"):
        assert seen[path] == "False" and os.path.exists(path), path  # on the host, not in the sandbox
    assert seen["/usr/local"] == "False" or not known_languages()["python"].runtime.startswith("/usr/local")
    assert seen["/usr/bin/sh"] == seen["/usr/bin/prlimit"] == "True"


OUT_OF_FDS = """
import asyncio, os, resource
from grpcgrade_code import Limits, SandboxUnavailable, run
from grpcgrade_code.bubblewrap import BubblewrapBackend

async def main():
    backend = BubblewrapBackend(max_concurrency=1)
    assert (await run(backend, "python", "print(1)", "", Limits())).stdout == "1\\n"  # fine with fds free
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    try:
        await run(backend, "python", "print(1)", "", Limits())
    except SandboxUnavailable as exc:
        print("unavailable:", exc)
    for fd in held:
        os.close(fd)

asyncio.run(main())
"""


def test_a_server_out_of_file_descriptors_is_sandbox_unavailable() -> None:
    """EMFILE while preparing the sandbox escaped as an OSError (the grader's GRADER_FAILED) before."""
    done = subprocess.run([sys.executable, "-c", OUT_OF_FDS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("unavailable:") and "Too many open files" in done.stdout, done.stdout


NAMESPACES = r"""
import ctypes, errno, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def call(*args):
    result = libc.syscall(*args)
    return errno.errorcode.get(ctypes.get_errno()) if result == -1 else "allowed"
print("unshare", call(272, 0x10000000))           # unshare(CLONE_NEWUSER)
print("clone", call(56, 0x10000000 | 17, 0, 0, 0, 0))  # clone(CLONE_NEWUSER | SIGCHLD): a child if allowed
print("clone3", call(435, 0, 0))
print("child", subprocess.run(["/bin/sh", "-c", "echo ran"], capture_output=True, text=True).stdout.strip())
threading.Thread(target=print, args=("thread",)).start()
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the program calls x86_64 system call numbers")
def test_a_program_cannot_create_a_user_namespace(backend: BubblewrapBackend) -> None:
    """unshare and clone refuse a new user namespace, clone3 is absent (glibc falls back to clone), and
    processes and threads are still made."""
    result = go(backend, NAMESPACES)
    assert result.outcome is Outcome.OK, result.stderr
    assert result.stdout.splitlines() == ["unshare EPERM", "clone EPERM", "clone3 ENOSYS", "child ran", "thread"]


# What every container engine does to /proc/sys (docker, podman, containerd): a read-only bind mount.
READ_ONLY_PROC_SYS = 'mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$@"'
IN_A_CONTAINER = """
import asyncio
from grpcgrade_code import Limits, run
from grpcgrade_code.bubblewrap import BubblewrapBackend
result = asyncio.run(run(BubblewrapBackend(), "python", "print(int(input()) * 2)", "21", Limits()))
print(result.outcome.value, result.stdout.strip())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="making a mount namespace with a read-only /proc/sys needs root")
def test_the_sandbox_starts_where_proc_sys_is_read_only() -> None:
    """As in a container (bwrap's --disable-userns needed /proc/sys writable: every run failed there)."""
    site = {str(Path(m.__file__).resolve().parents[1]) for m in (grpcgrade, grpcgrade_code)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sorted(site))}
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY_PROC_SYS, "sh"]
    done = subprocess.run([*command, sys.executable, "-c", IN_A_CONTAINER], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "42"]
