"""Errors a caller can act on: the client raises the `GradingError` family (code, details, the server, the
grader or reward), against real servers; a server that goes away is retried for `unavailable_seconds`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import grpc
import pytest

from grpcgrade.client import AsyncGradingClient, GradingClient, SampleColumns, UnsendableSample
from grpcgrade.errors import GradingError, InvalidRequest, ServerUnavailable, UnknownName
from grpcgrade.testing import free_port, start_server


def test_an_unknown_grader_is_a_typed_error_naming_it_and_the_server(client, server):
    with pytest.raises(UnknownName) as caught:
        client.evaluate({"response": "x"}, ["json_validatr"])
    error = caught.value
    assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.NOT_FOUND
    assert error.grader == "json_validatr" and server.target in str(error)
    assert "did you mean 'json_validator'" in error.details()


def test_a_grader_of_a_plugin_that_failed_to_load_names_the_plugin_and_its_error(client):
    with pytest.raises(UnknownName) as caught:
        client.evaluate({"response": "x"}, ["no_such_grader"])
    # tests/plugins/grpcgrade-broken imports a module that does not exist
    assert "plugin 'broken' failed to load" in caught.value.details()
    assert "ModuleNotFoundError" in caught.value.details() or "No module named" in caught.value.details()


def test_bad_params_are_an_invalid_request_naming_the_grader(client):
    with pytest.raises(InvalidRequest) as caught:
        client.evaluate({"response": "x", "reference": "x"}, [{"name": "string_match", "params": {"algorithm": "?"}}])
    assert caught.value.grader == "string_match"


def test_one_grader_given_as_a_string_is_one_grader(client):
    (result,) = client.batch_evaluate([{"response": "{}"}], graders="json_validator")
    assert [r.grader for r in result.results] == ["json_validator"]
    assert [r.grader for r in client.evaluate({"response": "{}"}, "json_validator").results] == ["json_validator"]
    client.check("json_validator")  # not five graders named j, s, o, n, ...


def test_params_given_as_json_text_are_refused_naming_the_grader(client):
    with pytest.raises(TypeError, match=r"grader 'similarity': params must be a mapping, not str .*json.loads"):
        spec = {"name": "similarity", "params": '{"algorithm": "bleu"}'}
        client.evaluate({"response": "a", "reference": "a"}, [spec])


def test_an_unknown_reward_lists_the_configured_ones(client):
    with pytest.raises(UnknownName) as caught:
        client.evaluate({"response": "x"}, reward="gsm9k")
    assert caught.value.reward == "gsm9k" and "configured rewards: " in caught.value.details()
    assert "'gsm8k'" in caught.value.details()


def test_an_unknown_reward_on_a_server_without_rewards_says_how_to_configure_them(tmp_path):
    srv = start_server(tmp_path, "--workers", "0")
    try:
        with srv.client() as client, pytest.raises(UnknownName, match="no rewards configured .*--config"):
            client.evaluate({"response": "x"}, reward="gsm8k")
    finally:
        srv.stop()


def test_no_server_is_retried_for_unavailable_seconds_then_a_typed_error_names_it():
    target = f"127.0.0.1:{free_port()}"
    client = GradingClient(target, unavailable_seconds=1.0, timeout=5)
    with client, pytest.raises(ServerUnavailable) as caught:
        client.batch_evaluate([{"response": "x"}], ["json_validator"])
    error = caught.value
    assert isinstance(error, GradingError) and error.target == target and target in str(error)
    assert "unavailable_seconds" in error.details()


def test_a_server_that_starts_within_unavailable_seconds_answers_the_call(tmp_path):
    """A rolling restart: the call is made while no server listens, and the server comes up meanwhile."""
    port = free_port()
    answers: list[object] = []

    def call() -> None:
        with GradingClient(f"127.0.0.1:{port}", unavailable_seconds=120, timeout=10) as client:
            try:
                answers.append(client.evaluate({"response": "{}"}, ["json_validator"]))
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                answers.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.5)  # the call is retrying by now (its first attempt is refused at once)
    cmd = [sys.executable, "-m", "grpcgrade.cli", "serve", "--port", str(port), "--workers", "0"]
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        thread.join(120)
    finally:
        proc.terminate()
        proc.wait(30)
    (answer,) = answers
    assert not isinstance(answer, Exception), answer
    assert answer.results[0].score == 1.0


def test_an_http_url_target_is_its_address_and_https_is_refused(client, server):
    with GradingClient(f"http://{server.target}/") as by_url:
        assert by_url.evaluate({"response": "{}"}, ["json_validator"]).results[0].score == 1.0
    with pytest.raises(ValueError, match="HTTPS URL; give host:port and TLS as credentials="):
        GradingClient(f"https://{server.target}")


@pytest.mark.parametrize("target", ["localhost:99999", "127.0.0.1:0", "[::1]:65536", "http://localhost:70000/"])
def test_a_port_past_65535_is_refused_not_taken_modulo(target):
    """gRPC takes a target's port modulo 65536 (`localhost:99999` connected to port 34463, whatever listens
    there); the client refuses it, naming the target, as `serve --port` refuses such a port."""
    with pytest.raises(ValueError, match=r"the port must be from 1 to 65535"):
        GradingClient(target)
    with pytest.raises(ValueError, match=r"the port must be from 1 to 65535"):
        GradingClient(["127.0.0.1:50051", target])


@pytest.mark.parametrize("target", ["localhost", "localhost:", ":50051", "::::", "a b:50051", "::1:50051", "h:1/x"])
def test_a_target_that_is_neither_host_port_nor_a_grpc_name_is_refused_at_once(target):
    """gRPC took `localhost` (no port) as port 443, and retried a malformed target ('::::', a name with a
    space) for the client's `unavailable_seconds` before UNAVAILABLE; the client refuses it, naming it."""
    with pytest.raises(ValueError, match=r"is not host:port, \[ipv6\]:port or a gRPC name") as caught:
        GradingClient(target)
    assert repr(target) in str(caught.value)


