"""The quarantine against a real server: an input whose grading killed a worker or ran past the time limit
is answered at once the next time, with the same code, and costs no worker; listed and cleared by the
AdminService and `grpcgrade quarantine`, behind the server's bearer token."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from grpcgrade.client import AsyncGradingClient, GradingClient
from grpcgrade.core.cached_grading import CachedGrading
from grpcgrade.core.engine import Engine, Job
from grpcgrade.core.grading import inputs_of
from grpcgrade.core.registry import get_registry
from grpcgrade.core.result_cache import CacheMode, Quarantine, ResultCache, scope_of
from grpcgrade.core.rewards import SpecData
from grpcgrade.grader import GraderError
from grpcgrade.testing import ServerProcess, children, free_port, start_server
from grpcgrade.v1 import admin_pb2, admin_pb2_grpc

MISBEHAVE = [{"name": "misbehave"}]


@pytest.fixture(scope="module")
def token() -> str:
    return secrets.token_urlsafe(16)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory, token: str) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "token"
    path.write_text(token + "\n")
    return path


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, plugin_env, token_file) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("quarantine")
    srv = start_server(tmp, "--workers", "2", "--auth-token-file", str(token_file), env=plugin_env)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(guarded: ServerProcess, token: str) -> Iterator[GradingClient]:
    with guarded.client(timeout=120, token=token) as c:
        yield c


def outcome(reply: Any) -> Any:
    (result,) = reply.results
    return result.error.code if result.HasField("error") else result.score


def message(reply: Any) -> str:
    return reply.results[0].error.message


def workers(srv: ServerProcess) -> set[int]:
    """The server's child processes (its workers and resource tracker), once the pool has its 2 workers
    up: a replaced pool starts its workers after the call that broke the old one has its answer."""
    deadline = time.monotonic() + 60
    while srv.metric("grpcgrade_workers_alive") != 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return set(children(srv.proc.pid))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grpcgrade.cli", *args], capture_output=True, text=True, timeout=60)


def test_a_sample_that_killed_a_worker_costs_no_worker_the_second_time(guarded, client):
    samples = [{"response": r} for r in ("ok", "die", "ok")]
    first = client.batch_evaluate(samples, MISBEHAVE)  # whole chunks in the workers
    assert [outcome(r) for r in first] == [1.0, "WORKER_LOST", 1.0]
    assert "quarantined" not in message(first[1])
    pids = workers(guarded)  # the pool back at its 2 workers: every death of the first call counted
    restarts = guarded.metric("grpcgrade_worker_pool_restarts_total")
    assert restarts >= 1
    again = client.batch_evaluate(samples, MISBEHAVE)
    assert [outcome(r) for r in again] == [1.0, "WORKER_LOST", 1.0]
    assert message(again[1]).startswith("quarantined since ")
    assert "grpcgrade quarantine clear" in message(again[1])
    single = client.evaluate({"id": "other id", "response": "die"}, MISBEHAVE)  # the id is not the content
    assert outcome(single) == "WORKER_LOST" and "quarantined" in message(single)
    assert guarded.metric("grpcgrade_worker_pool_restarts_total") == restarts
    assert workers(guarded) - pids == set()  # no process was started for the second occurrences
    assert guarded.metric("grpcgrade_quarantine_hits_total", grader="misbehave") >= 2
    assert guarded.metric("grpcgrade_quarantined_entries") >= 1
    other_params = client.evaluate({"response": "ok"}, [{"name": "misbehave", "params": {"heavy": False}}])
    assert outcome(other_params) == 1.0


def test_a_sample_that_timed_out_is_answered_at_once_with_timeout(guarded, client):
    samples = [{"response": r} for r in ("hang", "ok")]
    first = client.batch_evaluate(samples, MISBEHAVE, grader_timeout=0.5)
    assert [outcome(r) for r in first] == ["TIMEOUT", 1.0]
    again = client.batch_evaluate(samples, MISBEHAVE, grader_timeout=0.5)
    assert [outcome(r) for r in again] == ["TIMEOUT", 1.0]
    assert message(again[0]).startswith("quarantined since ")
    assert "time limit of 0.5 s" in message(again[0])  # what happened the first time
    unary = client.evaluate({"response": "hang"}, MISBEHAVE, grader_timeout=0.4)  # a shorter limit: the same
    assert outcome(unary) == "TIMEOUT" and "quarantined" in message(unary)
    assert "a call with a time limit over 0.5 s grades it again" in message(unary)
    longer = client.evaluate({"response": "hang"}, MISBEHAVE, grader_timeout=0.6)  # may finish: graded again
    assert outcome(longer) == "TIMEOUT" and "quarantined" not in message(longer)
    assert "quarantined" in message(client.evaluate({"response": "hang"}, MISBEHAVE, grader_timeout=0.6))


def test_the_admin_call_lists_and_clears_the_quarantine(guarded, client, token):
    client.evaluate({"response": "hang"}, [{"name": "misbehave", "params": {"heavy": True}}], grader_timeout=0.5)
    listing = client.list_quarantine()
    assert listing.enabled and 0 < listing.bytes <= listing.max_bytes
    entries = {(e.grader, e.params, e.code, e.preview) for e in listing.entries}
    assert ("misbehave", '{"heavy": true}', "TIMEOUT", '{"response":"hang"}') in entries
    assert all(e.since_unix_seconds < e.expires_unix_seconds for e in listing.entries)
    assert len(client.list_quarantine("misbehave").entries) == len(listing.entries)
    assert client.list_quarantine("shout").entries == []
    with grpc.insecure_channel(guarded.target) as channel:  # the AdminService is behind the same token
        with pytest.raises(grpc.RpcError) as err:
            admin_pb2_grpc.AdminServiceStub(channel).ListQuarantine(admin_pb2.ListQuarantineRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert client.clear_quarantine() == len(listing.entries)
    assert client.list_quarantine().entries == []
    graded = client.evaluate({"response": "hang"}, MISBEHAVE, grader_timeout=0.5)
    assert outcome(graded) == "TIMEOUT" and "quarantined" not in message(graded)


def test_the_cli_lists_and_clears_the_quarantine(guarded, client, token_file):
    client.evaluate({"response": "hang"}, [{"name": "misbehave", "params": {"heavy": True}}], grader_timeout=0.5)
    connection = ("--target", guarded.target, "--auth-token-file", str(token_file))
    listed = cli("quarantine", "list", *connection)
    assert listed.returncode == 0, listed.stderr
    assert "misbehave" in listed.stdout and "TIMEOUT" in listed.stdout and '{"response":"hang"}' in listed.stdout
    as_json = cli("quarantine", "list", "--json", *connection)
    entries = json.loads(as_json.stdout)["entries"]
    assert {e["code"] for e in entries} <= {"TIMEOUT", "WORKER_LOST"} and entries
    cleared = cli("quarantine", "clear", "--grader", "misbehave", *connection)
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.startswith(f"cleared {len(entries)} quarantined input")
    assert cli("quarantine", "list", *connection).stdout.startswith("0 quarantined inputs")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--grader", "no_such_grader", "--auth-token-file", "TOKEN"), "NOT_FOUND: unknown grader 'no_such_grader'"),
        (("--token", "wrong"), "UNAUTHENTICATED"),
    ],
)
def test_cli_errors_are_messages(guarded, token_file, args, expected):
    args = tuple(str(token_file) if a == "TOKEN" else a for a in args)
    done = cli("quarantine", "list", "--target", guarded.target, *args)
    assert done.returncode == 1
    assert expected in done.stderr and "Traceback" not in done.stderr


def test_cli_with_no_server_is_a_message():
    done = cli("quarantine", "clear", "--target", f"127.0.0.1:{free_port()}", "--timeout", "2")
    assert done.returncode == 1
    assert "UNAVAILABLE" in done.stderr and "Traceback" not in done.stderr
    assert "no server answered for 2 s of retries" in done.stderr  # its --timeout, not the client's 60 s


def test_only_graders_with_quarantined_inputs_leave_whole_chunks():
    """In-process: a call's path depends on its own graders' entries only, so cheap calls keep whole chunks."""
    registry = get_registry()
    cached = CachedGrading(ResultCache(1 << 20, 60), Quarantine(1 << 20, 60))
    engine = Engine(registry, cached=cached)

    def job(name: str) -> Job:
        grader = registry.build(name, {})
        return Job(SpecData(name=name), grader, inputs_of(grader), True)

    cheap, risky = job("json_validator"), job("math_exact")
    assert engine.whole_chunks([cheap]) and engine.whole_chunks([risky])
    cached.note_sample(
        risky, {"sample_id": "1", "response": "x", "reference": "y"}, GraderError("math_exact", "t", code="TIMEOUT")
    )
    assert engine.whole_chunks([cheap])
    assert not engine.whole_chunks([risky]) and not engine.whole_chunks([cheap, risky])
    cached.note_sample(cheap, {"response": "x"}, GraderError("json_validator", "bad", code="GRADER_FAILED"))
    assert engine.whole_chunks([cheap])  # only TIMEOUT and WORKER_LOST are quarantined


def test_a_kept_resolution_is_planned_again_each_call():
    """`Engine.resolve_keyed` keeps a call's graders by key (a trainer names the same graders in every call) but
    makes the plan again each call: a grader whose inputs were quarantined since is filtered from then on."""
    registry = get_registry()
    cached = CachedGrading(ResultCache(1 << 20, 60), Quarantine(1 << 20, 60))
    engine = Engine(registry, cached=cached)
    first = engine.resolve_keyed(b"math", lambda: [SpecData(name="math_exact")], cache=CacheMode.OFF)
    assert first.together is not None and not first.groups[0].filtered
    sample = {"sample_id": "1", "response": "x", "reference": "y"}
    cached.note_sample(first[0], sample, GraderError("math_exact", "t", code="TIMEOUT"))

    def resolved_again() -> list[SpecData]:
        raise AssertionError("the kept resolution was not used")

    again = engine.resolve_keyed(b"math", resolved_again, cache=CacheMode.OFF)
    assert again[0].grader is first[0].grader
    assert again.together is None and again.groups[0].filtered
    other = engine.resolve_keyed(b"json", lambda: [SpecData(name="json_validator")], cache=CacheMode.OFF)
    assert other[0].grader.name == "json_validator"


def test_a_quarantined_input_with_a_lone_surrogate_can_be_listed():
    """The HTTP face's JSON may carry a lone surrogate ("\\udc80"), which protobuf strings cannot hold: the
    quarantine's preview of such an input has U+FFFD in its place, so ListQuarantine can still answer."""
    quarantine = Quarantine(1 << 20, 60)
    grader = get_registry().build("math_exact", {})
    scope = scope_of(grader, {})
    error = GraderError("math_exact", "ran past its time limit", code="TIMEOUT")
    quarantine.add(b"k" * 16, error, scope, {"response": "12\udc80", "reference": "12"}, inputs_of(grader), 1.0)
    ((_, entry),) = quarantine.items()
    listed = admin_pb2.QuarantineEntry(preview=entry.value.preview)
    assert "12\N{REPLACEMENT CHARACTER}" in listed.preview


def test_the_async_client_has_the_admin_calls(guarded, token):
    async def run() -> tuple[bool, int, int]:
        async with AsyncGradingClient(guarded.target, token=token, timeout=30) as client:
            await client.evaluate(
                {"response": "hang"}, [{"name": "misbehave", "params": {"heavy": True}}], grader_timeout=0.5
            )
            listing = await client.list_quarantine("misbehave")
            return listing.enabled, len(listing.entries), await client.clear_quarantine("misbehave")

    enabled, listed, cleared = asyncio.run(run())
    assert enabled and listed >= 1 and cleared == listed
