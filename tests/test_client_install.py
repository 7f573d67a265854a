"""The client as a trainer installs it: `pip install grpcgrade` pulls grpcio and protobuf only, and the
client works under the lowest versions pyproject.toml admits.

The lowest versions run in the Makefile's `.venv-oldest` (grpcio 1.62.3, protobuf 4.21.6, no grpcgrade
dependency at all) with the source tree on PYTHONPATH; the integrations grade against the suite's server.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CLIENT_CODE = """
import sys
import google.protobuf, grpc
from grpcgrade import GradingClient, reward_function
from grpcgrade.integrations.verl import compute_score_sync

target = sys.argv[1]
with GradingClient(target) as client:
    reply = client.evaluate({"response": "HI", "reference": "hi"}, ["shout"])
    assert reply.results[0].score == 1.0, reply
reward = reward_function(target, reward="gsm8k")
got = reward(prompts=["q"], completions=["<think>\\nr\\n</think>\\n72"], completion_ids=[[1, 2]], answer=["#### 72"])
assert got == [1.0], got
assert compute_score_sync("d", "HI", "hi", {}, target=target, reward="flaky")["score"] == 1.0
server_only = ("pluggy", "yaml", "prometheus_client", "httpx", "aiohttp", "sacrebleu", "nltk", "re2")
loaded = [m for m in server_only if m in sys.modules]
assert not loaded, loaded
print(grpc.__version__, google.protobuf.__version__)
"""


def lower_bound(requirement: str) -> str:
    return re.search(r">=([\w.]+)", requirement).group(1)


def test_the_client_install_depends_on_grpcio_and_protobuf_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = sorted(re.match(r"[\w-]+", r).group() for r in project["dependencies"])
    assert names == ["grpcio", "protobuf"]
    assert "pluggy>=1.5,<2" in project["optional-dependencies"]["server"]


def test_the_client_works_under_the_lowest_supported_grpcio_and_protobuf(server, oldest_python: Path):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lows = {re.match(r"[\w-]+", r).group(): lower_bound(r) for r in project["dependencies"]}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(oldest_python), "-c", CLIENT_CODE, server.target],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [lows["grpcio"], lows["protobuf"]]


def _install_and_use(spec: str, site: Path, server, oldest_python: Path) -> None:
    """`pip install --no-deps SPEC` into `site` (as README says, without the dependencies the oldest venv
    already has), then the client from there, not from the source tree, against the suite's server."""
    pip = [str(ROOT / ".venv" / "bin" / "pip"), "install", "--quiet", "--no-deps", "--target", str(site), spec]
    subprocess.run(pip, check=True, timeout=600, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(oldest_python), "-c", CLIENT_CODE, server.target],
        env={**env, "PYTHONPATH": str(site)},
        cwd=site,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_readmes_wheel_installs_a_working_client(tmp_path, server, oldest_python: Path):
    """README: `pip wheel --no-deps /path/to/grpcgrade -w dist/`, then `pip install dist/grpcgrade-*.whl`."""
    pip = [str(ROOT / ".venv" / "bin" / "pip"), "wheel", "--quiet", "--no-deps", str(ROOT), "-w", str(tmp_path)]
    subprocess.run(pip, check=True, timeout=600, capture_output=True)
    (wheel,) = tmp_path.glob("grpcgrade-*-py3-none-any.whl")
    readme = (ROOT / "README.md").read_text()
    assert f"pip install dist/{wheel.name}" in readme
    _install_and_use(str(wheel), tmp_path / "site", server, oldest_python)


def test_the_readmes_git_url_installs_a_working_client(tmp_path, server, oldest_python: Path):
    """README: `pip install "grpcgrade @ git+URL"`, here with the repository's own URL on this machine (what
    is committed, as a git URL gives it)."""
    assert 'pip install "grpcgrade @ git+https://' in (ROOT / "README.md").read_text()
    _install_and_use(f"grpcgrade @ git+file://{ROOT}", tmp_path / "site", server, oldest_python)


def test_graders_without_target_on_a_client_only_install_says_what_to_do(oldest_python: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(oldest_python), "-m", "grpcgrade.cli", "graders"],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "--target HOST:PORT" in done.stderr and "grpcgrade[server]" in done.stderr