def test_a_list_of_targets_must_resolve_to_one_address_family():
    """A list is balanced over IP addresses of one family (gRPC's `ipv4:` / `ipv6:` lists): a name that does
    not resolve, a gRPC name, or IPv4 beside IPv6 is a ValueError when the client is made (before: UNKNOWN,
    "the target uri is not valid", at the first call)."""
    with pytest.raises(ValueError, match="'no-such-host.invalid' does not resolve"):
        GradingClient(["no-such-host.invalid:50051", "127.0.0.1:50051"])
    with pytest.raises(ValueError, match="a list holds host:port addresses, not gRPC names"):
        GradingClient(["dns:///a:50051", "127.0.0.1:50051"])
    with pytest.raises(ValueError, match="mix IPv4 and IPv6 addresses"):
        GradingClient(["127.0.0.1:50051", "[::1]:50051"])


@pytest.mark.parametrize(
    ("option", "value", "error", "message"),
    [
        # each failed late and in other words: range()'s "arg 3 must not be zero", "server returned no
        # result" (a negative chunk), a ThreadPoolExecutor's, gRPC's RESOURCE_EXHAUSTED at the first call...
        ("chunk_size", 0, ValueError, "chunk_size must be at least 1, got 0"),
        ("chunk_size", -1, ValueError, "chunk_size must be at least 1, got -1"),
        ("chunk_size", 2.5, TypeError, "chunk_size must be a whole number, not float"),
        ("max_in_flight", 0, ValueError, "max_in_flight must be at least 1"),
        ("max_message_bytes", 0, ValueError, "max_message_bytes must be at least 1"),
        # ...and gRPC took an infinite or NaN deadline as one already past: every call DEADLINE_EXCEEDED
        ("timeout", float("inf"), ValueError, "timeout must be a finite number of seconds > 0, got inf"),
        ("timeout", float("nan"), ValueError, "timeout must be a finite number of seconds > 0, got nan"),
        ("timeout", -1, ValueError, "timeout must be a finite number of seconds > 0"),
        ("timeout", "60", TypeError, "timeout must be a number of seconds, not str"),
        ("unavailable_seconds", -1, ValueError, "unavailable_seconds must be a finite number of seconds >= 0"),
        ("gc_pause", float("inf"), ValueError, "gc_pause must be a finite number of seconds >= 0"),
        # gRPC failed every call INTERNAL ("Invalid metadata"); the message never shows the token
        ("token", "s3cret\n", ValueError, "token must be printable ASCII (it travels as gRPC metadata)"),
        ("caller", "équipe", ValueError, "caller must be printable ASCII"),
    ],
)
def test_a_client_option_out_of_range_is_refused_naming_it(option, value, error, message):
    for client in (GradingClient, AsyncGradingClient):
        with pytest.raises(error) as caught:
            client("127.0.0.1:50051", **{option: value})
        assert message in str(caught.value) and "s3cret" not in str(caught.value)


def test_a_calls_own_timeout_is_checked_as_the_clients_is(client):
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds > 0, got inf"):
        client.evaluate({"response": "{}"}, J, timeout=float("inf"))
    assert client.evaluate({"response": "{}"}, J, timeout=30).results[0].score == 1.0


@pytest.mark.parametrize("target", ["localhost:65535", "[::1]:1", "dns:///grpcgrade.ns.svc:50051", "unix:/tmp/s"])
def test_targets_with_a_port_in_range_or_a_grpc_name_are_taken(target):
    GradingClient(target).close()  # no connection is made until a call


