"""Shared fixtures: real servers in subprocesses on free loopback ports, and really installed plugins.

Fixtures only: tests import their helpers from `grpcgrade.testing`, as plugin authors' suites do, and
what several test modules share from helper modules beside them (`expected.py`, `faces.py`, `pki.py`...):
no test module imports another.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from pki import Pki, make_pki

from grpcgrade.client import GradingClient
from grpcgrade.testing import ServerProcess, install_into, start_server

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEST_PLUGINS = Path(__file__).resolve().parent / "plugins"


@pytest.fixture(scope="session")
def oldest_python() -> Path:
    """The Makefile's venv of the oldest grpcio/protobuf the client supports, with the grpcio-tools that
    generates the stubs; made once (`make .venv-oldest/.installed`, a few MB from PyPI) and kept."""
    subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), ".venv-oldest/.installed"], check=True)
    return ROOT / ".venv-oldest" / "bin" / "python"


def made_venv(name: str) -> Path:
    """A Makefile venv of a trainer framework's own packages (`make NAME/.installed`, made once and kept):
    the `trainers`-marked tests run the framework's code in it."""
    subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), f"{name}/.installed"], check=True)
    return ROOT / name / "bin" / "python"


@pytest.fixture(scope="session")
def nemo_gym_python() -> Path:
    """nemo-gym 0.4.0 and its requirements (Makefile: .venv-nemo-gym)."""
    return made_venv(".venv-nemo-gym")


@pytest.fixture(scope="session")
def trainers_python() -> Path:
    """skyrl-gym, verifiers and AReaL's reward wrapper, with this client (Makefile: .venv-trainers)."""
    return made_venv(".venv-trainers")


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test plugins, pip-installed (entry points and all) into a directory of their own."""
    site = tmp_path_factory.mktemp("plugin-site")
    names = ("grpcgrade-testplugin", "grpcgrade-broken", "grpcgrade-raising", "grpcgrade-clashing")
    return install_into(site, *(TEST_PLUGINS / name for name in names))


@pytest.fixture(scope="session")
def plugin_env(plugin_site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(plugin_site), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, plugin_env: dict[str, str]) -> Iterator[ServerProcess]:
    """One real server for the suite: 2 worker processes, the test plugins installed, a config of rewards."""
    tmp = tmp_path_factory.mktemp("server")
    config = tmp / "grpcgrade.yaml"
    config.write_text((FIXTURES / "server-config.yaml").read_text())
    srv = start_server(tmp, "--workers", "2", "--config", str(config), env=plugin_env)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def face_server(
    tmp_path_factory: pytest.TempPathFactory, plugin_env: dict[str, str]
) -> Iterator[Callable[..., ServerProcess]]:
    """Starts servers with the HTTP face for this module (stopped after it): `face_server(config, token=...,
    workers=..., more=[serve flags])` writes the configuration (and the token as the auth token file) to a
    fresh directory and serves it with the test plugins installed; the server's `http` is the face's base URL."""
    started: list[ServerProcess] = []

    def start(config: str, token: str | None = None, workers: int = 0, more: Sequence[str] = ()) -> ServerProcess:
        tmp = tmp_path_factory.mktemp("face")
        (tmp / "config.yaml").write_text(config)
        args = ["--workers", str(workers), "--config", "config.yaml", *more]
        if token is not None:
            (tmp / "tokens").write_text(token + "\n")
            args += ["--auth-token-file", "tokens"]
        started.append(start_server(tmp, *args, env=plugin_env, http=True))
        return started[-1]

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> Iterator[GradingClient]:
    with server.client(timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates made fresh for the module's TLS tests (`pki.make_pki`)."""
    return make_pki(tmp_path_factory.mktemp("pki"))
