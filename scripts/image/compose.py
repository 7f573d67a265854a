"""`make image-test`, second part: deploy/compose/docker-compose.yml started for real with podman-compose.

Two grpcgrade replicas of the image check.py built (free host ports), and Prometheus: the official image
when a registry answers, else a stand-in with Debian's prometheus (prometheus-standin.Containerfile).
Checks that docker-compose 1.29 (compose v1, Debian's) accepts the file, that each replica grades (a
code_tests program in its sandbox, under the compose file's read-only root and CPU limit), that
Prometheus found both replicas by DNS and scrapes them, that the alert rules are loaded, and that `down`
stops the stack. Grafana is not started (no stand-in for it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check import (  # noqa: E402  (this folder's module)
    IMAGE,
    RIGHT,
    ROOT,
    base_image,
    code_sample,
    engine,
    expect,
    free_port,
    say,
    scores,
)

COMPOSE = ROOT / "deploy" / "compose" / "docker-compose.yml"
PROJECT = "grpcgrade-image-test"
PROMETHEUS = "docker.io/prom/prometheus:v2.53.0"
PROMETHEUS_STANDIN = "localhost/grpcgrade-prometheus-standin:debian12"
REPLICAS = 2


def prometheus_image(base: str) -> str:
    if engine("pull", "-q", PROMETHEUS, check=False, timeout=120).returncode == 0:
        return PROMETHEUS
    if engine("image", "exists", PROMETHEUS_STANDIN, check=False).returncode != 0:
        containerfile = Path(__file__).resolve().parent / "prometheus-standin.Containerfile"
        engine("build", "--build-arg", f"BASE={base}", "-t", PROMETHEUS_STANDIN, "-f", str(containerfile), str(ROOT))
    say(f"prometheus: no registry reachable for {PROMETHEUS}; using {PROMETHEUS_STANDIN} (Debian's prometheus)")
    return PROMETHEUS_STANDIN


def compose(env: dict[str, str], *args: str) -> str:
    command = ["podman-compose", "-p", PROJECT, "-f", str(COMPOSE), *args]
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def published_ports() -> list[int]:
    """The host ports of the grpcgrade replicas' 50051 (each got a free one)."""
    ids = engine(
        "ps",
        "-q",
        "--filter",
        f"label=io.podman.compose.project={PROJECT}",
        "--filter",
        "label=com.docker.compose.service=grpcgrade",
    ).stdout.split()
    ports = []
    for cid in ids:
        mapped = engine("port", cid, "50051/tcp").stdout.strip()
        ports.append(int(mapped.rsplit(":", 1)[1]))
    return ports


def main() -> int:
    started = time.monotonic()
    prometheus_port = free_port()
    env = {
        "GRPCGRADE_IMAGE": IMAGE,
        "PROMETHEUS_IMAGE": prometheus_image(base_image()),
        "GRPCGRADE_PORT": "",  # a free host port per replica
        "GRPCGRADE_REPLICAS": str(REPLICAS),
        "PROMETHEUS_PORT": str(prometheus_port),
    }
    v1 = subprocess.run(
        ["docker-compose", "-p", PROJECT, "-f", str(COMPOSE), "config", "-q"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    expect("compose v1: Debian's docker-compose 1.29 accepts the file (`config`)", v1.returncode == 0, v1.stderr)
    compose(env, "down", "-v")
    compose(env, "up", "-d", "--no-build", "grpcgrade", "prometheus")
    say(f"compose: up with {REPLICAS} grpcgrade replicas and Prometheus on 127.0.0.1:{prometheus_port}")
    try:
        check_stack(prometheus_port)
    except BaseException:
        print(engine("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}").stdout, file=sys.stderr)
        raise
    finally:
        compose(env, "down", "-v")
    left = engine("ps", "-aq", "--filter", f"label=io.podman.compose.project={PROJECT}").stdout.split()
    expect("compose: `down` removed every container", left == [], left)
    say(f"all compose checks passed in {time.monotonic() - started:.0f} s")
    return 0


def check_stack(prometheus_port: int) -> None:
    from grpcgrade.client import GradingClient

    ports = published_ports()
    expect(f"compose: {REPLICAS} grpcgrade replicas running", len(ports) == REPLICAS, ports)
    for port in ports:
        with GradingClient(f"127.0.0.1:{port}", timeout=60) as client:
            client.wait_ready(120)
            right = client.evaluate(code_sample(RIGHT), ["code_tests"])
        expect(
            f"compose: replica on :{port} grades code_tests in its sandbox (read-only root, cpus: 2)",
            scores(right) == {"code_tests": (1.0, "")},
            right,
        )
    api = f"http://127.0.0.1:{prometheus_port}/api/v1"
    deadline = time.monotonic() + 180  # the first scrape follows DNS discovery (refresh 30 s, interval 15 s)
    while True:
        targets = get(f"{api}/targets")["data"]["activeTargets"]
        up = [t for t in targets if t["labels"].get("job") == "grpcgrade" and t["health"] == "up"]
        if len(up) == REPLICAS or time.monotonic() > deadline:
            break
        time.sleep(3)
    expect(f"compose: Prometheus found the {REPLICAS} replicas by DNS and scrapes them", len(up) == REPLICAS, targets)
    query = urllib.parse.quote("count(grpcgrade_workers_alive == 2)")
    result = get(f"{api}/query?query={query}")["data"]["result"]
    expect(
        "compose: each replica runs --workers=2 (grpcgrade_workers_alive)",
        result and result[0]["value"][1] == str(REPLICAS),
        result,
    )
    rules = [r for g in get(f"{api}/rules")["data"]["groups"] for r in g["rules"] if r["type"] == "alerting"]
    alerts = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    wanted = {r["alert"] for g in alerts["groups"] for r in g["rules"] if "alert" in r}
    expect("compose: Prometheus loaded every alert rule of alerts.yml", {r["name"] for r in rules} == wanted, rules)


if __name__ == "__main__":
    sys.exit(main())
