"""The languages a program may be written in, and how each is compiled and run inside the sandbox.

Each language names its runtime on this machine (found under /usr), what of the host that runtime needs
inside the sandbox (nothing else of the host is there), the file its source goes to, the command that
runs it, and the memory limit that suits it: the address-space limit (RLIMIT_AS) for Python and C++, the
data limit (RLIMIT_DATA) for JavaScript, whose V8 engine reserves gigabytes of address space it never
uses and cannot start under RLIMIT_AS.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from .sandbox import Limits

#: Where runtimes are looked for, and the PATH programs get.
RUNTIME_PATH = "/usr/local/bin:/usr/bin"
#: The environment variable that picks the Python interpreter programs run with (default: python3 on
#: RUNTIME_PATH, the image's /usr/local/bin/python3 or Debian's /usr/bin/python3).
PYTHON_ENV = "GRPCGRADE_CODE_PYTHON"
BOX = "/box"  #: where the program's files are, read-only

#: Lines of stderr that show an allocation failed at the memory limit, per runtime.
MEMORY_MARKERS = (
    "MemoryError",  # Python
    "std::bad_alloc",  # C++
    "heap out of memory",  # V8's heap limit
    "Array buffer allocation failed",  # V8 buffers under RLIMIT_DATA
    "Fatal process out of memory",  # V8
    "Cannot allocate memory",  # ENOMEM from the C library
)
#: stderr that shows a write failed at the file size limit (Python ignores SIGXFSZ and raises instead).
FILE_SIZE_MARKERS = ("File too large",)
#: The last line of a Python traceback that means the source did not even parse.
PYTHON_PARSE_ERRORS = ("SyntaxError:", "IndentationError:", "TabError:")


#: Fenced-code-block info strings that mean each language.
TAGS = {
    "python": frozenset({"python", "py", "python3", "py3"}),
    "cpp": frozenset({"cpp", "c++", "cc", "cxx"}),
    "javascript": frozenset({"javascript", "js", "node", "nodejs"}),
}
LANGUAGE_NAMES = tuple(TAGS)


@dataclass(frozen=True)
class Language:
    name: str
    source_file: str
    runtime: str  #: the binary that must exist for the language to be available here
    memory_rlimit: str  #: "as" or "data"
    #: RLIMIT_STACK, also every thread's default stack size (glibc, libuv), and so counted per thread
    #: against the memory limit: deep recursion for C++ as judges allow it, little for threaded runtimes.
    stack_mb: int
    compiled: bool = False
    #: What of the host the runtime reads at run time, bound read-only into its sandbox (`mounts.py`).
    needs: tuple[str, ...] = ()

    def source_path(self) -> str:
        return f"{BOX}/{self.source_file}"

    def compile_argv(self) -> tuple[str, ...]:
        """A shell command that compiles the source and writes the binary to stdout (diagnostics to stderr)."""
        out = "/tmp/main"
        return ("/bin/sh", "-c", f"{self.runtime} -std=gnu++17 -O2 -pipe -o {out} {self.source_path()} && cat {out}")

    def run_argv(self, limits: Limits) -> tuple[str, ...]:
        if self.compiled:
            return (f"{BOX}/main",)
        if self.name == "javascript":
            return (self.runtime, f"--max-old-space-size={limits.memory_mb}", self.source_path())
        # -I: no environment variables, no user site-packages, no script directory on sys.path; -B: no .pyc.
        return (self.runtime, "-I", "-B", self.source_path())

    def parse_failed(self, stderr: str) -> bool:
        return self.name == "python" and python_parse_failed(stderr)


def python_parse_failed(stderr: str) -> bool:
    """Python reports a source that does not parse only when run: read it from the traceback's last line."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return bool(lines) and lines[-1].startswith(PYTHON_PARSE_ERRORS)


def _which(name: str) -> str:
    found = shutil.which(name, path=RUNTIME_PATH)
    return os.path.realpath(found) if found else f"/usr/bin/{name}"


def python_runtime() -> str:
    chosen = os.environ.get(PYTHON_ENV) or _which("python3")
    if not os.path.realpath(chosen).startswith("/usr/"):
        raise ValueError(f"{PYTHON_ENV}={chosen!r}: the interpreter must live under /usr, the sandbox's only runtime")
    return chosen


def python_needs(runtime: str) -> tuple[str, ...]:
    """The interpreter, its standard library (with its own site-packages) and its libpython, if shared."""
    real = os.path.realpath(runtime)
    prefix = os.path.dirname(os.path.dirname(real))
    version = os.path.basename(real).removeprefix("python")  # python3.11 -> 3.11
    return (runtime, real, f"{prefix}/lib/python{version}", f"{prefix}/lib/libpython{version}*.so*")


#: GCC's driver, compilers and headers, and binutils' assembler and linker (the driver finds them on PATH).
CPP_NEEDS = ("/usr/lib/gcc", "/usr/libexec/gcc", "/usr/include", "/usr/bin/as", "/usr/bin/ld", "/usr/bin/ld.bfd")


def known_languages() -> dict[str, Language]:
    """Every language this package can run, with its runtime as found on this machine."""
    python, cpp, node = python_runtime(), _which("g++"), _which("node")
    return {
        "python": Language("python", "main.py", python, "as", 64, needs=python_needs(python)),
        "cpp": Language("cpp", "main.cpp", cpp, "as", 256, compiled=True, needs=(cpp, *CPP_NEEDS)),
        "javascript": Language("javascript", "main.js", node, "data", 8, needs=(node,)),
    }
