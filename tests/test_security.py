"""Access control against real servers: bearer tokens, TLS, mutual TLS, and where the metrics port listens.

Certificates come from the `openssl` command line, made fresh for the module (the `pki` fixture,
tests/pki.py): a CA, a server certificate for 127.0.0.1 and localhost, a client certificate from that CA,
and a CA and client certificate that the server has never heard of.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from pki import Pki

from grpcgrade.client import GradingClient
from grpcgrade.testing import ServerProcess, health_status, memory_kib, start_server
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent

SAMPLE = pb.Sample(id="s", response='{"a": 1}')
COMMENT = "tokens-for-the-trainers"  # a comment line of the token file, which is no token
GRADERS = [pb.GraderSpec(name="json_validator")]


# -- bearer tokens -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokens() -> list[str]:
    return [secrets.token_urlsafe(24), secrets.token_urlsafe(24)]


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory, tokens: list[str]) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("auth")
    token_file = tmp / "tokens"
    # CRLF, a blank line, padding, a comment: as files come
    token_file.write_text(f"# {COMMENT}\n{tokens[0]}\r\n\n  {tokens[1]}  \n")
    srv = start_server(tmp, "--workers", "0", "--auth-token-file", str(token_file), "--log-level", "debug")
    yield srv
    srv.stop()


#: Every method of GradingService, from the contract: a method added there is called here, or the tests fail.
METHODS = tuple(m.name for m in pb.DESCRIPTOR.services_by_name["GradingService"].methods)


def _call_each_method(target: str, metadata: tuple[tuple[str, str], ...]) -> dict[str, grpc.StatusCode]:
    """The status of each GradingService method called with `metadata`."""
    codes = {}
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GradingServiceStub(channel)
        calls = {
            "Evaluate": lambda: stub.Evaluate(
                pb.EvaluateRequest(graders=GRADERS, sample=SAMPLE), timeout=10, metadata=metadata
            ),
            "BatchEvaluate": lambda: list(
                stub.BatchEvaluate(
                    pb.BatchEvaluateRequest(graders=GRADERS, samples=[SAMPLE] * 3), timeout=10, metadata=metadata
                )
            ),
            "BatchEvaluateUnary": lambda: stub.BatchEvaluateUnary(
                pb.BatchEvaluateUnaryRequest(batch=pb.BatchEvaluateRequest(graders=GRADERS, samples=[SAMPLE] * 3)),
                timeout=10,
                metadata=metadata,
            ),
            "ListGraders": lambda: stub.ListGraders(pb.ListGradersRequest(), timeout=10, metadata=metadata),
        }
        assert set(calls) == set(METHODS)
        for name, call in calls.items():
            try:
                call()
                codes[name] = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                codes[name] = exc.code()
    return codes


@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer not-a-token",
        "Basic {token}",
        "{token}",
        "Bearer",
        "Bearer {token}x",
        "Bearer {prefix}",
        f"Bearer # {COMMENT}",
    ],
    ids=[
        "no-header",
        "wrong-token",
        "basic-scheme",
        "no-scheme",
        "empty-token",
        "token-plus-char",
        "token-prefix",
        "comment-line",
    ],
)
def test_calls_without_a_valid_bearer_token_are_unauthenticated(auth_server, tokens, header):
    metadata = () if header is None else (("authorization", header.format(token=tokens[0], prefix=tokens[0][:-1])),)
    codes = _call_each_method(auth_server.target, metadata)
    assert codes == dict.fromkeys(METHODS, grpc.StatusCode.UNAUTHENTICATED)


def test_a_refused_call_is_not_parsed(auth_server):
    """A BatchEvaluate of 1.5 million tiny samples (7.5 MB) with no token: refused on its metadata, its
    body dropped unparsed. Parsed, its samples would take the server's peak memory up by well over 100 MB."""
    sample = pb.Sample(response="x").SerializeToString()
    body = (b"\x12" + bytes([len(sample)]) + sample) * 1_500_000  # field 2 (samples), length-delimited
    before = memory_kib(auth_server.proc.pid, "VmHWM")
    with grpc.insecure_channel(auth_server.target, options=[("grpc.max_send_message_length", 1 << 25)]) as channel:
        call = channel.unary_stream("/grpcgrade.v1.GradingService/BatchEvaluate")  # bytes as they are
        with pytest.raises(grpc.RpcError) as err:
            list(call(body, timeout=30))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert memory_kib(auth_server.proc.pid, "VmHWM") - before < 40_000


def test_a_request_id_is_logged_safe_and_short(auth_server, tokens):
    unsafe = "id with spaces;" + "x" * 5000  # spaces would let a caller forge a log line's fields
    metadata = (("authorization", f"Bearer {tokens[0]}"), ("x-request-id", unsafe))
    with grpc.insecure_channel(auth_server.target) as channel:
        pb_grpc.GradingServiceStub(channel).ListGraders(pb.ListGradersRequest(), timeout=10, metadata=metadata)
    logged = [line for line in auth_server.log().splitlines() if "request_id=id" in line]
    assert logged, auth_server.log()[-2000:]
    request_id = logged[-1].split("request_id=")[1].split()[0]
    assert request_id == "id_with_spaces_" + "x" * 49  # 64 characters, spaces and ; replaced


