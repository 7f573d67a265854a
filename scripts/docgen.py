"""The generated parts of the manual, for cog (`make cog` writes them, tests/test_docs.py checks them).

The CLI help, the graders table and the configuration reference are printed from the code that defines them
(the argparse parser, the registry, the config dataclasses), as llm and datasette do with cog, so a page
cannot drift from the program: a stale page fails `cog --check` in the test suite.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
from typing import Any

#: Distributions whose graders the graders page lists: the built-ins and the plugins bundled in plugins/.
DOCUMENTED_DISTRIBUTIONS = ("grpcgrade", "grpcgrade-math-verify", "grpcgrade-code")

#: argparse wraps help to the terminal; a fixed width keeps the generated pages the same everywhere.
HELP_COLUMNS = "100"

#: What each top-level key of the `--config` YAML means. A key missing here fails generation.
CONFIG_KEYS = {
    "grader_timeout_seconds": "per grader, per sample time limit in seconds; a request's "
    "`grader_timeout_seconds` may lower it, never raise it; `--grader-timeout` overrides the file",
    "limits": "request limits (below)",
    "rewards": "named rewards: a name -> `{description, graders: [spec, ...], canaries: [canary, ...]}` (see "
    "[Rewards](rewards.md); canaries below); a reward's own `tokenizer:` comes before the top-level one",
    "models": "chat models LLM judges may name (see [LLM judges](llm-judges.md#configuring-models))",
    "default_reward": "the reward the HTTP face's `POST /get_reward` grades with "
    "(see [Trainers](trainers.md#openrlhf)); one of `rewards`",
    "http": "the HTTP face (`--http-port`) (below)",
    "grpc": "who serves the public gRPC port: the engine's process, gRPC face processes, or the native face (below)",
    "canary": "how the rewards' canaries run (below; see [Reward guard](reward-guard.md#canaries))",
    "cache": "the result cache (below; see [Reward guard](reward-guard.md#result-cache))",
    "quarantine": "inputs that timed out or killed a worker, answered at once (below; see "
    "[Reward guard](reward-guard.md#quarantine))",
    "callers": "each caller's weight in every judge model's fair share: a name -> `{weight: N}` (a caller not "
    "named has weight 1; see [LLM judges](llm-judges.md#fair-share))",
    "tokenizer": "what length gates count a response with when the trainer sends no `completion_tokens`: "
    "`tiktoken:ENCODING` or a model's `tokenizer.json` (relative to this file); `--tokenizer` overrides it "
    "(see [Trainers](trainers.md#token-counts-the-trainer-does-not-send))",
    "coalesce_linger_seconds": "one-sample calls (unary `Evaluate`, one-sample HTTP requests) with the same "
    "graders arriving together are graded as one chunk (unless the engine grades them inline anyway: cheap "
    "graders, a small sample); while a chunk of theirs is being graded, a call waits "
    "at most this long for others (0: each call graded alone; the gRPC faces wait at least 10 ms: see "
    "[Performance](performance.md#how-long-a-call-waits))",
}

#: What each setting of `cache:` and `quarantine:` means. A setting missing here fails generation.
STORE_DOCS = {
    "enabled": "false: never used, whatever a call asks",
    "max_bytes": "the bound on all entries together (an estimate per entry); past it the least recently used go",
    "ttl_seconds": "how long an entry is used after it was stored",
}

#: What each `canary:` setting means. A setting missing here fails generation.
CANARY_SETTINGS_DOCS = {
    "interval_seconds": "seconds between canary runs after the first (which is at start, before SERVING); 0.5 to 86400",
    "fail_health": "while any canary fails, the gRPC health service says NOT_SERVING (SERVING again once all pass)",
}

#: What each key of a canary (`rewards.<name>.canaries[i]`) means. A key missing here fails generation.
CANARY_DOCS = {
    "name": "its label in the metrics (`canary`); unique within the reward; default: its position (`0`, `1`, ...)",
    "sample": "the sample, as a client's sample dict: `query`, `response`, `reference`, `context`, `responses`, "
    "`id`; any other key goes to `extra`",
    "expect": "the reward the sample must get (required; a finite number)",
    "tolerance": "how far the reward may be from `expect` (default 1e-9); no reward at all (an error) always fails",
}

#: What each setting of the HTTP face means. A setting missing here fails generation.
GRPC_DOCS = {
    "processes": "0: the engine's process serves the gRPC port itself. N >= 1: N gRPC face processes own the port "
    "(SO_REUSEPORT; at most 64): each coalesces unary `Evaluate` calls into `BatchEvaluate` calls to the engine's "
    "process and relays every other call to it; the engine's process then listens only on its private socket. "
    "`--grpc-processes` overrides it (see [Operations](operations.md#the-grpc-face-processes)). With `face: native`: "
    "the cores the native face uses (0: every core)",
    "face": "who serves the gRPC port when the engine's process does not: `python` (the face processes above) or "
    "`native` (the Go face, one process: built by `make native-face`; see "
    "[Operations](operations.md#the-native-grpc-face)); `--grpc-face` overrides it",
    "max_connections": "gRPC connections open at once, per process serving the port (the engine's, each face "
    "process, the native face); past it a new connection is closed at once, unread. Lowered to half the "
    "process's open-files limit (`ulimit -n`) when above it, so that connections cannot take the descriptors "
    "the server needs itself (see [Security](security.md#the-grpc-port))",
    "handshake_timeout_seconds": "seconds a new connection may take to finish its TLS handshake and send HTTP/2's "
    "preface and first SETTINGS; past it the connection is closed (gRPC's own default: 120)",
    "idle_timeout_seconds": "seconds a connection may stay open with no call; past it the server sends it away "
    "(HTTP/2's GOAWAY) and gRPC clients connect again on their next call",
}
HTTP_DOCS = {
    "failure_reward": "the reward a failed sample gets over HTTP, where the trainer needs a number (OpenRLHF, "
    "slime, NeMo Gym); it is also flagged in the answer (`grpcgrade_failed`), counted and logged "
    "([Trainers](trainers.md))",
    "strip_suffixes": "trailing end-of-turn tokens removed, repeatedly, from each decoded query before grading",
    "budget_seconds": "the step budget of a request whose body has no `budget_seconds`; 0: none "
    "(see [Reward guard](reward-guard.md#step-budget))",
    "max_failure_ratio": "the failure budget of a request whose body has no `max_failure_ratio`; null: none "
    "(see [Reward guard](reward-guard.md#failure-budget))",
    "max_body_bytes": "the largest request body: a larger declared one is refused 413 before it is read, a larger "
    "chunked one as it passes the limit (see [Security](security.md))",
    "body_timeout_seconds": "seconds a request's body may take to arrive once its head has; past it, 408",
    "header_timeout_seconds": "seconds a new connection may take to send its first complete request head; past "
    "it, the connection is closed",
    "idle_timeout_seconds": "seconds a keep-alive connection may sit idle (or take to send its next request head) "
    "before it is closed",
    "max_connections": "HTTP connections open at once; past it, a new connection is closed at once (gRPC's "
    "are not counted); per face process",
    "processes": "HTTP face processes, each translating HTTP into the gRPC contract off the engine's process, "
    "all on the face's port (SO_REUSEPORT; at most 64); `--http-processes` overrides it (see "
    "[Operations](operations.md#the-http-face-processes))",
}

#: What each request limit bounds. A limit missing here fails generation.
LIMIT_DOCS = {
    "max_message_bytes": "largest gRPC message received or sent: a larger request is `RESOURCE_EXHAUSTED`; answers "
    "are split over several messages, and one sample's answer larger than this goes with its scores and reward "
    "but without its reasons and metadata (its first reason says why)",
    "max_samples_per_batch": "samples in one `BatchEvaluate` call; more is `RESOURCE_EXHAUSTED`",
    "max_field_chars": "characters in one text field or `responses` item of a sample, and the encoded size of its "
    "`extra`; over it, that sample is `INVALID_SAMPLE`",
    "max_graders_per_request": "grader specs in one request; more is `INVALID_ARGUMENT`",
    "send_timeout_seconds": "seconds a `BatchEvaluate` stream waits for its client to take a message; past it "
    "the call ends with `RESOURCE_EXHAUSTED` and its graded answers are dropped (see [Security](security.md))",
    "max_buffered_output_bytes": "graded answers waiting for their readers, server-wide; while spent, calls "
    "wait before starting new chunks (see [Security](security.md))",
    "max_concurrent_calls": "gRPC calls and HTTP requests handled at once; past it a call is refused at once with "
    "`RESOURCE_EXHAUSTED` (HTTP 503) and the retry hint, never cancelled "
    "(see [Security](security.md#a-crowd-of-callers))",
    "max_queued_samples": "samples accepted and not yet answered, over every call; a call that would pass it is "
    "refused as above (one that finds nothing queued is admitted whatever its size)",
    "max_memory_bytes": "the server process's resident memory past which calls are refused as above; 0: no such limit",
    "max_pending_calls": "calls gRPC's core holds before the server takes them up (it cancels calls past its own "
    "limit: 1,000 to 3,000 by default, the CANCELLED calls of a crowd); with the native gRPC face, the calls in "
    'flight on it, past which it refuses as above (`limit="max_pending_calls"` in the refusals\' metric)',
    "max_pending_request_bytes": "requests (gRPC messages, HTTP bodies) one serving process holds at once, from "
    "their arrival to their answers: the server's process, each face process (an HTTP body counted as it "
    "arrives; one whose declared size would pass the bound is refused before it is read); past it a call is "
    "refused as above; one that finds none held is admitted whatever its size; 0: no such limit "
    "(see [Security](security.md#a-crowd-of-callers))",
    "retry_after_seconds": "the retry hint of a refusal: gRPC's `grpc-retry-pushback-ms` trailer, HTTP's "
    "`Retry-After` (whole seconds, at least 1); the Python client waits about this long, longer as refusals repeat",
}

#: What each model setting does. A setting missing here fails generation.
MODEL_DOCS = {
    "base_url": "the endpoint, ending where `/chat/completions` is appended (`.../v1`); http(s) only; required",
    "model": "the model id the endpoint expects; default: the entry's name",
    "api_key_env": "the NAME of the environment variable that holds the API key, read once at start",
    "max_concurrency": "calls in flight to this model, across the whole server",
    "requests_per_minute": "the provider's request limit for this key: requests are paced under it across "
    "every call the server serves (see [LLM judges](llm-judges.md#provider-limits)); 0: none",
    "tokens_per_minute": "the provider's token limit (prompt and completion): each request's tokens are "
    "estimated before it is sent and corrected by its answer's usage; 0: none",
    "timeout_seconds": "per HTTP attempt, counted once the call has its turn under the limits",
    "max_retries": "retries on 5xx (but 503), connection errors and timeouts; 429 and 503 are retried while the "
    "sample's time limit allows (without one, this many times)",
    "retry_backoff_seconds": "the first pause; doubles on each retry, with jitter",
    "price_per_million_input_tokens": "the price of a million prompt tokens, for the cost estimate "
    "(`grpcgrade_judge_cost_total`); 0: not counted",
    "price_per_million_output_tokens": "the price of a million completion tokens, for the cost estimate",
    "extra_body": "merged into every request body, e.g. `{temperature: 0, max_tokens: 512}`",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """Text shown as code in a table cell, safe with pipes and angle brackets on GitHub and in the site."""
    return "<code>" + html.escape(text, quote=False).replace("|", "&#124;") + "</code>"


def _check_documented(kind: str, names: list[str], docs: dict[str, str]) -> None:
    missing = [n for n in names if n not in docs]
    stale = [n for n in docs if n not in names]
    if missing or stale:
        raise SystemExit(f"scripts/docgen.py: {kind}: undocumented {missing}, no longer exist {stale}")


def cli_help(*words: str) -> str:
    """`grpcgrade [words] --help`, as a fenced block."""
    os.environ["COLUMNS"] = HELP_COLUMNS
    from grpcgrade.cli import build_parser

    parser = build_parser()
    for word in words:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[word]  # type: ignore[attr-defined]
    return f"```\n$ grpcgrade {' '.join((*words, '--help'))}\n{parser.format_help().rstrip()}\n```"


def cli_commands() -> list[str]:
    from grpcgrade.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return list(sub.choices)  # type: ignore[attr-defined]


def cli_reference() -> str:
    parts = [cli_help()]
    for command in cli_commands():
        parts.append(f"### `grpcgrade {command} --help`\n\n{cli_help(command)}")
    return "\n\n".join(parts)


def _param(p: Any) -> str:
    return f"`{p.name}`" if p.required else f"`{p.name}={json.dumps(p.default)}`"


def graders_table() -> str:
    from grpcgrade.core.registry import get_registry

    rows = ["| grader | mode | parameters (default) | plugin | description |", "|---|---|---|---|---|"]
    entries = [e for e in get_registry().entries if e.plugin.distribution in DOCUMENTED_DISTRIBUTIONS]
    for e in sorted(entries, key=lambda e: e.name):
        name = f"`{e.name}`" + "".join(f" (alias `{a}`)" for a in e.aliases)
        params = ", ".join(_param(p) for p in e.params) or "none"
        plugin = e.plugin.name if e.plugin.distribution == "grpcgrade" else f"{e.plugin.name} ({e.plugin.distribution})"
        rows.append(f"| {name} | {e.mode.value} | {_cell(params)} | {plugin} | {_cell(e.description)} |")
    return "\n".join(rows)


def config_reference() -> str:
    from grpcgrade.core.canaries import CanarySettings
    from grpcgrade.core.config import CANARY_KEYS, GrpcConfig, HttpConfig, ServerConfig
    from grpcgrade.core.result_cache import CacheConfig, QuarantineConfig
    from grpcgrade.core.samples import Limits
    from grpcgrade.llm.models import ModelConfig

    top = [f.name for f in dataclasses.fields(ServerConfig) if f.name not in ("server_only_graders", "canaries")]
    _check_documented("ServerConfig", top, CONFIG_KEYS)
    defaults = {
        "grader_timeout_seconds": ServerConfig().grader_timeout_seconds,
        "default_reward": "none",
        "coalesce_linger_seconds": ServerConfig().coalesce_linger_seconds,
    }
    out = ["| key | default | meaning |", "|---|---|---|"]
    out += [f"| `{k}` | {defaults.get(k, '')} | {_cell(CONFIG_KEYS[k])} |" for k in top]

    http = HttpConfig()
    names = [f.name for f in dataclasses.fields(HttpConfig)]
    _check_documented("HttpConfig", names, HTTP_DOCS)
    out += ["", "`http:`", "", "| setting | default | meaning |", "|---|---|---|"]
    for n in names:
        default = json.dumps(getattr(http, n), ensure_ascii=False)
        out.append(f"| `{n}` | {_code(default)} | {_cell(HTTP_DOCS[n])} |")

    grpc = GrpcConfig()
    names = [f.name for f in dataclasses.fields(GrpcConfig)]
    _check_documented("GrpcConfig", names, GRPC_DOCS)
    out += ["", "`grpc:`", "", "| setting | default | meaning |", "|---|---|---|"]
    out += [f"| `{n}` | {_code(json.dumps(getattr(grpc, n)))} | {_cell(GRPC_DOCS[n])} |" for n in names]

    limits = Limits()
    names = [f.name for f in dataclasses.fields(Limits)]
    _check_documented("Limits", names, LIMIT_DOCS)
    out += ["", "`limits:`", "", "| limit | default | bounds |", "|---|---:|---|"]
    out += [f"| `{n}` | {getattr(limits, n):,} | {_cell(LIMIT_DOCS[n])} |" for n in names]

    canary = CanarySettings()
    names = [f.name for f in dataclasses.fields(CanarySettings)]
    _check_documented("CanarySettings", names, CANARY_SETTINGS_DOCS)
    out += ["", "`canary:`", "", "| setting | default | meaning |", "|---|---|---|"]
    out += [f"| `{n}` | `{json.dumps(getattr(canary, n))}` | {_cell(CANARY_SETTINGS_DOCS[n])} |" for n in names]
    _check_documented("canary", list(CANARY_KEYS), CANARY_DOCS)
    out += ["", "`rewards.<name>.canaries:` (each canary)", "", "| key | meaning |", "|---|---|"]
    out += [f"| `{n}` | {_cell(CANARY_DOCS[n])} |" for n in CANARY_KEYS]
    for key, store in (("cache", CacheConfig()), ("quarantine", QuarantineConfig())):
        names = [f.name for f in dataclasses.fields(store)]
        _check_documented(key, names, STORE_DOCS)
        out += ["", f"`{key}:`", "", "| setting | default | meaning |", "|---|---:|---|"]
        for n in names:
            value = getattr(store, n)
            default = (
                json.dumps(value)
                if isinstance(value, bool)
                else f"{value:,}"
                if isinstance(value, int)
                else f"{value:g}"
            )
            out.append(f"| `{n}` | {default} | {_cell(STORE_DOCS[n])} |")

    settings = [f for f in dataclasses.fields(ModelConfig) if f.name not in ("name", "api_key")]
    _check_documented("ModelConfig", [f.name for f in settings], MODEL_DOCS)
    out += ["", "`models:` (each model)", "", "| setting | default | meaning |", "|---|---|---|"]
    for f in settings:
        if f.default is not dataclasses.MISSING:
            default = "none" if f.default is None else f"`{json.dumps(f.default)}`"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"`{json.dumps(f.default_factory())}`"
        else:
            default = "required" if f.name == "base_url" else "the entry's name"
        out.append(f"| `{f.name}` | {default} | {_cell(MODEL_DOCS[f.name])} |")
    return "\n".join(out)


def error_codes() -> str:
    """The per-sample error codes with the `#:` comment each has where `ErrorCode` defines it."""
    import inspect

    from grpcgrade.core.errors import ErrorCode

    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(ErrorCode).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
        elif "=" in text and pending:
            comments[text.split("=")[0].strip()] = " ".join(pending)
            pending = []
    _check_documented("ErrorCode", [c.name for c in ErrorCode], comments)
    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| `{c.value}` | {_cell(comments[c.name])} |" for c in ErrorCode]
    return "\n".join(rows)


def retry_service_config() -> str:
    """The Python client's gRPC service config (its retry policy), as JSON for other languages' channels."""
    from grpcgrade.client import SERVICE_CONFIG

    return "```json\n" + json.dumps(SERVICE_CONFIG, indent=2) + "\n```"
