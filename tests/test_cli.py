"""The `grpcgrade` command, run as a user runs it."""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shlex
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from grpcgrade import __version__
from grpcgrade.cli import build_parser
from grpcgrade.testing import free_port

ROOT = Path(__file__).resolve().parent.parent


def grpcgrade(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = env if env is not None else {k: v for k, v in os.environ.items() if not k.startswith("GRPCGRADE_")}
    return subprocess.run(
        [sys.executable, "-m", "grpcgrade", *args], capture_output=True, text=True, timeout=120, env=base
    )


def test_version():
    out = grpcgrade("version")
    assert out.returncode == 0 and out.stdout.strip() == f"grpcgrade {__version__}"


def test_graders_json_lists_built_ins_with_params():
    out = grpcgrade("graders", "--json")
    assert out.returncode == 0, out.stderr
    graders = {g["name"]: g for g in json.loads(out.stdout)["graders"]}
    assert {"json_validator", "similarity", "think_format", "math_verify"} <= set(graders)
    params = {p["name"]: p for p in graders["ngram_repetition_penalty"]["params"]}
    assert params["n"]["default"] == 3 and params["tokenizer_type"]["default"] == "tiktoken"


def test_eval_grades_a_jsonl_file_through_a_server(server, tmp_path):
    rows = [{"id": "a", "response": '{"x": 1}'}, {"id": "b", "response": "{nope"}, {"id": "c", "response": "[]"}]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = grpcgrade(
        "eval", str(source), "--grader", "json_validator", "--target", server.target, "-o", str(tmp_path / "out.jsonl")
    )
    assert out.returncode == 0, out.stderr
    assert "3/3" in out.stderr  # the progress bar's last state
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(x["id"], x["results"][0]["score"], x["reward"]) for x in lines] == [
        ("a", 1.0, 1.0),
        ("b", 0.0, 0.0),
        ("c", 1.0, 1.0),
    ]
    assert [x["sample"] for x in lines] == rows


