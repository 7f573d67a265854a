"""Linux's prctl for the processes the service starts: a name of their own (`/proc/PID/comm`, what `ps`,
`top` and the tests tell them apart by) and a signal when their parent ends, so none outlives the server.

Through ctypes and libc: the standard library has no prctl, and the one package that wraps it (python-prctl)
needs a compiler and libcap's headers for two calls. Elsewhere than Linux both are skipped: a process there
still ends when its pipe to the server closes, between tasks.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

#: prctl's options (linux/prctl.h).
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def _prctl(option: int, value: int | bytes) -> bool:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    return False


def name_process(name: str) -> None:
    """This process takes `name` (the kernel keeps its first 15 bytes)."""
    _prctl(PR_SET_NAME, name.encode())


def end_with_parent(signal: int, parent: int) -> bool:
    """This process gets `signal` when the thread that started it ends (Linux; its parent process ends
    with that thread at the latest). False if the parent, `parent` by pid, had ended already: the signal
    set now would never come, and the caller should end at once.

    The kernel sends it when the parent *thread* ends, not the process: whoever starts such processes
    must do so from a thread that lives as long as they should (the service starts them on its event
    loop's thread)."""
    _prctl(PR_SET_PDEATHSIG, signal)
    return os.getppid() == parent
