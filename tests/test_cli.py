"""The `grpcgrade` command, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

from grpcgrade import __version__


def grpcgrade(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpcgrade.cli", *args], capture_output=True, text=True, timeout=120, env=env
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
