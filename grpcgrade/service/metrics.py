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

import platform
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from grpcgrade import __version__
from grpcgrade.core.grading import GraderStats
from grpcgrade.core.plugins import PluginInfo

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
        return [
            CounterMetricFamily(
                "grpcgrade_worker_pool_restarts", "Times the worker pool was replaced.", value=self.read()
            )
        ]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
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
            "Requests to the HTTP face, per method and status.",
            ["method", "code"],
            registry=r,
        )
        self.in_flight = Gauge("grpcgrade_samples_in_flight", "Samples accepted and not yet answered.", registry=r)
        self.workers = Gauge("grpcgrade_workers_alive", "Worker processes alive.", registry=r)
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

    def watch_workers(self, alive: Callable[[], int], restarts: Callable[[], int]) -> None:
        self.workers.set_function(alive)
        self.worker_restarts.read = restarts

    def observe_grading(self, stats: GraderStats) -> None:
        """The engine's observer: called once per grader per chunk."""
        grader, ok, errors, seconds = stats
        if ok:
            self.evaluations.labels(grader, "ok").inc(ok)
        if errors:
            self.evaluations.labels(grader, "error").inc(errors)
        self.grading_seconds.labels(grader).inc(seconds)
        self.chunk_seconds.labels(grader).observe(seconds)

    def serve(self, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
        """prometheus-client's exposition server, except that a connection idle for `IDLE_SECONDS` is
        closed: its server keeps a thread per open connection, and idle ones would pile up forever."""
        httpd = make_server(host, port, make_wsgi_app(self.registry), ThreadingWSGIServer, handler_class=_Handler)
        thread = threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True)
        thread.start()
        return httpd, thread


#: Seconds a metrics connection may stay silent: a scrape sends its request at once.
IDLE_SECONDS = 3.0


class _Handler(WSGIRequestHandler):
    timeout = IDLE_SECONDS  # socketserver sets it on the connection: an idle read ends the thread

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Scrapes are not logged."""
