"""The HTTP face against hostile clients, on a real server: credentials that are not UTF-8, bodies past
the limit, connections that never finish their headers or sit idle, more connections than the cap; and
gRPC callers keep being answered meanwhile (issue 33)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from grpcgrade.core.json_body import PARSER_NICENESS
from grpcgrade.service.http.limits import INLINE_PARSE_BYTES, MAX_JSON_CONTAINERS, PARSE_PROCESSES
from grpcgrade.service.http.openai_graders import MOUNT_PATH
from grpcgrade.testing import (
    CpuSince,
    ServerProcess,
    eventually,
    face_pids,
    memory_kib,
    parser_pids,
    start_server,
    writing,
)
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

HEAD_SECONDS, IDLE_SECONDS, MAX_CONNECTIONS, MAX_BODY = 2, 2, 16, 4 * 1024 * 1024
HELD_BODIES = 3  # bodies of MAX_BODY the face may hold at once
CONFIG = f"""
default_reward: exact
http: {{header_timeout_seconds: {HEAD_SECONDS}, idle_timeout_seconds: {IDLE_SECONDS},
        max_connections: {MAX_CONNECTIONS}, max_body_bytes: {MAX_BODY}}}
limits: {{max_pending_request_bytes: {HELD_BODIES * MAX_BODY}}}
rewards:
  exact:
    graders: [{{name: string_match}}]
"""
GRADER = {"type": "string_check", "name": "s", "input": "{{sample.output_text}}", "reference": "a", "operation": "eq"}
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "config.yaml").write_text(CONFIG)
    (tmp / "tokens").write_text(TOKEN + "\n")
    args = ["--workers", "1", "--config", "config.yaml", "--auth-token-file", "tokens"]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))  # the server starts with a low soft limit
    try:
        srv = start_server(tmp, *args, http=True)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    yield srv
    srv.stop()


def raw_request(port: int, head: bytes, body: bytes = b"", timeout: float = 30) -> bytes:
    """Send `head` (request line and headers, without the blank line) and `body` as they are; the answer's
    bytes up to the server's close (every request here says Connection: close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + b"\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize("path", ["/get_reward", "/rewards/exact/get_reward", MOUNT_PATH + "/run"])
def test_credentials_that_are_not_utf8_are_401_and_one_log_line(hostile_server: ServerProcess, path: str) -> None:
    """`Authorization: Bearer \\xe9` answered 500 with a 26-line traceback per request before."""
    before = hostile_server.log()
    head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    answer = raw_request(hostile_server.http_port, head + b"Authorization: Bearer \xe9\xff", b'{"query": ["x"]}')
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    eventually(lambda: hostile_server.log() != before, "the log line")  # written as the answer goes out
    new = hostile_server.log()[len(before) :].splitlines()
    assert len(new) == 1 and "Authorization" in new[0] and "Traceback" not in new[0], new


AUTH = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
RUN = b"POST " + MOUNT_PATH.encode() + b"/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + AUTH


def test_a_body_declared_over_the_limit_is_413_before_it_is_sent(hostile_server: ServerProcess) -> None:
    """A 60 MB body (under gRPC's 64 MiB message limit, the face's limit before) was read to its end."""
    with socket.create_connection(("127.0.0.1", hostile_server.http_port), timeout=30) as sock:
        sock.sendall(RUN + b"Content-Length: 60000000\r\n\r\n" + b'{"item": "' + b"x" * 65536)
        answer = sock.recv(65536)  # the rest is never sent: only an early answer ends this wait
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"max_body_bytes" in answer


class GrpcCaller:
    """Calls Evaluate over and over on its own thread, recording when each call ended."""

    def __init__(self, target: str) -> None:
        self.ended: list[float] = []
        self.stopped = threading.Event()
        self.channel = grpc.insecure_channel(target)
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        stub = pb_grpc.GradingServiceStub(self.channel)
        request = pb.EvaluateRequest(graders=[pb.GraderSpec(name="json_validator")], sample=pb.Sample(response="1"))
        while not self.stopped.is_set():
            stub.Evaluate(request, timeout=120, metadata=(("authorization", f"Bearer {TOKEN}"),))
            self.ended.append(time.monotonic())

    def __enter__(self) -> GrpcCaller:
        self.thread.start()
        while not self.ended:  # the channel is up and calls go through
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(120)
        self.channel.close()

    def between(self, start: float, end: float) -> int:
        return sum(start < t < end for t in self.ended)


