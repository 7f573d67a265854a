"""What every HTTP face shares: auth, reading the JSON body, the reward guard, the one engine call, and the
`face` a request is counted under.

Each protocol module (openrlhf, openai_graders, ...) only translates its framework's body into samples'
keyword arguments and the engine's answer back into its framework's body; the grading itself is
`FaceContext.grade`, so every face has the same limits (`Limits`, checked per sample), tokens, result cache,
step budget and failure ratio, worker pool and grader metrics as the gRPC service.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from aiohttp import BasicAuth, web

from grpcgrade.core.admission import Admission
from grpcgrade.core.coalesce import ServerCoalescer
from grpcgrade.core.config import HttpConfig
from grpcgrade.core.engine import Batch, Engine, Job, Plan
from grpcgrade.core.errors import (
    InvalidParams,
    Overloaded,
    SampleProblem,
    TooManyFailures,
    UnknownGrader,
    UnknownReward,
    as_value,
)
from grpcgrade.core.guard import FailureTally, call_guards
from grpcgrade.core.plan import required_inputs
from grpcgrade.core.result_cache import CacheMode
from grpcgrade.core.samples import (
    AGENT_FIELDS,
    TEXT_FIELDS,
    Limits,
    add_extra,
    check_fields,
    missing_input,
)
from grpcgrade.core.tokens import no_tokenizer_message, uncounted
from grpcgrade.grader import GraderError, GraderResult

from ..counters import FaceCounters
from ..overload import service_unavailable
from ..rows import ROWS, encoded
from .forward import NESTING, UNREACHABLE_RETRY_SECONDS, EngineLink, too_deep
from .limits import MAX_JSON_DEPTH, BodyError, read_json

__all__ = ["MAX_JSON_DEPTH", "BodyError", "read_json"]  # where the faces have found them

log = logging.getLogger("grpcgrade.http")

#: The request key a face's handlers record their face under, for the request counter's `face` label.
FACE_KEY = web.RequestKey("grpcgrade_face", str)
#: The `face` label of a request no face answered (an unknown path).
NO_FACE = "none"
#: A body's `cache` value and the mode it asks for.
CACHE_MODES = {mode.value: mode for mode in CacheMode}

log = logging.getLogger("grpcgrade.service.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def sample_fields(
    response: str,
    query: str | None = None,
    reference: str | None = None,
    context: str | None = None,
    extra: Mapping[str, Any] | None = None,
    agent: Mapping[str, list[Any]] | None = None,
) -> dict[str, Any]:
    """A sample's keyword arguments as the graders take them (the gRPC Sample's fields, `extra` beside
    them); SampleProblem when an `extra` key would replace a standard field. A text field given as None is
    one the trainer did not send: `FaceContext.grade` answers INVALID_SAMPLE when a grader requires it, as
    the gRPC service does for an unset field, and gives it to the others as ""."""
    fields: dict[str, Any] = {"sample_id": "", "response": response, "responses": []}
    for name, value in (("query", query), ("reference", reference), ("context", context)):
        if value is not None:
            fields[name] = value
    if agent:  # docs/agents.md: messages, tool_calls, tool_definitions (size-checked with the other fields)
        fields.update(agent)
    if extra:
        add_extra(fields, dict(extra))
    return fields


#: The keys `sample_fields` gives every sample; any other key came from its `extra`.
STANDARD_KEYS = frozenset(("sample_id", *TEXT_FIELDS, "responses", *AGENT_FIELDS))


def check_sample(fields: dict[str, Any], limits: Limits) -> None:
    """SampleProblem for a standard field over `max_field_chars`, or for `extra` (the other keys) whose JSON
    is longer: grader input, so the gRPC service's limit holds for it too."""
    if STANDARD_KEYS.issuperset(fields):  # the usual sample: no extra, so no split and no encoding
        check_fields(fields, limits)
        extra: dict[str, Any] = {}
    else:
        check_fields({k: v for k, v in fields.items() if k in STANDARD_KEYS}, limits)
        extra = {k: v for k, v in fields.items() if k not in STANDARD_KEYS}
    size = len(json.dumps(extra)) if extra else 0
    if size > limits.max_field_chars:
        raise SampleProblem(
            f"field 'extra' takes {size} characters, over the limit max_field_chars={limits.max_field_chars}"
        )
    deep = [k for k, v in extra.items() if isinstance(v, dict | list) and too_deep(v)]
    deep += [k for k in AGENT_FIELDS if k in fields and any(too_deep(entry) for entry in fields[k] or ())]
    if deep:
        raise SampleProblem(f"field {deep[0]!r} nests deeper than a sample carries ({NESTING})")


