"""A soak under worker deaths: mixed BatchEvaluate load while worker processes are killed mid-result.

Not run in CI (minutes of full load on every core, and signals sent to the server it starts). Run it by hand
before a release, or after a change to the execution layer:

    python scripts/soak.py                     # 8 streams for 120 s, a fault every 3 s
    python scripts/soak.py --duration 600 --fault-interval 0.5

What it checks is what a training run depends on when workers die (the OOM killer, an operator, a grader
that crashes): every sample sent is answered exactly once, with the answer it gets when nothing goes
wrong, and no call hangs. First a calm pass grades a pool of samples with each grader mix (the reference
answers); then streams of calls take random subsets of the pool (each call's ids unique, and long, so a
chunk's answer is far larger than a pipe holds) while a fault thread takes turns at:

- `kill`: SIGKILL a random worker (whatever it is doing: grading, writing an answer, idle);
- `kill-mid-write`: SIGSTOP the server so its workers block writing their answers, SIGKILL a worker that is
  blocked in a write, SIGCONT the server (the wedge of issue 32);
- `stop`: SIGSTOP a worker for a moment (less than any watchdog), then SIGCONT it.

It prints samples sent, answered exactly once, lost, doubled, wrong (an answer that differs from the
reference; a WORKER_LOST or TIMEOUT counts here too: no sample should have lost its result), failed calls,
hung calls (past --call-timeout) and the faults made, and exits non-zero unless lost, doubled, wrong,
failed and hung are all 0 and the server exits 0 on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from grpcgrade.service.convert import sample_to_pb, spec_to_pb
from grpcgrade.testing import start_server, worker_pids, writing
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

#: The grader mixes and how calls take them: whole chunks in workers (answers of megabytes), the scores
#: view of whole chunks, a heavy grader in guided chunks, small bounded calls graded inline, and a
#: grader per chunk in workers through the result cache.
MIXES: dict[str, tuple[list[object], dict[str, object], int]] = {
    "whole": (["json_validator", {"name": "string_match", "params": {"algorithm": "exact_match"}}], {}, 2048),
    "scores": (["json_validator"], {"view": pb.RESULT_VIEW_SCORES}, 2048),
    "heavy": ([{"name": "similarity", "params": {"algorithm": "chrf"}}], {}, 256),
    "inline": (["json_validator", "think_format"], {}, 8),
    "cached": (["json_validator", {"name": "similarity", "params": {"algorithm": "fuzzy_match"}}], {"cache": 2}, 512),
}
POOL = 4096
ID_CHARS = 600  # each answer repeats its sample's id: a 2,048-sample chunk answers ~1.3 MB
WORDS = 'the model answers 42 because 6 times 7 is 42 and nothing else { } [ ] " : , 漢字 é'.split()


def pool_samples(seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(POOL):
        text = " ".join(rng.choices(WORDS, k=rng.randint(1, 60)))
        response = [f"<think>\n{text}\n</think>\n42", json.dumps({"a": [i]}), text][i % 3]
        out.append({"response": response, "reference": response if i % 5 else text + "!"})
    return out


def answer_of(result: pb.EvaluateResponse) -> tuple[object, ...]:
    """What must match the reference: each grader's score or error code, and the reward."""
    each = tuple(r.error.code if r.HasField("error") else r.score for r in result.results)
    return (*each, result.reward if result.HasField("reward") else None)


def scores_answers(message: pb.BatchEvaluateResponse) -> list[tuple[int, tuple[object, ...]]]:
    """The scores view's answers, as `answer_of` gives the full view's (without the reward's absence)."""
    cols = message.columns
    out = []
    for row, index in enumerate(cols.indices):
        each = []
        for col in cols.scores:
            errors = dict(zip(col.error_rows, col.errors, strict=True))
            each.append(errors[row].code if row in errors else col.scores[row])
        reward = None if row in set(cols.reward_absent_rows) else cols.rewards[row]
        out.append((index, (*each, reward)))
    return out


def call(
    stub: pb_grpc.GradingServiceStub, mix: str, picks: list[int], pool: list[dict[str, str]], tag: str, timeout: float
) -> tuple[dict[int, list[tuple[object, ...]]], str]:
    """One call over pool samples `picks`: each request index's answers (several: doubled), or a failure."""
    graders, fields, _ = MIXES[mix]
    samples = [sample_to_pb({"id": f"{tag}-{k}-".ljust(ID_CHARS, "x"), **pool[p]}) for k, p in enumerate(picks)]
    request = pb.BatchEvaluateRequest(graders=[spec_to_pb(g) for g in graders], samples=samples, **fields)  # type: ignore[arg-type]
    answers: dict[int, list[tuple[object, ...]]] = {}
    try:
        for message in stub.BatchEvaluate(request, timeout=timeout):
            if message.HasField("columns"):
                pairs = scores_answers(message)
            else:
                pairs = [(item.index, answer_of(item.result)) for item in message.items]
            for index, answer in pairs:
                answers.setdefault(index, []).append(answer)
    except grpc.RpcError as exc:
        return answers, exc.code().name
    return answers, ""


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: int = 0
    sent: int = 0
    once: int = 0
    lost: int = 0
    doubled: int = 0
    wrong: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    hung: int = 0
    wrong_examples: list[str] = field(default_factory=list)