def test_eval_with_params_and_health(server, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"response": "abc", "reference": "abd"}) + "\n")
    out = grpcgrade(
        "eval",
        str(source),
        "--grader",
        "similarity",
        "--params",
        '{"algorithm": "edit_distance"}',
        "--target",
        server.target,
        "-q",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["results"][0]["score"] == 1 - 1 / 3  # one substitution in three characters
    health = grpcgrade("health", "--target", server.target)
    assert health.returncode == 0 and health.stdout.strip() == "SERVING"


def test_health_fails_when_nothing_listens():
    from grpcgrade.testing import free_port

    out = grpcgrade("health", "--target", f"127.0.0.1:{free_port()}", "--timeout", "0.5")
    assert out.returncode == 1 and "unhealthy" in out.stderr


# -- errors are messages ---------------------------------------------------------------------------------


def no_traceback(out: subprocess.CompletedProcess) -> None:
    """A message of a line or two (besides the usage text and the progress bar's lines)."""
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.replace("\r", "\n").splitlines() if line.strip() and "samples/s" not in line]
    assert 0 < len(lines) <= 2 or out.stderr.startswith("usage:"), out.stderr


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_option_of_every_command_has_help():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"serve", "graders", "eval", "health", "bench", "new-plugin", "version"} <= set(sub.choices)
    missing = [
        f"{name} {'/'.join(a.option_strings) or a.dest}"
        for name, command in sub.choices.items()
        for a in command._actions
        if not isinstance(a, argparse._HelpAction) and not (a.help and a.help.strip())
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "/no/such/file.jsonl", "--grader", "json_validator"], "/no/such/file.jsonl: No such file"),
        (["eval", "-", "-q"], "--grader NAME (repeatable) or --reward NAME"),
        (["eval", "-", "--params", "{}"], "--params must follow the --grader it is for"),
        (["eval", "-", "--grader", "similarity", "--params", "{nope"], "params of grader 'similarity' are not JSON"),
        (["eval", "-", "--grader", 'similarity:["bleu"]'], "params of grader 'similarity' must be a JSON object"),
        (["eval", "-", "--grader", "x", "--reward", "y"], "not both"),
        (
            ["eval", "-", "--grader", "x", "-o", "/no/such/dir/out.jsonl"],
            "-o /no/such/dir/out.jsonl: no such directory",
        ),
        (["eval", "-", "--grader", "x", "--chunk-size", "0"], "--chunk-size: must be at least 1, got 0"),
        (["health", "--timeout", "-1"], "--timeout: must be a number more than 0, got -1"),
        (["health", "--timeout", "inf"], "--timeout: must be a number more than 0, got inf"),
        # each of these was taken before: a server on port 34463, with no workers, draining for -5 s (its
        # exit warned of a negative time), grading under a NaN time limit; a traceback for inf and -5
        (["serve", "--port", "99999"], "--port: must be a port number, 0 to 65535, got 99999"),
        (["serve", "--http-port", "-1"], "--http-port: must be a port number, 0 to 65535, got -1"),
        (["serve", "--workers", "-1"], "--workers: must be 0 or more, got -1"),
        (["serve", "--grace", "-5"], "--grace: must be a number, 0 or more, got -5"),
        (["serve", "--grace", "inf"], "--grace: must be a number, 0 or more, got inf"),
        (["serve", "--grace", "1e12"], "--grace: must be at most 86400 seconds, got 1e12"),
        (["serve", "--grader-timeout", "nan"], "--grader-timeout: must be a number more than 0, got nan"),
        (["serve", "--http-processes", "0"], "--http-processes: must be at least 1, got 0"),
        (["serve", "--grpc-processes", "-1"], "--grpc-processes: must be 0 or more, got -1"),
        (["bench", "--samples", "-5"], "--samples: must be at least 1, got -5"),
        (["health", "--tls-cert", "/no/cert.pem"], "--tls-cert and --tls-key go together"),
        (["serve", "--config", "/no/such.yaml"], "--config /no/such.yaml: no such file"),
        # gRPC took a target without a port as port 443 and retried a malformed one until --timeout
        (["health", "--target", "localhost"], "--target: target 'localhost' is not host:port"),
        (["quarantine", "list", "--target", "::::"], "--target: target '::::' is not host:port"),
        (["eval", "/no/such.jsonl", "--grader", "json_validator", "--target", "a b:1"], "--target: target 'a b:1'"),
    ],
)
def test_usage_errors_exit_2_with_a_message(args, message):
    out = grpcgrade(*args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    no_traceback(out)


def test_serve_ray_without_ray_names_the_extra():
    """`--ray` where Ray is not installed: a usage error naming the grpcgrade[ray] extra, not the server's
    ImportError (Ray is hidden from the import system here, as on a machine without it)."""
    code = "import runpy, sys; sys.modules['ray'] = None; runpy.run_module('grpcgrade', run_name='__main__')"
    out = subprocess.run(
        [sys.executable, "-c", code, "serve", "--ray", "127.0.0.1:1"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2, out.stderr
    assert "--ray needs Ray" in out.stderr and "pip install 'grpcgrade[ray]'" in out.stderr
    no_traceback(out)


def test_debug_brings_the_traceback_back():
    args = ["eval", "/no/such/file.jsonl", "--grader", "json_validator"]
    assert "Traceback" in grpcgrade(*args, "--debug").stderr
    assert "Traceback" in grpcgrade(*args, env={**os.environ, "GRPCGRADE_DEBUG": "1"}).stderr


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "rewards: {r: {graders: [{name: json_validator, weight: heavy}]}}",
            "rewards.r.graders[0].weight: must be a number, got 'heavy'",
        ),
        (
            "rewards: {r: {graders: [{name: json_validator, wieght: 2}]}}",
            "rewards.r.graders[0]: unknown key 'wieght' (allowed: name, params, key, weight, gate)",
        ),
        ("limits: {max_samples: 10}", "limits: unknown key 'max_samples' (allowed: max_message_bytes,"),
        ("limits: {max_samples_per_batch: lots}", "limits.max_samples_per_batch: must be a whole number, got 'lots'"),
        (
            "rewardz: {}",
            "unknown key 'rewardz' (allowed: rewards, limits, grader_timeout_seconds, models, default_reward, http, "
            "grpc, canary, cache, quarantine, callers, tokenizer, coalesce_linger_seconds)",
        ),
        ("cache: {max_bytes: 0}", "cache.max_bytes: must be at least 1, got 0"),
        # both were served before: a reward no call can name, and one of two rewards named "5" dropped
        ('rewards: {"": [json_validator]}', "rewards: a reward needs a name, got ''"),
        ('rewards: {5: [json_validator], "5": [json_match]}', "rewards.5: a second reward named '5'"),
        ("cache: {enabled: 'no'}", "cache.enabled: must be true or false, got 'no'"),
        ("quarantine: {ttl: 60}", "quarantine: unknown key 'ttl' (allowed: enabled, max_bytes, ttl_seconds)"),
        ("quarantine: 60", "quarantine: must be a mapping (keys: enabled, max_bytes, ttl_seconds)"),
        ("rewards: {r: [json_validatr]}", "reward 'r': unknown grader 'json_validatr'; did you mean 'json_validator'"),
        (
            "rewards: {r: [{name: similarity, params: {algorithm: nope}}]}",
            "reward 'r': grader 'similarity', parameter 'algorithm': unknown algorithm 'nope'; supported: bleu",
        ),
        (
            "models: {judge: {base_url: 'http://127.0.0.1:9/v1', api_key_env: GRPCGRADE_TEST_NO_SUCH_KEY}}",
            "models: model 'judge': environment variable 'GRPCGRADE_TEST_NO_SUCH_KEY' (api_key_env) is not set",
        ),
    ],
)
def test_a_bad_config_names_the_file_the_key_and_what_is_allowed(tmp_path, config, message):
    path = tmp_path / "grpcgrade.yaml"
    path.write_text(config + "\n")
    out = grpcgrade("serve", "--port", "0", "--workers", "0", "--config", str(path))
    assert out.returncode == 2, out.stderr
    assert f"grpcgrade serve: {path}: " in out.stderr and message in out.stderr
    no_traceback(out)


