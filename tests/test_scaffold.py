"""`grpcgrade new-plugin`: what it writes installs with pip, is served by a real server, and passes its own test."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpcgrade.client import GradingClient
from grpcgrade.testing import install_into, start_server
from grpcgrade.v1 import grading_pb2 as pb

NAME = "Scaffolded-Demo"  # what an author types; the names below follow the llm-style convention
SHORT, DIST, MODULE = "scaffolded_demo", "grpcgrade-scaffolded-demo", "grpcgrade_scaffolded_demo"


def grpcgrade_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grpcgrade.cli", *args], cwd=cwd, capture_output=True, text=True)


@dataclass(frozen=True)
class Generated:
    root: Path
    files: list[str]  # as written, before pip adds its build directories
    env: dict[str, str]  # puts the installed package on the path


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """The generated package, pip-installed into a directory of its own."""
    tmp = tmp_path_factory.mktemp("scaffold")
    made = grpcgrade_cli("new-plugin", NAME, cwd=tmp)
    assert made.returncode == 0, made.stderr
    files = sorted(str(p.relative_to(tmp / DIST)) for p in (tmp / DIST).rglob("*") if p.is_file())
    site = tmp / "site"
    install_into(site, tmp / DIST)
    return Generated(tmp / DIST, files, {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])})


@pytest.fixture(scope="module")
def client(generated: Generated, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GradingClient]:
    server = start_server(tmp_path_factory.mktemp("scaffold-server"), "--workers", "0", env=generated.env)
    try:
        with server.client(timeout=30) as c:
            yield c
    finally:
        server.stop()


def test_the_package_layout_and_entry_point(generated: Generated) -> None:
    assert generated.files == ["README.md", f"{MODULE}.py", "pyproject.toml", f"tests/test_{MODULE}.py"]
    project = tomllib.loads((generated.root / "pyproject.toml").read_text())["project"]
    assert project["name"] == DIST
    assert project["entry-points"]["grpcgrade"] == {SHORT: MODULE}


def test_a_real_server_serves_the_new_grader(client: GradingClient) -> None:
    listing = client.list_graders()
    plugin = next(p for p in listing.plugins if p.name == SHORT)
    assert (plugin.distribution, plugin.version, plugin.status, list(plugin.graders)) == (
        DIST,
        "0.1.0",
        "loaded",
        [SHORT],
    )
    grader = next(g for g in listing.graders if g.name == SHORT)
    assert grader.mode == pb.GRADER_MODE_POINTWISE
    assert [(p.name, p.type, p.default.bool_value) for p in grader.params] == [("ignore_case", "bool", True)]

    sample = {"response": "Grading happens over gRPC.", "reference": "GRPC"}
    (found,) = client.evaluate(sample, [SHORT]).results
    (exact,) = client.evaluate(sample, [{"name": SHORT, "params": {"ignore_case": False}}]).results
    assert (found.score, exact.score) == (1.0, 0.0)


def test_the_generated_test_passes(generated: Generated) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/test_{MODULE}.py"],
        cwd=generated.root,
        env={**os.environ, **generated.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout


def test_refuses_to_overwrite_or_to_take_a_bad_name(tmp_path: Path) -> None:
    (tmp_path / DIST).mkdir()
    (tmp_path / DIST / "mine.py").write_text("kept")
    again = grpcgrade_cli("new-plugin", NAME, cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr
    assert [p.name for p in (tmp_path / DIST).iterdir()] == ["mine.py"]
    bad = grpcgrade_cli("new-plugin", "3-graders", cwd=tmp_path)
    assert bad.returncode == 1 and "plugin name '3-graders'" in bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [DIST]
