"""`grpcgrade bench`: how close the service comes to the bare library loop, measured side by side.

For one grader it measures, in one run on the same data: the bare library call in a loop (the limit
for one core), the in-process grader API, BatchEvaluate over gRPC to a server in another process, and
unary Evaluate under concurrency (back to back, and open loop at an offered rate), and BatchEvaluate
against a minimal server that only makes the bare call (what gRPC itself allows); optionally the
reference's in-process GradingRunner (py-openjudge) and the cost of metrics. Every figure is printed as
items/s and as a ratio to the bare loop. `--sandbox N` instead measures the code sandbox (grpcgrade-code).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORDS = (
    "the model answer reward policy gradient token sample batch learning rate value function state action "
    "agent environment step episode return advantage critic actor loss update network layer weight bias "
    "training data prompt completion reference score grader service cluster replica latency throughput "
    "python rust go node request response stream chunk worker process core memory cache queue metric"
).split()


@dataclass(frozen=True)
class Preset:
    grader: str
    params: dict[str, Any]
    samples: int
    data: str  # "json" or "text"
    bare: Callable[[], Callable[[dict[str, Any]], object]]


def uncached_server_args(workdir: Path) -> list[str]:
    """`serve` arguments for a bench server with its result cache off: the figures time grading, and a run
    repeating the samples of the run before would otherwise be answered from the cache (math_verify, say)."""
    config = workdir / "bench-config.yaml"
    config.write_text("cache: {enabled: false}\n")
    return ["--config", str(config)]


def _bare_json() -> Callable[[dict[str, Any]], object]:
    def call(s: dict[str, Any]) -> object:
        try:
            return json.loads(s["response"])
        except ValueError:
            return None

    return call


def _bare_chrf() -> Callable[[dict[str, Any]], object]:
    from sacrebleu.metrics import CHRF

    chrf = CHRF()
    return lambda s: chrf.sentence_score(s["response"], [s["reference"]]).score


def _bare_rouge_l() -> Callable[[dict[str, Any]], object]:
    """rouge_score's RougeScorer configured as the reference configures it (jieba words, Porter stems)."""
    from grpcgrade.graders.text.similarity_metrics import make_rouge

    scorer = make_rouge(("rougeL",), True)
    return lambda s: scorer.score(s["reference"], s["response"])["rougeL"].fmeasure


def _bare_math_verify() -> Callable[[dict[str, Any]], object]:
    """HF math-verify's `parse` of both sides and `verify`, with the extraction config Kolibrify's grader
    uses (and the grpcgrade-math-verify plugin), on the text after `</think>`."""
    from math_verify import (  # type: ignore[import-untyped]
        LatexExtractionConfig,
        LatexNormalizationConfig,
        parse,
        verify,
    )

    config = [
        LatexExtractionConfig(
            try_extract_without_anchor=True,
            boxed_match_priority=0,
            normalization_config=LatexNormalizationConfig(
                basic_latex=True, units=True, malformed_operators=False, nits=False, boxed="all", equations=False
            ),
        )
    ]

    def call(s: dict[str, Any]) -> object:
        gold = parse(s["reference"], extraction_config=config, parsing_timeout=2, raise_on_error=False)
        pred = parse(s["response"].split("</think>", 1)[-1].strip(), extraction_config=config, parsing_timeout=2,
                     raise_on_error=False)  # fmt: skip
        return bool(gold and pred) and verify(gold, pred, strict=True, timeout_seconds=2, raise_on_error=False)

    return call


PRESETS = {
    "json_validator": Preset("json_validator", {}, 200_000, "json", _bare_json),
    "chrf": Preset("similarity", {"algorithm": "chrf"}, 3_000, "text", _bare_chrf),
    "rougeL": Preset("similarity", {"algorithm": "rougeL"}, 3_000, "text", _bare_rouge_l),
    # needs the grpcgrade-math-verify plugin (plugins/grpcgrade-math-verify), which brings math-verify
    "math_verify": Preset("math_verify", {}, 1_000, "math", _bare_math_verify),
}


