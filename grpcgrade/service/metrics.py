"""Prometheus metrics: the go-grpc-prometheus series operators already chart, plus grpcgrade's own.

Only the server process exports. Worker processes hand their timings back with each chunk's results,
so the exporter sees every evaluation without prometheus-client's multiprocess mode (whose file-per-
process storage would also rule out the info gauges below). Grading metrics are updated once per chunk
and grader, not per sample: at a few microseconds per cheap sample, per-sample updates would cost more
than the grading.

Names follow Prometheus' conventions: a counter's series end in `_total`. The `_created` series that
prometheus-client adds beside every counter and histogram (the time each child was first touched) are
turned off: they double the series count, and nothing here (alerts, dashboard, rate()) reads them.
"""

from __future__ import annotations

import itertools
import platform
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from grpcgrade import __version__
from grpcgrade.core import histograms
from grpcgrade.core.admission import LIMITS, Admission
from grpcgrade.core.cached_grading import CachedGrading
from grpcgrade.core.errors import ErrorCode
from grpcgrade.core.grading import Stats
from grpcgrade.core.plugins import PluginInfo
from grpcgrade.core.rewards import RewardStats
from grpcgrade.llm import usage

from .metrics_http import serve_wsgi

# gRFC A66 latency buckets, as grpc's own OpenTelemetry plugin uses.
LATENCY_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
BATCH_BUCKETS = (1, 8, 32, 128, 256, 1024, 4096, 16384, 65536, 262144)

disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide in prometheus-client; see the module docstring


class _RestartsCollector(Collector):
    """`grpcgrade_worker_pool_restarts_total`, a counter read from the pool when scraped."""

    def __init__(self) -> None:
        self.read: Callable[[], int] = lambda: 0

    def collect(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily("grpcgrade_worker_pool_restarts", "Worker processes replaced.", value=self.read())]


class _Distributions(Collector):
    """`grpcgrade_grader_score{grader}` and `grpcgrade_reward_value{reward}`: histograms fed whole chunks'
    bucket counts (`core.histograms`), which prometheus-client's Histogram can only take one sample at a
    time; with them, each reward's samples without a value and the sum of its values' squares."""

    LE = [floatToGoString(b) for b in histograms.SCORE_BUCKETS]  # type: ignore[no-untyped-call]  # as prometheus-client writes `le`

    def __init__(self) -> None:
        self.lock = threading.Lock()  # chunks are added on the event loop, scrapes read on the metrics thread
        self.scores: dict[str, histograms.Histogram] = {}
        self.rewards: dict[str, histograms.Histogram] = {}
        self.absent: dict[str, int] = {}

    def add_scores(self, grader: str, scores: histograms.Histogram) -> None:
        with self.lock:
            self.scores[grader] = self.scores.get(grader, histograms.EMPTY).plus(scores)

    def add_reward(self, stats: RewardStats) -> None:
        with self.lock:
            self.rewards[stats.reward] = self.rewards.get(stats.reward, histograms.EMPTY).plus(stats.values)
            self.absent[stats.reward] = self.absent.get(stats.reward, 0) + stats.absent

    def _family(
        self, name: str, doc: str, label: str, values: dict[str, histograms.Histogram]
    ) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=[label])
        for key, h in values.items():
            buckets = [*zip(self.LE, h.buckets, strict=True), ("+Inf", h.observed)]
            family.add_metric([key], buckets, None)
            # prometheus-client leaves out _count and _sum when a bucket bound is negative (OpenMetrics wants
            # a sum that never goes down); Prometheus' own clients export them, and the mean needs them.
            family.samples.append(Sample(f"{name}_count", {label: key}, h.observed))
            family.samples.append(Sample(f"{name}_sum", {label: key}, h.total))
        return family

    def collect(self) -> list[CounterMetricFamily | HistogramMetricFamily]:
        with self.lock:
            scores, rewards, absent = dict(self.scores), dict(self.rewards), dict(self.absent)
        squares = CounterMetricFamily(
            "grpcgrade_reward_value_squares",
            "Sum of the squares of a configured reward's values (with _sum and _count: the standard deviation).",
            labels=["reward"],
        )
        missing = CounterMetricFamily(
            "grpcgrade_reward_absent",
            "Samples of calls with a configured reward that got no reward (a grader failed on them).",
            labels=["reward"],
        )
        for reward, h in rewards.items():
            squares.add_metric([reward], h.squares)
            missing.add_metric([reward], absent[reward])
        return [
            self._family("grpcgrade_grader_score", "Scores given, per grader.", "grader", scores),
            self._family(
                "grpcgrade_reward_value", "Values of the configured rewards calls asked for.", "reward", rewards
            ),
            squares,
            missing,
        ]


