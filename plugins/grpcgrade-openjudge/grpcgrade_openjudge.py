"""grpcgrade plugin: every grader of the installed py-openjudge, served as `openjudge.NAME`.

OpenJudge's LLM graders are prompts around a model; rather than port them, this plugin builds each one with
a model object of its own (`BridgedModel`, an OpenJudge `BaseChatModel`) whose `achat` goes through
grpcgrade's configured models (`models:`, the grader param `model`, default "default"): the endpoint, key,
concurrency, timeouts, retries and pacing are the server's, and a request names a model, never a URL. The
deterministic ones (format, text, agent, code, math) run as they are. Each result is grpcgrade's; an
OpenJudge GraderError is an error result, never a score.

What it serves is found, not listed: every concrete `BaseGrader` subclass in the modules of
`openjudge.graders`, named by the `name` its constructor sets. A grader that cannot be built with its
defaults (one needing a search API key, a module whose imports fail) is still listed, as unavailable,
its description saying why, and a request for it is refused naming that reason.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import logging
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpcgrade import BaseGrader, GraderError, GraderMode, GraderRank, GraderScore, InvalidParams, hookimpl
from grpcgrade.grader import Inputs, declared_names

log = logging.getLogger(__name__)

PREFIX = "openjudge."
#: OpenJudge's bases and wrappers: not graders of their own.
BASE_MODULES = frozenset(
    {
        "openjudge.graders.base_grader",
        "openjudge.graders.llm_grader",
        "openjudge.graders.agentic_grader",
        "openjudge.graders.function_grader",
        "openjudge.graders.schema",
    }
)
#: Constructor parameters the bridge sets itself (or that take Python objects a request cannot send).
BRIDGE_SET = frozenset({"self", "model", "strategy", "template", "callback", "structured_model", "executor"})
DEFAULT_MODEL = "default"


class BridgedModel:
    """Placeholder replaced at import time by a subclass of OpenJudge's BaseChatModel (see `_model_class`)."""


def _model_class() -> type:
    """An OpenJudge chat model whose calls are grpcgrade's `get_model(name).achat`: what OpenJudge's
    `OpenAIChatModel.achat` returns (a ChatResponse whose `parsed` is the structured answer), made from
    grpcgrade's reply."""
    from openjudge.models.base_chat_model import BaseChatModel
    from openjudge.models.schema.oai.response import ChatResponse
    from openjudge.utils.utils import repair_and_load_json
    from pydantic import BaseModel, ValidationError

    from grpcgrade.llm.models import get_model

    class Bridged(BaseChatModel):
        def __init__(self, name: str) -> None:
            super().__init__(model=name, stream=False)

        async def achat(
            self,
            messages: list[Any],
            tools: list[dict[str, Any]] | None = None,
            tool_choice: str | None = None,
            structured_model: Any = None,
            callback: Callable[..., Any] | None = None,
            **kwargs: Any,
        ) -> Any:
            wire = [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in messages]
            options: dict[str, Any] = dict(kwargs)
            schema_class = structured_model if inspect.isclass(structured_model) else None
            if schema_class is not None and issubclass(schema_class, BaseModel):
                schema = {"name": schema_class.__name__, "schema": schema_class.model_json_schema()}
                options["response_format"] = {"type": "json_schema", "json_schema": schema}
            elif isinstance(structured_model, dict):
                options["response_format"] = structured_model
            elif tools:
                options["tools"] = tools
                if tool_choice:
                    options["tool_choice"] = tool_choice
            reply = await get_model(self.model).achat(wire, options)
            response = ChatResponse(role="assistant", content=reply.content, parsed={})
            if structured_model is not None and reply.content:
                data = repair_and_load_json(reply.content)
                if schema_class is not None and issubclass(schema_class, BaseModel):
                    with contextlib.suppress(ValidationError):  # OpenJudge falls back to the repaired JSON too
                        data = schema_class.model_validate(data).model_dump()
                response.parsed = data if isinstance(data, dict) else {"result": data}
            if callback is not None:
                extra = callback(response)
                if isinstance(extra, dict):
                    response.parsed = {**(response.parsed or {}), **extra}
            return response

    return Bridged


@dataclass
class Found:
    """One OpenJudge grader class, or the reason it cannot be served."""

    name: str
    cls: type | None
    takes_model: bool = False
    problem: str = ""
    description: str = ""
    listwise: bool = False


def _concrete_graders() -> tuple[list[type], list[tuple[str, str]]]:
    """Every concrete BaseGrader subclass defined in openjudge.graders' modules, and (module, error) for the
    modules that do not import."""
    import openjudge.graders as package
    from openjudge.graders.base_grader import BaseGrader as OpenJudgeGrader

    classes: list[type] = []
    broken: list[tuple[str, str]] = []
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name in BASE_MODULES or info.name.split(".")[-1].startswith("_"):
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception as exc:  # noqa: BLE001 - an optional dependency missing: listed as unavailable
            broken.append((info.name, f"{type(exc).__name__}: {exc}"))
            continue
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == info.name and issubclass(obj, OpenJudgeGrader) and not inspect.isabstract(obj):
                classes.append(obj)
    return classes, broken


def describe(cls: type, model_class: type) -> Found:
    """One grader class as served: built once with its defaults (and grpcgrade's default model) for its
    name and mode, or unavailable with the reason it cannot be built."""
    takes_model = "model" in inspect.signature(cls.__init__).parameters
    doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
    try:
        grader = cls(model=model_class(DEFAULT_MODEL)) if takes_model else cls()
    except Exception as exc:  # noqa: BLE001 - it needs more than its defaults: listed, not served
        return Found(cls.__name__, None, takes_model, f"cannot be built with its defaults: {exc}", doc)
    listwise = str(getattr(grader, "mode", "")).lower().endswith("listwise")
    return Found(grader.name, cls, takes_model, description=doc or grader.description, listwise=listwise)