@pytest.mark.parametrize("flag", ["--port", "--metrics-port", "--http-port"])
def test_serve_on_a_port_in_use_names_the_flag_and_the_port(flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {f: str(port if f == flag else free_port()) for f in ("--port", "--metrics-port", "--http-port")}
        out = grpcgrade("serve", "--workers", "0", *(x for pair in ports.items() for x in pair))
    assert out.returncode == 1
    assert f"grpcgrade serve: {flag} {port}: cannot listen on 127.0.0.1:{port}" in out.stderr
    assert f"pick another port with {flag}" in out.stderr
    assert "Failed to add port" not in out.stderr and "E0000" not in out.stderr  # grpc C core's own lines
    no_traceback(out)


def test_a_closed_pipe_is_not_a_traceback():
    """`grpcgrade graders --json | head`: the reader goes away before the output is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpcgrade", "graders", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # before the command has imported anything, let alone written
    stderr = proc.stderr.read().decode()
    assert proc.wait(60) == 1
    assert stderr == ""


def test_health_of_an_unknown_service_says_which_exist(server):
    out = grpcgrade("health", "--target", server.target, "--service", "nope")
    assert out.returncode == 1
    assert "no service 'nope'" in out.stderr and "'grpcgrade.v1.GradingService'" in out.stderr
    no_traceback(out)


@pytest.mark.parametrize(
    ("graders", "message"),
    [
        (["--grader", "nope"], "NOT_FOUND: unknown grader 'nope'"),
        (
            ["--grader", "similarity", "--params", '{"algorithm": "nope"}'],
            "INVALID_ARGUMENT: grader 'similarity', parameter 'algorithm': unknown algorithm 'nope'",
        ),
        (["--reward", "nope"], "NOT_FOUND: unknown reward 'nope'"),
    ],
)
def test_eval_refused_by_the_server_is_a_failed_run(server, tmp_path, graders, message):
    source = jsonl(tmp_path / "in.jsonl", [{"response": "x"}])
    out = grpcgrade("eval", str(source), *graders, "--target", server.target, "-q")
    assert out.returncode == 1
    assert f"grpcgrade eval: {server.target}: {message}" in out.stderr
    no_traceback(out)


# -- eval never destroys data ----------------------------------------------------------------------------


def test_a_bad_json_line_fails_the_run_names_the_line_and_keeps_the_old_output(server, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"response": "[]"}\n\n{"response": oops}\n')
    output = tmp_path / "out.jsonl"
    output.write_text("precious\n")
    out = grpcgrade("eval", str(source), "--grader", "json_validator", "--target", server.target, "-o", str(output))
    assert out.returncode == 1
    assert f"{source}, line 3: not JSON" in out.stderr
    no_traceback(out)
    assert output.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]  # no temporary file left


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"\xff\xfegarbage", "line 2: not UTF-8 text (byte 0xff at column 1)"),
        (b"[" * 100_000 + b"]" * 100_000, "line 2: not JSON this reader takes: nested too deeply"),
        (b'{"response": "\\ud800"}', "line 2: the sample, field 'response': text that UTF-8 cannot encode"),
        (
            b'{"response": "1", "extra": {"n": 1' + b"0" * 400 + b"}}",
            "line 2: the sample, field 'extra': int too large",
        ),
    ],
    ids=["not-utf8", "too-deep", "lone-surrogate", "huge-int"],
)
def test_an_input_line_eval_cannot_send_is_named(server, tmp_path, line, message):
    """Each ended before in a message naming neither the file nor the line (a UnicodeDecodeError, a
    RecursionError) or in protobuf's words ("surrogates not allowed", "int too large to convert")."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'\xef\xbb\xbf{"response": "[]"}\n' + line + b"\n")  # a BOM first: read as none
    out = grpcgrade("eval", str(source), "--grader", "json_validator", "--target", server.target, "-q")
    assert out.returncode == 1
    assert f"{source}, {message}" in out.stderr, out.stderr
    no_traceback(out)


def test_a_refused_run_keeps_the_old_output_and_a_good_one_replaces_it(server, tmp_path):
    source = jsonl(tmp_path / "in.jsonl", [{"response": "[]"}])
    output = tmp_path / "out.jsonl"
    output.write_text("precious\n")
    args = [str(source), "--target", server.target, "-o", str(output), "-q"]
    assert grpcgrade("eval", *args, "--grader", "nope").returncode == 1
    assert output.read_text() == "precious\n"
    assert grpcgrade("eval", *args, "--grader", "json_validator").returncode == 0
    (line,) = output.read_text().splitlines()
    assert json.loads(line)["results"][0]["score"] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def test_eval_streams_stdin_to_stdout_in_input_order(server):
    """Results come out while the input is still open: the test writes the rest only after reading the
    first results, so a command that read its whole input first would never answer (and time out here)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpcgrade", "eval", "-", "-o", "-", "--grader", "json_validator", "--chunk-size", "2",
         "--target", server.target, "-q"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:

        def read_line() -> dict:
            try:
                return json.loads(lines.get(timeout=60))
            except queue.Empty:
                raise AssertionError("no result while the input is open") from None

        first = [{"id": "a", "response": "[]"}, {"id": "b", "response": "{nope"}]
        proc.stdin.write("".join(json.dumps(r) + "\n" for r in first))
        proc.stdin.flush()
        got = [read_line(), read_line()]
        proc.stdin.write(json.dumps({"id": "c", "response": "{}"}) + "\n")
        proc.stdin.flush()
        got.append(read_line())
        proc.stdin.close()
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [(r["id"], r["results"][0]["score"]) for r in got] == [("a", 1.0), ("b", 0.0), ("c", 1.0)]


def test_params_per_grader(server, tmp_path):
    source = jsonl(
        tmp_path / "in.jsonl", [{"response": "abc", "reference": "abd"}, {"response": "ABC", "reference": "abc"}]
    )
    out = grpcgrade(
        "eval", str(source), "--target", server.target, "-q",
        "--grader", 'similarity:{"algorithm": "edit_distance"}',
        "--grader", "string_match", "--params", '{"case_sensitive": true}',
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    scores = [{r["key"]: r["score"] for r in json.loads(line)["results"]} for line in out.stdout.splitlines()]
    assert scores[0]["similarity"] == 1 - 1 / 3  # one substitution in three characters
    assert scores[1]["string_match"] == 0.0  # case-sensitive: "ABC" is not "abc" (the default would say 1.0)


def test_progress_shows_count_rate_and_eta(server, tmp_path):
    source = jsonl(tmp_path / "in.jsonl", [{"response": "[]"}] * 5)
    out = grpcgrade("eval", str(source), "--grader", "json_validator", "--target", server.target, "--chunk-size", "2",
                    "-o", str(tmp_path / "out.jsonl"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    final = out.stderr.replace("\r", "\n").strip().splitlines()[-1]
    assert re.search(r"5/5 \[\d\d:\d\d<\d\d:\d\d, +[\d.]+ samples/s\]", final), final  # elapsed<ETA, rate


# -- graders says what the server serves -----------------------------------------------------------------


def test_graders_without_target_says_it_shows_this_installation(plugin_env):
    out = grpcgrade("graders", env={**os.environ, **plugin_env})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("The graders and plugins of this installation")
    assert "=null" not in out.stdout and "= null" not in out.stdout
    plugins = out.stdout.split("\nplugins:\n", 1)[1].split("\n\n")[0]
    assert "None" not in plugins
    # the clash: the losing plugin's status says so, and names the name and the winner
    (clash,) = [line for line in out.stdout.splitlines() if line.strip().startswith("clashing ")]
    assert "clashed: grader name 'string_match' is already registered by plugin 'text'" in clash


def test_graders_with_target_lists_params_plugins_and_rewards(server):
    out = grpcgrade("graders", "--target", server.target)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.splitlines()[0] == f"The graders, plugins and rewards of the server at {server.target}:"
    assert "n: int = 3," in text  # an int param's default as an int, not 3.0
    assert "rubric: str (required)" in text
    assert "=null" not in text and "= null" not in text and "= None" not in text
    plugins = text.split("\nplugins:\n", 1)[1].split("\nrewards:\n")[0]
    assert "None" not in plugins
    assert "  testplugin  grpcgrade-testplugin 0.3.1  loaded" in text
    rewards = text.split("\nrewards:\n", 1)[1].splitlines()
    rewards = rewards[rewards.index(next(r for r in rewards if r.startswith("  gsm8k: "))) :]
    assert rewards[:5] == [
        "  gsm8k: exact answer (x2), terse output, Kolibrify's think format, gated on 200 tokens",
        "    math_exact, weight 2",
        "    number_only",
        "    think_format",
        '    completion_length_cap, gate, params {"max_completion_tokens": 200, "min_reward": 0.2}',  # as in the YAML
    ]
    data = json.loads(grpcgrade("graders", "--json", "--target", server.target).stdout)
    params = {p["name"]: p for g in data["graders"] if g["name"] == "ngram_repetition_penalty" for p in g["params"]}
    assert params["n"]["default"] == 3 and isinstance(params["n"]["default"], int)


# -- the Makefile ------------------------------------------------------------------------------------------


def make_commands(*args: str) -> list[str]:
    """What `make` would run (-n: print only; -B: as on a fresh clone, every step)."""
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", *args], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def serve_args(lines: list[str]) -> argparse.Namespace:
    (line,) = [line for line in lines if "grpcgrade serve" in line]
    return build_parser().parse_args(shlex.split(line)[1:])


def test_make_serve_takes_port_metrics_port_and_config_and_installs_no_dev_tools():
    lines = make_commands("serve")
    default = serve_args(lines)
    assert (default.port, default.metrics_port, default.config) == (50051, 9090, None)
    installs = [line for line in lines if "pip install" in line]
    assert installs and not [line for line in installs if "--group dev" in line]
    chosen = serve_args(make_commands("serve", "PORT=6001", "METRICS_PORT=6002", "CONFIG=deploy/k8s/grpcgrade.yaml"))
    assert (chosen.port, chosen.metrics_port, chosen.config) == (6001, 6002, "deploy/k8s/grpcgrade.yaml")


def test_make_test_adds_the_dev_tools():
    lines = make_commands("test")
    assert any("pip install" in line and "'.[server" in line for line in lines)
    assert any("pip install" in line and "--group dev --group docs" in line for line in lines)
    assert lines[-1].endswith("-m pytest -q")


# -- docs/cli.md -------------------------------------------------------------------------------------------

CLI_DOC = ROOT / "docs" / "cli.md"


def test_the_cli_reference_names_every_command_and_option():
    doc = CLI_DOC.read_text()
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [
        f"{name} {flag}"
        for name, command in sub.choices.items()
        for a in command._actions
        for flag in a.option_strings
        if flag.startswith("--") and flag != "--help" and f"`{flag}" not in doc
    ]
    assert missing == []
    assert all(f"`grpcgrade {name}" in doc for name in sub.choices)


def test_the_cli_reference_eval_examples_run(server, tmp_path):
    """The shell examples of docs/cli.md's eval section, against the suite's server (which has the reward
    gsm8k): `grpcgrade` is this Python's, `producer` a cat of the samples."""
    section = CLI_DOC.read_text().split("## `grpcgrade eval`", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = [line for line in block.splitlines() if line.strip()]
    assert len(commands) == 3
    jsonl(tmp_path / "samples.jsonl", [{"response": "42", "reference": "42"}, {"response": "{}"}])
    for command in commands:
        line = command.replace("grpcgrade ", f"{sys.executable} -m grpcgrade ").replace("producer", "cat samples.jsonl")
        (tmp_path / "scored.jsonl").unlink(missing_ok=True)
        done = subprocess.run(
            ["bash", "-c", f"{line} --target {server.target} -q"], cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 0, (command, done.stderr)
        scored = [json.loads(x) for x in (tmp_path / "scored.jsonl").read_text().splitlines()]
        assert [x["sample"] for x in scored] == [{"response": "42", "reference": "42"}, {"response": "{}"}]
        assert all(x["results"] for x in scored)


def test_make_serve_and_make_test_take_turns_with_the_venv():
    """Started together (the Quick start's two shells), they would run two pips in one .venv at once: every
    step that creates or installs into .venv holds the one lock."""
    for target in ("serve", "test"):
        writes = [line for line in make_commands(target) if "pip install" in line or "-m venv" in line]
        assert writes
        assert all(line.startswith("flock .venv.lock ") for line in writes), writes
