"""OpenAI grader JSON, checked against the public schema and turned into typed configs.

The schema is the `openai` package's `types/graders/*` (and the Evals criteria for `pass_threshold`):
`string_check`, `text_similarity`, `score_model`, `label_model`, `python` and `multi`, whose `graders` is a
mapping of keys to graders of the other five types (a single grader object, as the generated types have it,
is also accepted and keyed by its name). Unknown fields are refused, so a typo does not pass silently.

Every error names the JSON path of the bad field (`grader.graders.judge.input[0].content`), which the
gRPC status and the HTTP error's `param` carry. Everything a request can make big has a limit here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from grpcgrade.core.errors import InvalidParams

from .formula import Formula, FormulaError, UnknownVariable
from .formula import parse as parse_formula
from .templating import Template, TemplateError, compile_template

MAX_TEXT_CHARS = 200_000  # one template string
MAX_SOURCE_CHARS = 256 * 1024  # a python grader's source (OpenAI's own limit)
MAX_MESSAGES = 64
MAX_PARTS = 64
MAX_LABELS = 256
MAX_SUB_GRADERS = 32

STRING_OPERATIONS = ("eq", "ne", "like", "ilike")
SIMILARITY_METRICS = (
    "cosine", "fuzzy_match", "bleu", "gleu", "meteor",
    "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l",
)  # fmt: skip
ROLES = ("user", "assistant", "system", "developer")
IMAGE_DETAILS = ("auto", "low", "high")
AUDIO_FORMATS = ("mp3", "wav")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY_RULE = "must be a formula variable name: letters, digits and _, not starting with a digit"


class GraderConfigError(InvalidParams):
    """The grader JSON is wrong at `path`. `flag` names the OpenAI error flag it corresponds to, if any
    (`formula_parse_error`, `invalid_variable_error`): the run endpoint reports those as OpenAI does."""

    def __init__(self, path: str, message: str, flag: str | None = None) -> None:
        super().__init__("grader", f"{path}: {message}")
        self.path = path
        self.detail = f"{path}: {message}"
        self.flag = flag


# -- configs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StringCheck:
    name: str
    input: Template
    reference: Template
    operation: str
    type: str = "string_check"


@dataclass(frozen=True)
class TextSimilarity:
    name: str
    input: Template
    reference: Template
    evaluation_metric: str
    pass_threshold: float | None = None
    type: str = "text_similarity"


@dataclass(frozen=True)
class TextPart:
    text: Template


@dataclass(frozen=True)
class ImagePart:
    image_url: Template
    detail: str | None = None


@dataclass(frozen=True)
class AudioPart:
    data: str
    format: str


Part = TextPart | ImagePart | AudioPart


@dataclass(frozen=True)
class Message:
    role: str
    parts: tuple[Part, ...]
    plain: bool  # the content was one string: sent as a string, not as a list of parts


@dataclass(frozen=True)
class ScoreModel:
    name: str
    model: str
    input: tuple[Message, ...]
    range: tuple[float, float] = (0.0, 1.0)
    sampling_params: tuple[tuple[str, Any], ...] = ()
    pass_threshold: float | None = None
    type: str = "score_model"


@dataclass(frozen=True)
class LabelModel:
    name: str
    model: str
    input: tuple[Message, ...]
    labels: tuple[str, ...]
    passing_labels: tuple[str, ...]
    type: str = "label_model"


@dataclass(frozen=True)
class Python:
    name: str
    source: str
    image_tag: str | None = None
    pass_threshold: float | None = None
    type: str = "python"


@dataclass(frozen=True)
class Multi:
    name: str
    graders: tuple[tuple[str, Config], ...]
    formula: Formula
    type: str = "multi"


Config = StringCheck | TextSimilarity | ScoreModel | LabelModel | Python | Multi


# -- field readers -----------------------------------------------------------------------------------


def _object(raw: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise GraderConfigError(path, f"must be an object, got {_kind(raw)}")
    return raw


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(type(value), "a number")


def _fields(raw: Mapping[str, Any], path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    for name in required:
        if name not in raw:
            raise GraderConfigError(f"{path}.{name}", "is required")
    unknown = sorted(set(raw) - set(required) - set(optional))
    if unknown:
        allowed = ", ".join(sorted({*required, *optional}))
        raise GraderConfigError(f"{path}.{unknown[0]}", f"unknown field (allowed: {allowed})")


def _string(raw: Any, path: str, limit: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(raw, str):
        raise GraderConfigError(path, f"must be a string, got {_kind(raw)}")
    if len(raw) > limit:
        raise GraderConfigError(path, f"has {len(raw)} characters, over the limit of {limit}")
    return raw


def _choice(raw: Any, path: str, options: tuple[str, ...]) -> str:
    if raw not in options:
        raise GraderConfigError(path, f"must be one of {', '.join(options)}; got {raw!r}")
    return str(raw)


def _number(raw: Any, path: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise GraderConfigError(path, f"must be a finite number, got {raw!r}")
    return float(raw)


def _integer(raw: Any, path: str, minimum: int | None = None) -> int:
    number = _number(raw, path)
    if not number.is_integer() or (minimum is not None and number < minimum):
        at_least = "" if minimum is None else f" >= {minimum}"
        raise GraderConfigError(path, f"must be an integer{at_least}, got {raw!r}")
    return int(number)


def _template(raw: Any, path: str) -> Template:
    try:
        return compile_template(_string(raw, path))
    except TemplateError as exc:
        raise GraderConfigError(path, str(exc), flag="invalid_variable_error") from None


def _optional(raw: Mapping[str, Any], name: str, read: Callable[[Any, str], Any], path: str) -> Any:
    value = raw.get(name)
    return None if value is None else read(value, f"{path}.{name}")


def _list(raw: Any, path: str, limit: int, allow_empty: bool = False) -> list[Any]:
    if not isinstance(raw, list):
        raise GraderConfigError(path, f"must be a list, got {_kind(raw)}")
    if not raw and not allow_empty:
        raise GraderConfigError(path, "must not be empty")
    if len(raw) > limit:
        raise GraderConfigError(path, f"has {len(raw)} items, over the limit of {limit}")
    return raw


# -- graders -----------------------------------------------------------------------------------------


def parse_grader(raw: Any, path: str = "grader", nested: bool = False) -> Config:
    """The typed config of grader JSON `raw`; raises GraderConfigError naming the bad field's path."""
    raw = _object(raw, path)
    kind = raw.get("type")
    readers: dict[str, Callable[..., Config]] = {
        "string_check": _string_check,
        "text_similarity": _text_similarity,
        "score_model": _score_model,
        "label_model": _label_model,
        "python": _python,
        "multi": _multi,
    }
    if kind not in readers:
        raise GraderConfigError(f"{path}.type", f"must be one of {', '.join(readers)}; got {kind!r}")
    if kind == "multi" and nested:
        raise GraderConfigError(f"{path}.type", "a multi grader's graders cannot be multi graders")
    name = raw.get("name")
    if not isinstance(name, str):
        problem = "is required" if name is None else f"must be a string, got {_kind(name)}"
        raise GraderConfigError(f"{path}.name", problem)
    return readers[kind](raw, path)