class _CacheCollector(Collector):
    """The result cache's and the quarantine's counts, read from `CachedGrading` when scraped: nothing is
    updated per sample or per chunk for them."""

    def __init__(self, cached: CachedGrading) -> None:
        self.cached = cached

    @staticmethod
    def _per_grader(name: str, text: str, counts: dict[str, int]) -> CounterMetricFamily:
        family = CounterMetricFamily(name, text, labels=["grader"])
        for grader, value in list(counts.items()):  # a copy made in one step: the event loop may add graders
            family.add_metric([grader], value)
        return family

    def collect(self) -> list[Metric]:
        c = self.cached
        return [
            self._per_grader("grpcgrade_cache_hits", "Results answered from the result cache, per grader.", c.hits),
            self._per_grader("grpcgrade_cache_misses", "Results graded and offered to the result cache.", c.misses),
            GaugeMetricFamily(
                "grpcgrade_cache_bytes",
                "The result cache's size (estimated bytes).",
                value=c.cache.bytes if c.cache else 0,
            ),
            GaugeMetricFamily("grpcgrade_cache_entries", "Results in the result cache.", value=len(c.cache or ())),
            self._per_grader(
                "grpcgrade_quarantine_hits", "Samples answered from the quarantine, per grader.", c.quarantine_hits
            ),
            GaugeMetricFamily(
                "grpcgrade_quarantined_entries",
                "Inputs in quarantine (timed out or killed a worker; expired ones until they are next looked at).",
                value=len(c.quarantine or ()),
            ),
        ]


class _AdmissionCollector(Collector):
    """Admission control's counts and limits (`core.admission`), read when scraped: nothing is updated per
    call for them."""

    def __init__(self, admission: Admission, at_faces: Counter) -> None:
        self.admission = admission
        self.at_faces = at_faces

    def collect(self) -> list[Metric]:
        a = self.admission
        faces = {
            s.labels["limit"]: s.value for f in self.at_faces.collect() for s in f.samples if s.name.endswith("_total")
        }
        refused = CounterMetricFamily(
            "grpcgrade_calls_refused",
            "Calls refused at once for load (RESOURCE_EXHAUSTED, HTTP 503).",
            labels=["limit"],
        )
        for name in LIMITS:
            refused.add_metric([name], a.refused[name] + faces.get(name, 0.0))
        limits = GaugeMetricFamily("grpcgrade_admission_limit", "Admission limits (0: none).", labels=["limit"])
        for name in LIMITS:
            limits.add_metric([name], getattr(a.limits, name))
        return [
            GaugeMetricFamily("grpcgrade_calls_admitted", "Calls (gRPC and HTTP) being handled.", value=a.calls),
            GaugeMetricFamily(
                "grpcgrade_samples_queued", "Samples of admitted calls not yet answered.", value=a.samples
            ),
            GaugeMetricFamily(
                "grpcgrade_resident_bytes", "The server's resident memory, as admission read it.", value=a.resident()
            ),
            refused,
            limits,
        ]


class Coalescing(Protocol):
    """What gathers one-sample calls and counts it: `core.coalesce.ServerCoalescer`, `http.faces.FaceProcesses`."""

    chunks: int
    samples: int


class _CoalescerCollector(Collector):
    """Server-side coalescing's counts (`core.coalesce`), read when scraped: samples / chunks is its gain."""

    def __init__(self, coalescers: Sequence[Coalescing]) -> None:
        self.coalescers = coalescers

    def collect(self) -> list[Metric]:
        chunks = sum(c.chunks for c in self.coalescers)
        samples = sum(c.samples for c in self.coalescers)
        return [
            CounterMetricFamily(
                "grpcgrade_coalesced_chunks", "Chunks graded from concurrent one-sample calls.", value=chunks
            ),
            CounterMetricFamily(
                "grpcgrade_coalesced_samples", "One-sample calls graded in those chunks.", value=samples
            ),
        ]


