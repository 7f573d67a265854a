"""Shared fixtures: real servers in subprocesses on free loopback ports, and really installed plugins."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpcgrade.client import GradingClient

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEST_PLUGINS = Path(__file__).resolve().parent / "plugins"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    metrics_port: int
    log_path: Path

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **kwargs) -> GradingClient:
        return GradingClient(self.target, **kwargs)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def health_status(target: str, service: str = "", timeout: float = 1.0) -> int | None:
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError:
            return None
    return reply.status


def start_server(tmp: Path, *args: str, env: dict[str, str] | None = None, wait: float = 60) -> ServerProcess:
    port, metrics_port = free_port(), free_port()
    log_path = tmp / f"server-{port}.log"
    cmd = [sys.executable, "-m", "grpcgrade.cli", "serve", "--port", str(port), "--metrics-port", str(metrics_port),
           *args]
    full_env = {**os.environ, **(env or {})}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=tmp)
    server = ServerProcess(proc, port, metrics_port, log_path)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        if health_status(server.target) == health_pb2.HealthCheckResponse.SERVING:
            return server
        time.sleep(0.05)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server not SERVING after {wait} s:\n{server.log()}")


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test plugins, pip-installed (entry points and all) into a directory of their own."""
    site = tmp_path_factory.mktemp("plugin-site")
    for name in ("grpcgrade-testplugin", "grpcgrade-broken"):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
             "--target", str(site), str(TEST_PLUGINS / name)],
            check=True,
        )
    return site


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
