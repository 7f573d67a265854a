"""The parts of the host a sandbox sees: what its runtimes need to run, read-only, and nothing else.

Binding the whole of /usr would show every program a run to whatever the host installed there (its tools,
/usr/local, /usr/share, /usr/src). Instead each sandbox gets:

* the system's shared libraries (/usr/lib/<triplet>, /usr/lib64), which every runtime links against, and
  the dynamic linker's cache;
* the few tools the sandbox itself runs before the program: the shell, `prlimit`, `cat` (compilation);
* per language (`Language.needs`): the runtime's binary and the directories it reads at run time (Python's
  standard library, GCC's headers and internals and binutils).

A path that does not exist on this host is left out (the language is then unavailable, or a run fails with
a clear message); a path inside another one that is bound already is not bound twice.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

#: Every runtime's shared libraries, and the dynamic linker (Debian's multiarch layout and others').
SHARED = ("/usr/lib/*-linux-gnu*", "/usr/lib64", "/usr/lib32")
#: What the sandbox runs before (or around) the program: `sh -c` starts it, `prlimit` sets its limits,
#: `cat` hands a compiled binary back.
TOOLS = ("/usr/bin/sh", "/usr/bin/prlimit", "/usr/bin/cat")


def existing(patterns: Iterable[str]) -> list[str]:
    """The paths the patterns (globs allowed) name on this host, in order, each once, none inside another."""
    found: list[str] = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]:
            path = os.path.normpath(path)
            if os.path.exists(path) and not any(path == p or path.startswith(p + "/") for p in found):
                found = [p for p in found if not p.startswith(path + "/")] + [path]
    return found


def binds(needs: Iterable[str]) -> list[str]:
    """bwrap arguments binding the shared libraries, the sandbox's tools and `needs`, read-only."""
    args: list[str] = []
    for path in existing([*SHARED, *TOOLS, *needs]):
        args += ["--ro-bind", path, path]
    return args
