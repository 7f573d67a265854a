"""`make image-test`: the image built by a real container engine, run as docs/deploy.md says, checked
through its ports, and stopped; then the compose stack (scripts/image/compose.py).

Run by the Makefile with the project's venv (the client and the expected values come from it) after
scripts/image/engine.sh installed and configured podman. Prints each check as it passes; the first that
fails stops the run with what it saw (and the container's log).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENGINE = os.environ.get("ENGINE", "podman")
IMAGE = os.environ.get("IMAGE", "localhost/grpcgrade:image-test")
#: The official base, and the name of its stand-in when no registry answers (scripts/image/standin-base.sh).
BASE = "docker.io/library/python:3.11-slim-bookworm"
STANDIN = "localhost/grpcgrade-base-standin:python3.11-bookworm"
CACHE = Path(os.environ.get("IMAGE_CACHE", "/var/cache/grpcgrade-image"))
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CONFIG = ROOT / "deploy" / "k8s" / "grpcgrade.yaml"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
#: The container name and image tag docs/deploy.md's run command uses (replaced by this run's).
DOC_NAME, DOC_IMAGE = "grpcgrade", "grpcgrade:0.1.0"
GRACE = 25
RIGHT = "```python\nprint(int(input()) * 2)\n```"
WRONG = "```python\nprint(int(input()) + 2)\n```"
SLOW = "```python\nimport time\ntime.sleep(3)\nprint(int(input()) * 2)\n```"
TESTS = {"inputs": ["21"], "outputs": ["42"]}


def say(text: str) -> None:
    print(f"image-test: {text}", flush=True)


def engine(*args: str, check: bool = True, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise SystemExit(f"{ENGINE} {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_image() -> str:
    """The official base when a registry answers, else the debootstrapped stand-in (made once, cached)."""
    if engine("pull", "-q", BASE, check=False, timeout=120).returncode == 0:
        say(f"base: {BASE} (pulled)")
        return BASE
    say(f"base: no registry reachable for {BASE}; using the stand-in {STANDIN}")
    script = ROOT / "scripts" / "image" / "standin-base.sh"
    subprocess.run(["bash", str(script), STANDIN, str(CACHE)], check=True)
    return STANDIN


def build(base: str) -> None:
    args = ["build", "--format", "docker", "--build-arg", f"PYTHON_IMAGE={base}", "-t", IMAGE]
    if CA_BUNDLE.exists():  # the route to PyPI may re-sign TLS; a build secret is in no layer
        args += ["--secret", f"id=ca-bundle,src={CA_BUNDLE}"]
    started = time.monotonic()
    done = subprocess.run([ENGINE, *args, str(ROOT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"build failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    # The image this tag named before is dangling now: pruned, so that runs on one machine do not pile up
    # images (the layers this build used stay: they have children).
    engine("image", "prune", "-f", check=False)
    size = engine("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.strip()
    say(f"built {IMAGE} over {base} in {time.monotonic() - started:.0f} s ({int(size) >> 20} MiB)")


class Container:
    """One container of the image, started as docs/deploy.md's code-rewards command with the config."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.grpc_port, self.metrics_port = free_port(), free_port()
        self.target = f"127.0.0.1:{self.grpc_port}"

    def start(self, security_opts: bool = True) -> None:
        """docs/deploy.md's `docker run` command, with this engine, this image, free host ports and a name
        of its own: nothing else is changed, so what the page tells users is what runs here. Without
        `security_opts`, its `--security-opt` flags are left out (what a user who forgets them runs)."""
        command = documented_run()
        if not security_opts:
            at = [i for i, word in enumerate(command) if word == "--security-opt"]
            command = [w for i, w in enumerate(command) if i not in at and i - 1 not in at]
        swaps = {
            "docker": ENGINE,
            DOC_NAME: self.name,
            DOC_IMAGE: IMAGE,
            "127.0.0.1:50051:50051": f"{self.target}:50051",
            "127.0.0.1:9090:9090": f"127.0.0.1:{self.metrics_port}:9090",
        }
        used = [swaps.get(word, word) for word in command]
        missing = [word for word in swaps if word not in command]
        if missing:
            raise SystemExit(f"docs/deploy.md's run command lacks {missing}: {' '.join(command)}")
        say("runs: " + " ".join(used))
        engine("rm", "-f", self.name, check=False)
        engine(*used[1:])

    def logs(self) -> str:
        done = engine("logs", self.name, check=False)
        return (done.stdout + done.stderr)[-6000:]

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            return str(reply.read().decode())

    def remove(self) -> None:
        engine("rm", "-f", "-t", "0", self.name, check=False)


