"""The seccomp filter that keeps a sandboxed program from creating user namespaces of its own.

Why not bwrap's `--disable-userns`: it writes `/proc/sys/user/max_user_namespaces`, and every container
engine (Docker, podman, containerd under Kubernetes) mounts /proc/sys read-only, so no sandbox would start
in a container. A filter needs no write anywhere: bwrap loads it (`--seccomp FD`) into the program's
process right before it executes the program, after bwrap has made its own namespaces.

It refuses, with EPERM, `unshare` and `clone` with CLONE_NEWUSER; `clone3` with ENOSYS, because its flags
sit in memory a filter cannot read (glibc then falls back to `clone`, as it does under Flatpak and Docker
with the same rule); and every system call of another ABI (32-bit x86, x32), whose numbers differ. All
else passes. It is a classic BPF program (the format `seccomp_export_bpf` writes and bwrap reads): a few
fixed instructions, written here rather than pulling libseccomp's bindings into the image for them.
"""

from __future__ import annotations

import errno
import platform
import struct

#: linux/audit.h: the architecture word the kernel puts in seccomp_data, per machine.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
#: (unshare, clone, clone3) system call numbers per machine (asm/unistd.h).
_SYSCALLS = {"x86_64": (272, 56, 435), "aarch64": (97, 220, 435)}
#: x86_64's x32 ABI: the same architecture word, numbers with this bit set.
_X32_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000

# linux/filter.h and linux/seccomp.h
_LD_ABS_W = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian: the
# low half of args[0] first).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def no_user_namespaces(machine: str | None = None) -> bytes:
    """The filter for `machine` (this one by default), as bwrap's `--seccomp` reads it.

    Raises ValueError on a machine whose numbers are not listed here: better no sandbox than one that
    lets a program make user namespaces.
    """
    machine = machine or platform.machine()
    if machine not in _SYSCALLS:
        raise ValueError(f"no seccomp filter for {machine!r} machines (known: {', '.join(sorted(_SYSCALLS))})")
    unshare, clone, clone3 = _SYSCALLS[machine]
    x32_limit = _X32_BIT if machine == "x86_64" else 0xFFFFFFFF
    program = [
        _op(_LD_ABS_W, _ARCH),  # 0
        _op(_JEQ, _AUDIT_ARCH[machine], 0, 8),  # 1: another ABI -> 10 (ENOSYS)
        _op(_LD_ABS_W, _NR),  # 2
        _op(_JGE, x32_limit, 6, 0),  # 3: x32 -> 10
        _op(_JEQ, clone3, 5, 0),  # 4: clone3 -> 10
        _op(_JEQ, unshare, 1, 0),  # 5: -> 7
        _op(_JEQ, clone, 0, 2),  # 6: neither -> 9 (allow)
        _op(_LD_ABS_W, _ARG0_LOW),  # 7: the flags
        _op(_JSET, CLONE_NEWUSER, 2, 0),  # 8: a new user namespace -> 11 (EPERM)
        _op(_RET, _ALLOW),  # 9
        _op(_RET, _ERRNO | errno.ENOSYS),  # 10
        _op(_RET, _ERRNO | errno.EPERM),  # 11
    ]
    return b"".join(program)
