"""`score_model` and `label_model`: a configured chat model judges the sample, as OpenAI's model graders do.

The grader's `model` is the name of a model in the server's `models:` configuration (the LLM judges' models),
never an address. The messages are the grader's `input` with its templates filled; the request asks for
OpenAI's structured answer through `response_format` (a JSON schema): `{"steps": [...], "result": <number>}`
for `score_model`, `{"steps": [...], "result": "<label>"}` for `label_model`.

A judge that fails (transport, HTTP error), refuses, or answers with something unusable (no such object, a
result that is not a number, outside `range`, or not one of the labels) makes the sample's error result
with OpenAI's flag for it. OpenAI clips a score outside `range`; grpcgrade does not invent a score.
"""

from __future__ import annotations

import math
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.llm.models import get_model
from grpcgrade.llm.parsing import JudgeOutputError, find_answer

from .outcome import RENDER_ERRORS, Outcome, add_usage, render_failure
from .schema import AudioPart, GraderConfigError, ImagePart, LabelModel, Message, ScoreModel
from .templating import MAX_RENDERED_CHARS, Namespaces, RenderedTooLong, Template

_STEPS_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"description": {"type": "string"}, "conclusion": {"type": "string"}},
        "required": ["description", "conclusion"],
        "additionalProperties": False,
    },
}


def _response_format(name: str, result: dict[str, Any]) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {"steps": _STEPS_SCHEMA, "result": result},
        "required": ["steps", "result"],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def chat_messages(messages: tuple[Message, ...], ns: Namespaces) -> list[dict[str, Any]]:
    """The grader's input as chat-completions messages; `developer` is sent as `system`, which every
    OpenAI-compatible server knows (OpenAI itself treats the two alike). All the filled text together is
    bounded as one filled template is."""
    budget = [MAX_RENDERED_CHARS]

    def fill(template: Template) -> str:
        text = template.render(ns)
        budget[0] -= len(text)
        if budget[0] < 0:
            raise RenderedTooLong(f"the filled messages are over the limit of {MAX_RENDERED_CHARS} characters")
        return text

    out: list[dict[str, Any]] = []
    for message in messages:
        role = "system" if message.role == "developer" else message.role
        if message.plain:
            out.append({"role": role, "content": fill(message.parts[0].text)})  # type: ignore[union-attr]
            continue
        parts: list[dict[str, Any]] = []
        for part in message.parts:
            if isinstance(part, ImagePart):
                image = {"url": fill(part.image_url), **({"detail": part.detail} if part.detail else {})}
                parts.append({"type": "image_url", "image_url": image})
            elif isinstance(part, AudioPart):
                parts.append({"type": "input_audio", "input_audio": {"data": part.data, "format": part.format}})
            else:
                parts.append({"type": "text", "text": fill(part.text)})
        out.append({"role": role, "content": parts})
    return out


class ModelJudgeNode:
    """What score_model and label_model share: the model, the messages, the call and its failures."""

    is_sync = False
    heavy = False

    def __init__(self, config: ScoreModel | LabelModel, path: str) -> None:
        self.config = config
        try:
            self.model = get_model(config.model)
        except InvalidParams as exc:
            raise GraderConfigError(f"{path}.model", exc.args[0].removeprefix("parameter 'model': ")) from None

    def options(self) -> dict[str, Any]:
        raise NotImplementedError

    def judge(self, answer: dict[str, Any]) -> tuple[float, str, dict[str, Any]]:
        """(score, reason, details) from the judge's answer object; raises JudgeOutputError."""
        raise NotImplementedError

    async def arun(self, ns: Namespaces) -> Outcome:
        try:
            messages = chat_messages(self.config.input, ns)
        except RENDER_ERRORS as exc:
            return render_failure(exc)
        from grpcgrade.llm.chat import ChatError, ChatRefusal  # httpx only in processes that call models

        try:
            reply = await self.model.achat(messages, self.options())
        except ChatRefusal as exc:
            return Outcome.fail("model_grader_refusal_error", str(exc))
        except ChatError as exc:
            return Outcome.fail("model_grader_server_error", str(exc))
        usage: dict[str, dict[str, int]] = {}
        add_usage(usage, self.config.model, reply.usage)
        sampled = self.model.config.model
        try:
            answer = find_answer(reply.content, "result")
            score, reason, details = self.judge(answer)
        except JudgeOutputError as exc:
            failed = Outcome.fail("model_grader_parse_error", str(exc))
            failed.usage, failed.sampled_model = usage, sampled
            return failed
        steps = answer.get("steps")
        if isinstance(steps, list):
            details["steps"] = steps
        return Outcome(score, reason=reason, details=details, usage=usage, sampled_model=sampled)


class ScoreModelNode(ModelJudgeNode):
    config: ScoreModel

    def options(self) -> dict[str, Any]:
        return {**dict(self.config.sampling_params), "response_format": _response_format("score", {"type": "number"})}

    def judge(self, answer: dict[str, Any]) -> tuple[float, str, dict[str, Any]]:
        result = answer["result"]
        if isinstance(result, bool) or not isinstance(result, (int, float)) or not math.isfinite(result):
            raise JudgeOutputError(f"the judge's result is not a number: {result!r}")
        low, high = self.config.range
        if not low <= result <= high:
            raise JudgeOutputError(f"the judge's result {result!r} is outside the range [{low:g}, {high:g}]")
        details: dict[str, Any] = {"range": [low, high]}
        if self.config.pass_threshold is not None:
            details.update(pass_threshold=self.config.pass_threshold, passed=result >= self.config.pass_threshold)
        return float(result), f"score {result:g} in [{low:g}, {high:g}]", details


class LabelModelNode(ModelJudgeNode):
    config: LabelModel

    def options(self) -> dict[str, Any]:
        return {"response_format": _response_format("label", {"type": "string", "enum": list(self.config.labels)})}

    def judge(self, answer: dict[str, Any]) -> tuple[float, str, dict[str, Any]]:
        label = answer["result"]
        if label not in self.config.labels:
            raise JudgeOutputError(f"the judge's label {label!r} is not one of {list(self.config.labels)}")
        passed = label in self.config.passing_labels
        return (1.0 if passed else 0.0), f"label {label!r} ({'passing' if passed else 'not passing'})", {"label": label}