class _JudgeCollector(Collector):
    """What the judge models' calls cost, per model and caller, read from `llm.usage.USAGE` when scraped:
    the judge client counts into plain numbers, once per HTTP request."""

    LE = [*(floatToGoString(b) for b in usage.SECONDS_BUCKETS), "+Inf"]  # type: ignore[no-untyped-call]

    def _seconds(self, name: str, doc: str, rows: list[tuple[str, str, usage.Seconds]]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=["model", "caller"])
        for model, caller, h in rows:
            cumulative = list(itertools.accumulate(h.counts))
            family.add_metric([model, caller], list(zip(self.LE, cumulative, strict=True)), h.total)
        return family

    def collect(self) -> list[Metric]:
        labels = ["model", "caller"]
        requests = CounterMetricFamily(
            "grpcgrade_judge_requests", "HTTP requests sent to a judge model, retries included.", labels=labels
        )
        throttled = CounterMetricFamily(
            "grpcgrade_judge_throttled",
            "Answers of 429 or 503 (over the provider's limits) from a judge model, per HTTP status.",
            labels=[*labels, "code"],
        )
        retries = CounterMetricFamily(
            "grpcgrade_judge_retries", "Requests that were a judgment's retry.", labels=labels
        )
        given_up = CounterMetricFamily(
            "grpcgrade_judge_rate_limited",
            "Judgments answered RATE_LIMITED: their time limit ran out while the model's limits held them back.",
            labels=labels,
        )
        tokens = CounterMetricFamily(
            "grpcgrade_judge_tokens",
            "Tokens the answers reported, in (prompt) and out (completion).",
            labels=[*labels, "direction"],
        )
        cost = CounterMetricFamily(
            "grpcgrade_judge_cost",
            "Estimated cost: tokens times the model's configured prices (per million tokens, in their currency).",
            labels=labels,
        )
        rows = usage.USAGE.snapshot()
        for model, caller, t in rows:
            requests.add_metric([model, caller], t.requests)
            for code, n in list(t.throttled.items()):
                throttled.add_metric([model, caller, str(code)], n)
            retries.add_metric([model, caller], t.retries)
            given_up.add_metric([model, caller], t.rate_limited)
            tokens.add_metric([model, caller, "in"], t.tokens_in)
            tokens.add_metric([model, caller, "out"], t.tokens_out)
            cost.add_metric([model, caller], t.cost)
        waits = [(m, c, t.queue_wait) for m, c, t in rows]
        latencies = [(m, c, t.latency) for m, c, t in rows]
        return [
            requests,
            throttled,
            retries,
            given_up,
            tokens,
            cost,
            self._seconds(
                "grpcgrade_judge_queue_wait_seconds",
                "Seconds a judge request waited for its turn under the model's limits and its caller's share.",
                waits,
            ),
            self._seconds(
                "grpcgrade_judge_latency_seconds", "Seconds a judge model took to answer a request.", latencies
            ),
        ]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        #: Called (in the exposition server's thread) before each scrape: the HTTP face processes' counts.
        self.before_scrape: list[Callable[[], None]] = []
        r = self.registry
        rpc = ["grpc_type", "grpc_service", "grpc_method"]
        self.started = Counter("grpc_server_started", "RPCs started on the server.", rpc, registry=r)
        self.handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, regardless of success or failure.",
            [*rpc, "grpc_code"],
            registry=r,
        )
        self.received = Counter(
            "grpc_server_msg_received", "RPC stream messages received on the server.", rpc, registry=r
        )
        self.sent = Counter("grpc_server_msg_sent", "gRPC stream messages sent by the server.", rpc, registry=r)
        self.handling = Histogram(
            "grpc_server_handling_seconds",
            "Response latency (seconds) of gRPC handled by the server.",
            rpc,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        #: The calls face processes refused for load (their own admission control), by limit, as they send
        #: them (`counters`): a tally, not registered; `grpcgrade_calls_refused_total` adds it to the engine's.
        self.calls_refused = Counter(
            "grpcgrade_calls_refused", "Calls refused by face processes.", ["limit"], registry=None
        )
        self.evaluations = Counter(
            "grpcgrade_evaluations",
            "Samples graded, per grader and outcome (ok or error).",
            ["grader", "outcome"],
            registry=r,
        )
        self.grading_seconds = Counter(
            "grpcgrade_grader_seconds",
            "Seconds spent grading, per grader (rate / evaluations = mean latency).",
            ["grader"],
            registry=r,
        )
        self.grader_errors = Counter(
            "grpcgrade_grader_errors",
            "Samples a grader answered with an error, per error code (a subset of evaluations, outcome=error).",
            ["grader", "code"],
            registry=r,
        )
        self.distributions = _Distributions()
        r.register(self.distributions)
        self.canary_passing = Gauge(
            "grpcgrade_canary_passing",
            "1 when a configured reward's canary got its expected score at the last run, else 0.",
            ["reward", "canary"],
            registry=r,
        )
        self.canary_value = Gauge(
            "grpcgrade_canary_value",
            "The reward a canary got at the last run (NaN when it got none).",
            ["reward", "canary"],
            registry=r,
        )
        self.canary_last_run = Gauge(
            "grpcgrade_canary_last_run_timestamp_seconds",
            "When a canary was last graded (Unix time).",
            ["reward", "canary"],
            registry=r,
        )
        # Counted by the step budget's work (issue 17): the alert rules and the dashboard read it.
        self.budget_exceeded = Counter(
            "grpcgrade_budget_exceeded_samples",
            "Samples answered BUDGET_EXCEEDED because their call's budget_seconds ran out, per grader.",
            ["grader"],
            registry=r,
        )
        self.chunk_seconds = Histogram(
            "grpcgrade_grader_chunk_seconds",
            "Seconds one grader took for one chunk of samples.",
            ["grader"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_samples = Histogram(
            "grpcgrade_batch_samples", "Samples per BatchEvaluate call.", buckets=BATCH_BUCKETS, registry=r
        )
        self.http_requests = Counter(
            "grpcgrade_http_requests",
            "Requests to the HTTP face, per face (the protocol: openrlhf, openai_graders, ...), method and status.",
            ["face", "method", "code"],
            registry=r,
        )
        self.http_failed_samples = Counter(
            "grpcgrade_http_failed_samples",
            "Samples an HTTP face answered as failed (no grader's reward), per face and reward.",
            ["face", "reward"],
            registry=r,
        )
        self.http_unusable_samples = Counter(
            "grpcgrade_http_unusable_samples",
            "Samples an HTTP face could not grade at all (a query that does not start with its prompt, a missing "
            "input, a field over the limits): failed samples, per face. The server log says why.",
            ["face"],
            registry=r,
        )
        self.failure_budget_calls = Counter(
            "grpcgrade_failure_budget_exceeded_calls",
            "Calls ended (FAILED_PRECONDITION, or HTTP 400) because their failures passed max_failure_ratio.",
            registry=r,
        )
        self.in_flight = Gauge("grpcgrade_samples_in_flight", "Samples accepted and not yet answered.", registry=r)
        self.workers = Gauge("grpcgrade_workers_alive", "Worker processes alive.", registry=r)
        self.can_grade = Gauge(
            "grpcgrade_workers_can_grade",
            "1 while the worker pool can grade; 0 while none of its processes can be kept up (NOT_SERVING,"
            " calls refused UNAVAILABLE).",
            registry=r,
        )
        r.register(_JudgeCollector())
        self.worker_restarts = _RestartsCollector()
        r.register(self.worker_restarts)
        self.plugins = Gauge(
            "grpcgrade_plugin_info",
            "Plugins found, with version and load status (value 1).",
            ["plugin", "distribution", "version", "status"],
            registry=r,
        )
        self.build = Gauge(
            "grpcgrade_build_info", "Build information (value 1).", ["version", "python", "grpcio"], registry=r
        )
        self.build.labels(__version__, platform.python_version(), grpc.__version__).set(1)

    def set_plugins(self, plugins: list[PluginInfo]) -> None:
        for p in plugins:
            self.plugins.labels(p.name, p.distribution, p.version, p.status).set(1)

    def watch_workers(
        self, alive: Callable[[], int], restarts: Callable[[], int], can_grade: Callable[[], bool]
    ) -> None:
        self.workers.set_function(alive)
        self.worker_restarts.read = restarts
        self.can_grade.set_function(lambda: 1.0 if can_grade() else 0.0)

    def watch_admission(self, admission: Admission) -> None:
        self.registry.register(_AdmissionCollector(admission, self.calls_refused))

    def watch_coalescer(self, *coalescers: Coalescing) -> None:
        """Coalescing's counts: the server's coalescer's and its HTTP face processes' (`http.faces`)."""
        self.registry.register(_CoalescerCollector(coalescers))

    def watch_cache(self, cached: CachedGrading) -> None:
        self.registry.register(_CacheCollector(cached))

    def observe_grading(self, stats: Stats) -> None:
        """The engine's observer: called once per grader per chunk, and once per chunk of a configured reward."""
        if isinstance(stats, RewardStats):
            self.distributions.add_reward(stats)
            return
        grader, ok, errors, seconds = stats[:4]
        if ok:
            self.evaluations.labels(grader, "ok").inc(ok)
        if errors:
            self.evaluations.labels(grader, "error").inc(errors)
            for code, n in stats.error_codes:
                self.grader_errors.labels(grader, code).inc(n)
                if code == ErrorCode.BUDGET_EXCEEDED:
                    self.budget_exceeded.labels(grader).inc(n)
        if stats.scores.observed:
            self.distributions.add_scores(grader, stats.scores)
        self.grading_seconds.labels(grader).inc(seconds)
        self.chunk_seconds.labels(grader).observe(seconds)

    def serve(self, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
        """prometheus-client's exposition of this registry, by a server bounded against its clients
        (`metrics_http`), in a daemon thread."""
        exposition = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Any:
            for hook in self.before_scrape:  # what other processes counted, in before the answer
                hook()
            return exposition(environ, start_response)

        return serve_wsgi(host, port, app)
