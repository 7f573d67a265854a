"""JSONL in and out for `grpcgrade eval`: input read lazily line by line (a file of any size, or stdin),
each line checked with its line number; output written to a temporary file beside the target and renamed
over it only when the whole run succeeded, so a failed run never destroys an existing file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

STDIO = "-"


class InputError(ValueError):
    """A line of the input is not a sample; the message names the file and the line."""


def open_input(path: str) -> IO[bytes]:
    """The input's bytes (`-`: stdin's), each line decoded by `read_samples`, which can then say which line
    is not UTF-8 (a text reader decodes blocks of lines at once). Raises FileNotFoundError,
    IsADirectoryError, PermissionError."""
    if path == STDIO:
        return sys.stdin.buffer
    return open(path, "rb")  # noqa: SIM115 - the caller closes it


def count_samples(path: str) -> int | None:
    """Non-blank lines of a regular file (for the progress bar's total and ETA), read in one streaming
    pass; None for stdin, pipes and FIFOs, which can only be read once."""
    if path == STDIO or not Path(path).is_file():
        return None
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def read_samples(fh: IO[bytes], name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, sample) for every non-blank line, read as it is needed; InputError naming the line
    that is not UTF-8, not JSON, or nested deeper than the parser goes."""
    for number, raw in enumerate(fh, 1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a BOM some editors write first
        except UnicodeDecodeError as exc:
            raise InputError(
                f"{name}, line {number}: not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1})"
            ) from None
        try:
            sample = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{name}, line {number}: not JSON: {exc.msg} (column {exc.colno})") from exc
        except RecursionError:
            raise InputError(f"{name}, line {number}: not JSON this reader takes: nested too deeply") from None
        if not isinstance(sample, dict):
            raise InputError(f"{name}, line {number}: a sample is a JSON object, got {type(sample).__name__}")
        yield number, sample


@contextlib.contextmanager
def atomic_output(path: str | None) -> Iterator[IO[str]]:
    """stdout for None or `-`; else a temporary file in the target's directory, renamed over the target when
    the block ends without an exception and removed when it raises."""
    if path in (None, STDIO):
        yield sys.stdout
        return
    target = Path(path)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp, 0o666 & ~umask)  # what open() would have made, not mkstemp's 0600
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
