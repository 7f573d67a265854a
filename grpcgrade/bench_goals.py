"""`grpcgrade bench --goals`: every figure the performance goals name, from one run, beside its goal.

The goals are ratios and latencies measured in the same run on the same machine (issue 21): a cheap
grader's BatchEvaluate against the bare library loop (full and scores views), heavy graders against the
bare single-core loop and the bare loop on every core at once, a trainer step's fixed cost through
`reward_function` as TRL calls it, unary
Evaluate latency at an offered rate, and the client's own CPU per sample. One server (a worker per core)
answers them all. The machine's cores and load average are part of the report: on a shared machine a
figure is only as good as the quiet it was measured in. The comparison with the HTTP peers is measured by
their own harness (`make perf-peers`).

A heavy grader's goals are measured through the call a trainer makes, `batch_scores` (what the TRL reward
functions call: samples and scores as columns), as the cheap grader's scores view is: issue 35 restated the
goals for what trainers read, and a trainer does not read reasons. The full view's batch (`batch_evaluate`,
a result message with reason and metadata per sample) takes its turns beside it and is reported with no
goal: its extra cost per sample is the cheap grader's full-view goal's business, and in a heavy batch it
is ~1% (the result objects, reasons and their encoding in the workers, their decoding in the client).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bench import PRESETS, _paced, _rate, bench_in_process, make_samples, uncached_server_args

#: The cheap grader and the heavy ones of the goals; math_verify only when its plugin is installed.
CHEAP = "json_validator"
HEAVY = ("chrf", "math_verify")
#: Samples per step of the step-cost figure, and of the client-CPU figure (TRL-sized steps).
STEP_SAMPLES = 8
CLIENT_STEP_SAMPLES = 8192
#: Turns each figure takes with the others (its best is kept), after one that is not counted: a ceiling needs
#: every core free at once, and on a shared machine it read 1.0-2.0x the single-core loop from run to run
#: with two; with three, chrF's ceiling read 1,358-1,695 samples/s in one run, its best below the service's 1,823.
ROUNDS = 5
#: Concurrent callers that offer the unary rate (as `ghz --rps` spreads it).
UNARY_CALLERS = 32


@dataclass(frozen=True)
class Goal:
    """`value` must be at least (`at_least`) or at most `bound`; `per_core` scales it by the server's
    cores (a parallel speed-up's goal: the issue's 1.85x is for 2 cores)."""

    bound: float
    at_least: bool = True
    per_core: bool = False

    def limit(self, cores: int) -> float:
        return self.bound * cores if self.per_core else self.bound

    def met(self, value: float, cores: int) -> bool:
        return value >= self.limit(cores) if self.at_least else value <= self.limit(cores)

    def text(self, cores: int) -> str:
        return f"{'>=' if self.at_least else '<='} {self.limit(cores):g}"


#: The goals of issue 21 that `grpcgrade bench` measures (the peer goals are the harness's).
GOALS: dict[str, Goal] = {
    # the full view restated from 0.5x (issue 35): its floor is ~13 us a sample of work a trainer does not
    # read (reasons, metadata); the scores view is what trainers take
    "cheap_batch_full_x_bare": Goal(0.3),
    "cheap_batch_scores_x_bare": Goal(0.5),
    "chrf_batch_x_bare": Goal(0.925, per_core=True),
    # the machine's own parallel ceiling (the bare loop on every core at once), not a nominal 2x (issue 35)
    "chrf_batch_x_bare_every_core": Goal(0.95),
    "math_verify_batch_x_bare": Goal(0.925, per_core=True),
    "step_8_median_ms": Goal(1.0, at_least=False),
    "unary_paced_p99_ms": Goal(5.0, at_least=False),
    "judge_throughput_x_limit": Goal(0.9),  # issue 34: judgments / what the endpoint's limit allows
    # issue 33: gRPC callers' worst latency while hostile HTTP bodies arrive, over their median alone
    "http_stall_added_ms": Goal(100.0, at_least=False),
}


@dataclass
class GoalsReport:
    cores: int
    workers: int
    samples: dict[str, int]
    figures: dict[str, float] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    load_average: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: float, unit: str) -> None:
        self.figures[key] = value
        self.units[key] = unit

    def goals(self) -> dict[str, dict[str, Any]]:
        cores = min(self.cores, self.workers) or 1
        # judged on the figure as reported (3 decimals): a step of 1.0004 ms shows as 1.0, and is met as shown
        return {
            key: {"goal": goal.text(cores), "met": goal.met(round(self.figures[key], 3), cores)}
            for key, goal in GOALS.items()
            if key in self.figures
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cores": self.cores,
            "workers": self.workers,
            "load_average": self.load_average,
            "samples": self.samples,
            "figures": {k: round(v, 3) for k, v in self.figures.items()},
            "units": self.units,
            "goals": self.goals(),
            **self.notes,
        }

    def text(self) -> str:
        load = " -> ".join(" ".join(f"{x:.2f}" for x in v) for v in self.load_average.values())
        lines = [f"{self.cores} cores, {self.workers} workers; load average (1, 5, 15 min) {load}"]
        goals = self.goals()
        for key, value in self.figures.items():
            goal = goals.get(key)
            verdict = f"goal {goal['goal']:<8} {'met' if goal['met'] else 'NOT met'}" if goal else ""
            lines.append(f"  {key:<32} {value:>12,.3f} {self.units[key]:<14} {verdict}")
        for key, value in self.notes.items():
            lines.append(f"  {key}: {value}")
        return "\n".join(lines)


def _installed(grader: str) -> bool:
    if grader != "math_verify":
        return True
    try:
        import grpcgrade_math_verify  # type: ignore[import-not-found]  # noqa: F401
        import math_verify  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return False
    return True


def _each(call: Callable[[dict[str, Any]], object], samples: list[dict[str, Any]]) -> list[object]:
    return [call(s) for s in samples]


def _alternating(
    n: int,
    runs: dict[str, Callable[[], object]],
    rounds: int,
    turns: dict[str, list[float]] | None = None,
    warmed: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Items/s of each run, its best of `rounds`, the runs taking turns round after round; every turn's
    figure goes in `turns` too, when given. `warmed()` is called after the turns that are not counted
    (a run that sums its own figures starts them again there).

    Each run first takes a turn that is not counted: a service is measured as a trainer meets it, warm
    (its processes' heaps, buffers and connection grown to the work's size). The full view's first
    100,000-sample turn after the 2,000-sample warm-up read 85-119k samples/s in seven runs, its later
    turns 125-150k. Each turn starts with the collector's count settled (`gc.collect()`, not timed), so it
    pays for the collections its own objects cause and not for the turn before's: after a full-view turn
    (100,000 result messages) the bare loop's next turn read 340k instead of 410k samples/s, a full
    collection the turn before had run up."""
    for run in runs.values():
        run()
    if warmed is not None:
        warmed()
    best = dict.fromkeys(runs, 0.0)
    for _ in range(rounds):
        for key, run in runs.items():
            gc.collect()
            rate = _rate(n, run)
            best[key] = max(best[key], rate)
            if turns is not None:
                turns.setdefault(key, []).append(rate)
    return best