def documented_run() -> list[str]:
    """The `docker run -d --name grpcgrade ...` command of docs/deploy.md, as words ($PWD: the repository)."""
    text = DEPLOY_DOC.read_text().replace("\\\n", " ")
    line = next((ln for ln in text.splitlines() if ln.startswith(f"docker run -d --name {DOC_NAME} ")), None)
    if line is None:
        raise SystemExit(f"docs/deploy.md has no `docker run -d --name {DOC_NAME}` line")
    return shlex.split(line.replace("$PWD", str(ROOT)), comments=True)


def expect(what: str, ok: bool, seen: Any) -> None:
    if not ok:
        raise AssertionError(f"{what}: saw {seen!r}")
    say(f"ok  {what}")


def code_sample(response: str) -> dict[str, Any]:
    return {"response": response, "extra": {"tests": TESTS}}


def scores(reply: Any) -> dict[str, tuple[float, str]]:
    """grader key -> (score, error code) of one EvaluateResponse."""
    return {r.key or r.name: (round(r.score, 6), r.error.code) for r in reply.results}


def check_serving(box: Container) -> None:
    from grpcgrade.client import GradingClient

    with GradingClient(box.target, timeout=60) as client:
        client.wait_ready(120)
        expect("health: SERVING through the published port", True, None)
        valid = json.loads('{"a": [1, 2]}') is not None  # what json_validator's score must say: it parses
        reply = client.evaluate({"response": '{"a": [1, 2]}'}, ["json_validator"])
        expect(
            "Evaluate: json_validator scores a JSON object 1",
            scores(reply) == {"json_validator": (float(valid), "")},
            reply,
        )
        sample = {"response": '{"a": 1, "b": [2]}', "reference": '{"b": [2], "a": 1}'}
        inside = client.evaluate(sample, reward="json_answer")
        with reference_server() as local:
            outside = local.evaluate(sample, reward="json_answer")
        expect(
            "a configured reward (json_answer from the mounted config) scores as the same config on the host",
            inside.reward == outside.reward == 1.0 and scores(inside) == scores(outside),
            (inside, outside),
        )
        right = client.evaluate(code_sample(RIGHT), ["code_tests"])
        expect(
            "code_tests in the container's sandbox: a right program scores 1",
            scores(right) == {"code_tests": (1.0, "")},
            right,
        )
        wrong = client.evaluate(code_sample(WRONG), ["code_tests"])
        expect(
            "code_tests in the container's sandbox: a wrong program scores 0",
            scores(wrong) == {"code_tests": (0.0, "")},
            wrong,
        )
    text = box.metrics()
    handled = [
        line
        for line in text.splitlines()
        if line.startswith("grpc_server_handled_total{") and 'grpc_method="Evaluate"' in line
    ]
    counted = sum(float(line.split()[-1]) for line in handled)
    expect("metrics: /metrics on the published port counted the 4 Evaluate calls above", counted == 4, handled)
    expect("metrics: the bundled plugins are loaded", 'distribution="grpcgrade-code"' in text, "no grpcgrade-code")


@contextmanager
def reference_server() -> Iterator[Any]:
    """The same config served on the host by the venv's grpcgrade: where the expected values come from."""
    from grpcgrade.testing import start_server

    with tempfile.TemporaryDirectory() as workdir:
        server = start_server(Path(workdir), "--config", str(CONFIG), "--workers", "1", metrics=False)
        try:
            with server.client(timeout=60) as client:
                yield client
        finally:
            server.stop()


