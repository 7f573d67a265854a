"""`openai_grader`: one of OpenAI's grader JSON configs (param `grader`) as a grpcgrade grader.

The config is validated and built once (templates and formula compiled, models looked up). Per sample, the
`sample` and `item` namespaces come from the grpcgrade Sample:

* `sample.output_text` <- `response`; `sample.output_json` <- `response` parsed as JSON;
  `sample.output_tools` <- the sample's `tool_calls` (chat-completions tool calls); `sample.choices` <- one
  chat-completions choice holding them;
* `item` <- the sample's `extra`, plus `query`, `reference` and `context` when they are not empty.

A config with no model grader is synchronous, so the service can run it inline or in a worker process;
one with a model grader (or cosine similarity) is asynchronous and bounds its own time like the LLM judges.
The result's score is the grader's reward; its metadata carries the config's name and type, a multi
grader's `sub_rewards`, OpenAI's error flags, and the model token usage.
"""

from __future__ import annotations

import asyncio
from typing import Any

from grpcgrade.core.errors import InvalidParams
from grpcgrade.grader import BaseGrader, GraderError, GraderResult, GraderScore

from .formula import FormulaError
from .judges import LabelModelNode, ScoreModelNode
from .local import DEFAULT_EMBEDDING_MODEL, StringCheckNode, TextSimilarityNode
from .outcome import Outcome, add_usage
from .python_sandbox import python_node
from .schema import Config, LabelModel, Multi, Python, ScoreModel, StringCheck, TextSimilarity, parse_grader
from .templating import Namespaces

#: The kwarg through which the HTTP endpoint hands over a run request's `item` as it is (see `namespaces`).
ITEM_KWARG = "__openai_item__"
_NOT_ITEM = frozenset({"response", "responses", "sample_id", "reference_response", "ground_truth", ITEM_KWARG})
_ITEM_FIELDS = ("query", "reference", "context")


class MultiNode:
    """Sub-graders by key, combined by the formula; the multi grader fails when any sub-grader does."""

    heavy = False

    def __init__(self, config: Multi, path: str, embedding_model: str) -> None:
        self.config = config
        self.nodes = {key: build_node(sub, f"{path}.graders.{key}", embedding_model) for key, sub in config.graders}
        self.is_sync = all(node.is_sync for node in self.nodes.values())
        self.heavy = any(node.heavy for node in self.nodes.values())

    def run(self, ns: Namespaces) -> Outcome:
        return self._combine({key: node.run(ns) for key, node in self.nodes.items()})

    async def arun(self, ns: Namespaces) -> Outcome:
        outcomes = await asyncio.gather(*(node.arun(ns) for node in self.nodes.values()))
        return self._combine(dict(zip(self.nodes, outcomes, strict=True)))

    def _combine(self, subs: dict[str, Outcome]) -> Outcome:
        usage: dict[str, dict[str, int]] = {}
        for sub in subs.values():
            for model, counts in sub.usage.items():
                add_usage(usage, model, counts)
        sampled = next((s.sampled_model for s in subs.values() if s.sampled_model), "")
        failed = {key: sub for key, sub in subs.items() if not sub.ok}
        if failed:
            flags = tuple(dict.fromkeys(f for sub in failed.values() for f in sub.errors))
            message = "; ".join(f"{key}: {sub.message}" for key, sub in failed.items())
            return Outcome(None, flags, message, usage=usage, sampled_model=sampled, sub=subs)
        values = {key: sub.score for key, sub in subs.items()}
        try:
            score = self.config.formula.evaluate(values)  # type: ignore[arg-type]
        except FormulaError as exc:
            failed_formula = Outcome.fail("formula_parse_error", f"calculate_output: {exc}")
            failed_formula.usage, failed_formula.sub = usage, subs
            return failed_formula
        reason = f"{self.config.formula.text} = {score:g}"
        return Outcome(score, reason=reason, usage=usage, sampled_model=sampled, sub=subs)


