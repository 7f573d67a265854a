"""Shared fixtures: real servers in subprocesses on free loopback ports, and really installed plugins."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpcgrade.client import GradingClient
from grpcgrade.testing import ServerProcess, free_port, health_status, install_into, start_server

__all__ = ["ServerProcess", "free_port", "health_status", "start_server"]

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEST_PLUGINS = Path(__file__).resolve().parent / "plugins"


@pytest.fixture(scope="session")
def oldest_python() -> Path:
    """The Makefile's venv of the oldest grpcio/protobuf the client supports, with the grpcio-tools that
    generates the stubs; made once (`make .venv-oldest/.installed`, a few MB from PyPI) and kept."""
    subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), ".venv-oldest/.installed"], check=True)
    return ROOT / ".venv-oldest" / "bin" / "python"


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


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> Iterator[GradingClient]:
    with server.client(timeout=120) as c:
        yield c


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a server's workers and its resource tracker)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def memory_kib(pid: int, field: str = "VmRSS") -> int:
    """A process's memory from /proc status: `VmRSS` (resident now) or `VmHWM` (its peak), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