def agent_columns(body: Mapping[str, Any], n: int) -> list[dict[str, list[Any]]]:
    """Each sample's agent inputs from a body's `messages`, `tool_calls` and `tool_definitions` keys: each, when
    given, a list with one entry per sample, that sample's list (or null: not sent). 400 naming the key
    otherwise."""
    out: list[dict[str, list[Any]]] = [{} for _ in range(n)]
    for name in AGENT_FIELDS:
        column = body.get(name)
        if column is None:
            continue
        if not isinstance(column, list) or len(column) != n:
            raise web.HTTPBadRequest(text=f"`{name}` must be a list with one entry per sample ({n})")
        for i, value in enumerate(column):
            if value is not None and not isinstance(value, list):
                raise web.HTTPBadRequest(text=f"`{name}[{i}]` must be a list (or null), not {type(value).__name__}")
            if value is not None:
                out[i][name] = value
    return out


def _complete(fields: dict[str, Any], required: dict[str, str]) -> dict[str, Any]:
    """`fields` with every text field a grader may read (unsent ones as ""), or SampleProblem when one the
    graders require was not sent."""
    if required and not all(name in fields for name in required):  # the usual sample: no set made
        problem = missing_input(fields.keys(), required)
        if problem is not None:
            raise problem
    for name in TEXT_FIELDS:
        fields.setdefault(name, "")
    return fields


def authorized(request: web.Request, secrets: Sequence[bytes]) -> bool:
    """`Authorization: Bearer TOKEN`, or Basic auth whose password is the token (what aiohttp sends for a
    URL like `http://trainer:TOKEN@host/...`, for trainers that cannot set headers)."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        presented = value.strip()
    elif scheme.lower() == "basic":
        try:
            presented = BasicAuth.decode(header).password
        except ValueError:
            return False
    else:
        return False
    return any(hmac.compare_digest(token_bytes(request, presented), t) for t in secrets)


def token_bytes(request: web.Request, presented: str) -> bytes:
    """A presented token as the bytes to compare with the configured ones (UTF-8 text). aiohttp decodes
    headers as UTF-8 with surrogate escapes, so a header that is not UTF-8 holds surrogates no token can
    match: it gets one log line and matches nothing (401), not an UnicodeEncodeError (500 and a traceback)."""
    try:
        return presented.encode()
    except UnicodeEncodeError:
        log.warning("HTTP %s %s from %s: its Authorization header is not UTF-8: 401",
                    request.method, request.path, request.remote)  # fmt: skip
        return b""


def http_error(exc: BodyError) -> web.HTTPException:
    """A body a face cannot take, as aiohttp's exception of its status (400, 408, 413, or 503 with a retry
    hint: its parsing processes died under it or hung, the server's trouble, not the body's), in plain text."""
    if exc.status == 413:
        return web.HTTPRequestEntityTooLarge(max_size=0, actual_size=0, text=str(exc))
    if exc.status == 503:
        return web.HTTPServiceUnavailable(text=str(exc), headers={"Retry-After": str(UNREACHABLE_RETRY_SECONDS)})
    kind = web.HTTPRequestTimeout if exc.status == 408 else web.HTTPBadRequest
    return kind(text=str(exc))


def faced(face: str, handler: Handler) -> Handler:
    """`handler` recording its face on the request first, so the counter labels even a refused request."""

    async def run(request: web.Request) -> web.StreamResponse:
        request[FACE_KEY] = face
        return await handler(request)

    return run


class Samples(Protocol):
    """A request's samples by index (a list, or samples made as the engine cuts each chunk: a face making
    a 100k-sample batch at once held the event loop for half a second)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> dict[str, Any] | SampleProblem: ...


class Graded(NamedTuple):
    """One sample's answer: its reward (None when it failed) and each grader's result, in the reward's
    order (empty when the sample never reached the graders)."""

    reward: float | None
    results: list[GraderResult]

    def error(self) -> GraderError | None:
        """The first grader's error (what a face reports for a failed sample)."""
        return next((r for r in self.results if isinstance(r, GraderError)), None)

    def why(self) -> str:
        """A failed sample's cause in one line: `grader CODE: message`."""
        error = self.error()
        if error is None:
            return "no grader answered"
        return f"{error.name} {error.code}: {error.error[:200]}"