def _string_check(raw: Mapping[str, Any], path: str) -> StringCheck:
    _fields(raw, path, ("type", "name", "input", "reference", "operation"))
    return StringCheck(
        name=raw["name"],
        input=_template(raw["input"], f"{path}.input"),
        reference=_template(raw["reference"], f"{path}.reference"),
        operation=_choice(raw["operation"], f"{path}.operation", STRING_OPERATIONS),
    )


def _text_similarity(raw: Mapping[str, Any], path: str) -> TextSimilarity:
    _fields(raw, path, ("type", "name", "input", "reference", "evaluation_metric"), ("pass_threshold",))
    return TextSimilarity(
        name=raw["name"],
        input=_template(raw["input"], f"{path}.input"),
        reference=_template(raw["reference"], f"{path}.reference"),
        evaluation_metric=_choice(raw["evaluation_metric"], f"{path}.evaluation_metric", SIMILARITY_METRICS),
        pass_threshold=_optional(raw, "pass_threshold", _number, path),
    )


def _score_model(raw: Mapping[str, Any], path: str) -> ScoreModel:
    _fields(raw, path, ("type", "name", "model", "input"), ("range", "sampling_params", "pass_threshold"))
    score_range = (0.0, 1.0)
    if raw.get("range") is not None:
        bounds = _list(raw["range"], f"{path}.range", MAX_LABELS)
        if len(bounds) != 2:
            raise GraderConfigError(f"{path}.range", f"must be two numbers [low, high], got {len(bounds)}")
        low, high = (_number(b, f"{path}.range[{i}]") for i, b in enumerate(bounds))
        if not low < high:
            raise GraderConfigError(f"{path}.range", f"the low end must be below the high end, got [{low:g}, {high:g}]")
        score_range = (low, high)
    return ScoreModel(
        name=raw["name"],
        model=_string(raw["model"], f"{path}.model", 256),
        input=_messages(raw["input"], f"{path}.input"),
        range=score_range,
        sampling_params=_sampling_params(raw.get("sampling_params"), f"{path}.sampling_params"),
        pass_threshold=_optional(raw, "pass_threshold", _number, path),
    )