#: A ceiling pool process's parts of the heavy samples, {grader: [part, ...]}, given once as it starts.
_parts: dict[str, list[list[dict[str, Any]]]] = {}


def _hold_parts(parts: dict[str, list[list[dict[str, Any]]]]) -> None:
    """A ceiling pool process's initializer: it keeps every part of every heavy grader's samples, so a timed
    run sends an index, not the samples (their pickling is no part of the bare loop)."""
    _parts.update(parts)


def _bare_part(args: tuple[str, int]) -> int:
    """In a pool process: the bare library loop of a heavy preset over its part of the samples; the CPU it
    took, in ns (what a worker's CPU per sample compares with: the same cores, in the same turns)."""
    grader, k = args
    part = _parts[grader][k]
    call = PRESETS[grader].bare()
    start = time.thread_time_ns()
    for sample in part:
        call(sample)
    return time.thread_time_ns() - start


def _split(data: list[dict[str, Any]], cores: int) -> list[list[dict[str, Any]]]:
    """The samples split evenly over the cores (every core-th sample each: alike in length)."""
    return [data[k::cores] for k in range(cores)]


def _bare_every_core(pool: Any, grader: str, cores: int) -> int:
    """The bare loop on every core at once (the samples split evenly, one part a process, held by it): what
    the machine gives in parallel, the ceiling of a parallel speed-up on it (a VM's cores rarely give a full
    2x). Returns the processes' CPU, in ns."""
    return sum(pool.map(_bare_part, [(grader, k) for k in range(cores)], chunksize=1))