class GradedBatch:
    """Every sample's `Graded`, made when a face asks for it: the rewards in one list, each chunk's result
    columns as the engine gave them. One `Graded` (a tuple and a list) per sample kept for the whole
    request made 200k objects more of a 100k-sample batch for the garbage collector to walk, on the
    event loop."""

    def __init__(self, n: int) -> None:
        self.rewards: list[float | None] = [None] * n
        self._chunk = [-1] * n  # which of `_columns` holds a sample's results (-1: none came), and where
        self._row = [0] * n
        self._columns: list[list[list[GraderResult]]] = []

    def add(self, indices: Sequence[int], columns: list[list[GraderResult]], rewards: Sequence[float | None]) -> None:
        chunk = len(self._columns)
        self._columns.append(columns)
        for row, (index, value) in enumerate(zip(indices, rewards, strict=True)):
            self.rewards[index], self._chunk[index], self._row[index] = value, chunk, row

    def __len__(self) -> int:
        return len(self.rewards)

    def __getitem__(self, index: int) -> Graded:
        chunk, row = self._chunk[index], self._row[index]
        results = [] if chunk < 0 else [column[row] for column in self._columns[chunk]]
        return Graded(self.rewards[index], results)

    def __iter__(self) -> Iterator[Graded]:
        return (self[i] for i in range(len(self.rewards)))

    def first_failed(self) -> Graded | None:
        index = next((i for i, value in enumerate(self.rewards) if value is None), None)
        return None if index is None else self[index]