def _label_model(raw: Mapping[str, Any], path: str) -> LabelModel:
    _fields(raw, path, ("type", "name", "model", "input", "labels", "passing_labels"))
    listed = _list(raw["labels"], f"{path}.labels", MAX_LABELS)
    labels = [_string(x, f"{path}.labels[{i}]", 1000) for i, x in enumerate(listed)]
    if len(set(labels)) != len(labels):
        raise GraderConfigError(f"{path}.labels", "lists a label twice")
    passing = _list(raw["passing_labels"], f"{path}.passing_labels", MAX_LABELS)
    for i, label in enumerate(passing):
        if label not in labels:
            raise GraderConfigError(f"{path}.passing_labels[{i}]", f"{label!r} is not one of the labels")
    return LabelModel(
        name=raw["name"],
        model=_string(raw["model"], f"{path}.model", 256),
        input=_messages(raw["input"], f"{path}.input"),
        labels=tuple(labels),
        passing_labels=tuple(passing),
    )


def _python(raw: Mapping[str, Any], path: str) -> Python:
    _fields(raw, path, ("type", "name", "source"), ("image_tag", "pass_threshold"))
    return Python(
        name=raw["name"],
        source=_string(raw["source"], f"{path}.source", MAX_SOURCE_CHARS),
        image_tag=_optional(raw, "image_tag", lambda v, p: _string(v, p, 256), path),
        pass_threshold=_optional(raw, "pass_threshold", _number, path),
    )


def _multi(raw: Mapping[str, Any], path: str) -> Multi:
    _fields(raw, path, ("type", "name", "graders", "calculate_output"))
    graders = _object(raw["graders"], f"{path}.graders")
    if isinstance(graders.get("type"), str):  # one grader object, as the generated types describe `graders`
        single = parse_grader(graders, f"{path}.graders", nested=True)
        if not _KEY.fullmatch(single.name):
            raise GraderConfigError(f"{path}.graders.name", _KEY_RULE)
        subs: list[tuple[str, Config]] = [(single.name, single)]
    else:
        if not graders:
            raise GraderConfigError(f"{path}.graders", "must not be empty")
        if len(graders) > MAX_SUB_GRADERS:
            problem = f"has {len(graders)} graders, over the limit of {MAX_SUB_GRADERS}"
            raise GraderConfigError(f"{path}.graders", problem)
        subs = []
        for key, sub in graders.items():
            if not _KEY.fullmatch(key):
                raise GraderConfigError(f"{path}.graders.{key}", _KEY_RULE)
            subs.append((key, parse_grader(sub, f"{path}.graders.{key}", nested=True)))
    formula_path = f"{path}.calculate_output"
    try:
        formula = parse_formula(_string(raw["calculate_output"], formula_path), {key for key, _ in subs})
    except UnknownVariable as exc:
        raise GraderConfigError(formula_path, str(exc), flag="invalid_variable_error") from None
    except FormulaError as exc:
        raise GraderConfigError(formula_path, str(exc), flag="formula_parse_error") from None
    return Multi(name=raw["name"], graders=tuple(subs), formula=formula)