# A sample or grader the client cannot send is refused by a TypeError or ValueError that names it: before,
# these were Python's or protobuf's words from deep in the writing ("'str' object has no attribute 'get'",
# "'int' object is not iterable", "Unexpected type", "unhashable type: 'slice'"), naming no sample or field.
J = ["json_validator"]
OK = [{"response": "a"}] * 5
CANNOT_SEND = [
    (
        lambda c: c.evaluate("x", J),
        TypeError,
        "the sample must be a mapping of its fields or a Sample message, not str",
    ),
    (
        lambda c: c.evaluate({"response": "x"}, 123),
        TypeError,
        "graders must be a grader (a name, a mapping with 'name', a GraderSpec) or a list of them, not int",
    ),
    (
        lambda c: c.evaluate({"response": "x"}, [7]),
        TypeError,
        "a grader is a name, a mapping with 'name', or a GraderSpec, not int",
    ),
    (
        lambda c: c.evaluate({"response": "x"}, [{"params": {}}]),
        TypeError,
        "a grader mapping needs a 'name' (a str), got NoneType None",
    ),
    (
        lambda c: c.evaluate({"response": "x"}, [{"name": "json_validator", "weight": "heavy"}]),
        ValueError,
        "grader 'json_validator': weight must be a number, got str 'heavy'",
    ),
    (
        lambda c: c.evaluate({"response": "x"}, [{"name": "similarity", "params": {"a": object()}}]),
        ValueError,
        "grader 'similarity': params must hold only JSON values",
    ),
    (
        lambda c: c.evaluate({"response": "\ud800"}, J),
        ValueError,
        "the sample, field 'response': text that UTF-8 cannot encode (surrogates not allowed at position 0)",
    ),
    (lambda c: c.evaluate({"response": "x", "extra": {"a": object()}}, J), ValueError, "the sample, field 'extra': "),
    (lambda c: c.evaluate({"response": "x", "tag": object()}, J), ValueError, "the sample, field 'tag': "),
    # the third chunk of 2: numbered in its batch, after the first two chunks were graded
    (
        lambda c: c.batch_evaluate([*OK, "b"], J),
        TypeError,
        "sample 5 must be a mapping of its fields or a Sample message",
    ),
    (
        lambda c: list(c.evaluate_stream(iter([*OK, {"response": 10**5000}]), J)),
        ValueError,
        "sample 5, field 'response': Exceeds the limit (4300 digits)",
    ),
    (
        lambda c: c.batch_scores({"response": "x"}, J),
        TypeError,
        "samples must be a list of samples (mappings or Sample messages) or SampleColumns, not dict: for one "
        "sample, pass [sample] or call evaluate(sample)",
    ),
]


@pytest.mark.parametrize(("call", "error", "message"), CANNOT_SEND)
def test_a_sample_or_grader_the_client_cannot_send_is_named(server, call, error, message):
    with GradingClient(server.target, chunk_size=2, timeout=60) as client, pytest.raises(error) as caught:
        call(client)
    assert message in str(caught.value)
    assert not isinstance(caught.value, GradingError)
    if "sample" in message and "samples must" not in message:  # a sample's fault: typed, with its place
        assert isinstance(caught.value, UnsendableSample)
        assert caught.value.index == (None if message.startswith("the sample") else 5)


# `batch_scores`, a trainer's call, masks a sample it cannot send instead of failing the step: the others
# are graded (JSON objects: json_validator's 1.0), its reward and scores are None, `unsent` says why. It
# raised, as `batch_evaluate` does (the training step ended on one odd sample of its data).
VALID = [{"response": f'{{"k": {i}}}'} for i in range(5)]
MASKED = [
    (lambda: [*VALID, {"response": "b", "x": {1}}], "sample 5, field 'x': "),
    (lambda: [*VALID, {"response": "\ud800"}], "sample 5, field 'response': text that UTF-8"),  # texts: columns
    (
        lambda: SampleColumns.of_text({"response": [s["response"] for s in VALID] + ["\ud800"]}),
        "sample 5, field 'response': text that UTF-8 cannot encode",
    ),
    (lambda: [{"response": "\udc80"}, *VALID[:2], {"response": 10**5000}, *VALID[2:]], "sample 0, field"),
]


@pytest.mark.parametrize(("samples", "message"), MASKED)
def test_batch_scores_masks_a_sample_it_cannot_send_and_grades_the_others(server, samples, message, caplog):
    batch = samples()
    bad = [i for i in range(len(batch)) if i not in (good := [i for i, s in enumerate(batch) if s in VALID])]
    with GradingClient(server.target, chunk_size=2, timeout=60) as client:
        table = client.batch_scores(batch, J)
    assert [table.rewards[i] for i in good] == [1.0] * 5
    assert [table.rewards[i] for i in bad] == [None] * len(bad) and table.masked == len(bad)
    assert [table.scores["json_validator"][i] for i in bad] == [None] * len(bad)
    assert sorted(table.unsent) == bad and message in table.unsent[bad[0]]
    assert f"{len(bad)} of {len(batch)} samples cannot be sent and are masked" in caplog.text

    async def awaited():
        async with AsyncGradingClient(server.target, chunk_size=2, timeout=60) as client:
            return await client.batch_scores(batch, J)

    table = asyncio.run(awaited())
    assert table.rewards == [1.0 if i in good else None for i in range(len(batch))]
    assert sorted(table.unsent) == bad
