"""What every trainer integration needs: which values can travel in a sample's `extra`, and how a result
becomes a reward or a mask."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Iterable
from typing import Any

from grpcgrade.client import GradingClient, UnsendableSample
from grpcgrade.core.chat import last_text as last_text  # prompts and completions as chats
from grpcgrade.core.errors import ErrorCode
from grpcgrade.core.samples import AGENT_FIELDS, INPUT_FIELDS, SAMPLE_FIELDS, plain
from grpcgrade.core.samples import as_text as as_text  # the integrations' rule for a field's text
from grpcgrade.core.samples import text_or_none as text_or_none  # None for a dataset's "no value" (NaN...)
from grpcgrade.core.tokens import TOKENIZER_PARAM, no_tokenizer_message
from grpcgrade.v1 import grading_pb2 as pb

#: Names a grader gets from the sample itself; a trainer's column or field of that name never goes to `extra`.
RESERVED = frozenset(INPUT_FIELDS) | frozenset(SAMPLE_FIELDS) | frozenset(AGENT_FIELDS)


#: Values that are their own JSON form (a float only when finite): no round trip through `json`.
_PLAIN = frozenset({str, int, bool, type(None)})


def field(name: str, value: Any) -> dict[str, str]:
    """A sample's text field from a trainer's value: `{name: text}`, or nothing for a value that stands for
    none (`is_missing`: None, NaN, pandas' NA), so a grader that requires the field answers INVALID_SAMPLE
    (masked) instead of grading "" or "NaN" (a made-up 0)."""
    text = text_or_none(value)
    return {} if text is None else {name: text}


def json_value(value: Any) -> Any:
    """`value` as JSON data (tuples become lists, numpy values their Python values: `samples.plain`), or
    TypeError/ValueError when it has no JSON form."""
    if type(value) in _PLAIN or (type(value) is float and math.isfinite(value)):
        return value
    return json.loads(json.dumps(plain(value), allow_nan=False))


log = logging.getLogger("grpcgrade.integrations")
#: The names of values already logged as dropped: one warning per name and process, not one per sample.
_dropped: set[str] = set()


def usable_extra(items: Iterable[tuple[str, Any]], skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The items that can reach a grader through `extra`: not a sample field's name, not in `skip`, and with
    a JSON form. The rest are dropped, never an error (an unrelated value must not fail a sample), but a
    value dropped for having no JSON form is logged once per name with its type: nothing a trainer sends
    disappears without a word."""
    out = {}
    for name, value in items:
        if name in RESERVED or name in skip:
            continue
        try:
            out[name] = json_value(value)
        except (TypeError, ValueError) as exc:
            if name not in _dropped:
                _dropped.add(name)
                log.warning(
                    "grpcgrade: %r (a %s) has no JSON form, so no grader can read it; left out of `extra` "
                    "(%s). Logged once per name.",
                    name,
                    type(value).__name__,
                    exc,
                )
    return out


def agent_inputs(items: Iterable[tuple[str, Any]]) -> dict[str, list[Any]]:
    """The agent inputs (`messages`, `tool_calls`, `tool_definitions`) among a trainer's values: each that is
    a list with a JSON form, for the sample's own fields. Anything else of those names is dropped, as
    `usable_extra` drops what cannot travel."""
    out = {}
    for name, value in items:
        if name in AGENT_FIELDS and isinstance(value, list | tuple):
            try:
                out[name] = json_value(list(value))
            except (TypeError, ValueError):
                continue
    return out


def reward_of(result: pb.EvaluateResponse) -> float | None:
    """The sample's reward, None when a grader failed (the sample is to be masked)."""
    return result.reward if result.HasField("reward") and math.isfinite(result.reward) else None


def score_of(result: pb.EvaluateResponse, key: str) -> float | None:
    """One grader's score, None where it failed (or ranked instead of scoring)."""
    found = next((r for r in result.results if r.key == key), None)
    if found is None or found.HasField("error") or found.rank:
        return None
    return found.score


def unsent_result(exc: UnsendableSample) -> pb.EvaluateResponse:
    """The result of a sample the client cannot send (a lone surrogate in its text...): no reward and an
    INVALID_SAMPLE error saying why, for the failure path every integration has (masked, flagged, logged),
    rather than an exception that ends the trainer's step over one odd sample of its data."""
    error = pb.GraderError(code=ErrorCode.INVALID_SAMPLE, message=f"not sent: {exc}")
    return pb.EvaluateResponse(results=[pb.GraderResult(grader="grpcgrade.client", error=error)])


def failure_of(result: pb.EvaluateResponse) -> str:
    """Why a sample has no reward, in one line: the first failed grader's `key CODE: message`."""
    for r in result.results:
        if r.HasField("error"):
            return f"{r.key or r.grader} {r.error.code}: {r.error.message[:200]}"
    return "no reward (no grader failed: a gate or an empty result)"


_clients: dict[tuple[str, str | None, float], GradingClient] = {}
_clients_lock = threading.Lock()


def shared_client(target: str, token: str | None, timeout: float) -> GradingClient:
    """One blocking client per target, token and timeout in the process: frameworks that make an object per
    prompt (SkyRL's environments) or call from a process pool (AReaL) then share one channel."""
    key = (target, token, timeout)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = GradingClient(target, token=token, timeout=timeout)
        return _clients[key]


def uncounted_gates(catalog: pb.ListGradersResponse, reward: str) -> list[str]:
    """The graders of configured `reward` that gate on a token count and have no tokenizer to make one, as
    the server's catalog shows them (the server fills its `--tokenizer` into their params): for a trainer
    path that sends no counts, each would cut every reward to its `min_reward` (`core.tokens.uncounted`)."""
    takes: set[str] = set()
    for grader in catalog.graders:
        if any(p.name == TOKENIZER_PARAM for p in grader.params):
            takes.update((grader.name, *grader.aliases))
    found = next((r for r in catalog.rewards if r.name == reward), None)
    out = []
    for spec in found.graders if found is not None else ():
        params = spec.params.fields
        if spec.name not in takes or (TOKENIZER_PARAM in params and params[TOKENIZER_PARAM].string_value):
            continue
        missing_fails = params.get("treat_missing_as_fail")
        if missing_fails is None or missing_fails.bool_value:
            out.append(spec.key or spec.name)
    return out


def uncounted_refusal(reward: str, gates: list[str], path: str) -> ValueError:
    """The error of a trainer path (`path`, named for the user) that sends no token counts, asked for a
    reward with `uncounted_gates`: it names the gates and `--tokenizer` (`core.tokens.no_tokenizer_message`)."""
    return ValueError("grpcgrade: " + no_tokenizer_message(reward, gates, path))


_counted: set[tuple[str, str | None, float, str]] = set()


def require_counts(target: str, token: str | None, timeout: float, reward: str, path: str) -> None:
    """Raise `uncounted_refusal` when configured `reward` gates on a token count that `path` never sends and
    the server has no tokenizer to make: issue 37's rule for every trainer path without counts, checked
    when the trainer builds its side (SkyRL's environment, verifiers' rubric) so it never starts training
    on rewards cut to a gate's `min_reward`. The server's catalog is asked once per client and reward in the
    process (SkyRL builds an environment per prompt)."""
    key = (target, token, timeout, reward)
    if key in _counted:
        return
    gates = uncounted_gates(shared_client(target, token, timeout).list_graders(), reward)
    if gates:
        raise uncounted_refusal(reward, gates, path)
    _counted.add(key)
