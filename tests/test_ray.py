"""`grpcgrade serve --ray ADDRESS` on a real local Ray cluster of two nodes (`ray.cluster_utils.Cluster`,
one CPU each): the workers are Ray actors spread over both nodes, answers are the grader's, and an actor
killed mid-batch costs no sample its result (the chunk is run again sample by sample on the others) and
is replaced, counted in the restarts metric as a local worker is; actors that die as they start fail the
server's start, or later make it NOT_SERVING until one stays up (calls refused UNAVAILABLE meanwhile), as
local workers do.

Marked `ray` (`make test-ray`; .ci/run runs it): it needs the grpcgrade[ray] extra and ~1 min per cluster.
The cluster is shut down by its own handle (never `ray stop`, which would stop every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from expected import json_score
from grpc_health.v1 import health_pb2

from grpcgrade.core.plan import INLINE_MAX_BYTES
from grpcgrade.errors import ServerUnavailable
from grpcgrade.testing import ServerProcess, eventually, free_port, health_status, start_server

pytestmark = pytest.mark.ray

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING

ray_cluster_utils = pytest.importorskip("ray.cluster_utils", reason="the grpcgrade[ray] extra is not installed")


@contextlib.contextmanager
def two_nodes(plugin_env: dict[str, str], head_cpus: int = 1) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """Two Ray nodes on this machine (the head with `head_cpus`, the other with one CPU), with the test
    plugins importable by their workers: (the cluster, its second node, the environment)."""
    mp = pytest.MonkeyPatch()
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    gate = os.path.join(ray_tmp, "warm-exit")  # while it exists, an actor exits as it warms (testplugin's `warmed`)
    env = {"RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled", "GRPCGRADE_TEST_WARM_EXIT": gate, **plugin_env}
    for key, value in env.items():
        mp.setenv(key, value)
    nodes = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus})
    try:
        second = nodes.add_node(num_cpus=1)
        nodes.wait_for_nodes()
        yield nodes, second, env
    finally:
        nodes.shutdown()
        mp.undo()
        shutil.rmtree(ray_tmp, ignore_errors=True)  # the nodes' session logs and sockets


@pytest.fixture(scope="module")
def cluster(plugin_env):
    """Two Ray nodes of one CPU each, for the module."""
    with two_nodes(plugin_env) as (nodes, _, env):
        yield nodes, env


def padded(i: int) -> str:
    """A response of ~26 KB, JSON or not: 25 of them (a call of `chunk_size=25`) pass the engine's inline
    bound (`plan.INLINE_MAX_BYTES`), so such a call is graded on the actors, never in the server's process."""
    body = json.dumps({"n": i, "pad": "x" * (INLINE_MAX_BYTES // 20)})
    return body if i % 3 else body[:-1]


def actor_pids(log: str) -> list[int]:
    match = re.search(r"Ray executor: (\d+) actors on (\d+) nodes \(pids \[([\d, ]+)\]\)", log)
    assert match, log
    return [int(p) for p in match.group(3).split(",")]


def health_becomes(server: ServerProcess, status: int, what: str) -> None:
    """Wait for the server's health to say `status` (the bound only keeps a broken server from hanging)."""
    eventually(lambda: health_status(server.target) == status, what, bound=180, every=0.5)


def grades_json(server: ServerProcess, n: int) -> None:
    """`n` samples graded on the actors (each past the inline size), every score json_validator's."""
    texts = [padded(i) for i in range(n)]
    with server.client(timeout=120, chunk_size=25) as client:
        results = client.batch_evaluate([{"response": t} for t in texts], ["json_validator"])
    assert [r.results[0].score for r in results] == [json_score(t) for t in texts]


def test_serve_ray_grades_on_both_nodes_and_survives_a_lost_actor(cluster, tmp_path):
    nodes, env = cluster
    server = start_server(tmp_path, "--ray", nodes.address, "--log-level", "info", env=env, wait=300)
    try:
        log = server.log()
        assert re.search(r"Ray executor: 2 actors on 2 nodes", log), log
        texts = [padded(i) for i in range(400)]
        with server.client(timeout=300, chunk_size=25) as client:
            results = client.batch_evaluate([{"response": t} for t in texts], ["json_validator"])
            assert [r.results[0].score for r in results] == [json_score(t) for t in texts]

            # a slow batch; one actor's process is killed while it grades
            spec = [{"name": "sleepy", "params": {"seconds": 0.05}}]  # heavy: on the actors, never inline
            victim = actor_pids(log)[0]
            killer = threading.Timer(1.0, os.kill, (victim, signal.SIGKILL))
            killer.start()
            slow = client.batch_evaluate([{"response": padded(i)} for i in range(60)], spec)
            killer.join()
        assert [r.results[0].score for r in slow] == [1.0] * 60  # no sample lost with the actor
        deadline = time.monotonic() + 60
        while server.metric("grpcgrade_workers_alive") < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert server.metric("grpcgrade_worker_pool_restarts_total") >= 1
        assert server.metric("grpcgrade_workers_alive") == 2
        assert "never retrieved" not in server.log()  # the lost actor's calls were all looked at
    finally:
        assert server.stop() == 0


def test_a_hung_or_dying_sample_costs_only_itself_on_ray(cluster, tmp_path):
    """The local pool's fault policy on actors: a Python loop past the time limit is stopped where it runs
    (the grading timer thread of a threaded actor), a sleep the limit cannot interrupt holds its actor
    until the watchdog kills it, a sample that kills its actor is tried once more and answered
    WORKER_LOST; every other sample of their chunks is graded."""
    nodes, env = cluster
    server = start_server(tmp_path, "--ray", nodes.address, "--grader-timeout", "1", env=env, wait=300)
    try:
        kinds = ["ok"] * 10 + ["hang", "hang_in_c", "die"] + ["ok"] * 10
        with server.client(timeout=300, chunk_size=8) as client:
            results = client.batch_evaluate([{"response": k} for k in kinds], [{"name": "misbehave"}])
        got = [r.results[0].error.code or r.results[0].score for r in results]
        assert got == [1.0] * 10 + ["TIMEOUT", "TIMEOUT", "WORKER_LOST"] + [1.0] * 10
        assert "held its work past the watchdog: killed" in server.log()
    finally:
        assert server.stop() == 0


def test_an_address_where_no_cluster_answers_is_a_message_at_once():
    """`ray.init` retries an address nothing answers at for minutes (over five, measured), logging every few
    seconds: `serve` says so at once instead, naming the address."""
    address = f"127.0.0.1:{free_port()}"
    out = subprocess.run(
        [sys.executable, "-m", "grpcgrade", "serve", "--ray", address, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    assert f"--ray {address}: no Ray cluster answers there (Connection refused)" in out.stderr


def test_actors_that_die_as_they_start_fail_the_start_then_the_health_check(cluster, tmp_path):
    """As a local worker pool: the first actors dying as they start (a node without a plugin's module, a
    plugin that kills its process) stop `serve` with a message, not a server that says SERVING and grades
    nothing; later replacements that keep dying make it NOT_SERVING (each slot waiting longer between
    tries, not a busy loop of new actors) until one stays up, and it grades again."""
    nodes, env = cluster
    gate = env["GRPCGRADE_TEST_WARM_EXIT"]
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    open(gate, "w").close()
    try:
        with pytest.raises(RuntimeError, match="a Ray actor ended while starting"):
            start_server(tmp_path / "first", "--ray", nodes.address, env=env, wait=300)
    finally:
        os.remove(gate)
    server = start_server(tmp_path / "second", "--ray", nodes.address, "--log-level", "info", env=env, wait=300)
    try:
        open(gate, "w").close()
        for pid in actor_pids(server.log()):
            os.kill(pid, signal.SIGKILL)
        health_becomes(server, NOT_SERVING, "NOT_SERVING with no actor able to start")
        assert server.metric("grpcgrade_workers_alive") == 0
        os.remove(gate)
        health_becomes(server, SERVING, "SERVING again once actors could start")
        grades_json(server, 100)
        assert server.metric("grpcgrade_worker_pool_restarts_total") >= 2 * 3  # each slot's three tries
    finally:
        if os.path.exists(gate):
            os.remove(gate)
        assert server.stop() == 0


def test_no_actor_up_for_a_while_is_not_serving_until_one_is(plugin_env, tmp_path):
    """A cluster whose only CPUs are on a node that is lost (a head without CPUs, as many are): the actor is
    lost, its replacement waits for a CPU, and nothing can be graded; the health check says NOT_SERVING
    (after `NO_ACTOR_SECONDS`) until a node with a CPU joins and the replacement is up, and it grades.
    Meanwhile a call waiting for an actor gets WORKER_UNAVAILABLE for each sample, and a new call is
    refused at once (UNAVAILABLE, naming why), instead of either waiting until its deadline."""
    with two_nodes(plugin_env, head_cpus=0) as (nodes, second, env):
        server = start_server(tmp_path, "--ray", nodes.address, env=env, wait=300)
        try:
            nodes.remove_node(second, allow_graceful=False)
            eventually(lambda: server.metric("grpcgrade_workers_alive") == 0, "the actor's loss seen", bound=180)
            held: list = []

            def call() -> None:  # a heavy grader's samples: never graded inline, in the server's process
                spec = [{"name": "sleepy", "params": {"seconds": 0.01}}]
                with server.client(timeout=120) as client:
                    held.extend(client.batch_evaluate([{"response": str(i)} for i in range(50)], spec))

            waiting = threading.Thread(target=call)
            waiting.start()
            health_becomes(server, NOT_SERVING, "NOT_SERVING with no actor up and no CPU to start one on")
            waiting.join(180)
            assert [r.results[0].error.code for r in held] == ["WORKER_UNAVAILABLE"] * 50
            refused = pytest.raises(ServerUnavailable, match="no worker can grade: no Ray actor has been up")
            with server.client(unavailable_seconds=0.5) as client, refused:
                client.evaluate({"response": "{}"}, ["json_validator"])
            nodes.add_node(num_cpus=1)
            health_becomes(server, SERVING, "SERVING again once a node with a CPU joined")
            grades_json(server, 50)
            assert server.metric("grpcgrade_workers_alive") == 1
        finally:
            assert server.stop() == 0