def _math_pair(rng: random.Random, i: int) -> tuple[str, str]:
    """(gold, final answer) in LaTeX, distinct for each i; about half the answers equal the gold written
    another way (a reduced fraction scaled, a sum, a power), the rest differ."""
    a, b = rng.randint(1, 60) + i, rng.randint(2, 40)
    equal = rng.random() < 0.5
    kind = i % 3
    if kind == 0:
        k = rng.randint(2, 6)
        return f"$\\frac{{{a}}}{{{b}}}$", f"$\\boxed{{\\frac{{{a * k}}}{{{b * k + (0 if equal else 1)}}}}}$"
    if kind == 1:
        return f"${a + b}$", f"The answer is $\\boxed{{{a} + {b if equal else b + 1}}}$."
    e = rng.randint(2, 5)
    return f"${a}^{{{e}}}$", f"$\\boxed{{{a**e if equal else a**e + 1}}}$"


def make_samples(kind: str, n: int, seed: int = 7) -> list[dict[str, Any]]:
    """Deterministic samples of 50-100 words (about 1 KB with the reference), as the prototype used."""
    rng = random.Random(seed)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 100)))

    if kind == "json":
        return [
            {"response": json.dumps({"answer": text()[:400], "n": i}) if i % 10 else text()[:400]} for i in range(n)
        ]
    if kind == "math":  # Kolibrify's completion format: reasoning in <think>, then the final answer
        pairs = [_math_pair(rng, i) for i in range(n)]
        return [{"response": f"<think>\n{text()[:200]}\n</think>\n{ans}", "reference": gold} for gold, ans in pairs]
    return [{"response": text(), "reference": text()} for _ in range(n)]


def _rate(n: int, fn: Callable[[], object], repeat: int = 1) -> float:
    """Items per second, the best of `repeat` runs (a run can lose time to the machine, never gain it)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return n / best


@dataclass
class Report:
    grader: str
    params: dict[str, Any]
    samples: int
    workers: int
    figures: dict[str, float] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def ratio(self, key: str) -> float:
        return self.figures[key] / self.figures["bare_loop"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "grader": self.grader,
            "params": self.params,
            "samples": self.samples,
            "workers": self.workers,
            "items_per_second": {k: round(v, 1) for k, v in self.figures.items()},
            "ratio_to_bare_loop": {k: round(self.ratio(k), 3) for k in self.figures},
            **self.notes,
        }

    def text(self) -> str:
        lines = [
            f"grader {self.grader} {json.dumps(self.params)}: {self.samples} samples, {self.workers} workers,"
            f" {os.cpu_count()} cores"
        ]
        for key, value in self.figures.items():
            lines.append(f"  {key:<32} {value:>12,.0f} items/s   {self.ratio(key):6.3f} x bare loop")
        for key, value in self.notes.items():
            lines.append(f"  {key}: {value}")
        return "\n".join(lines)


def bench_in_process(preset: Preset, samples: list[dict[str, Any]]) -> dict[str, float]:
    from grpcgrade.core.registry import get_registry
    from grpcgrade.core.samples import select

    bare = preset.bare()
    grader = get_registry().build(preset.grader, preset.params)
    inputs = grader.input_names()
    kwargs = [
        select({"query": "", "response": s["response"], "reference": s.get("reference", ""), "context": ""}, inputs)
        for s in samples
    ]
    grader.evaluate(**kwargs[0])  # build lazy state outside the timing
    return {
        "bare_loop": _rate(len(samples), lambda: [bare(s) for s in samples], repeat=3),
        "in_process_grader": _rate(len(samples), lambda: [grader.evaluate(**kw) for kw in kwargs], repeat=3),
    }


def bench_reference_runner(preset: Preset, samples: list[dict[str, Any]]) -> float | None:
    """py-openjudge 0.2.4's GradingRunner on the same data, when it is installed (it has no math_verify)."""
    if preset.grader not in ("json_validator", "similarity"):
        return None
    try:
        from openjudge.graders.format.json.json_validator import JsonValidatorGrader  # type: ignore[import-not-found]
        from openjudge.graders.text.similarity import SimilarityGrader  # type: ignore[import-not-found]
        from openjudge.runner.grading_runner import GradingRunner  # type: ignore[import-not-found]
    except ImportError:
        return None
    grader = JsonValidatorGrader() if preset.grader == "json_validator" else SimilarityGrader(**preset.params)
    rows = [{"response": s["response"], "reference_response": s.get("reference", "")} for s in samples]
    runner = GradingRunner({"g": grader}, max_concurrency=32, show_progress=False)
    return _rate(len(rows), lambda: runner.run(rows), repeat=3)