@dataclass
class _Ceiling:
    """`_bare_every_core` as a run of its own, its processes' CPU summed over its turns."""

    pool: Any
    grader: str
    cores: int
    cpu_ns: int = 0

    def run(self) -> None:
        self.cpu_ns += _bare_every_core(self.pool, self.grader, self.cores)

    def reset(self) -> None:
        self.cpu_ns = 0


def _reset(*sums: _Ceiling | _Breakdown | None) -> None:
    """Runs that sum their own figures start them again (after the turns that are not counted)."""
    for summed in sums:
        if summed is not None:
            summed.reset()


def _cpu_ns(pids: list[int]) -> int:
    """CPU time of `pids` so far, every thread, in ns (the scheduler's own count: /proc/PID/task/*/schedstat,
    finer than the clock ticks of /proc/PID/stat). OSError where there is no such file (not Linux)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                total += int((task / "schedstat").read_text().split()[0])
    return total


@dataclass
class _Breakdown:
    """Where a heavy batch's time goes, summed over its turns: the CPU of the server's own process (the
    engine: the call, cutting chunks, the pool's hops), of this client, and of the workers, beside the
    wall time. On N cores every microsecond of the first two is taken from the workers, and workers idle
    (a batch's start and end) are the rest of the gap to the ceiling."""

    server: int
    workers: list[int]
    samples: int = 0
    wall: float = 0.0
    engine_ns: int = 0
    workers_ns: int = 0
    client_s: float = 0.0

    def reset(self) -> None:
        self.wall, self.engine_ns, self.workers_ns, self.client_s = 0.0, 0, 0, 0.0

    def run(self, call: Callable[[], object]) -> None:
        engine, workers = _cpu_ns([self.server]), _cpu_ns(self.workers)
        client, start = time.process_time(), time.perf_counter()
        call()
        self.wall += time.perf_counter() - start
        self.client_s += time.process_time() - client
        self.engine_ns += _cpu_ns([self.server]) - engine
        self.workers_ns += _cpu_ns(self.workers) - workers

    def add_to(self, report: GoalsReport, key: str, ceiling: _Ceiling) -> None:
        """The figures, beside the ceiling's processes' CPU per sample over the same turns: the workers' is
        compared with that, not with the best turn of the single-core loop (a turn in a busy moment costs
        more CPU a sample on both sides)."""
        if not self.samples:
            return
        report.add(f"{key}_engine_cpu_per_sample", self.engine_ns / self.samples / 1e3, "us")
        report.add(f"{key}_client_cpu_per_sample", self.client_s / self.samples * 1e6, "us")
        report.add(f"{key}_workers_cpu_per_sample", self.workers_ns / self.samples / 1e3, "us (all workers)")
        report.add(f"{key}_bare_every_core_cpu_per_sample", ceiling.cpu_ns / self.samples / 1e3, "us (ceiling)")
        report.add(f"{key}_workers_busy", self.workers_ns / 1e9 / (self.wall * len(self.workers)), "x wall")


def _cpu_per_sample_us(run: Callable[[], object], n: int, repeat: int = 3) -> float:
    """This process's CPU (every thread) per sample over `run`, the least of `repeat` runs, in µs."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best / n * 1e6


def _breakdown(server: int) -> _Breakdown | None:
    """A heavy batch's breakdown for the server `server` and its workers; None where /proc cannot say."""
    from .testing import worker_pids

    try:
        workers = worker_pids(server)
        _cpu_ns([server, *workers])
    except OSError:
        return None
    return _Breakdown(server, workers) if workers else None


def run_goals(
    samples: int = 100_000,
    heavy_samples: int = 2_000,
    workers: int | None = None,
    step_reps: int = 500,
    unary_rate: float = 1_000.0,
    unary_seconds: float = 10.0,
    judge_samples: int = 2_000,
    stall_seconds: float = 6.0,
) -> GoalsReport:
    from .integrations.trl import reward_function
    from .testing import start_server
    from .v1 import grading_pb2 as pb

    if samples < 2 * STEP_SAMPLES:
        raise ValueError(f"--samples must be at least {2 * STEP_SAMPLES} for the goals")
    cores = os.cpu_count() or 1
    workers = cores if workers is None else workers
    heavy = [h for h in HEAVY if _installed(h)]
    report = GoalsReport(cores, workers, {CHEAP: samples, **dict.fromkeys(heavy, heavy_samples)})
    report.load_average["start"] = [round(x, 2) for x in os.getloadavg()]
    if "math_verify" not in heavy:
        report.notes["math_verify"] = "not measured: the grpcgrade-math-verify plugin is not installed"

    cheap = PRESETS[CHEAP]
    data = make_samples(cheap.data, samples)
    bare = bench_in_process(cheap, data)  # the in-process grader's figure, and the bare loop warmed up
    report.add("cheap_in_process_grader", bare["in_process_grader"], "samples/s")
    bare_json = cheap.bare()
    heavy_data = {h: make_samples(PRESETS[h].data, heavy_samples) for h in heavy}
    heavy_calls = {h: PRESETS[h].bare() for h in heavy}
    for h in heavy:
        heavy_calls[h](heavy_data[h][0])  # lazy imports and tables outside the timing

    with tempfile.TemporaryDirectory() as tmp:
        args = uncached_server_args(Path(tmp))
        server = start_server(Path(tmp), "--workers", str(workers), "--log-level", "warning", *args, metrics=False)
        try:
            spec = [{"name": cheap.grader, "params": cheap.params}]
            with server.client(timeout=600) as client:
                client.batch_evaluate(data[:2000], spec)  # warm-up: connection, workers, graders
                # Each side of a ratio takes turns with the other, run after run, and each keeps its best
                # run: on a shared machine the load changes within seconds, and a busy moment only slows
                # a run down, so alternating best-ofs compare the two sides at the same quiet.
                # The scores view as a trainer gets it: `batch_scores` (columns both ways, what the TRL
                # reward functions call); the same view one message per sample; the full view.
                cheap_runs: dict[str, Callable[[], object]] = {
                    "cheap_bare_loop": functools.partial(_each, bare_json, data),
                    "cheap_batch_full": functools.partial(client.batch_evaluate, data, spec),
                    "cheap_batch_scores": functools.partial(client.batch_scores, data, spec),
                    "cheap_batch_scores_items": functools.partial(
                        client.batch_evaluate, data, spec, view=pb.RESULT_VIEW_SCORES
                    ),
                }
                cheap_turns: dict[str, list[float]] = {}
                best = _alternating(samples, cheap_runs, ROUNDS, cheap_turns)
                for key in ("cheap_bare_loop", "cheap_batch_full"):  # how steady the turns were
                    report.notes[f"{key}_turns"] = [round(x) for x in cheap_turns[key]]
                for key in cheap_runs:
                    report.add(key, best[key], "samples/s")
                for key in ("cheap_batch_full", "cheap_batch_scores", "cheap_batch_scores_items"):
                    report.add(f"{key}_x_bare", best[key] / best["cheap_bare_loop"], "x bare loop")
                parallel = None
                if heavy:
                    parts = {h: _split(heavy_data[h], workers) for h in heavy}
                    parallel = multiprocessing.get_context("spawn").Pool(workers, _hold_parts, (parts,))
                try:
                    for h in heavy:
                        hspec = [{"name": PRESETS[h].grader, "params": PRESETS[h].params}]
                        client.batch_evaluate(heavy_data[h][: 4 * workers], hspec)
                        _bare_every_core(parallel, h, workers)  # every process up, imports and tables loaded
                        breakdown = _breakdown(server.proc.pid)
                        ceiling = _Ceiling(parallel, h, workers)
                        # The goals' batch is the call a trainer makes (`batch_scores`, as the TRL reward
                        # functions: columns both ways); the full view (reasons and metadata, one message a
                        # sample) takes its turns beside it, reported with no goal.
                        batch = functools.partial(client.batch_scores, heavy_data[h], hspec)
                        runs: dict[str, Callable[[], object]] = {
                            "bare": functools.partial(_each, heavy_calls[h], heavy_data[h]),
                            "bare_every_core": ceiling.run,
                            "batch": batch if breakdown is None else functools.partial(breakdown.run, batch),
                            "batch_full": functools.partial(client.batch_evaluate, heavy_data[h], hspec),
                        }
                        turns: dict[str, list[float]] = {}
                        best = _alternating(
                            heavy_samples, runs, ROUNDS, turns, functools.partial(_reset, ceiling, breakdown)
                        )
                        # Each turn of the ceiling, beside its best: how steady the machine's cores were.
                        report.notes[f"{h}_bare_every_core_turns"] = [round(x) for x in turns["bare_every_core"]]
                        report.add(f"{h}_bare_loop", best["bare"], "samples/s")
                        report.add(f"{h}_bare_every_core", best["bare_every_core"], "samples/s")
                        for key in ("batch", "batch_full"):
                            report.add(f"{h}_{key}", best[key], "samples/s")
                            report.add(f"{h}_{key}_x_bare", best[key] / best["bare"], "x bare loop")
                            report.add(
                                f"{h}_{key}_x_bare_every_core", best[key] / best["bare_every_core"], "x its ceiling"
                            )
                        if breakdown is not None:
                            breakdown.samples = heavy_samples * ROUNDS
                            breakdown.add_to(report, h, ceiling)
                finally:
                    if parallel is not None:
                        parallel.close()
                        parallel.join()

            # a trainer's step as TRL makes it: reward_function(prompts, completions, reference=...)
            reward = reward_function(server.target, graders=spec, timeout=600)
            prompts = [f"Question {i}: answer in JSON." for i in range(len(data))]
            completions = [s["response"] for s in data]
            references = [""] * len(data)
            times = []
            for k in range(step_reps + 20):  # the first 20 warm the connection up
                lo = (k * STEP_SAMPLES) % (len(data) - STEP_SAMPLES)
                start = time.perf_counter()
                reward(
                    prompts[lo : lo + STEP_SAMPLES],
                    completions[lo : lo + STEP_SAMPLES],
                    reference=references[:STEP_SAMPLES],
                )
                if k >= 20:
                    times.append(time.perf_counter() - start)
            deciles = statistics.quantiles(times, n=10)
            report.add("step_8_median_ms", statistics.median(times) * 1000, "ms")
            report.add("step_8_p90_ms", deciles[8] * 1000, "ms")
            m = min(CLIENT_STEP_SAMPLES, len(data))
            report.add(
                "client_cpu_per_sample_us",
                _cpu_per_sample_us(lambda: reward(prompts[:m], completions[:m], reference=references[:m]), m),
                f"us ({m}/step)",
            )

            messages = data[: min(len(data), 10_000)]
            paced, elapsed = asyncio.run(
                _paced(server.target, messages, spec, unary_rate, unary_seconds, UNARY_CALLERS)
            )
            q = statistics.quantiles(paced, n=100)
            report.add("unary_paced_p50_ms", q[49] * 1000, "ms")
            report.add("unary_paced_p99_ms", q[98] * 1000, "ms")
            report.add("unary_paced_per_second", len(paced) / elapsed, "calls/s")
            report.notes["unary_offered_per_second"] = unary_rate
        finally:
            server.stop()
    if judge_samples:
        from .bench_judges import bench_judges

        judges = bench_judges(judge_samples)
        report.add("judge_per_second", judges["judge_per_second"], "judgments/s")
        report.add("judge_throughput_x_limit", judges["judge_throughput_x_limit"], "x endpoint limit")
        report.notes["judge_endpoint"] = {
            k: judges[k] for k in ("judge_endpoint_limit_per_second", "judge_endpoint_429s")
        }
    if stall_seconds:
        from .bench_stall import run_http_stall

        stall = run_http_stall(seconds=stall_seconds, workers=workers, each_shape=False)
        report.add("http_stall_added_ms", stall["worst_added_stall_ms"], "ms")
        report.notes["http_stall_loop_max_cpu_ms"] = stall["phases"]["all_at_once"]["loop_max_cpu_ms"]
    report.notes.update(_sandbox_overhead())
    report.load_average["end"] = [round(x, 2) for x in os.getloadavg()]
    return report


#: Trivial programs started each way for the code sandbox's start-up overhead.
SANDBOX_RUNS = 20


def _sandbox_overhead() -> dict[str, Any]:
    """code_tests' sandbox start-up over a bare subprocess of the same program (reported, no goal), when
    the grpcgrade-code plugin and bubblewrap are there."""
    try:
        from .bench import bench_sandbox

        figures = bench_sandbox(SANDBOX_RUNS)
    except ImportError:
        return {"sandbox": "not measured: the grpcgrade-code plugin is not installed"}
    except (OSError, RuntimeError) as exc:  # no bwrap, or user namespaces refused on this machine
        return {"sandbox": f"not measured: {exc}"}
    keys = ("sandboxed_ms", "bare_ms", "sandbox_startup_overhead_ms", "sandboxed_runs_per_second")
    return {key: figures[key] for key in keys}