@pytest.mark.parametrize("which", [0, 1])
def test_every_token_in_the_file_is_accepted(auth_server, tokens, which):
    codes = _call_each_method(auth_server.target, (("authorization", f"Bearer {tokens[which]}"),))
    assert codes == dict.fromkeys(METHODS, grpc.StatusCode.OK)
    with auth_server.client(token=tokens[which]) as client:
        assert client.evaluate({"response": "[1, 2]"}, ["json_validator"]).results[0].score == 1.0
        replies = client.batch_evaluate([{"response": "{"}, {"response": "null"}], ["json_validator"])
        assert [r.results[0].score for r in replies] == [0.0, 1.0]


@pytest.mark.parametrize(("header", "code"), [(None, "UNAUTHENTICATED"), ("Bearer {token}", "INVALID_ARGUMENT")])
def test_authentication_comes_before_parsing(auth_server, tokens, header, code):
    """Bytes that do not parse tell an unauthenticated caller nothing but UNAUTHENTICATED."""
    raw = pb.EvaluateRequest(graders=GRADERS, sample=pb.Sample(response="XYZ")).SerializeToString()
    metadata = () if header is None else (("authorization", header.format(token=tokens[0])),)
    with grpc.insecure_channel(auth_server.target) as channel:
        call = channel.unary_unary("/grpcgrade.v1.GradingService/Evaluate", request_serializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as err:
            call(raw.replace(b"XYZ", b"\xffYZ"), timeout=10, metadata=metadata)
    assert err.value.code().name == code


def test_health_check_needs_no_token(auth_server):
    assert health_status(auth_server.target) == health_pb2.HealthCheckResponse.SERVING
    assert health_status(auth_server.target, "grpcgrade.v1.GradingService") == health_pb2.HealthCheckResponse.SERVING


def test_tokens_never_reach_the_log_even_at_debug_level(auth_server, tokens):
    near_miss = tokens[0][:-1] + ("A" if tokens[0][-1] != "A" else "B")
    for header in (f"Bearer {near_miss}", f"Basic {tokens[1]}", tokens[0]):
        assert _call_each_method(auth_server.target, (("authorization", header),))["Evaluate"] == (
            grpc.StatusCode.UNAUTHENTICATED
        )
    for token in tokens:
        assert _call_each_method(auth_server.target, (("authorization", f"Bearer {token}"),))["ListGraders"] == (
            grpc.StatusCode.OK
        )
    log = auth_server.log()
    assert "code=UNAUTHENTICATED" in log and "code=OK" in log  # the calls were logged, at debug level too
    for secret in (*tokens, near_miss):
        assert secret not in log


# -- TLS and mutual TLS --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    srv = start_server(
        tmp_path_factory.mktemp("tls"),
        "--workers",
        "0",
        "--tls-cert",
        pki.path("server.crt"),
        "--tls-key",
        pki.path("server.key"),
        credentials=pki.credentials(),
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    srv = start_server(
        tmp_path_factory.mktemp("mtls"),
        "--workers",
        "0",
        "--tls-cert",
        pki.path("server.crt"),
        "--tls-key",
        pki.path("server.key"),
        "--tls-client-ca",
        pki.path("ca.crt"),
        credentials=pki.credentials(client="client"),
    )
    yield srv
    srv.stop()


def _evaluate(target: str, credentials: grpc.ChannelCredentials | None) -> pb.EvaluateResponse:
    with GradingClient(target, credentials=credentials, timeout=10) as client:
        return client.evaluate({"response": "[]"}, ["json_validator"])


def _refused(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """The status of a call on a bare channel (the client's retries of UNAVAILABLE would only add time)."""
    channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    with channel, pytest.raises(grpc.RpcError) as err:
        pb_grpc.GradingServiceStub(channel).Evaluate(pb.EvaluateRequest(graders=GRADERS, sample=SAMPLE), timeout=10)
    return err.value.code()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_tls_client_trusting_the_ca_is_served(tls_server, pki, host):
    assert _evaluate(f"{host}:{tls_server.port}", pki.credentials()).results[0].score == 1.0


def test_tls_server_refuses_plaintext_and_untrusted_clients(tls_server, pki):
    assert _refused(tls_server.target, None) == grpc.StatusCode.UNAVAILABLE
    # A client that does not trust the server's CA refuses the server: the server is authenticated.
    assert _refused(tls_server.target, pki.credentials(trust="other-ca")) == grpc.StatusCode.UNAVAILABLE
    assert _evaluate(tls_server.target, pki.credentials()).results[0].score == 1.0  # still up


def test_mutual_tls_requires_a_client_certificate_from_the_ca(mtls_server, pki):
    assert _evaluate(mtls_server.target, pki.credentials(client="client")).results[0].score == 1.0
    assert _refused(mtls_server.target, pki.credentials()) == grpc.StatusCode.UNAVAILABLE
    assert _refused(mtls_server.target, pki.credentials(client="stranger")) == grpc.StatusCode.UNAVAILABLE
    assert _refused(mtls_server.target, None) == grpc.StatusCode.UNAVAILABLE
    assert _evaluate(mtls_server.target, pki.credentials(client="client")).results[0].score == 1.0  # still up


# -- metrics bind address ------------------------------------------------------------------------------


def _metrics_answer(host: str, port: int) -> bool:
    """True when a Prometheus exposition answers at host:port; False when the connection is refused."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as reply:
            body = reply.read().decode()
    except urllib.error.URLError as exc:
        assert isinstance(exc.reason, ConnectionRefusedError), exc
        return False
    assert "grpcgrade_build_info" in body
    return True


def test_metrics_listen_on_loopback_by_default(auth_server):
    assert _metrics_answer("127.0.0.1", auth_server.metrics_port)
    assert not _metrics_answer("127.0.0.2", auth_server.metrics_port)  # not on every interface


def test_metrics_host_flag_moves_the_endpoint(tmp_path):
    srv = start_server(tmp_path, "--workers", "0", "--metrics-host", "127.0.0.2")
    try:
        assert _metrics_answer("127.0.0.2", srv.metrics_port)
        assert not _metrics_answer("127.0.0.1", srv.metrics_port)
    finally:
        srv.stop()


def test_the_token_file_example_in_the_docs_reads_as_two_tokens(tmp_path):
    from grpcgrade.service.options import read_tokens as _tokens

    page = (Path(__file__).resolve().parent.parent / "docs" / "security.md").read_text()
    example = page.split("```text\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "tokens"
    path.write_text(example)
    assert _tokens(str(path)) == [line.strip() for line in example.splitlines()[1:] if line.strip()]
    assert len(_tokens(str(path))) == 2


# -- the command line's connection options ---------------------------------------------------------------


def grpcgrade(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GRPCGRADE_")}
    return subprocess.run(
        [sys.executable, "-m", "grpcgrade", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **(env or {})},
    )


def healthcheck() -> list[str]:
    """The Dockerfile's HEALTHCHECK command (exec form)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return json.loads(re.search(r"^HEALTHCHECK .*? CMD (\[.*\])$", text, re.M).group(1))


def test_cli_health_and_graders_over_mutual_tls(mtls_server, pki):
    tls = ["--tls-ca", pki.path("ca.crt"), "--tls-cert", pki.path("client.crt"), "--tls-key", pki.path("client.key")]
    health = grpcgrade("health", "--target", mtls_server.target, *tls)
    assert (health.returncode, health.stdout.strip()) == (0, "SERVING"), health.stderr
    listing = grpcgrade("graders", "--json", "--target", mtls_server.target, *tls)
    assert listing.returncode == 0, listing.stderr
    assert "json_validator" in {g["name"] for g in json.loads(listing.stdout)["graders"]}
    plain = grpcgrade("health", "--target", mtls_server.target, "--timeout", "2")
    assert plain.returncode == 1 and "--tls-ca" in plain.stderr and "Traceback" not in plain.stderr


def test_docker_healthcheck_reaches_a_tls_server_through_the_environment(tls_server, mtls_server, pki):
    """The image's HEALTHCHECK command, with the variables docs/cli.md tells a TLS deployment to set."""
    command = healthcheck()
    assert command[:2] == ["grpcgrade", "health"] and "--target" not in command  # GRPCGRADE_TARGET decides
    run = [sys.executable, "-m", "grpcgrade", *command[1:]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPCGRADE_")}

    def check(target: str, **variables: str) -> int:
        return subprocess.run(run, env={**env, "GRPCGRADE_TARGET": target, **variables}, capture_output=True).returncode

    assert check(tls_server.target) == 1  # plaintext to a TLS server
    assert check(tls_server.target, GRPCGRADE_TLS_CA=pki.path("ca.crt")) == 0
    client = {"GRPCGRADE_TLS_CERT": pki.path("client.crt"), "GRPCGRADE_TLS_KEY": pki.path("client.key")}
    assert check(mtls_server.target, GRPCGRADE_TLS_CA=pki.path("ca.crt")) == 1  # no client certificate
    assert check(mtls_server.target, GRPCGRADE_TLS_CA=pki.path("ca.crt"), **client) == 0


def test_cli_sends_the_token_from_a_file(auth_server, tokens, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(f"\n{tokens[1]}\n")
    source = tmp_path / "in.jsonl"
    source.write_text('{"response": "[]"}\n')
    out = grpcgrade("eval", str(source), "--grader", "json_validator", "--target", auth_server.target, "-q",
                    "--auth-token-file", str(token_file))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["results"][0]["score"] == 1.0
    refused = grpcgrade("graders", "--target", auth_server.target)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr and "--auth-token-file" in refused.stderr
    assert "Traceback" not in refused.stderr