def _serve_floor(grader: str, port: int) -> None:
    """A spawned process's target: the least a BatchEvaluate server can do for `grader`, to measure what
    gRPC itself allows. Each sample gets the bare library call and an index and score back; no
    validation, no grader API, no reasons, no metadata, no workers."""
    import grpc

    from .v1 import grading_pb2 as pb
    from .v1 import grading_pb2_grpc as pb_grpc

    bare = PRESETS[grader].bare()

    class Floor(pb_grpc.GradingServiceServicer):
        async def BatchEvaluate(self, request: Any, context: Any) -> Any:
            samples = request.samples
            for start in range(0, len(samples), 1024):
                message = pb.BatchEvaluateResponse()
                for i in range(start, min(start + 1024, len(samples))):
                    s = samples[i]
                    bare({"response": s.response, "reference": s.reference})
                    message.items.add(index=i).result.results.add(score=1.0)
                yield message

    async def serve() -> None:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)])
        pb_grpc.add_GradingServiceServicer_to_server(Floor(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


def bench_floor(grader: str, messages: list[Any], spec: list[dict[str, Any]]) -> float:
    """BatchEvaluate against `_serve_floor`, with the client and data of the real measurement."""
    import multiprocessing

    from .client import GradingClient
    from .testing import free_port

    port = free_port()
    proc = multiprocessing.get_context("spawn").Process(target=_serve_floor, args=(grader, port), daemon=True)
    proc.start()
    try:
        target = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with GradingClient(target, timeout=5) as probe:
                try:
                    probe.batch_evaluate(messages[:10], spec)
                    break
                except Exception:  # not up yet
                    time.sleep(0.1)
        with GradingClient(target, timeout=600, chunk_size=4096, max_in_flight=2) as client:
            return _rate(len(messages), lambda: client.batch_evaluate(messages, spec), 3)
    finally:
        proc.kill()
        proc.join()


async def _unary(
    target: str, messages: list[Any], spec: list[dict[str, Any]], calls: int, concurrency: int
) -> tuple[list[float], float]:
    """`concurrency` callers in one asyncio client, each calling Evaluate back to back."""
    from .client import AsyncGradingClient

    latencies: list[float] = []
    per_caller = max(1, calls // concurrency)

    async def caller(offset: int) -> None:
        for i in range(per_caller):
            t0 = time.perf_counter()
            await client.evaluate(messages[(offset * per_caller + i) % len(messages)], spec)
            latencies.append(time.perf_counter() - t0)

    async with AsyncGradingClient(target, timeout=600) as client:
        await client.evaluate(messages[0], spec)
        start = time.perf_counter()
        await asyncio.gather(*(caller(k) for k in range(concurrency)))
        return latencies, time.perf_counter() - start


async def _paced(
    target: str, messages: list[Any], spec: list[dict[str, Any]], rate: float, seconds: float, concurrency: int
) -> tuple[list[float], float]:
    """`concurrency` callers offering `rate` calls/s in all, open loop (as `ghz --rps`): each call is due at
    a fixed time, and its latency counts from then, so a server that falls behind cannot hide it."""
    from .client import AsyncGradingClient

    latencies: list[float] = []
    interval = concurrency / rate

    async def caller(k: int, start: float) -> None:
        due = start + k * interval / concurrency
        end = start + seconds
        while due < end:
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await client.evaluate(messages[len(latencies) % len(messages)], spec)
            latencies.append(time.perf_counter() - due)
            due += interval

    async with AsyncGradingClient(target, timeout=600) as client:
        await client.evaluate(messages[0], spec)
        start = time.perf_counter()
        await asyncio.gather(*(caller(k, start) for k in range(concurrency)))
        return latencies, time.perf_counter() - start


def _histogram_p99(before: dict[Any, float], after: dict[Any, float], method: str) -> float | None:
    """p99 of the server's own handling time for `method` between two scrapes (bucket upper bound, ms).

    The client's latency includes its own queueing: with N callers in flight, Little's law puts its mean
    at N / throughput whatever the server does, so the server's figure is reported beside it.
    """
    buckets = []
    for (name, labels), value in after.items():
        tags = dict(labels)
        if name == "grpc_server_handling_seconds_bucket" and tags.get("grpc_method") == method:
            buckets.append((float(tags["le"]), value - before.get((name, labels), 0.0)))
    buckets.sort()
    if not buckets or buckets[-1][1] <= 0:
        return None
    target = 0.99 * buckets[-1][1]
    return next(round(le * 1000, 3) for le, count in buckets if count >= target)


def bench_service(
    preset: Preset,
    samples: list[dict[str, Any]],
    workers: int,
    unary_calls: int,
    concurrency: int,
    metrics: bool,
    workdir: Path,
    unary_rate: float = 0.0,
) -> tuple[dict[str, float], dict[str, Any]]:
    from grpcgrade.service.convert import sample_to_pb

    from .testing import start_server
    from .v1 import grading_pb2 as pb

    figures: dict[str, float] = {}
    notes: dict[str, Any] = {}
    started = time.perf_counter()
    server = start_server(
        workdir, "--workers", str(workers), "--log-level", "warning", *uncached_server_args(workdir), metrics=metrics
    )
    # SERVING means every worker is up, has loaded the plugins and warmed the graders (`registry.warm`)
    notes["start_to_serving_s"] = round(time.perf_counter() - started, 2)
    try:
        spec = [{"name": preset.grader, "params": preset.params}]
        messages = [sample_to_pb(s) for s in samples]
        with server.client(timeout=600, chunk_size=4096, max_in_flight=2) as client:
            client.batch_evaluate(messages[:2000], spec)  # warm-up: workers up, graders built
            figures["batch_evaluate_grpc"] = _rate(len(messages), lambda: client.batch_evaluate(messages, spec), 3)
            if not unary_calls:
                return figures, notes
            figures["batch_evaluate_grpc_scores_view"] = _rate(
                len(messages), lambda: client.batch_evaluate(messages, spec, view=pb.RESULT_VIEW_SCORES), 3
            )
            before = server.metrics() if metrics else {}
            latencies, elapsed = asyncio.run(_unary(server.target, messages, spec, unary_calls, concurrency))
            figures["unary_evaluate_grpc"] = len(latencies) / elapsed
            if metrics:
                notes["unary_server_handling_p99_ms"] = _histogram_p99(before, server.metrics(), "Evaluate")
            q = statistics.quantiles(latencies, n=100)
            notes["unary_concurrency"] = concurrency
            notes["unary_p50_ms"] = round(q[49] * 1000, 2)
            notes["unary_p99_ms"] = round(q[98] * 1000, 2)
            if unary_rate:
                paced, elapsed = asyncio.run(
                    _paced(server.target, messages, spec, unary_rate, unary_calls / unary_rate, concurrency)
                )
                q = statistics.quantiles(paced, n=100)
                notes["unary_offered_per_second"] = unary_rate
                notes["unary_paced_per_second"] = round(len(paced) / elapsed)
                notes["unary_paced_p50_ms"] = round(q[49] * 1000, 2)
                notes["unary_paced_p99_ms"] = round(q[98] * 1000, 2)
    finally:
        server.stop()
    return figures, notes


#: (registered grader, params, reference class path, data kind) for the per-call comparison.
PER_CALL = [
    ("json_validator", {}, "format.json.json_validator:JsonValidatorGrader", "json"),
    ("json_match", {}, "format.json.json_match:JsonMatchGrader", "json"),
    ("length_penalty", {}, "format.length_penalty:LengthPenaltyGrader", "json"),
    ("reasoning_format", {}, "format.reasoning_format:ReasoningFormatGrader", "json"),
    ("reasoning_tool_call_format", {}, "format.reasoning_tool_format:ReasoningToolCallFormatGrader", "json"),
    ("ngram_repetition_penalty", {"tokenizer_type": "jieba"},
     "format.ngram_repetition_penalty:NgramRepetitionPenaltyGrader", "text"),
    ("number_accuracy", {}, "text.number_accuracy:NumberAccuracyGrader", "text"),
    *[("similarity", {"algorithm": a}, "text.similarity:SimilarityGrader", "text")
      for a in ("bleu", "sentence_bleu", "gleu", "chrf", "rouge", "rougeL", "rouge3", "f1_score", "meteor", "cosine",
                "jaccard", "fuzzy_match", "edit_distance")],
    *[("string_match", {"algorithm": a}, "text.string_match:StringMatchGrader", "text")
      for a in ("exact_match", "regex_match", "substring_match", "contains_all", "word_overlap", "char_overlap")],
]  # fmt: skip


def _best_of_fresh(n: int, run: Callable[[list[dict[str, Any]]], object], kwargs: list[dict[str, Any]]) -> float:
    """Items/s, the best of three runs, each on its own slice of never-seen samples (slices 1-3 of 4)."""
    return max(_rate(n, functools.partial(run, kwargs[k * n : (k + 1) * n])) for k in (1, 2, 3))


def bench_per_call(n: int = 300) -> list[dict[str, Any]]:
    """µs per call of each built-in grader, and of the reference's (py-openjudge 0.2.4) when installed.

    Each side warms up on other texts, then is timed on three sets of texts it has not seen (the best of
    the three counts), so caches keyed by text (jieba's) flatter neither side.
    """
    import importlib

    from grpcgrade.core.registry import get_registry

    from .grader import declared_names

    rows = []
    data = {"json": make_samples("json", 4 * n), "text": make_samples("text", 4 * n)}
    for data_kind in data.values():  # json_match compares a response with itself
        for s in data_kind:
            s.setdefault("reference", s["response"])
    for name, params, ref_path, kind in PER_CALL:
        samples = data[kind]
        ours = get_registry().build(name, params)
        kwargs = [{"response": s["response"], "reference_response": s["reference"]} for s in samples]
        row: dict[str, Any] = {"grader": name, "params": params}
        for kw in kwargs[:n]:
            ours.evaluate(**kw)

        def run_ours(part: list[dict[str, Any]], g: Any = ours) -> object:
            return [g.evaluate(**kw) for kw in part]

        row["ours_us"] = round(1e6 / _best_of_fresh(n, run_ours, kwargs), 1)
        try:
            module, cls = ref_path.split(":")
            ref_class = getattr(importlib.import_module(f"openjudge.graders.{module}"), cls)
        except ImportError:
            rows.append(row)
            continue
        ref = ref_class(**params)
        accepted = declared_names(ref._aevaluate)  # some reference graders take no **kwargs
        ref_kwargs = [{k: v for k, v in kw.items() if accepted.open or k in accepted.names} for kw in kwargs]

        async def reference(g: Any, a: list[dict[str, Any]]) -> None:
            for kw in a:
                await g._aevaluate(**kw)

        asyncio.run(reference(ref, ref_kwargs[:n]))

        def run_reference(part: list[dict[str, Any]], g: Any = ref) -> object:
            return asyncio.run(reference(g, part))

        row["reference_us"] = round(1e6 / _best_of_fresh(n, run_reference, ref_kwargs), 1)
        row["speedup"] = round(row["reference_us"] / row["ours_us"], 2)
        rows.append(row)
    return rows


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children (the worker pool), from /proc."""
    total = 0.0
    pids = [pid] + [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == pid]
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


def _parent(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def bench_stream_memory(total: int, workers: int, chunk: int = 10_000) -> dict[str, Any]:
    """Stream `total` cheap samples through one server, chunk by chunk, and watch its RSS stay flat."""
    from grpcgrade.service.convert import sample_to_pb

    from .testing import start_server

    template = [sample_to_pb(s) for s in make_samples("json", chunk)]
    peak, stop = 0.0, threading.Event()
    with tempfile.TemporaryDirectory() as tmp:
        args = uncached_server_args(Path(tmp))
        server = start_server(Path(tmp), "--workers", str(workers), "--log-level", "warning", *args, metrics=False)
        try:
            start_rss = rss_mib(server.proc.pid)

            def watch() -> None:
                nonlocal peak
                while not stop.wait(0.25):
                    peak = max(peak, rss_mib(server.proc.pid))

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            started = time.perf_counter()
            answered = 0
            with server.client(timeout=600, chunk_size=chunk, max_in_flight=2) as client:
                for _ in range(0, total, chunk):
                    answered += len(client.batch_evaluate(template, ["json_validator"]))
            elapsed = time.perf_counter() - started
            stop.set()
            watcher.join()
            end_rss = rss_mib(server.proc.pid)
        finally:
            server.stop()
    return {
        "stream_samples": answered,
        "stream_items_per_second": round(answered / elapsed),
        "server_rss_mib": {"start": round(start_rss), "peak": round(peak), "end": round(end_rss)},
    }


async def _runs_per_second(n: int, concurrency: int, one: Callable[[], Any]) -> float:
    """`n` calls of the coroutine function `one`, `concurrency` at a time: calls per second."""
    slots = asyncio.Semaphore(concurrency)

    async def bounded() -> None:
        async with slots:
            await one()

    start = time.perf_counter()
    await asyncio.gather(*(bounded() for _ in range(n)))
    return n / (time.perf_counter() - start)


def bench_sandbox(runs: int) -> dict[str, Any]:
    """The code sandbox (grpcgrade-code's bubblewrap backend) against a bare subprocess, in one run.

    The same trivial program (a Python file holding `pass`, run by the same interpreter with the same
    flags) is started `runs` times in a row each way, then `runs` times with as many at once as the
    backend allows: the sandbox's start-up overhead in ms, and both runs/s.
    """
    from grpcgrade_code import Limits, Outcome, run
    from grpcgrade_code.bubblewrap import BubblewrapBackend
    from grpcgrade_code.languages import known_languages

    backend = BubblewrapBackend()
    argv = known_languages()["python"].run_argv(Limits())
    limits = Limits(time_seconds=30)

    async def sandboxed() -> None:
        result = await run(backend, "python", "pass", "", limits)
        if result.outcome is not Outcome.OK:
            raise RuntimeError(f"the trivial program did not run in the sandbox: {result}")

    async def measure(program: Path) -> dict[str, Any]:
        bare_argv = [*argv[:-1], str(program)]

        async def bare() -> None:
            proc = await asyncio.create_subprocess_exec(*bare_argv, stdin=asyncio.subprocess.DEVNULL, env={})
            if await proc.wait() != 0:
                raise RuntimeError(f"the trivial program failed: {bare_argv}")

        await sandboxed()  # warm-up: the interpreter's files in the page cache for both
        bare_serial = await _runs_per_second(runs, 1, bare)
        sandbox_serial = await _runs_per_second(runs, 1, sandboxed)
        concurrency = backend.max_concurrency
        return {
            "sandbox_program": " ".join(bare_argv[:-1]) + " <file holding `pass`>",
            "sandbox_runs": runs,
            "sandbox_concurrency": concurrency,
            "sandboxed_runs_per_second": round(await _runs_per_second(runs, concurrency, sandboxed), 1),
            "bare_runs_per_second": round(await _runs_per_second(runs, concurrency, bare), 1),
            "sandboxed_ms": round(1000 / sandbox_serial, 2),
            "bare_ms": round(1000 / bare_serial, 2),
            "sandbox_startup_overhead_ms": round(1000 / sandbox_serial - 1000 / bare_serial, 2),
        }

    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "main.py"
        program.write_text("pass\n")
        return asyncio.run(measure(program))


def run_bench(
    grader: str = "json_validator",
    samples: int | None = None,
    workers: int | None = None,
    unary_calls: int = 20_000,
    concurrency: int = 32,
    compare_metrics: bool = False,
    unary_rate: float = 2_500.0,
) -> Report:
    from grpcgrade.service.convert import sample_to_pb

    preset = PRESETS[grader]
    n = samples or preset.samples
    workers = os.cpu_count() or 1 if workers is None else workers
    data = make_samples(preset.data, n)
    report = Report(preset.grader, preset.params, n, workers)
    report.notes["cores"] = os.cpu_count()
    report.notes["load_average_start"] = [round(x, 2) for x in os.getloadavg()]
    report.figures.update(bench_in_process(preset, data))
    reference = bench_reference_runner(preset, data[: min(n, 20_000)])
    if reference is not None:
        report.figures["openjudge_grading_runner"] = reference
    with tempfile.TemporaryDirectory() as tmp:
        figures, notes = bench_service(
            preset, data, workers, unary_calls, concurrency, True, Path(tmp), unary_rate=unary_rate
        )
        report.figures.update(figures)
        report.notes.update(notes)
        messages = [sample_to_pb(s) for s in data]
        report.figures["grpc_floor_minimal_server"] = bench_floor(grader, messages, [{"name": preset.grader}])
        if compare_metrics:  # alternate off/on runs and keep the best of each: one run is noisier than 5%
            on, off = [figures["batch_evaluate_grpc"]], list[float]()
            for metrics_on in (False, True, False):
                run, _ = bench_service(preset, data, workers, 0, concurrency, metrics_on, Path(tmp))
                (on if metrics_on else off).append(run["batch_evaluate_grpc"])
            report.figures["batch_evaluate_grpc"] = max(on)
            report.figures["batch_evaluate_grpc_no_metrics"] = max(off)
            report.notes["metrics_cost"] = f"{1 - max(on) / max(off):+.1%}"
    report.notes["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    if "openjudge_grading_runner" in report.figures:
        report.notes["grpc_batch_vs_reference_runner"] = round(
            report.figures["batch_evaluate_grpc"] / report.figures["openjudge_grading_runner"], 2
        )
    return report
