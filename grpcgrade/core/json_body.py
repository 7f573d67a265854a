"""An untrusted JSON body parsed within bounds: its nesting depth, its number of arrays and objects, and the
encoded size of the fields a caller passes on whole.

The HTTP face parses bodies larger than a few kB in a separate process (`service.http.limits`), which
imports only this module (and `prctl`, to name itself): the standard library's C decoder is the fastest
there is in CPython, and it holds the GIL for its whole call, harmless in a process whose only work it
is. The object then comes back pickled; unpickling it is one C call in the server's process, whose length
grows with the body's containers: `MAX_JSON_CONTAINERS` bounds it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from typing import Any

from .prctl import name_process

#: JSON nested deeper than this is refused (protobuf's Struct limit is the same).
MAX_JSON_DEPTH = 100
#: Arrays and objects a body may hold. Each is a Python object the server's process makes when it takes
#: the parsed body back (and its garbage collector then walks); trainers' bodies hold text.
MAX_JSON_CONTAINERS = 100_000


class BodyError(ValueError):
    """A body a face cannot take; `status` is the HTTP status (400, 408 or 413), each face answers it in
    its own error format."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:  # raised in the parsing process, re-raised in the server's
        return (type(self), (str(self), self.status, self.param))


def too_deep() -> BodyError:
    return BodyError(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep")


def check_shape(value: Any) -> None:
    """BodyError for a value nested past MAX_JSON_DEPTH (400) or holding more than MAX_JSON_CONTAINERS
    arrays and objects (413); one walk, without recursion."""
    stack = [(value, 1)]
    containers = 0
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        containers += 1
        if depth > MAX_JSON_DEPTH:
            raise too_deep()
        if containers > MAX_JSON_CONTAINERS:
            raise BodyError(f"the request body has more than {MAX_JSON_CONTAINERS} arrays and objects", 413)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def encoded_size(value: Any) -> int:
    """The UTF-8 size of `value` as compact JSON (the C encoder: one call, in the parsing process)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return len(text.encode("utf-8", errors="surrogatepass"))


def parse_body(raw: bytes, sized: Sequence[str] = ()) -> tuple[Any, dict[str, int]]:
    """The body as JSON, and the JSON size of each of its top-level `sized` fields present; BodyError
    naming what is wrong. In the parsing process, or on the loop for a small body."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except RecursionError:  # nesting past the interpreter's limit: a bad body, not the server's trouble
        raise too_deep() from None
    except ValueError:
        raise BodyError("the request body is not valid JSON") from None
    # no more brackets than the depth limit can neither nest past it nor make too many containers: counted
    # in C, no walk (most bodies, one sample each, are shallow)
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
        check_shape(body)
    sizes = {key: encoded_size(body[key]) for key in sized if isinstance(body, dict) and key in body}
    return body, sizes


#: The name a parsing process gives itself (/proc/PID/comm): told apart from the server's workers.
PROCESS_NAME = "grpcgrade-json"
#: How much lower a parsing process's priority is than the server's: large bodies sent back to back keep
#: the parsing processes busy, and on a machine with few cores they would take them from the event loop
#: (which gRPC callers wait on) and the workers; at a lower priority they get what those leave.
PARSER_NICENESS = 10


def init_process() -> None:
    """The parsing pool's initializer: this process named PROCESS_NAME (where Linux allows it) and at
    PARSER_NICENESS."""
    name_process(PROCESS_NAME)
    with contextlib.suppress(OSError):
        os.nice(PARSER_NICENESS)
