"""The system calls a sandboxed program may not make: those that take memory no rlimit counts.

RLIMIT_AS and RLIMIT_DATA count a process's own mappings. Memory that lives in the kernel outside any
process is not counted: a `memfd_create` file, a System V shared-memory segment or message queue, a POSIX
message queue. Each survives its creator and can be made again and again up to the open-files limit, so a
program limited to 512 MiB made gigabytes of it. A memory cgroup would count that memory; without one
(this plugin does not require the host to delegate one), these calls are refused by a seccomp filter that
bwrap installs in the sandbox before the program starts (`--add-seccomp-fd`, beside `seccomp.py`'s
filter). They fail with ENOMEM, the errno of a failed allocation, so the run's verdict is `memory_limit`
like any other allocation refused at the limit. Sandboxed programs (solutions to programming problems)
have no use for them.

The filter is built with libseccomp (through `pyseccomp`, its ctypes binding) rather than by hand-writing
BPF: libseccomp knows each architecture's syscall numbers and checks the architecture of every call, so a
32-bit call (another syscall table) is killed instead of slipping past the rules.
"""

from __future__ import annotations

import errno
import functools
import tempfile

#: Refused with ENOMEM: calls that make memory outside the process's own address space.
DENIED = (
    "memfd_create",  # an anonymous file in memory, outside RLIMIT_AS
    "memfd_secret",  # the same, unmapped from the kernel
    "shmget",  # System V shared memory: a segment lives on after its creator
    "msgget",  # System V message queues: up to msgmni queues of msgmnb bytes each
    "mq_open",  # POSIX message queues (RLIMIT_MSGQUEUE is also 0)
)


class SeccompMissing(RuntimeError):
    """libseccomp or its Python binding is not installed: the sandbox cannot bound memory, so it does not run."""


@functools.cache
def filter_program() -> bytes:
    """The filter as the BPF program bwrap loads (built once per process)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError) as exc:  # RuntimeError: the binding is there, libseccomp.so.2 is not
        raise SeccompMissing(
            f"the sandbox's seccomp filter needs libseccomp (Debian: libseccomp2) and pyseccomp ({exc})"
        ) from exc
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED:
        rules.add_rule(seccomp.ERRNO(errno.ENOMEM), name)
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()
