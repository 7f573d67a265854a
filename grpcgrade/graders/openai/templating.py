"""OpenAI grader templates: `{{ item.x.y }}`, `{{ sample.output_text }}`, `{{ sample.output_tools[0].function.name }}`.

Every `{{ ... }}` in a template string holds a namespace (`item` or `sample`) and a JSON-path-like variable:
`.key` steps into an object (or, with digits, a list), `[0]` into a list, `["a key"]` into an object with any
key. Templates are compiled once when the grader config is validated, so a malformed one is a bad request;
a variable that a sample does not have is that sample's error (MissingVariable), never an empty string.

A value that is a string is inserted as it is; any other value (number, object, list, true/false/null) as
compact JSON. A rendered text is bounded (`MAX_RENDERED_CHARS`): a short template that repeats a big value
many times is an error, not a memory blow-up.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_RENDERED_CHARS = 2_000_000
NAMESPACES = ("item", "sample")
#: The variables of the `sample` namespace grpcgrade fills (see Namespaces).
SAMPLE_VARIABLES = ("output_text", "output_json", "output_tools", "choices")

_STEP = re.compile(r"""\.([^.\[\]\s]+)|\[\s*(\d+)\s*\]|\[\s*"((?:[^"\\]|\\.)*)"\s*\]|\[\s*'([^']*)'\s*\]""")
_ROOT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TemplateError(ValueError):
    """A template string is malformed (raised when the config is validated)."""


class MissingVariable(LookupError):
    """A sample has no value at a template's variable; the message names the variable."""


class SampleNotJson(ValueError):
    """A template reads `sample.output_json`, and the sample's output is not valid JSON."""


class RenderedTooLong(ValueError):
    """A filled template is longer than MAX_RENDERED_CHARS."""


Step = str | int


@dataclass(frozen=True)
class Variable:
    """`namespace.step.step...` as written (`text`) and as steps."""

    text: str
    namespace: str
    steps: tuple[Step, ...]

    def resolve(self, ns: Namespaces) -> Any:
        value = ns.root(self.namespace, self.steps[0] if self.steps else None)
        walked = self.namespace
        for i, step in enumerate(self.steps):
            if i == 0 and self.namespace == "sample":
                walked += f".{step}"
                continue
            value = _step(value, step, walked, self.text)
            walked += f"[{step}]" if isinstance(step, int) else f".{step}"
        return value


def _step(value: Any, step: Step, walked: str, text: str) -> Any:
    if isinstance(value, dict):
        key = str(step)
        if key in value:
            return value[key]
        raise MissingVariable(f"template variable {{{{ {text} }}}}: {walked} has no key {key!r}")
    if isinstance(value, list):
        index = step if isinstance(step, int) else int(step) if str(step).isdigit() else None
        if index is None:
            raise MissingVariable(f"template variable {{{{ {text} }}}}: {walked} is a list, not an object")
        if index < len(value):
            return value[index]
        raise MissingVariable(f"template variable {{{{ {text} }}}}: {walked} has {len(value)} items, no [{index}]")
    kind = "null" if value is None else type(value).__name__
    raise MissingVariable(f"template variable {{{{ {text} }}}}: {walked} is {kind}, which has no {step!r}")


def parse_variable(text: str) -> Variable:
    """`item.a[0]["b c"]` -> Variable; raises TemplateError."""
    text = text.strip()
    root = _ROOT.match(text)
    if root is None or root.group() not in NAMESPACES:
        raise TemplateError(f"{{{{ {text} }}}}: a variable starts with a namespace, `item` or `sample`")
    steps: list[Step] = []
    pos = root.end()
    while pos < len(text):
        step = _STEP.match(text, pos)
        if step is None:
            raise TemplateError(f"{{{{ {text} }}}}: cannot read the path at {text[pos:]!r}")
        key, index, quoted, single = step.groups()
        if index is not None:
            steps.append(int(index))
        elif quoted is not None:
            steps.append(json.loads(f'"{quoted}"'))
        else:
            steps.append(key if key is not None else single)
        pos = step.end()
    namespace = root.group()
    if not steps:
        raise TemplateError(f"{{{{ {text} }}}}: name a variable of the namespace, e.g. {{{{ {namespace}.name }}}}")
    if namespace == "sample" and steps[0] not in SAMPLE_VARIABLES:
        allowed = ", ".join(f"sample.{v}" for v in SAMPLE_VARIABLES)
        raise TemplateError(f"{{{{ {text} }}}}: the sample namespace has {allowed}")
    return Variable(text, namespace, tuple(steps))