def check_identity_and_healthcheck(box: Container) -> None:
    ids = engine("exec", box.name, "id").stdout.strip()
    expect(
        "runs as uid 10001 with a group entry (gid 10001)",
        ids.startswith("uid=10001(grpcgrade) gid=10001(grpcgrade)"),
        ids,
    )
    secret = engine("run", "--rm", "--entrypoint", "/bin/sh", IMAGE, "-c", "ls -a /run/secrets 2>&1; true").stdout
    expect("the CA bundle was a build secret: not in the image", "ca-bundle" not in secret, secret)
    configured = json.loads(engine("image", "inspect", IMAGE, "--format", "{{json .Config.Healthcheck}}").stdout)
    expect(
        "HEALTHCHECK kept by `build --format docker`",
        configured and configured["Test"][-2:] == ["grpcgrade", "health"],
        configured,
    )
    done = engine("healthcheck", "run", box.name, check=False)
    expect("HEALTHCHECK: `podman healthcheck run` passes", done.returncode == 0, done.stdout + done.stderr)


def check_drain(box: Container) -> None:
    """SIGTERM (`stop`) while a 3 s program is being graded: the call still gets its score, the server exits 0."""
    from grpcgrade.client import GradingClient

    result: dict[str, Any] = {}
    with GradingClient(box.target, timeout=60) as client:

        def slow() -> None:
            try:
                result["reply"] = client.evaluate(code_sample(SLOW), ["code_tests"], cache="off")
            except Exception as exc:  # noqa: BLE001  (reported below)
                result["error"] = exc

        caller = threading.Thread(target=slow)
        caller.start()
        deadline = time.monotonic() + 30
        while "grpcgrade_samples_in_flight 1.0" not in box.metrics():
            assert time.monotonic() < deadline and caller.is_alive(), "the slow call never got in flight"
            time.sleep(0.1)
        engine("stop", "-t", str(GRACE + 5), box.name)
        caller.join(60)
    expect(
        "drain: a call in flight at `stop` still gets its score",
        "reply" in result and scores(result["reply"]) == {"code_tests": (1.0, "")},
        result,
    )
    status = engine("inspect", box.name, "--format", "{{.State.ExitCode}}").stdout.strip()
    expect("drain: the server exits 0 after SIGTERM", status == "0", status + box.logs())


def check_without_the_sandbox_flags() -> None:
    """The run command without its --security-opt flags: the sandbox cannot start, and code_tests says so
    (SANDBOX_UNAVAILABLE, with the flags in the message, no reward) rather than scoring the program 0."""
    from grpcgrade.client import GradingClient

    box = Container("grpcgrade-image-test-confined")
    box.start(security_opts=False)
    try:
        with GradingClient(box.target, timeout=60) as client:
            client.wait_ready(120)
            reply = client.evaluate(code_sample(RIGHT), ["code_tests"])
    except BaseException:
        print(box.logs(), file=sys.stderr)
        raise
    finally:
        box.remove()
    (result,) = reply.results
    expect(
        "without --security-opt: code_tests is SANDBOX_UNAVAILABLE naming the flags, and no reward",
        result.error.code == "SANDBOX_UNAVAILABLE"
        and "seccomp=unconfined" in result.error.message
        and not reply.HasField("reward"),
        reply,
    )


def main(argv: Sequence[str]) -> int:
    if shutil.which(ENGINE) is None:
        raise SystemExit(f"{ENGINE} is not installed: run scripts/image/engine.sh (make image-test does)")
    started = time.monotonic()
    build(base_image())
    box = Container("grpcgrade-image-test")
    box.start()
    try:
        check_serving(box)
        check_identity_and_healthcheck(box)
        check_drain(box)
    except BaseException:
        print(box.logs(), file=sys.stderr)
        raise
    finally:
        box.remove()
    check_without_the_sandbox_flags()
    say(f"all image checks passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