def stream(
    stub: pb_grpc.GradingServiceStub,
    pool: list[dict[str, str]],
    reference: dict[str, dict[int, tuple[object, ...]]],
    until: float,
    seed: int,
    timeout: float,
    tally: Tally,
) -> None:
    rng = random.Random(seed)
    n = 0
    while time.monotonic() < until:
        mix = rng.choice(list(MIXES))
        picks = [rng.randrange(POOL) for _ in range(MIXES[mix][2])]
        answers, failure = call(stub, mix, picks, pool, f"s{seed}c{n}", timeout)
        n += 1
        with tally.lock:
            tally.calls += 1
            tally.sent += len(picks)
            if failure == "DEADLINE_EXCEEDED":
                tally.hung += 1
            elif failure:
                tally.failed[failure] += 1
            for k, p in enumerate(picks):
                got = answers.get(k, [])
                if not got:
                    tally.lost += 1
                    continue
                tally.doubled += len(got) > 1
                tally.once += len(got) == 1
                if got[0] != reference[mix][p]:
                    tally.wrong += 1
                    if len(tally.wrong_examples) < 5:
                        tally.wrong_examples.append(f"{mix} pool[{p}]: {got[0]} != {reference[mix][p]}")


def faults(server_pid: int, interval: float, stop: threading.Event, seed: int, made: Counter[str]) -> None:
    """Takes turns at the faults of the module docstring until `stop` is set."""
    rng = random.Random(seed)
    kinds = ["kill", "kill-mid-write", "stop"]
    while not stop.wait(interval * rng.uniform(0.5, 1.5)):
        pids = worker_pids(server_pid)
        if not pids:
            continue
        kind = kinds[len(made) % 3] if sum(made.values()) < 3 else rng.choice(kinds)
        try:
            if kind == "kill":
                os.kill(rng.choice(pids), signal.SIGKILL)
            elif kind == "stop":
                victim = rng.choice(pids)
                os.kill(victim, signal.SIGSTOP)
                time.sleep(0.3)
                os.kill(victim, signal.SIGCONT)
            else:
                os.kill(server_pid, signal.SIGSTOP)
                try:
                    deadline = time.monotonic() + 4.0  # the workers finish what they grade, then block writing
                    blocked: list[int] = []
                    while not blocked and time.monotonic() < deadline:
                        time.sleep(0.05)
                        blocked = [p for p in pids if writing(p)]
                    if not blocked:
                        kind = "kill-mid-write (none writing: killed one)"
                    os.kill(rng.choice(blocked or pids), signal.SIGKILL)
                    time.sleep(0.1)
                finally:
                    os.kill(server_pid, signal.SIGCONT)
        except ProcessLookupError:
            continue
        made[kind] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8, help="concurrent BatchEvaluate streams")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load under faults")
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument("--fault-interval", type=float, default=3.0, help="mean seconds between faults")
    parser.add_argument("--call-timeout", type=float, default=120.0, help="a call not done by then is hung")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    pool = pool_samples(args.seed)
    tally, made = Tally(), Counter[str]()
    with tempfile.TemporaryDirectory(prefix="grpcgrade-soak-") as tmp:
        config = Path(tmp) / "soak.yaml"  # every fault meets the grading afresh: no quarantine
        config.write_text("quarantine: {enabled: false}\n")
        server = start_server(Path(tmp), "--workers", str(args.workers), "--config", str(config))
        options = [("grpc.max_receive_message_length", 64 << 20)]
        try:
            with grpc.insecure_channel(server.target, options=options) as channel:
                stub = pb_grpc.GradingServiceStub(channel)
                reference = {}
                for mix in MIXES:  # the calm pass: every pool sample once per mix, no fault
                    answers, failure = call(stub, mix, list(range(POOL)), pool, f"ref-{mix}", 600)
                    if failure or len(answers) != POOL:
                        print(f"FAIL: the calm pass of {mix} failed: {failure}", file=sys.stderr)
                        return 1
                    reference[mix] = {p: got[0] for p, got in answers.items()}
                restarts_before = server.metric("grpcgrade_worker_pool_restarts_total")
                stop = threading.Event()
                faulting = threading.Thread(target=faults, args=(server.proc.pid, args.fault_interval, stop, 1, made))
                started = time.monotonic()
                until = started + args.duration
                threads = [
                    threading.Thread(
                        target=stream, args=(stub, pool, reference, until, args.seed + i, args.call_timeout, tally)
                    )
                    for i in range(args.streams)
                ]
                faulting.start()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                stop.set()
                faulting.join()
                elapsed = time.monotonic() - started
                deadline = time.monotonic() + 60
                while server.metric("grpcgrade_workers_alive") != args.workers and time.monotonic() < deadline:
                    time.sleep(0.1)
                alive = server.metric("grpcgrade_workers_alive")
                restarts = server.metric("grpcgrade_worker_pool_restarts_total") - restarts_before
                after, failure = call(stub, "whole", list(range(64)), pool, "after", 60)
                healthy = not failure and all(after[k][0] == reference["whole"][k] for k in range(64))
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
            code = server.stop()

    print(
        f"soak: {elapsed:.0f} s, {args.streams} streams, {args.workers} workers, {tally.calls} calls; "
        f"faults made {sum(made.values())} {dict(made)}; worker restarts {restarts:.0f}; "
        f"samples sent {tally.sent}, answered exactly once {tally.once}, lost {tally.lost}, "
        f"doubled {tally.doubled}, wrong {tally.wrong}; failed calls {sum(tally.failed.values())}"
        f"{f' {dict(tally.failed)}' if tally.failed else ''}, hung calls {tally.hung}; "
        f"after: workers alive {alive:.0f}, a call graded right {healthy}; server exit code {code}"
    )
    for example in tally.wrong_examples:
        print(f"  wrong: {example}", file=sys.stderr)
    bad = tally.lost or tally.doubled or tally.wrong or tally.failed or tally.hung
    if bad or not healthy or alive != args.workers or code != 0:
        print("FAIL", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