@dataclass(frozen=True)
class Template:
    """A compiled template: literal text and variables, alternating."""

    source: str
    parts: tuple[str | Variable, ...]

    def render(self, ns: Namespaces) -> str:
        if len(self.parts) == 1 and isinstance(self.parts[0], str):
            return self.parts[0]
        out: list[str] = []
        size = 0
        for part in self.parts:
            text = part if isinstance(part, str) else as_text(part.resolve(ns))
            size += len(text)
            if size > MAX_RENDERED_CHARS:
                raise RenderedTooLong(f"a filled template is over the limit of {MAX_RENDERED_CHARS} characters")
            out.append(text)
        return "".join(out)


def compile_template(source: str) -> Template:
    """Split `source` at its `{{ ... }}`; an unclosed `{{` is literal text. One pass (str.find, no regex
    backtracking), so a hostile template costs time in proportion to its length."""
    parts: list[str | Variable] = []
    pos = 0
    while (start := source.find("{{", pos)) >= 0 and (end := source.find("}}", start + 2)) >= 0:
        if start > pos:
            parts.append(source[pos:start])
        parts.append(parse_variable(source[start + 2 : end]))
        pos = end + 2
    if pos < len(source) or not parts:
        parts.append(source[pos:])
    return Template(source, tuple(parts))


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class Namespaces:
    """The `sample` and `item` namespaces of one graded sample.

    `sample.output_text` is the model's output; `sample.output_json` the same parsed as JSON (only read when a
    template or a python grader asks for it); `sample.output_tools` the tool calls (chat-completions shape);
    `sample.choices` one chat-completions choice holding all of these.
    """

    __slots__ = ("item", "output_text", "output_tools", "_json")

    def __init__(self, output_text: str, item: Any, output_tools: list[Any] | None = None) -> None:
        self.output_text = output_text
        self.item = item
        self.output_tools = output_tools or []
        self._json: tuple[bool, Any] | None = None

    def output_json(self) -> Any:
        if self._json is None:
            try:
                self._json = (True, json.loads(self.output_text))
            except (ValueError, RecursionError):
                self._json = (False, None)
        ok, value = self._json
        if not ok:
            raise SampleNotJson("the template reads sample.output_json, and the sample's output is not valid JSON")
        return value

    def choices(self) -> list[dict[str, Any]]:
        message: dict[str, Any] = {"role": "assistant", "content": self.output_text}
        if self.output_tools:
            message["tool_calls"] = self.output_tools
        finish = "tool_calls" if self.output_tools else "stop"
        return [{"index": 0, "message": message, "finish_reason": finish}]

    def root(self, namespace: str, first: Step | None) -> Any:
        if namespace == "item":
            return self.item
        getters: dict[Step | None, Callable[[], Any]] = {
            "output_text": lambda: self.output_text,
            "output_json": self.output_json,
            "output_tools": lambda: self.output_tools,
            "choices": self.choices,
        }
        return getters[first]()

    def sample(self, with_json: bool = True) -> dict[str, Any]:
        """The whole `sample` namespace as a dict (what a python grader's `grade(sample, item)` receives)."""
        out: dict[str, Any] = {"output_text": self.output_text, "output_tools": self.output_tools}
        out["choices"] = self.choices()
        if with_json:
            try:
                out["output_json"] = self.output_json()
            except SampleNotJson:
                out["output_json"] = None
        return out
