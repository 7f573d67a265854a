"""Scale-out: one client balancing round-robin over three real replicas, one of them drained mid-run.

This is the deployment the Kubernetes manifests set up (a headless Service, every pod address in one
client channel), on loopback: every replica must get its share of the calls, and stopping a replica
with SIGTERM while calls are going must cost no call: the replica drains (NOT_SERVING, refuses new
calls, finishes in-flight ones), the channel's retry policy sends refused calls to the others, and
every call is answered exactly once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from grpcgrade.client import GradingClient
from grpcgrade.testing import ServerProcess, start_server

REPLICAS = 3
CALLS = 1500  # per phase
THREADS = 8
GRADER = {"name": "string_match", "params": {"algorithm": "exact_match"}}


def evaluate_handled(server: ServerProcess) -> dict[str, float]:
    """grpc_server_handled_total of Evaluate by status code, from the replica's own /metrics."""
    return {
        dict(tags)["grpc_code"]: value
        for (name, tags), value in server.metrics().items()
        if name == "grpc_server_handled_total" and dict(tags).get("grpc_method") == "Evaluate"
    }


def served(server: ServerProcess) -> float:
    return sum(evaluate_handled(server).values())


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    tmp: Path = tmp_path_factory.mktemp("replicas")
    servers = [start_server(tmp, "--workers", "0", "--grace", "10") for _ in range(REPLICAS)]
    yield servers
    for s in servers:
        s.stop()


def run_calls(
    client: GradingClient, first: int, n: int, on_done: threading.Event | None = None, after: int = 0
) -> dict[str, float]:
    """`n` Evaluate calls with ids first..first+n-1 from THREADS threads: each id's returned id and score."""
    done = 0
    lock = threading.Lock()

    def one(i: int) -> tuple[str, str, float]:
        nonlocal done
        sample = {"id": f"s{i}", "response": f"answer {i}", "reference": f"answer {i if i % 2 else i + 1}"}
        reply = client.evaluate(sample, [GRADER])
        with lock:
            done += 1
            if on_done is not None and done == after:
                on_done.set()
        return sample["id"], reply.id, reply.results[0].score

    with ThreadPoolExecutor(THREADS) as pool:
        answers = list(pool.map(one, range(first, first + n)))
    assert [sent for sent, _, _ in answers] == [got for _, got, _ in answers]
    return {got: score for _, got, score in answers}


def expected_scores(first: int, n: int) -> dict[str, float]:
    """exact_match: odd ids were sent their own answer as reference (1.0), even ids another one (0.0)."""
    return {f"s{i}": 1.0 if i % 2 else 0.0 for i in range(first, first + n)}


def test_round_robin_spreads_calls_over_every_replica(replicas: list[ServerProcess]) -> None:
    before = [served(s) for s in replicas]
    with GradingClient([s.target for s in replicas], timeout=30) as client:
        assert run_calls(client, 0, CALLS) == expected_scores(0, CALLS)
    shares = [served(s) - b for s, b in zip(replicas, before, strict=True)]
    assert sum(shares) == CALLS  # no call executed twice, none lost
    for share in shares:
        assert share >= CALLS / REPLICAS * 0.75, shares  # round-robin: a third each, give or take


def test_a_list_of_names_is_balanced_over_the_addresses_they_resolve_to(replicas: list[ServerProcess]) -> None:
    """`localhost:PORT` per replica: gRPC balances lists of IP addresses only (`ipv4:a:p,b:p`), so the client
    resolves the names when it is made. Before, the first call failed UNKNOWN ("the target uri is not valid")."""
    before = [served(s) for s in replicas]
    with GradingClient([f"localhost:{s.port}" for s in replicas], timeout=30) as client:
        assert run_calls(client, 0, CALLS) == expected_scores(0, CALLS)
    shares = [served(s) - b for s, b in zip(replicas, before, strict=True)]
    assert sum(shares) == CALLS
    for share in shares:
        assert share >= CALLS / REPLICAS * 0.75, shares


def test_sigterm_on_one_replica_mid_run_loses_no_call(replicas: list[ServerProcess]) -> None:
    victim, survivors = replicas[-1], replicas[:-1]
    before = [served(s) for s in survivors]
    halfway = threading.Event()
    exit_code: list[int] = []

    def stop_victim() -> None:
        halfway.wait(60)
        exit_code.append(victim.stop(signal.SIGTERM))

    stopper = threading.Thread(target=stop_victim)
    stopper.start()
    with GradingClient([s.target for s in replicas], timeout=30) as client:
        scores = run_calls(client, CALLS, CALLS, on_done=halfway, after=CALLS // 3)
    stopper.join(60)
    assert scores == expected_scores(CALLS, CALLS)  # every call answered, with its own id, exactly once
    assert exit_code == [0]  # the drained replica exited cleanly
    assert "draining" in victim.log()
    after = [evaluate_handled(s) for s in survivors]
    for codes, b in zip(after, before, strict=True):
        assert set(codes) == {"OK"}
        assert codes["OK"] - b > 0
    # The survivors took over the victim's share after it stopped: together more than their two thirds.
    assert sum(c["OK"] for c in after) - sum(before) > CALLS * 2 / REPLICAS