def post_raw(port: int, head: bytes, body: bytes) -> tuple[bytes, float, float]:
    """(the answer, when the body was sent, when the answer came)."""
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.sendall(head + b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        sent = time.monotonic()
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer, sent, time.monotonic()


def test_a_body_that_is_slow_to_parse_does_not_hold_grpc_callers(hostile_server: ServerProcess) -> None:
    """A body of 90,000 empty lists (270 kB, under the body limit): the C decoder held the event loop for
    all of the parse (0.5 s here), during which no gRPC call could end. Parsed off the loop now. Shown by
    order, not by time: with the parsing processes stopped (SIGSTOP) the body waits for them, and gRPC calls
    keep ending meanwhile, 20 of them after it was sent with no answer to it yet; resumed, the request is
    answered (400: it has no model_sample). Parsed on the loop, the answer would come first: the loop could
    end no call while it parsed, and wrote the answer as soon as it had. With more arrays and objects than
    MAX_JSON_CONTAINERS it is refused as it is parsed (413)."""
    item = b"[" + b"[]," * 90_000 + b"[]]"
    body = b'{"grader": ' + json.dumps(GRADER).encode() + b', "item": ' + item + b"}"
    assert len(body) > INLINE_PARSE_BYTES
    server = hostile_server.proc.pid
    eventually(lambda: len(parser_pids(server)) == PARSE_PROCESSES, "the parsing processes up")
    pids = parser_pids(server)
    with (
        GrpcCaller(hostile_server.target) as caller,
        socket.create_connection(("127.0.0.1", hostile_server.http_port), timeout=300) as sock,
    ):
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            sock.sendall(RUN + b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            sent = time.monotonic()
            eventually(lambda: caller.between(sent, time.monotonic()) >= 20, "gRPC calls ending while the body waits")
            unanswered = not select.select([sock], [], [], 0)[0]
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert unanswered, answer[:300]
    assert answer.startswith(b"HTTP/1.1 400 ") and b"model_sample: is required" in answer, answer[:300]
    many = b'{"grader": {}, "item": [' + b"[]," * MAX_JSON_CONTAINERS + b"[]]}"
    answer, *_ = post_raw(hostile_server.http_port, RUN, many)
    assert answer.startswith(b"HTTP/1.1 413 ") and f"more than {MAX_JSON_CONTAINERS} arrays".encode() in answer


def niceness(pid: int) -> int:
    """A process's nice value (/proc/PID/stat's 19th field)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_a_parsing_process_killed_is_replaced(hostile_server: ServerProcess) -> None:
    """Bodies past INLINE_PARSE_BYTES are parsed in the face's parsing processes. One killed (SIGKILL, as
    the OOM killer would) broke their pool for good, every later large body answered 500; now they are
    replaced and the body answered. Both killed at once, a body that arrives before the pool has noticed is
    answered too: neither dead process read it, so it goes to a replacement (it met both dead processes and
    was 503, "died twice", before; 400 before that)."""
    deadline = time.monotonic() + 60  # started with the face; named once they have started (this bounds it)
    while len(pids := parser_pids(hostile_server.proc.pid)) < PARSE_PROCESSES and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pids) == PARSE_PROCESSES
    server_nice = niceness(hostile_server.proc.pid)
    expected = min(19, server_nice + PARSER_NICENESS)  # 19: the kernel's ceiling (a server started under nice)
    assert [niceness(pid) for pid in pids] == [expected] * len(pids)  # they yield the cores
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    labels = ["b" * 100 for _ in range(INLINE_PARSE_BYTES // 50)]
    body = json.dumps({"query": ["a"] * len(labels), "labels": labels}).encode()
    assert len(body) > INLINE_PARSE_BYTES
    head = b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + AUTH
    answer, *_ = post_raw(hostile_server.http_port, head, body)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["rewards"] == [0.0] * len(labels)  # "a" is no "b..."
    assert set(parser_pids(hostile_server.proc.pid)).isdisjoint(pids)


def test_a_body_its_parsing_processes_could_not_parse_is_503_with_a_retry_hint() -> None:
    """A body whose parsing processes died twice or hung (`limits._ParseItem.failed`: status 503; the test
    above met it when its body went to both dead processes) is the server's trouble, answered 503 with
    Retry-After; it was 400, which tells a trainer its body is wrong and not to send it again."""
    from grpcgrade.core.json_body import BodyError
    from grpcgrade.service.http.common import http_error

    refused = http_error(BodyError("the request body could not be parsed (WORKER_LOST): ...", status=503))
    assert refused.status == 503
    assert int(refused.headers["Retry-After"]) >= 1


def large_post(port: int, body: bytes, out: list[bytes]) -> threading.Thread:
    """POST `body` to /get_reward on a thread; `out` gets the answer (a minute at most: a wedged face fails
    the test instead of hanging it)."""
    head = b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + AUTH

    def run() -> None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(head + b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            out.append(answer)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_parsing_process_killed_while_it_writes_a_parsed_body_wedges_nothing(hostile_server: ServerProcess) -> None:
    """A 3 MB body's parsed answer is far more than a pipe holds. With the face process stopped, the parsing
    process blocks writing it back; killed there (the OOM killer's timing), the body is parsed again in a
    new process and answered, and so are later large bodies. Before, the parsing processes shared one result
    pipe (a ProcessPoolExecutor): its reader was left with half a message, and every later large body
    waited forever."""
    server = hostile_server.proc.pid
    (face,) = face_pids(server)  # the parsing processes' parent, which reads their answers
    eventually(lambda: len(parser_pids(server)) == PARSE_PROCESSES, "the parsing processes up")
    labels = ["b" * 2000 for _ in range(1500)]
    body = json.dumps({"query": ["a"] * len(labels), "labels": labels}).encode()
    assert INLINE_PARSE_BYTES < len(body) < MAX_BODY
    for _attempt in range(20):  # catch a parsing process mid-write (it may finish before the server stops)
        pids = parser_pids(server)
        parsers = CpuSince(pids)
        out: list[bytes] = []
        thread = large_post(hostile_server.http_port, body, out)
        # CPU is counted in clock ticks: a parse that took less than one may never show, so a request
        # answered before any parsing process was seen at work is one more try, not a wedge.
        eventually(lambda p=parsers, t=thread: p.busy() or not t.is_alive(), "a parsing process at work", every=0.001)
        if not thread.is_alive():
            assert out and out[0].startswith(b"HTTP/1.1 200 "), out[:1]
            victim = None
            continue
        os.kill(face, signal.SIGSTOP)
        try:
            stop = time.monotonic() + 2  # a bound on the poll, not a timing assertion
            while time.monotonic() < stop and not any(writing(p) for p in pids):
                time.sleep(0.01)
            victim = next((p for p in pids if writing(p)), None)
            if victim is not None:
                os.kill(victim, signal.SIGKILL)
                eventually(lambda v=victim: not Path(f"/proc/{v}/cmdline").read_bytes(), "the killed process gone")
        finally:
            os.kill(face, signal.SIGCONT)
        thread.join(90)
        assert not thread.is_alive() and out, "the body's request hung"
        assert out[0].startswith(b"HTTP/1.1 200 "), out[0][:300]
        assert json.loads(out[0].split(b"\r\n\r\n", 1)[1])["rewards"] == [0.0] * len(labels)
        if victim is not None:
            break
    assert victim is not None, "no parsing process was caught writing in 20 tries"
    later: list[bytes] = []
    large_post(hostile_server.http_port, body, later).join(90)
    assert later and later[0].startswith(b"HTTP/1.1 200 "), later[:1]
    eventually(lambda: len(parser_pids(server)) == PARSE_PROCESSES, "the parsing processes whole again")
    assert victim not in parser_pids(server)


def test_an_oversized_body_is_refused_while_grpc_callers_are_answered(hostile_server: ServerProcess) -> None:
    """The issue's 40-60 MB POST, its `item` never size-checked: now 413 (over max_body_bytes), and an item
    under the body limit but over max_field_chars is 400 naming it; gRPC calls end meanwhile."""
    big = json.dumps({"grader": GRADER, "model_sample": "a", "item": {"x": "y" * (50 << 20)}}).encode()
    grown = json.dumps({"grader": GRADER, "model_sample": "a", "item": {"x": "y" * 2_000_000}}).encode()
    with GrpcCaller(hostile_server.target) as caller:
        refused, sent, answered = post_raw(hostile_server.http_port, RUN, big)
        too_long, *_ = post_raw(hostile_server.http_port, RUN, grown)
        ended = caller.between(sent, time.monotonic())
    assert refused.startswith(b"HTTP/1.1 413 "), refused[:300]
    assert too_long.startswith(b"HTTP/1.1 400 ") and b"item: " in too_long and b"max_field_chars" in too_long
    assert ended > 0


def test_connections_that_never_finish_their_head_are_closed(hostile_server: ServerProcess) -> None:
    """They stayed open (1,100 of them exhausted the server's descriptors); now each is closed once
    header_timeout_seconds have passed since it opened, even while it trickles bytes."""
    socks = [socket.create_connection(("127.0.0.1", hostile_server.http_port), timeout=30) for _ in range(8)]
    try:
        for sock in socks:
            sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: x\r\n")
        for sock in socks:
            assert sock.recv(1024) == b""  # closed by the server (a timeout here raises instead)
    finally:
        for sock in socks:
            sock.close()


def test_an_idle_keep_alive_connection_is_closed(hostile_server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", hostile_server.http_port), timeout=30) as sock:
        body = json.dumps({"query": ["a"]}).encode()
        head = b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + AUTH
        sock.sendall(head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ")
        rest = sock.recv(1024)  # nothing more is sent: the server closes the connection once it is idle
    assert rest == b""


def reward_request(port: int) -> bytes:
    """A complete, authorized OpenRLHF request; b"" when the server closed the connection without answering."""
    try:
        return raw_request(port, b"POST /get_reward HTTP/1.1\r\nHost: x\r\n" + AUTH.rstrip(), b'{"query": ["a"]}')
    except ConnectionResetError:  # closed with the request unread: the kernel resets the connection
        return b""


def test_connections_past_the_cap_are_closed_at_once(hostile_server: ServerProcess) -> None:
    """Past max_connections a new connection is closed before it is read: its complete request gets no
    answer. gRPC, not counted, still answers; and the face answers again once connections are gone."""
    port = hostile_server.http_port
    held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(MAX_CONNECTIONS)]
    try:
        assert reward_request(port) == b""
        with GrpcCaller(hostile_server.target) as caller:
            assert caller.ended
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 30
    while (answer := reward_request(port)) == b"":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert answer.startswith(b"HTTP/1.1 200 ")


def _open_post(port: int, body: bytes) -> socket.socket:
    """A post declaring a body of MAX_BODY bytes of which only `body` is sent: held open by the face."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Type: application/json\r\n"
                 b"Content-Length: " + str(MAX_BODY).encode() + b"\r\n\r\n" + body)  # fmt: skip
    return sock


def test_bodies_past_what_a_face_may_hold_are_refused_503(hostile_server: ServerProcess) -> None:
    """Each body is held from its arrival to its answer: 100 posts of 8 MB at once took a face process to
    1.7 GB resident. Past `limits.max_pending_request_bytes` a request is refused at once with the retry hint,
    unread, counted under its limit; once the held bodies are gone, the same request is answered."""
    port = hostile_server.http_port

    def probe() -> bytes:
        """A post declaring 5 kB, past the room the held bodies leave; without credentials, so that once
        admitted it is answered 401 unread and holds nothing while the held bodies are read."""
        return raw_request(port, b"POST /get_reward HTTP/1.1\r\nHost: x", b"x" * 5000)

    held = [_open_post(port, b"x" * (MAX_BODY - 1)) for _ in range(HELD_BODIES)]  # all but their last byte
    try:
        eventually(lambda: probe().startswith(b"HTTP/1.1 503 "), "a request past the bodies held refused")
        answer = probe()
        assert answer.startswith(b"HTTP/1.1 503 ") and b"\r\nRetry-After: 1\r\n" in answer
        assert b"max_pending_request_bytes" in answer
        for sock in held:  # still being read: none was refused
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
    finally:
        for sock in held:
            sock.close()
    eventually(lambda: reward_request(port).startswith(b"HTTP/1.1 200 "), "answered once the held bodies are gone")
    eventually(
        lambda: hostile_server.metric("grpcgrade_calls_refused_total", limit="max_pending_request_bytes") >= 2,
        "the refusals counted under their limit",
    )


def test_bodies_declared_and_not_sent_hold_nothing(hostile_server: ServerProcess) -> None:
    """A body counts as it arrives, not as declared: clients declaring large bodies and trickling them (here
    over four times the bound, sending nothing) cannot take the bound from the others."""
    port = hostile_server.http_port
    trickling = [_open_post(port, b"") for _ in range(MAX_CONNECTIONS - 2)]  # 14 x 4 MiB declared: 4.7 x the bound
    try:
        assert reward_request(port).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in trickling:
            sock.close()


def test_rejected_samples_leave_nothing_behind_in_the_face(hostile_server: ServerProcess) -> None:
    """A sample the face rejects (a text over `max_field_chars`) was kept as its SampleProblem with its
    traceback, whose frames held the text and the list the problem was kept in: a reference cycle, freed
    only by a full collection, which a face process runs seldom. A face grew by every rejected text (1.4 GB
    after nine rounds of 16 posts of 8 MB). Here 10 rounds of 3 posts of ~3.5 MB at once: resident memory
    may not grow by the texts graded, only by allocator noise."""
    (face,) = face_pids(hostile_server.proc.pid)
    text = "x" * (MAX_BODY - 600_000)  # over max_field_chars (1,000,000), under the body limit
    body = json.dumps({"query": [text], "labels": ["x"]}).encode()
    head = b"POST /get_reward HTTP/1.1\r\nHost: x\r\n" + AUTH.rstrip()

    def post(_: int) -> bytes:
        return raw_request(hostile_server.http_port, head, body)

    with futures.ThreadPoolExecutor(HELD_BODIES) as pool:
        assert all(a.startswith(b"HTTP/1.1 200 ") for a in pool.map(post, range(HELD_BODIES)))  # warm
        before = memory_kib(face)
        graded = 0  # posts read and graded (the others were refused 503 unread: limits.max_pending_request_bytes)
        for _ in range(10):
            answers = list(pool.map(post, range(HELD_BODIES)))
            assert all(a.startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 503 ")) for a in answers)
            graded += sum(a.startswith(b"HTTP/1.1 200 ") for a in answers)
    grown = (memory_kib(face) - before) * 1024
    assert graded >= 10
    assert grown < graded * len(text) / 2, f"the face grew by {grown >> 20} MiB over {graded} rejected texts"


def test_the_server_raises_its_soft_open_files_limit(hostile_server: ServerProcess) -> None:
    """Started with a soft limit of 1,024 (as systemd and many shells give), it runs with its hard limit."""
    limits = Path(f"/proc/{hostile_server.proc.pid}/limits").read_text()
    (line,) = [row for row in limits.splitlines() if row.startswith("Max open files")]
    soft, hard = line.split()[3:5]
    assert soft == hard, line


def test_the_http_bounds_are_configured_and_checked() -> None:
    from grpcgrade.core.config import HttpConfig, parse_config
    from grpcgrade.core.errors import ConfigError

    http = parse_config({"http": {"max_body_bytes": 1024, "idle_timeout_seconds": 0.5, "max_connections": 3}}).http
    assert (http.max_body_bytes, http.idle_timeout_seconds, http.max_connections) == (1024, 0.5, 3)
    assert http.header_timeout_seconds == HttpConfig().header_timeout_seconds
    assert HttpConfig().max_body_bytes < 64 * 1024 * 1024
    for key, value in (("max_connections", 0), ("max_body_bytes", 1.5), ("header_timeout_seconds", -1)):
        with pytest.raises(ConfigError, match=f"http: {key}"):
            parse_config({"http": {key: value}})