def discover() -> list[Found]:
    """What the installed py-openjudge offers."""
    model_class = _model_class()
    classes, broken = _concrete_graders()
    found = [describe(cls, model_class) for cls in classes]
    for module, error in broken:
        found.append(Found(module.removeprefix("openjudge.graders."), None, problem=f"does not import: {error}"))
    return found


def _json_default(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _signature(cls: type, takes_model: bool) -> inspect.Signature:
    """The params a request may give: the constructor's, less what the bridge sets or a request cannot send
    (Python objects as defaults), plus `model`, the name of one of grpcgrade's configured models."""
    kept = [
        p.replace(annotation=inspect.Parameter.empty, kind=inspect.Parameter.KEYWORD_ONLY)
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name not in BRIDGE_SET
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and (p.default is p.empty or _json_default(p.default) or getattr(p.default, "value", None) is not None)
    ]
    if takes_model:
        kept.insert(0, inspect.Parameter("model", inspect.Parameter.KEYWORD_ONLY, default=DEFAULT_MODEL))
    return inspect.Signature(kept)


def _result(name: str, result: Any) -> GraderScore | GraderRank | GraderError:
    """OpenJudge's result as grpcgrade's (an OpenJudge GraderError is an error result)."""
    from openjudge.graders.schema import GraderError as OJError
    from openjudge.graders.schema import GraderRank as OJRank

    metadata = dict(getattr(result, "metadata", None) or {})
    if isinstance(result, OJError):
        return GraderError(name, result.error or result.reason or "OpenJudge grader failed", metadata=metadata)
    if isinstance(result, OJRank):
        return GraderRank(name, list(result.rank), result.reason or "", metadata)
    return GraderScore(name, result.score, result.reason or "", metadata)


class OpenJudgeGrader(BaseGrader):
    """One OpenJudge grader, built with grpcgrade's model, its inputs those its `_aevaluate` names."""

    bounds_own_time = True  # its judge calls are bounded by the configured model's timeout and retries
    cache_by_default = True  # a judge call (or a pure function): the same inputs give the same answer

    def __init__(self, name: str, inner: Any, listwise: bool) -> None:
        super().__init__(name=name, mode=GraderMode.LISTWISE if listwise else GraderMode.POINTWISE)
        self.inner = inner

    def input_names(self) -> Inputs:
        return declared_names(self.inner._aevaluate)

    async def aevaluate(self, **kwargs: Any) -> GraderScore | GraderRank | GraderError:
        return _result(self.name, await self.inner.aevaluate(**kwargs))


class LocalOpenJudgeGrader(OpenJudgeGrader):
    """An OpenJudge grader that calls no model (format, text, agent, code, math): CPU work on what a request
    sent, so it is graded like grpcgrade's own sync graders, in a worker process under the per-sample time
    limit, never on the server's event loop."""

    bounds_own_time = False
    cache_by_default = False

    def evaluate(self, **kwargs: Any) -> GraderScore | GraderRank | GraderError:
        return _result(self.name, _finished(self.inner.aevaluate(**kwargs)))


def _finished(coro: Any) -> Any:
    """A coroutine that never waits (OpenJudge's local graders are `async` but do no I/O) run to its end in
    this thread, which may already run an event loop; one that waits is an error result, not a hang."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("an OpenJudge grader without a model waited on I/O; it cannot run as a local grader")


def _factory(found: Found) -> Callable[..., BaseGrader]:
    served = PREFIX + found.name

    if found.cls is None:

        def unavailable(**params: Any) -> BaseGrader:
            raise InvalidParams("grader", f"{served} is unavailable: {found.problem}")

        unavailable.__signature__ = inspect.Signature()  # type: ignore[attr-defined]
        return unavailable

    cls, model_class = found.cls, _model_class()

    def build(**params: Any) -> BaseGrader:
        if found.takes_model:
            params["model"] = model_class(params.get("model", DEFAULT_MODEL))
        for key, value in list(params.items()):
            enum = getattr(inspect.signature(cls.__init__).parameters.get(key), "default", None)
            if isinstance(value, str) and enum is not None and type(enum) is not str and hasattr(enum, "value"):
                params[key] = type(enum)(value)  # LanguageEnum and the like, sent as their value
        try:
            inner = cls(**params)
        except (TypeError, ValueError) as exc:
            raise InvalidParams("params", f"{served}: {exc}") from None
        kind = OpenJudgeGrader if found.takes_model else LocalOpenJudgeGrader
        return kind(served, inner, found.listwise)

    build.__signature__ = _signature(cls, found.takes_model)  # type: ignore[attr-defined]
    build.__doc__ = found.description
    return build


@hookimpl
def register_graders(register: Callable[..., None]) -> None:
    register_found(discover(), register)


def register_found(graders: list[Found], register: Callable[..., None]) -> None:
    """Each grader under `openjudge.NAME` (the first of a name), an unavailable one with why."""
    seen: set[str] = set()
    for found in graders:
        if found.name in seen:
            log.warning("openjudge: two graders named %r; serving the first", found.name)
            continue
        seen.add(found.name)
        description = found.description
        if found.cls is None:
            description = f"unavailable: {found.problem}"
        mode = GraderMode.LISTWISE if found.listwise else GraderMode.POINTWISE
        register(_factory(found), name=PREFIX + found.name, description=description[:500], mode=mode)