# -- model inputs ------------------------------------------------------------------------------------


def _messages(raw: Any, path: str) -> tuple[Message, ...]:
    messages = []
    for i, item in enumerate(_list(raw, path, MAX_MESSAGES)):
        where = f"{path}[{i}]"
        message = _object(item, where)
        _fields(message, where, ("role", "content"), ("type",))
        if message.get("type") not in (None, "message"):
            raise GraderConfigError(f"{where}.type", f"must be 'message'; got {message['type']!r}")
        role = _choice(message["role"], f"{where}.role", ROLES)
        content = message["content"]
        if isinstance(content, str):
            messages.append(Message(role, (TextPart(_template(content, f"{where}.content")),), plain=True))
        elif isinstance(content, list):
            parts = _list(content, f"{where}.content", MAX_PARTS)
            messages.append(Message(role, tuple(_part(p, f"{where}.content[{j}]") for j, p in enumerate(parts)), False))
        else:
            messages.append(Message(role, (_part(content, f"{where}.content"),), plain=False))
    return tuple(messages)


def _part(raw: Any, path: str) -> Part:
    if isinstance(raw, str):
        return TextPart(_template(raw, path))
    part = _object(raw, path)
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        _fields(part, path, ("type", "text"))
        return TextPart(_template(part["text"], f"{path}.text"))
    if kind == "input_image":
        _fields(part, path, ("type", "image_url"), ("detail",))
        detail = _optional(part, "detail", lambda v, p: _choice(v, p, IMAGE_DETAILS), path)
        return ImagePart(_template(part["image_url"], f"{path}.image_url"), detail)
    if kind == "input_audio":
        _fields(part, path, ("type", "input_audio"))
        audio = _object(part["input_audio"], f"{path}.input_audio")
        _fields(audio, f"{path}.input_audio", ("data", "format"))
        return AudioPart(
            _string(audio["data"], f"{path}.input_audio.data", 20_000_000),
            _choice(audio["format"], f"{path}.input_audio.format", AUDIO_FORMATS),
        )
    kinds = "input_text, output_text, input_image, input_audio"
    raise GraderConfigError(f"{path}.type", f"must be one of {kinds}; got {kind!r}")


def _sampling_params(raw: Any, path: str) -> tuple[tuple[str, Any], ...]:
    """The chat-completions options of `sampling_params` (OpenAI's `max_completions_tokens` is sent as the
    chat API's `max_completion_tokens`)."""
    if raw is None:
        return ()
    params = _object(raw, path)
    readers: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
        "max_completions_tokens": ("max_completion_tokens", lambda v, p: _integer(v, p, 1)),
        "reasoning_effort": ("reasoning_effort", lambda v, p: _choice(v, p, REASONING_EFFORTS)),
        "seed": ("seed", _integer),
        "temperature": ("temperature", lambda v, p: _bounded(v, p, 0.0, 2.0)),
        "top_p": ("top_p", lambda v, p: _bounded(v, p, 0.0, 1.0)),
    }
    _fields(params, path, (), tuple(readers))
    out = []
    for name, value in params.items():
        if value is not None:
            wire_name, read = readers[name]
            out.append((wire_name, read(value, f"{path}.{name}")))
    return tuple(out)


def _bounded(raw: Any, path: str, low: float, high: float) -> float:
    number = _number(raw, path)
    if not low <= number <= high:
        raise GraderConfigError(path, f"must be from {low:g} to {high:g}, got {raw!r}")
    return number