def build_node(config: Config, path: str, embedding_model: str) -> Any:
    """The runnable grader for a config; raises GraderConfigError for what the server cannot run."""
    if isinstance(config, StringCheck):
        return StringCheckNode(config)
    if isinstance(config, TextSimilarity):
        return TextSimilarityNode(config, path, embedding_model)
    if isinstance(config, ScoreModel):
        return ScoreModelNode(config, path)
    if isinstance(config, LabelModel):
        return LabelModelNode(config, path)
    if isinstance(config, Python):
        return python_node(config, path)
    return MultiNode(config, path, embedding_model)


def namespaces(kwargs: dict[str, Any]) -> Namespaces:
    """A sample's fields (the grader's keyword arguments) as OpenAI's namespaces; see the module docstring."""
    if ITEM_KWARG in kwargs:
        item: Any = kwargs[ITEM_KWARG]
    else:
        item = {name: kwargs[name] for name in _ITEM_FIELDS if kwargs.get(name)}
        item.update((k, v) for k, v in kwargs.items() if k not in _NOT_ITEM and k not in _ITEM_FIELDS)
    tools = kwargs.get("tool_calls")
    return Namespaces(str(kwargs.get("response", "")), item, tools if isinstance(tools, list) else [])


def report(outcome: Outcome, config: Config) -> dict[str, Any]:
    """The result metadata: what OpenAI's run response needs besides the reward."""
    meta: dict[str, Any] = {"name": config.name, "type": config.type}
    if outcome.sub:
        meta["sub_rewards"] = outcome.sub_rewards
    if outcome.errors:
        meta["errors"] = list(outcome.errors)
    if outcome.usage:
        meta["token_usage"] = outcome.total_tokens
        meta["model_grader_token_usage_per_model"] = outcome.usage
    if outcome.sampled_model:
        meta["sampled_model_name"] = outcome.sampled_model
    meta.update(outcome.details)
    return meta


class OpenAIGraderBase(BaseGrader):
    """What the synchronous and the asynchronous form share."""

    def __init__(self, config: Config, node: Any) -> None:
        super().__init__()
        self.config = config
        self.node = node
        self.heavy = node.heavy

    def result(self, outcome: Outcome) -> GraderResult:
        meta = report(outcome, self.config)
        if outcome.ok:
            return GraderScore(self.name, outcome.score, outcome.reason, meta)  # type: ignore[arg-type]
        return GraderError(self.name, outcome.message, code=outcome.code, metadata=meta)


class OpenAIGrader(OpenAIGraderBase):
    """A config without model graders: computed synchronously (inline or in a worker process)."""

    def evaluate(self, **kwargs: Any) -> GraderResult:
        return self.result(self.node.run(namespaces(kwargs)))


class AsyncOpenAIGrader(OpenAIGraderBase):
    """A config with a model grader (or cosine similarity): computed in the event loop."""

    bounds_own_time = True  # as the LLM judges: each model call has its own timeout and bounded retries
    cache_by_default = True  # a model call costs money and seconds, as the LLM judges' do

    async def aevaluate(self, **kwargs: Any) -> GraderResult:
        return self.result(await self.node.arun(namespaces(kwargs)))


def openai_grader(grader: dict, embedding_model: str = DEFAULT_EMBEDDING_MODEL) -> BaseGrader:
    """Run one of OpenAI's grader JSON configs (string_check, text_similarity, score_model, label_model,
    multi, python) given as param `grader`; see docs/openai-graders.md.

    Params: `grader` (the grader JSON object), `embedding_model` (the configured model that embeds texts for
    text_similarity's `cosine`).
    """
    if not isinstance(embedding_model, str) or not embedding_model:
        raise InvalidParams("embedding_model", "must be the name of a configured model")
    config = parse_grader(grader)
    node = build_node(config, "grader", embedding_model)
    return OpenAIGrader(config, node) if node.is_sync else AsyncOpenAIGrader(config, node)