@dataclass
class FaceContext:
    """The server's engine and settings as every face sees them."""

    engine: Engine
    limits: Limits
    http: HttpConfig
    default_reward: str = ""
    tokens: Sequence[str] = ()
    metrics: FaceCounters | None = None
    admission: Admission | None = None
    coalescer: ServerCoalescer | None = None  # None: a one-sample request is graded alone
    #: The engine's process, when this face runs in a process of its own (`http.process`): samples are
    #: graded there, over the gRPC contract, and `engine` only resolves plans.
    link: EngineLink | None = None
    secrets: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.secrets = [t.encode() for t in self.tokens if t]
        if self.admission is None:
            self.admission = Admission(self.limits)

    def check_auth(self, request: web.Request) -> None:
        """401 (plain text) unless the request carries one of the server's tokens (when it has any)."""
        if self.secrets and not authorized(request, self.secrets):
            raise web.HTTPUnauthorized(
                text="missing or invalid token (Authorization: Bearer TOKEN, or the URL's password)",
                headers={"WWW-Authenticate": 'Basic realm="grpcgrade"'},
            )

    def reward_of(self, request: web.Request, path: str) -> str:
        """The reward a request asks for: `/rewards/NAME/...`'s NAME, else the configuration's default
        (404 naming `path`, the named form, when there is none)."""
        name = request.match_info.get("name")
        if name is not None:
            return name
        if not self.default_reward:
            raise web.HTTPNotFound(
                text=f"no default_reward in the server's configuration; POST to /rewards/NAME/{path} instead"
            )
        return self.default_reward

    async def json_object(self, request: web.Request, what: str) -> dict[str, Any]:
        """The body as a JSON object (400 naming the problem; `what` says what the object holds)."""
        try:
            body, _ = await read_json(request, self.http)
        except BodyError as exc:
            raise http_error(exc) from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text=f"the body must be a JSON object with {what}")
        return body

    def resolve(self, reward: str, cache: Any = CacheMode.DEFAULT.value) -> Plan:
        """The reward's graders (404 for an unknown reward, 400 for a bad `cache` or parameters)."""
        mode = CACHE_MODES.get(cache) if isinstance(cache, str) else None  # a list or an object: not hashable
        if mode is None:
            allowed = ", ".join(f'"{mode.value}"' for mode in CacheMode)
            raise web.HTTPBadRequest(text=f"`cache` must be one of {allowed}, got {str(cache)[:40]!r}")
        try:  # kept by the engine, as a gRPC call's (a reward's graders named by no spec: the empty key)
            return self.engine.resolve_keyed(b"", list, reward, mode)
        except (UnknownReward, UnknownGrader) as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        except InvalidParams as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None

    def require_counts(self, reward: str, jobs: Sequence[Job], path: str) -> None:
        """400 naming `--tokenizer` when the reward gates on a token count that `path` (a trainer's protocol
        that never sends counts) cannot give and the server has no tokenizer to make."""
        gates = [job.spec.name for job in jobs if uncounted(job.grader)]
        if gates:  # every reward would be cut to the gate's min_reward
            raise web.HTTPBadRequest(text=no_tokenizer_message(reward, gates, path))

    def check_count(self, n: int, what: str) -> None:
        """413 past `max_samples_per_batch`."""
        if n > self.limits.max_samples_per_batch:
            raise web.HTTPRequestEntityTooLarge(
                max_size=self.limits.max_samples_per_batch,
                actual_size=n,
                text=f"{n} {what}, over the limit max_samples_per_batch={self.limits.max_samples_per_batch}",
            )

    def guards(
        self, body: Mapping[str, Any], n: int, started: float, *, ratio: bool = True
    ) -> tuple[float | None, FailureTally | None]:
        """The request's reward guard (its body's `budget_seconds` / `max_failure_ratio`, else the server's
        `http` defaults); 400 naming a value out of range. `ratio=False` for one-sample faces, whose one
        failure would otherwise end the trainer's run."""
        budget = body.get("budget_seconds", self.http.budget_seconds)
        max_ratio = body.get("max_failure_ratio", self.http.max_failure_ratio) if ratio else None
        for name, value in (("budget_seconds", budget), ("max_failure_ratio", max_ratio)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise web.HTTPBadRequest(text=f"`{name}` must be a number")
        try:
            return call_guards(float(budget or 0.0), None if max_ratio is None else float(max_ratio), n, started)
        except InvalidParams as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None

    async def grade(
        self,
        reward: str,
        jobs: Sequence[Job],
        samples: Samples,
        guards: tuple[float | None, FailureTally | None] = (None, None),
        face: str = "",
        nbytes: int = 0,
    ) -> GradedBatch:
        """Every sample graded with the reward's `jobs`: the one engine call of every face. A sample given
        as its SampleProblem, or whose fields are past the limits, is a failed sample (no other sample pays
        for it). A request past its failure ratio is 400 `FAILED_PRECONDITION: ...` naming the grader and
        its most frequent error code. Failed samples are counted per face and reward
        (`grpcgrade_http_failed_samples_total`) and logged, one WARNING line per request. `nbytes`: the
        request body's size (0: unknown), for the engine's choice to grade a small request inline."""
        n = len(samples)
        required = required_inputs(jobs)
        unusable: list[SampleProblem] = []

        def checked(i: int) -> dict[str, Any] | SampleProblem:
            sample = samples[i]
            try:
                if isinstance(sample, SampleProblem):
                    raise sample
                check_sample(sample, self.limits)
                return _complete(sample, required)
            except SampleProblem as exc:
                problem = as_value(exc)  # kept: its traceback would hold this frame, and `unusable` it
                unusable.append(problem)
                return problem

        out = GradedBatch(n)
        deadline, failures = guards
        admission = self.admission
        assert admission is not None  # set in __post_init__
        try:
            admission.reserve(n)  # the call was admitted by the app's middleware; now its samples count
        except Overloaded as exc:
            raise service_unavailable(exc) from None
        try:
            if n == 1 and guards == (None, None) and self.coalescer is not None:  # with concurrent one-sample calls
                results, value = await self.coalescer.grade(jobs, checked(0), self.engine.timeout(None), reward, nbytes)
                out.add([0], [[result] for result in results], [value])
            elif self.link is not None:  # each piece's samples made as it leaves: no step makes them all
                async for part in self.link.grade_pieces(jobs, n, checked, reward, deadline, failures):
                    out.add(part.indices, part.columns, part.rewards)
            else:
                # Whole chunks travel in the rows codec (`service.rows`); a sample is checked again only when
                # the quarantine asks for one that failed (a usable one: nothing is counted twice).
                batch = Batch(
                    n,
                    lambda a, b: [(i, checked(i)) for i in range(a, b)],
                    lambda a, b: encoded([checked(i) for i in range(a, b)]),
                    nbytes,
                )
                async for graded in self.engine.grade_batch(
                    jobs, batch, self.engine.chunks(jobs, n), reward=reward, deadline=deadline, failures=failures
                ):
                    columns, values = (
                        (graded.columns, graded.rewards) if graded.encoded is None else ROWS.answer(graded.encoded)
                    )
                    out.add(graded.indices, columns, values)
        except TooManyFailures as exc:
            if self.metrics is not None:
                self.metrics.failure_budget_calls.inc()
            raise web.HTTPBadRequest(text=f"FAILED_PRECONDITION: {exc}") from None
        finally:
            admission.release(n)
            self._report(face, unusable, n)
        first = out.first_failed()
        if first is not None:
            failed = out.rewards.count(None)
            if self.metrics is not None:
                self.metrics.http_failed_samples.labels(face or NO_FACE, reward).inc(failed)
            log.warning(
                "%s face: %d of %d samples of reward %r failed (answered as the face's failure value); first: %s",
                face or "HTTP", failed, n, reward, first.why(),
            )  # fmt: skip
        return out

    def _report(self, face: str, unusable: list[SampleProblem], n: int) -> None:
        """Samples that could not be graded at all (a query without its prompt, a missing input, a field over
        the limits): logged once per request with the first reason, and counted per face, so a tokenizer
        that does not round-trip the prompt shows at once instead of as a quietly lower reward."""
        if not unusable:
            return
        log.warning(
            "%s face: %d of %d samples could not be graded (failed samples); the first: %s",
            face or "HTTP",
            len(unusable),
            n,
            unusable[0],
        )
        if self.metrics is not None:
            self.metrics.http_unusable_samples.labels(face or NO_FACE).inc(len(unusable))
