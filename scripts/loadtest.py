"""A bounded load test: concurrent BatchEvaluate streams of mixed graders against a server it starts itself.

Not run in CI (a minute of full load on every core). Run it by hand before a release:

    python scripts/loadtest.py                       # 16 streams for 60 s
    python scripts/loadtest.py --streams 32 --duration 300

It checks what a long training run depends on and a unit test cannot see: under sustained concurrent load
every sample sent is answered exactly once (none lost, none doubled, none with a missing grader result), and
the server's memory (its process and its worker processes) stops growing once warm. It exits non-zero when
a sample is lost, a call fails, or RSS grows by more than --max-rss-growth-mib between the end of the warm-up
and the end of the run. The server listens on a free loopback port and is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from grpcgrade.service.convert import sample_to_pb, spec_to_pb
from grpcgrade.testing import start_server
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

# Grader mixes the streams take turns with: cheap inline graders, worker-pool similarity, and both at once.
MIXES: list[list[pb.GraderSpec]] = [
    [spec_to_pb(g) for g in mix]
    for mix in (
        ["json_validator", {"name": "string_match", "params": {"algorithm": "substring_match"}}],
        [{"name": "similarity", "params": {"algorithm": "fuzzy_match"}}, "number_accuracy", "length_penalty"],
        ["think_format", "math_exact", {"name": "similarity", "params": {"algorithm": "rougeL"}, "weight": 2}],
        [{"name": "similarity", "params": {"algorithm": "chrf"}}, {"name": "json_match", "key": "jm", "gate": True}],
    )
]
WORDS = 'the model answers 42 because 6 times 7 is 42 and nothing else { } [ ] " : , 漢字 é'.split()


def make_samples(rng: random.Random, n: int) -> list[pb.Sample]:
    samples = []
    for i in range(n):
        text = " ".join(rng.choices(WORDS, k=rng.randint(1, 60)))
        response = f"<think>\n{text}\n</think>\n{rng.randint(0, 99)}" if i % 3 else json.dumps({"a": [i]})
        samples.append(sample_to_pb({"id": str(i), "response": response, "reference": "#### 42 " + text}))
    return samples


# -- memory ------------------------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from the parent ids in /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])  # the command name, in parentheses, may hold spaces
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def tree_rss_kib(pid: int) -> int:
    """VmRSS of `pid` and its descendants, summed (shared pages count once per process: a ceiling)."""
    total = 0
    for p in (pid, *_descendants(pid)):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total


# -- load --------------------------------------------------------------------------------------------


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0
    answered: int = 0
    malformed: int = 0  # doubled indexes, or a result count that is not the grader count
    calls: int = 0
    failures: Counter[str] = field(default_factory=Counter)


def run_stream(
    stub: pb_grpc.GradingServiceStub, mix: list[pb.GraderSpec], batch: int, until: float, seed: int, tally: Tally
) -> None:
    """BatchEvaluate calls, one after another, until the clock passes `until`."""
    rng = random.Random(seed)
    while time.monotonic() < until:
        request = pb.BatchEvaluateRequest(graders=mix, samples=make_samples(rng, batch))
        seen: set[int] = set()
        malformed = 0
        failure = ""
        try:
            for message in stub.BatchEvaluate(request, timeout=120):
                for item in message.items:
                    malformed += item.index in seen or len(item.result.results) != len(mix)
                    seen.add(item.index)
        except grpc.RpcError as exc:
            failure = exc.code().name
        with tally.lock:
            tally.calls += 1
            tally.sent += batch
            tally.answered += len(seen)
            tally.malformed += malformed
            if failure:
                tally.failures[failure] += 1


def sample_rss(pid: int, interval: float, stop: threading.Event, out: list[tuple[float, int]], verbose: bool) -> None:
    t0 = time.monotonic()
    while True:
        out.append((time.monotonic() - t0, tree_rss_kib(pid)))
        if verbose:
            print(f"{out[-1][0]:6.1f} s  RSS {out[-1][1] / 1024:7.1f} MiB", file=sys.stderr)
        if stop.wait(interval):
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=16, help="concurrent BatchEvaluate streams")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--batch", type=int, default=128, help="samples per call")
    parser.add_argument("--workers", type=int, help="server worker processes (default: cores)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the RSS baseline is taken")
    parser.add_argument("--rss-interval", type=float, default=2.0, help="seconds between RSS samples")
    parser.add_argument("--max-rss-growth-mib", type=float, default=64.0, help="allowed RSS growth after warm-up")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every RSS sample to stderr")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="grpcgrade-load-") as tmp:
        workers = [] if args.workers is None else ["--workers", str(args.workers)]
        server = start_server(Path(tmp), *workers, "--log-level", "warning")
        pid = server.proc.pid
        rss: list[tuple[float, int]] = []
        stop = threading.Event()
        sampling = (pid, args.rss_interval, stop, rss, args.verbose)
        sampler = threading.Thread(target=sample_rss, args=sampling, daemon=True)
        tally = Tally()
        started = time.monotonic()
        until = started + args.duration
        try:
            sampler.start()
            with grpc.insecure_channel(server.target) as channel:
                stub = pb_grpc.GradingServiceStub(channel)
                threads = [
                    threading.Thread(target=run_stream, args=(stub, MIXES[i % len(MIXES)], args.batch, until, i, tally))
                    for i in range(args.streams)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            elapsed = time.monotonic() - started
            stop.set()
            sampler.join()
            rss.append((elapsed, tree_rss_kib(pid)))
        finally:
            stop.set()
            code = server.stop()

    warm = [kib for t, kib in rss if t >= args.warmup] or [rss[-1][1]]
    start_mib, peak_mib, end_mib = warm[0] / 1024, max(kib for _, kib in rss) / 1024, rss[-1][1] / 1024
    growth = end_mib - start_mib
    lost = tally.sent - tally.answered
    print(
        f"loadtest: {elapsed:.0f} s, {args.streams} streams x {args.batch} samples/call, {tally.calls} calls: "
        f"{tally.sent} samples sent, {tally.answered} answered, {lost} lost, {tally.malformed} malformed, "
        f"{sum(tally.failures.values())} failed calls{f' {dict(tally.failures)}' if tally.failures else ''}, "
        f"{tally.answered / elapsed:,.0f} samples/s; server RSS incl. workers: start {start_mib:.0f} MiB "
        f"(after {args.warmup:g} s warm-up), peak {peak_mib:.0f} MiB, end {end_mib:.0f} MiB ({growth:+.0f} MiB); "
        f"server exit code {code}"
    )
    problems = []
    if lost or tally.malformed or tally.failures:
        problems.append("samples lost, malformed or failed")
    if growth > args.max_rss_growth_mib:
        problems.append(f"RSS grew {growth:.0f} MiB after warm-up, over {args.max_rss_growth_mib:g} MiB")
    if code != 0:
        problems.append(f"the server exited with {code} on SIGTERM")
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
