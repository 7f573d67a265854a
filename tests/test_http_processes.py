"""The HTTP face in processes of its own (`service/http/faces.py`, `process.py`, `forward.py`): they listen
on the face's port side by side, are started again when one dies, grade through the engine's process over
the gRPC contract (in pieces, with the request's failure ratio over all of them), and answer 503 with a
retry hint when the engine does not answer."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from grpcgrade.core.engine import Engine
from grpcgrade.core.registry import get_registry
from grpcgrade.core.rewards import SpecData
from grpcgrade.service.http.forward import FORWARD_PIECE, EngineLink
from grpcgrade.testing import ServerProcess, eventually, face_pids, health_status

CONFIG = """
default_reward: exact
http: {failure_reward: -1.0}
rewards:
  exact:
    graders: [{name: string_match}]
  flaky:
    graders: [{name: misbehave, params: {heavy: false}}]
"""
TOKEN = "face-token"


def slime(srv: ServerProcess, response: str, label: str, path: str = "/slime") -> object:
    """slime's body (`remote_rm`): the reward as a JSON number."""
    url = srv.http + path
    body = json.dumps({"prompt": "q", "response": response, "label": label}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    request.add_header("Authorization", "Bearer " + TOKEN)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def listeners(port: int) -> set[int]:
    """The PIDs holding a socket that listens on `port` (from /proc/net/tcp and each process's fds)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    owners = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            links = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
        except OSError:
            continue
        if links & inodes:
            owners.add(int(entry.name))
    return owners


@pytest.fixture(scope="module")
def two_faces(face_server):
    return face_server(CONFIG, token=TOKEN, more=["--http-processes", "2"])


def test_the_face_processes_listen_on_the_port_and_the_engine_process_does_not(two_faces):
    faces = face_pids(two_faces.proc.pid)
    assert len(faces) == 2
    assert listeners(two_faces.http_port) == set(faces)  # the server only holds the port (SO_REUSEPORT)
    assert [slime(two_faces, "x", "x") for _ in range(8)] == [1.0] * 8


def test_the_face_processes_run_on_uvloops_event_loop(two_faces):
    """uvloop is a server dependency: each face process serves on its loop (its extension module is mapped
    into the process: nothing else in a face imports uvloop)."""
    import uvloop.loop

    for pid in face_pids(two_faces.proc.pid):
        assert uvloop.loop.__file__ in Path(f"/proc/{pid}/maps").read_text()


def test_a_scrape_counts_every_request_the_faces_answered_before_it(two_faces):
    """The face processes send their counts every `counters.BATCH_SECONDS`, not one message per request
    (a pipe write each); a scrape asks each face for its counts first, so the requests answered just before
    it, by either face (each on a connection of its own: the kernel spreads them), are all in it."""
    counted = lambda: two_faces.metric("grpcgrade_http_requests_total", face="slime", code="200")  # noqa: E731
    for _ in range(3):
        before = counted()
        assert [slime(two_faces, "x", "x") for _ in range(20)] == [1.0] * 20
        assert counted() == before + 20


def test_a_face_process_that_does_not_answer_does_not_hold_a_scrape(two_faces):
    """A stopped face process (SIGSTOP) cannot answer the scrape's ask for its counts: the scrape is
    answered without them (after `faces.FLUSH_WAIT_SECONDS`), and once it runs again its counts arrive."""
    counted = lambda: two_faces.metric("grpcgrade_http_requests_total", face="slime", code="200")  # noqa: E731
    before = counted()
    assert [slime(two_faces, "x", "x") for _ in range(20)] == [1.0] * 20
    stopped = face_pids(two_faces.proc.pid)[0]
    os.kill(stopped, signal.SIGSTOP)
    try:
        for _ in range(2):
            assert before <= counted() <= before + 20  # answered, whatever the stopped face had sent
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert counted() == before + 20


def test_a_killed_face_process_is_started_again_and_answers(face_server):
    srv = face_server(CONFIG, token=TOKEN)
    (face,) = face_pids(srv.proc.pid)
    assert slime(srv, "yes", "yes") == 1.0
    os.kill(face, signal.SIGKILL)
    eventually(lambda: face_pids(srv.proc.pid) not in ([], [face]), "a new face process")

    def answers() -> bool:
        try:
            return slime(srv, "yes", "no") == 0.0
        except (urllib.error.URLError, ConnectionError):  # still starting: nobody listens yet
            return False

    eventually(answers, "the new face process answers")
    assert f"HTTP face process 0 (pid {face}) exited" in srv.log()
    assert health_status(srv.target) == 1  # SERVING all along: the engine never stopped


def test_a_large_request_goes_in_pieces_and_its_failure_ratio_holds_over_all_of_them(two_faces):
    """A request of several pieces: every sample answered in order. Its failures (all in its first piece,
    more than the ratio allows of a piece, fewer than of the request) are counted over the request: a
    ratio checked per piece would refuse it."""
    n = 2 * FORWARD_PIECE + 800
    bad = FORWARD_PIECE // 5  # 20% of the first piece, under 10% of the request
    queries = ["nan"] * bad + ["x"] * (n - bad)
    url = two_faces.http + "/rewards/flaky/get_reward"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    body = json.dumps({"query": queries, "max_failure_ratio": 0.1}).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=auth), timeout=120) as answer:
        data = json.loads(answer.read())
    assert data["rewards"] == [-1.0] * bad + [1.0] * (n - bad)
    over = json.dumps({"query": ["nan"] * (n // 10 + 1) + ["x"] * (n - n // 10 - 1), "max_failure_ratio": 0.1})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=over.encode(), headers=auth), timeout=120)
    assert refused.value.code == 400
    assert "FAILED_PRECONDITION" in refused.value.read().decode()


def test_an_engine_that_does_not_answer_is_a_503_with_a_retry_hint(tmp_path):
    """The link's call to an engine process that is not there (restarting, gone): the face answers 503
    with Retry-After, never a reward."""
    jobs = Engine(get_registry(), None, grader_timeout=5.0).resolve([SpecData("string_match", {})])

    async def call() -> None:
        link = EngineLink(f"unix:{tmp_path / 'no-engine.sock'}", None, 4 * 1024 * 1024)
        try:
            await link.grade_chunk(jobs, [(0, {"response": "a", "reference": "a"})], timeout=5.0)
        finally:
            await link.close()

    with pytest.raises(web.HTTPServiceUnavailable) as refused:
        asyncio.run(call())
    assert int(refused.value.headers["Retry-After"]) >= 1
    assert "not reachable" in refused.value.text


def test_an_item_nested_deeper_than_the_contract_carries_is_refused_naming_it(two_faces):
    """OpenAI's `item` goes to the engine's process inside a Sample, which protobuf parses to a depth of 100
    messages (two per JSON level): one nested deeper was a 500 (the engine could not parse the call). Now
    400 naming `item`, and an item at the limit is graded."""
    url = two_faces.http + "/v1/fine_tuning/alpha/graders/run"
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    grader = {"type": "string_check", "name": "s", "input": "{{item.x}}", "reference": "a", "operation": "eq"}

    def nested(depth: int) -> object:
        value: object = "a"
        for _ in range(depth - 1):  # the item itself is one level
            value = [value]
        return value

    def run(item: object) -> tuple[int, dict]:
        body = json.dumps({"grader": grader, "model_sample": "a", "item": item}).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=auth), timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    # protobuf levels: the item's Value and Struct and its map entry (3), then 2 a list, 1 the innermost text
    status, answer = run({"x": "a", "n": nested(47)})  # 3 + 2 * 46 + 1 = 96: carried
    assert status == 200 and answer["reward"] == 1.0, answer
    status, answer = run({"x": "a", "n": nested(48)})  # 98: not
    assert status == 400 and answer["error"]["param"] == "item", answer
