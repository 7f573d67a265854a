"""TRL reward functions backed by a grpcgrade server, shaped after TRL's own call.

TRL's GRPOTrainer and RLOOTrainer (`trl/trainer/grpo_trainer.py` and `rloo_trainer.py`, `_calculate_rewards`,
TRL 1.16) call every reward function as

    reward_func(prompts=..., completions=..., completion_ids=..., **columns,
                trainer_state=..., log_extra=..., log_metric=..., [environments=...])

where `columns` holds every dataset column but `prompt`/`completion`/`completion_ids`, one value per
completion. An `async def` reward function is awaited (all of them together, on TRL's own event loop); a
None in the returned list becomes NaN. A completion every reward function gave NaN is masked (left out of
the group's baseline, advantage 0); otherwise TRL adds the functions' values with `nansum`, a NaN as 0.

How a call becomes samples (documented for users in docs/trainers.md):

- `query` is the prompt's text (the last user message of a conversational prompt); `response` the
  completion's (see `completion_text`).
- Columns map to sample fields by `DEFAULT_COLUMNS`, overridden by `columns=`: the first of `reference`,
  `answer`, `ground_truth`, `solution` present becomes `reference`, `id` becomes the sample's id, `context`
  its context. A column mapped to None is dropped.
- `completion_tokens` is derived from `completion_ids` (their count); the ids themselves never travel.
- Agent inputs (docs/agents.md) travel in the sample's own fields: a conversational completion's tool calls
  (every assistant message's, in order) as `tool_calls`, a conversational prompt with its completion as
  `messages`, and the dataset's tools (a `tools` or `tool_definitions` column of JSON Schema function
  definitions) as `tool_definitions`.
- Every other column travels in `extra`, since any grader may read it, unless it cannot reach a grader:
  its name is a sample field or a name for one (a grader gets those from the sample itself), or a name TRL
  passes for its own use, or its value is not JSON. Those are dropped, never an error, so an unrelated
  column cannot fail a sample. `extra_columns=[...]` narrows `extra` to the columns the graders read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import grpc

from grpcgrade.batch_scores import BatchScores
from grpcgrade.client import AsyncGradingClient, Cache, Graders, GradingClient, Target, cache_mode
from grpcgrade.core.guard import failure_limit, step_deadline
from grpcgrade.core.loops import PerLoop
from grpcgrade.service.convert import SampleColumns, all_text, specs_to_pb
from grpcgrade.v1 import grading_pb2 as pb

from .common import RESERVED, agent_inputs, text_or_none, usable_extra

#: Keyword arguments TRL passes for the reward function's own use; never sample data.
TRL_KWARGS = frozenset({"trainer_state", "log_extra", "log_metric", "environments", "completion_ids"})
#: Dataset columns holding the tools offered to the model (JSON Schema function definitions), by preference.
TOOL_COLUMNS = ("tool_definitions", "tools")
#: Dataset column -> sample field, unless `columns=` says otherwise. For `reference` the first present wins.
DEFAULT_COLUMNS: dict[str, str] = {
    "reference": "reference",
    "answer": "reference",
    "ground_truth": "reference",
    "solution": "reference",
    "id": "id",
    "context": "context",
}
#: What a column may be mapped to.
COLUMN_TARGETS = frozenset({"id", "query", "reference", "context"})
#: Where a conversational completion's reasoning goes back in (the think format TRL's parser took it from).
THINK = "<think>\n{reasoning}\n</think>\n{content}"
#: Metric and column names reported through TRL's `log_metric` / `log_extra`.
LOG_PREFIX = "grpcgrade"


def _content_text(content: Any) -> str:
    """A message's content: a string, None (a tool-call turn: no text), or a list of content blocks, whose
    text blocks are joined (images and other blocks carry no text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "".join(parts)
    return str(content)


def prompt_text(prompt: Any) -> str:
    """A standard prompt as it is; a conversational one as its last user message."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users:
            return _content_text(users[-1].get("content"))
        return _content_text(prompt[-1].get("content")) if prompt and isinstance(prompt[-1], Mapping) else ""
    return str(prompt)


def completion_text(completion: Any) -> tuple[str, list[Any]]:
    """The completion's response text and its tool calls.

    A conversational completion is a list of messages (TRL's tool loop appends tool results and further
    assistant turns). The response is the last assistant message's text; when that message carries
    `reasoning_content` (or `thinking`), which TRL's `parse_response` splits out of `<think>...</think>`,
    it is put back as `<think>\\n{reasoning}\\n</think>\\n{content}` so think-format graders see what the
    model wrote. The tool calls of every assistant message, in order, become the sample's `tool_calls`.
    """
    if isinstance(completion, str):
        return completion, []
    if not isinstance(completion, list):
        return str(completion), []
    assistant = [m for m in completion if isinstance(m, Mapping) and m.get("role", "assistant") == "assistant"]
    tool_calls = [call for m in assistant for call in (m.get("tool_calls") or [])]
    if not assistant:
        return "", tool_calls
    last = assistant[-1]
    content = _content_text(last.get("content"))
    reasoning = last.get("reasoning_content") or last.get("thinking")
    if isinstance(reasoning, str) and reasoning.strip() and "<think>" not in content:
        content = THINK.format(reasoning=reasoning.strip(), content=content)
    return content, tool_calls


def _listed(value: Any) -> list[Any] | None:
    """A column given as an array of one dimension (numpy's, torch's) as the list of its values (Python's
    own: numpy's `tolist`), None for anything else. Arrays are no `Sequence`: such a reference column was
    left out, and every sample failed for want of a reference."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and getattr(value, "ndim", None) == 1:
        listed = tolist()
        return listed if isinstance(listed, list) else None
    return None


class SampleBuilder:
    """TRL's keyword arguments -> grpcgrade samples (as columns), by the rules in the module docstring."""

    def __init__(self, columns: Mapping[str, str | None] | None = None, extra_columns: Sequence[str] | None = None):
        mapping: dict[str, str | None] = dict(DEFAULT_COLUMNS)
        for column, target in (columns or {}).items():
            if target is not None and target not in COLUMN_TARGETS:
                raise ValueError(
                    f"columns: {column!r} -> {target!r}: a column maps to one of "
                    f"{', '.join(sorted(COLUMN_TARGETS))}, or None to drop it"
                )
            mapping[column] = target
        self.mapping = mapping
        self.explicit = dict(columns or {})
        self.extra_columns = None if extra_columns is None else frozenset(extra_columns)

    def _plan(self, names: Sequence[str]) -> tuple[dict[str, str], list[str]]:
        """Which present column fills which field (explicit mappings first), and which go to `extra`."""
        fields: dict[str, str] = {}
        ordered = [n for n in self.explicit if n in names] + [n for n in self.mapping if n in names]
        for name in ordered:
            target = self.mapping.get(name)
            if target is not None and target not in fields:
                fields[target] = name
        used = set(fields.values()) | {n for n in names if n in self.mapping}
        extra = [
            n
            for n in names
            if n not in used
            and n not in TRL_KWARGS
            and n not in RESERVED
            and n not in TOOL_COLUMNS
            and (self.extra_columns is None or n in self.extra_columns)
        ]
        return fields, extra

    def columns(self, prompts: Sequence[Any], completions: Sequence[Any], kwargs: Mapping[str, Any]) -> SampleColumns:
        """The batch as columns (no dict per sample): `query` and `response` from the prompts and
        completions, the mapped columns' texts, and `extra` only when some sample has any."""
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts but {n} completions")
        columns: dict[str, Sequence[Any]] = {}
        for k, v in kwargs.items():
            if k in TRL_KWARGS or isinstance(v, (str, bytes)):
                continue
            if not isinstance(v, Sequence):
                v = _listed(v)
                if v is None:  # not a column: a setting, an object
                    continue
            if len(v) == n:
                columns[k] = v
            elif self.mapping.get(k) is not None:  # a column a field is read from, of another batch's length
                raise ValueError(f"column {k!r} holds {len(v)} values for {n} completions")
        fields, extra_names = self._plan(list(columns))
        ids = kwargs.get("completion_ids")
        # Derived from TRL's own argument, not a dataset column: `extra_columns` does not narrow it away (a
        # length gate would read a missing count as over the cap).
        want_tokens = ids is not None and "completion_tokens" not in columns
        queries = prompts if all_text(prompts) else [prompt_text(p) for p in prompts]
        texts: dict[str, Sequence[str | None]] = {"query": queries}
        tool_calls: list[list[Any]] | None = None
        if all_text(completions):  # standard completions: the texts as they are
            texts["response"] = completions
        else:
            parsed = [completion_text(c) for c in completions]
            texts["response"] = [text for text, _ in parsed]
            tool_calls = [calls for _, calls in parsed]
        gaps = False  # a None in a mapped column: that sample does not carry the field (see docs/calling.md)
        for field, column in fields.items():
            values = columns[column]
            if all_text(values):
                texts[field] = values
                continue
            if field == "query":
                texts[field] = [None if v is None else prompt_text(v) for v in values]
            else:  # None, NaN, pandas' NA: the sample does not carry the field
                texts[field] = [text_or_none(v) for v in values]
            gaps = gaps or None in texts[field]
        extras: list[dict[str, Any]] | None = None
        if extra_names or want_tokens:
            extras = [usable_extra((name, columns[name][i]) for name in extra_names) for i in range(n)]
            if want_tokens and ids is not None:
                for i, extra in enumerate(extras):
                    extra["completion_tokens"] = len(ids[i])
        out = SampleColumns.of_text(texts, extras, gaps)  # every column is n texts (or None) by now
        tools = next((columns[c] for c in TOOL_COLUMNS if c in columns), None)
        if tool_calls is not None or tools is not None:
            calls = tool_calls or [[] for _ in range(n)]
            out.with_agent([_agent(prompts[i], completions[i], calls[i], tools, i) for i in range(n)])
        return out


def _agent(
    prompt: Any, completion: Any, calls: list[Any] | None, tools: Sequence[Any] | None, i: int
) -> dict[str, Any]:
    """One sample's agent inputs: a conversational completion's tool calls (`calls`, from `completion_text`)
    and the whole conversation, and the dataset's tools (what has no JSON form is left out, as for `extra`)."""
    given: list[tuple[str, Any]] = []
    if isinstance(completion, list):
        given.append(("tool_calls", calls or []))
        if isinstance(prompt, list):
            given.append(("messages", [*prompt, *completion]))
    if tools is not None and tools[i] is not None:
        given.append(("tool_definitions", tools[i]))
    return agent_inputs(given)


def report(table: BatchScores, kwargs: Mapping[str, Any]) -> None:
    """Per-grader mean scores and the count of masked samples through TRL's `log_metric`, and each grader's
    score per completion through `log_extra` (columns of TRL's completions table)."""
    log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
    if not len(table) or not (callable(log_metric) or callable(log_extra)):
        return
    if callable(log_metric):
        log_metric(f"{LOG_PREFIX}/masked", float(table.masked))
    for key, scores in table.scores.items():
        ok = [s for s in scores if s is not None]
        if callable(log_metric) and ok:
            log_metric(f"{LOG_PREFIX}/{key}", sum(ok) / len(ok))
        if callable(log_extra):
            log_extra(f"{LOG_PREFIX}/{key}", scores)


def _name(graders: Sequence[Any], reward: str) -> str:
    if reward:
        return f"grpcgrade_{reward}"
    names = [g if isinstance(g, str) else g.name if isinstance(g, pb.GraderSpec) else g["name"] for g in graders]
    return "grpcgrade_" + "_".join(names)


def validate(
    target: Target, graders: Sequence[Any], reward: str, wait_for_ready: float | None, client_options: dict[str, Any]
) -> pb.ListGradersResponse:
    """At construction: the server answers (waiting up to `wait_for_ready` seconds for it), and resolves the
    reward or graders (unknown name, bad params). Raises ConnectionError or ValueError saying which."""
    if bool(reward) == bool(graders):
        raise ValueError("give either `reward` (a reward configured on the server) or `graders`, not both")
    with GradingClient(target, **client_options) as client:
        if wait_for_ready:
            client.wait_ready(wait_for_ready)
        try:
            client.check(graders, reward)
            return client.list_graders()
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise ValueError(f"grpcgrade server at {client.target}: {exc.details()}") from None
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise ConnectionError(f"no grpcgrade server reachable at {client.target}: {exc.details()}") from None
            raise


class _Config:
    """What every TRL reward function of this module shares: the request and how samples are built."""

    def __init__(
        self,
        target: Target,
        graders: Graders,
        reward: str,
        *,
        columns: Mapping[str, str | None] | None = None,
        extra_columns: Sequence[str] | None = None,
        check: bool = True,
        wait_for_ready: float | None = 30.0,
        budget_seconds: float = 0.0,
        max_failure_ratio: float | None = None,
        cache: Cache = None,
        **client_options: Any,
    ) -> None:
        self.target = target
        self.graders = list(graders or [])
        self.reward = reward
        self.builder = SampleBuilder(columns, extra_columns)
        step_deadline(budget_seconds, 0.0)  # out of range: ValueError naming the option, now, not at step 1
        failure_limit(max_failure_ratio, 0)
        #: The reward guard's options of every call (docs/reward-guard.md).
        self.guards: dict[str, Any] = {
            "budget_seconds": budget_seconds,
            "max_failure_ratio": max_failure_ratio,
            "cache": cache_mode(cache),
        }
        self.client_options = client_options
        self.catalog = validate(target, self.graders, reward, wait_for_ready, client_options) if check else None

    def terms(self) -> list[Term]:
        """The reward's graders, each with its key, weight and whether it is a gate, in order (a configured
        reward's from the server's catalog). All pointwise: `batch_scores` refuses a listwise grader."""
        if self.reward:
            catalog = self.catalog or validate(self.target, [], self.reward, None, self.client_options)
            specs = list(next(r for r in catalog.rewards if r.name == self.reward).graders)
        else:
            specs = specs_to_pb(self.graders)
        return [Term(s.key or s.name, s.weight if s.HasField("weight") else 1.0, s.gate) for s in specs]


class Term(NamedTuple):
    """A grader of a reward, as `reward_functions` splits the reward up."""

    key: str
    weight: float
    gate: bool


def shares(table: BatchScores, terms: Sequence[Term]) -> dict[str, list[float | None]]:
    """Each non-gate grader's share of every sample's reward: gates x weight / sum of weights x score, so
    the shares add up to the reward (`core.rewards.combine`), and None for every grader of a sample that
    has no reward, so that TRL, which masks a completion only when every reward function returns None for
    it (and otherwise adds a None as 0), masks it."""
    scored = [t for t in terms if not t.gate]
    total = sum(t.weight for t in scored)
    gates = [table.scores.get(t.key) or [None] * len(table) for t in terms if t.gate]
    out: dict[str, list[float | None]] = {}
    for term in scored:
        column = table.scores.get(term.key) or [None] * len(table)
        part = term.weight / total
        values: list[float | None] = []
        for i, (reward, score) in enumerate(zip(table.rewards, column, strict=True)):
            if reward is None or score is None:
                values.append(None)
                continue
            gate = 1.0
            for g in gates:
                factor = g[i]  # present: the sample has a reward, so every grader of it scored
                gate *= math.nan if factor is None else factor
            values.append(gate * part * score)
        out[term.key] = values
    return out


def reward_function(
    target: Target,
    graders: Graders = None,
    reward: str = "",
    **options: Any,
) -> Callable[..., list[float | None]]:
    """A TRL reward function: `reward` (configured on the server) or `graders` (names, dicts or GraderSpec)
    for every completion, None where a grader failed (TRL masks it).

    Options: `columns` ({column: sample field or None}) and `extra_columns` (the only columns sent in
    `extra`), see the module docstring; `check=True` builds the function only after the server has answered
    and accepted the reward or graders, waiting `wait_for_ready` seconds (default 30) for a server that is
    still starting; the reward guard's `budget_seconds` (per step: the samples not graded by then come back
    as None), `max_failure_ratio` (past it the step raises `grpcgrade.client.FailureBudgetExceeded`) and
    `cache` ("on", "off", None: the server's default), see docs/reward-guard.md; anything else (`token`,
    `timeout`, `chunk_size`...) goes to the client.
    """
    config = _Config(target, graders, reward, **options)
    client: GradingClient | None = None

    def score(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        nonlocal client
        if client is None:  # made on first use: a trainer may copy the function to other processes first
            client = GradingClient(config.target, **config.client_options)
        samples = config.builder.columns(prompts, completions, kwargs)
        table = client.batch_scores(samples, config.graders, config.reward, **config.guards)
        report(table, kwargs)
        return table.rewards

    score.__name__ = _name(config.graders, reward)
    return score


def async_reward_function(
    target: Target,
    graders: Graders = None,
    reward: str = "",
    **options: Any,
) -> Callable[..., Any]:
    """`reward_function` as an `async def`: TRL awaits async reward functions together on its own event
    loop, so a slow grader does not hold up the other reward functions. One client per event loop, closed
    on that loop when it ends (`core.loops.PerLoop`): a script calling `asyncio.run` per batch
    leaves no channel (and its connection) open behind each run."""
    config = _Config(target, graders, reward, **options)
    clients = PerLoop(lambda: AsyncGradingClient(config.target, **config.client_options), AsyncGradingClient.close)

    async def score(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        client = clients.get()
        samples = config.builder.columns(prompts, completions, kwargs)
        table = await client.batch_scores(samples, config.graders, config.reward, **config.guards)
        report(table, kwargs)
        return table.rewards

    score.__name__ = _name(config.graders, reward)
    return score


def reward_functions(
    target: Target,
    graders: Graders = None,
    reward: str = "",
    **options: Any,
) -> list[Callable[..., list[float | None]]]:
    """One TRL reward function per grader of the reward (named `grpcgrade_<key>`), all answered by one
    server call per batch, so TRL logs each grader's part of the reward on its own.

    Each returns its grader's share of the reward (see `shares`): with TRL's default `reward_weights` of 1
    they add up to the reward `reward_function` gives, and a sample without a reward is None in every one,
    which TRL masks. A gate has no function of its own (TRL adds functions; a gate multiplies): it is in
    every share. `reward_weights` then scale the shares. Each grader's raw mean score is logged as
    `grpcgrade/<key>`.

    TRL calls its reward functions one after another with the same `prompts` and `completions` lists; the
    first call grades the batch and the others read its results.
    """
    config = _Config(target, graders, reward, **options)
    terms = config.terms()
    keys = [t.key for t in terms if not t.gate]
    if not keys:
        raise ValueError("the reward has only gates, which TRL cannot add up: use reward_function")
    client: GradingClient | None = None
    last: tuple[Any, Any, dict[str, list[float | None]]] | None = None  # holds the lists: their ids stay unique

    def results_for(prompts: Sequence[Any], completions: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        nonlocal client, last
        if last is not None and last[0] is prompts and last[1] is completions:
            return last[2]
        if client is None:
            client = GradingClient(config.target, **config.client_options)
        samples = config.builder.columns(prompts, completions, kwargs)
        table = client.batch_scores(samples, config.graders, config.reward, **config.guards)
        report(table, kwargs)
        last = (prompts, completions, shares(table, terms))
        return last[2]

    def make(key: str) -> Callable[..., list[float | None]]:
        def score(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
            return list(results_for(prompts, completions, kwargs)[key])

        score.__name__ = f"grpcgrade_{key}"
        return score

    return [make(key) for key in keys]
