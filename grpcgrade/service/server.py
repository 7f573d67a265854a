"""Assembling and running the gRPC server: health, reflection, interceptors, metrics, drain on SIGTERM.

An aio server: no thread per open stream, and measured as fast as the sync server for this work.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import math
import os
import resource
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from grpcgrade.core import tokens as token_counts
from grpcgrade.core.admission import Admission
from grpcgrade.core.cached_grading import CachedGrading
from grpcgrade.core.canaries import CanaryResult, run_canaries, watch
from grpcgrade.core.coalesce import ServerCoalescer
from grpcgrade.core.config import ServerConfig, load_config
from grpcgrade.core.engine import Engine
from grpcgrade.core.errors import ConfigError, InvalidParams, PortUnavailable, UnknownGrader
from grpcgrade.core.executors import Executor
from grpcgrade.core.registry import Registry, get_registry
from grpcgrade.core.workers import WorkerPool
from grpcgrade.llm.models import close_clients as close_judge_clients
from grpcgrade.llm.models import configure as configure_models
from grpcgrade.v1 import admin_pb2_grpc
from grpcgrade.v1 import grading_pb2 as pb

from .admin import SERVICE_NAME as ADMIN_SERVICE_NAME
from .admin import AdminServicer
from .callers import CallerInterceptor
from .http import build_http_app
from .http.limits import ConnectionGuard
from .interceptors import AuthInterceptor, DecodeGuardInterceptor, ObservingInterceptor
from .metrics import Metrics
from .servicer import GradingServicer, add_to_server

log = logging.getLogger("grpcgrade.service.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GradingService"].full_name
POOL_HEALTH_SECONDS = 1.0  # how often the health check asks whether the worker pool can grade


class _WatchEnded(Exception):
    """Leaves grpc's Watch loop once the watcher has been told NOT_SERVING in a drain."""


class _EndAfterDrainNotice:
    """The Watch call's context, except that a write of the drain's NOT_SERVING ends the stream."""

    def __init__(self, context: grpc.aio.ServicerContext, health_servicer: DrainingHealthServicer) -> None:
        self._context = context
        self._health = health_servicer

    async def write(self, message: health_pb2.HealthCheckResponse) -> None:
        await self._context.write(message)
        if self._health.draining and message.status == health_pb2.HealthCheckResponse.NOT_SERVING:
            raise _WatchEnded


class DrainingHealthServicer(health.aio.HealthServicer):
    """grpc's health service, whose Watch streams end once they have said NOT_SERVING in a drain: an open
    watch (client-side health checking) would otherwise hold the drain open for the whole grace period."""

    draining = False

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        with contextlib.suppress(_WatchEnded):
            await super().Watch(request, _EndAfterDrainNotice(context, self))  # type: ignore[arg-type]  # Watch only writes

    async def enter_graceful_shutdown(self) -> None:
        self.draining = True
        await super().enter_graceful_shutdown()


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0: no metrics endpoint
    workers: int | None = None  # None: one per core; 0: grade everything in the server process
    config: str | None = None
    kolibrify_config: str | None = None
    grace_seconds: float = 25.0
    grader_timeout_seconds: float | None = None  # None: the config's value
    auth_token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    http_host: str = "127.0.0.1"
    http_port: int | None = None  # None: no HTTP face; 0: a free port (see Service.http_port)
    ray_address: str | None = None  # the workers as actors on this Ray cluster (core.executors_ray)
    tokenizer: str | None = None  # None: the config's `tokenizer:` (core.tokens)
    extra_options: list[tuple[str, int]] = field(default_factory=list)


def read_config(opts: ServeOptions, registry: Registry) -> ServerConfig:
    config = load_config(opts.config) if opts.config else ServerConfig()
    if opts.kolibrify_config:
        from grpcgrade.graders.kolibrify.config import load_kolibrify_config

        config = load_kolibrify_config(opts.kolibrify_config, registry, base=config)
    if opts.grader_timeout_seconds is not None:
        config.grader_timeout_seconds = opts.grader_timeout_seconds
    if opts.tokenizer:
        config.tokenizer = token_counts.normalize(opts.tokenizer)
        try:
            token_counts.load(config.tokenizer)
        except InvalidParams as exc:
            raise ConfigError(f"--tokenizer {opts.tokenizer}: {exc.reason}") from None
    return config


def _credentials(opts: ServeOptions) -> grpc.ServerCredentials | None:
    if not (opts.tls_cert and opts.tls_key):
        return None
    client_ca = Path(opts.tls_client_ca).read_bytes() if opts.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(Path(opts.tls_key).read_bytes(), Path(opts.tls_cert).read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def _tokens(path: str | None) -> list[str]:
    """The auth token file: one token a line; blank lines and lines starting with `#` are ignored."""
    if not path:
        return []
    lines = (line.strip() for line in Path(path).read_text().splitlines())
    tokens = [line for line in lines if line and not line.startswith("#")]
    if not tokens:
        raise ValueError(f"{path}: no token in the auth token file")
    return tokens


@dataclass
class Service:
    """A built, not yet started, server and what it grades with; `serve` runs one until a signal, tests
    can start and stop one in-process."""

    options: ServeOptions
    server: grpc.aio.Server
    port: int
    health: DrainingHealthServicer
    engine: Engine
    registry: Registry
    config: ServerConfig
    metrics: Metrics | None
    pool: Executor | None
    tls: bool
    http_app: web.Application | None = None
    http_runner: web.AppRunner | None = None
    http_guard: ConnectionGuard | None = None
    #: The HTTP face's bound port once started (None without one).
    http_port: int | None = None
    #: The periodic canary runs (None without canaries), and whether a canary failed at the last run.
    canary_task: asyncio.Task[None] | None = None
    #: Watches whether the worker pool can grade (`Executor.healthy`): the health check says so.
    pool_task: asyncio.Task[None] | None = None
    pool_failing: bool = False
    canaries_failing: bool = False

    async def start(self) -> None:
        if self.metrics is not None:
            self.metrics.set_plugins(self.registry.plugins)
            if self.pool is not None:
                pool = self.pool
                self.metrics.watch_workers(pool.alive, lambda: pool.restarts)
            host, port = self.options.metrics_host, self.options.metrics_port
            try:
                self.metrics.serve(host, port)
            except OSError as exc:
                raise PortUnavailable("metrics_port", host, port, exc.strerror or str(exc)) from exc
        for name in ("", SERVICE_NAME):  # grpc's health service starts out SERVING: not before we are
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        if self.pool is not None:  # every worker up, plugins loaded, graders warmed (`workers.warm`)
            await self.pool.ready()
        if self.http_app is not None:
            await self._start_http(self.http_app)
        canaries = self.config.canaries
        if canaries:  # the first run before SERVING: with `fail_health`, a broken reward never takes traffic
            await self._report_canaries(await run_canaries(self.engine, canaries))
            interval = self.config.canary.interval_seconds
            self.canary_task = asyncio.create_task(watch(self.engine, canaries, interval, self._report_canaries))
        if self.pool is not None:
            self.pool_task = asyncio.create_task(self._watch_pool(self.pool))
        await self._set_health()
        log.info(
            "grpcgrade serving on %s:%d (%d graders, %d rewards, %d workers%s%s)",
            self.options.host,
            self.port,
            len(self.registry.entries),
            len(self.config.rewards),
            self.pool.size if self.pool is not None else 0,
            ", TLS" if self.tls else "",
            f", metrics on {self.options.metrics_host}:{self.options.metrics_port}" if self.metrics else "",
        )
        if self.http_port is not None:
            log.info("HTTP face on %s:%d", self.options.http_host, self.http_port)

    async def _set_health(self) -> None:
        """SERVING, unless a canary fails and the configuration makes that fail the health check."""
        if self.health.draining:
            return
        failing = (self.canaries_failing and self.config.canary.fail_health) or self.pool_failing
        status = health_pb2.HealthCheckResponse.NOT_SERVING if failing else health_pb2.HealthCheckResponse.SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _watch_pool(self, pool: Executor) -> None:
        """NOT_SERVING while the worker pool cannot grade (no worker stays up), SERVING again once it can."""
        while True:
            await asyncio.sleep(POOL_HEALTH_SECONDS)
            failing = not pool.healthy()
            if failing != self.pool_failing:
                self.pool_failing = failing
                if failing:
                    log.error("the worker pool cannot keep a worker up: NOT_SERVING")
                else:
                    log.info("the worker pool is up again")
                await self._set_health()

    async def _report_canaries(self, results: list[CanaryResult]) -> None:
        """A canary run's results into the metrics, and into the health service with `canary.fail_health`."""
        if self.metrics is not None:
            for r in results:
                labels = (r.canary.reward, r.canary.name)
                self.metrics.canary_passing.labels(*labels).set(1 if r.passing else 0)
                self.metrics.canary_value.labels(*labels).set(math.nan if r.value is None else r.value)
                self.metrics.canary_last_run.labels(*labels).set(r.at)
        failing = not all(r.passing for r in results)
        changed = failing != self.canaries_failing
        self.canaries_failing = failing
        if changed and self.canary_task is not None:  # at start, `start` sets the health once the run is done
            await self._set_health()

    async def _start_http(self, app: web.Application) -> None:
        # handler_cancellation: a request whose client went away (OpenRLHF gives up after 180 s, then posts it
        # again) stops grading, as a cancelled gRPC call does, instead of running to an answer nobody reads.
        # Its connections are served by http.limits' guard: a cap, a time for the request head, an idle timeout.
        self.http_guard = ConnectionGuard(self.config.http)
        self.http_runner = web.AppRunner(
            app,
            shutdown_timeout=self.options.grace_seconds,
            handler_cancellation=True,
            **self.http_guard.connection_options(),
        )
        await self.http_runner.setup()
        host, port = self.options.http_host, self.options.http_port or 0
        try:
            self.http_port = await self.http_guard.start(self.http_runner, host, port)
        except OSError as exc:
            raise PortUnavailable("http_port", host, port, exc.strerror or str(exc)) from exc

    async def stop(self) -> None:
        """Drain: NOT_SERVING, refuse new calls, finish in-flight ones for up to the grace period, all
        within `grace_seconds + SHUTDOWN_MARGIN_SECONDS` (`exit_deadline` holds the process to it)."""
        grace = self.options.grace_seconds
        loop = asyncio.get_running_loop()
        end = loop.time() + grace + SHUTDOWN_MARGIN_SECONDS
        log.info("draining: NOT_SERVING, finishing in-flight calls for up to %.0f s", grace)
        if self.pool_task is not None:
            self.pool_task.cancel()
        if self.canary_task is not None:
            self.canary_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.canary_task
        await self.health.enter_graceful_shutdown()
        # The two faces drain at once, each for the grace period: one after the other took twice as long.
        await asyncio.gather(self._stop_http(grace), self.server.stop(grace))
        await close_judge_clients()  # nothing is judged any more: the judge endpoints' connections close
        if self.pool is not None:  # what workers still hold after the grace, nobody waits for any more
            self.pool.close(patience=max(0.0, min(POOL_PATIENCE_SECONDS, end - loop.time() - 1.5)))
        log.info("stopped")

    async def _stop_http(self, grace: float) -> None:
        """Stop accepting, let in-flight HTTP requests finish for up to `grace`, then end them. aiohttp
        spends up to its shutdown_timeout waiting for handlers and as long again for the cancelled ones to
        end: bounded here to the grace period and half a second more."""
        if self.http_guard is not None:
            self.http_guard.close()
        if self.http_runner is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.http_runner.cleanup(), grace + 0.5)


def _bindable(option: str, host: str, port: int) -> None:
    """PortUnavailable now when `host:port` cannot be bound (in use, not this machine's address), with the
    operating system's reason: grpc would say so only after its C core had logged lines of its own."""
    if not port:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise PortUnavailable(option, host, port, exc.strerror or str(exc)) from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc binds: TIME_WAIT is no obstacle
        try:
            probe.bind(address)
        except OSError as exc:
            raise PortUnavailable(option, host, port, exc.strerror or str(exc)) from exc


def build_server(opts: ServeOptions) -> Service:
    """Everything `serve` runs, assembled: configuration read, rewards resolved (a broken one fails here,
    not on the first call), workers started, the port bound. Raises for a bad configuration."""
    _bindable("port", opts.host, opts.port)  # before grpc tries: its C core logs its own lines first
    registry = get_registry()
    config = read_config(opts, registry)
    configure_models(config.models, config.callers)  # before the rewards are resolved: their LLM graders look models up
    metrics = Metrics() if opts.metrics_port else None
    workers = os.cpu_count() or 1 if opts.workers is None else opts.workers
    pool: Executor | None
    if opts.ray_address:  # one actor per cluster CPU unless --workers says how many
        from grpcgrade.core.executors_ray import RayExecutor

        pool = RayExecutor(opts.ray_address, opts.workers or None)
    else:
        pool = WorkerPool(workers) if workers > 0 else None
    cached = CachedGrading.from_config(config.cache, config.quarantine)
    if metrics is not None:
        metrics.watch_cache(cached)
    engine = Engine(
        registry,
        pool,
        rewards=config.rewards,
        grader_timeout=config.grader_timeout_seconds,
        observer=metrics.observe_grading if metrics else None,
        server_only_graders=config.server_only_graders,
        cached=cached,
        tokenizer=config.tokenizer,
    )
    try:
        source = " or ".join(str(f) for f in (opts.config, opts.kolibrify_config) if f)
        for name, reward in engine.rewards.items():
            try:
                jobs = engine.resolve(reward.specs)
            except (UnknownGrader, InvalidParams) as exc:
                raise ConfigError(f"{source}: reward {name!r}: {exc}") from exc
            gates = [job.spec.name for job in jobs if token_counts.uncounted(job.grader)]
            if gates and name == config.default_reward and opts.http_port is not None:
                # OpenRLHF's remote reward model never sends token counts: refuse now, not every reward x0.2
                message = token_counts.no_tokenizer_message(name, gates, "the HTTP face (OpenRLHF)")
                raise ConfigError(f"{source}: default_reward: {message}")
    except Exception:
        if pool is not None:
            pool.close(patience=0)
        raise

    interceptors: list[grpc.aio.ServerInterceptor] = [ObservingInterceptor(metrics)]
    tokens = _tokens(opts.auth_token_file)
    if tokens:
        interceptors.append(AuthInterceptor(tokens))
    interceptors.append(CallerInterceptor())  # who calls: the judges' fair share
    interceptors.append(DecodeGuardInterceptor())  # innermost: after auth, inside the logging and metrics
    max_bytes = config.limits.max_message_bytes
    pending = config.limits.max_pending_calls  # past gRPC's own pending limit its core cancels calls (admission)
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.so_reuseport", 0),  # a second server on the same port fails instead of sharing it
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.server.max_pending_requests", pending),
            ("grpc.server.max_pending_requests_hard_limit", pending),
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.max_connection_age_ms", 30 * 60_000),  # lets L4 balancers spread long-lived clients
            ("grpc.max_connection_age_grace_ms", int(opts.grace_seconds * 1000)),
            *opts.extra_options,
        ],
    )
    admission = Admission(config.limits)
    if metrics is not None:
        metrics.watch_admission(admission)
    linger = config.coalesce_linger_seconds
    coalescer = ServerCoalescer(engine, linger) if linger > 0 else None
    if metrics is not None and coalescer is not None:
        metrics.watch_coalescer(coalescer)
    add_to_server(GradingServicer(engine, config.limits, metrics, admission, coalescer), server)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(cached, registry), server)
    health_servicer = DrainingHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    services = (SERVICE_NAME, ADMIN_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(services, server)

    address = f"{opts.host}:{opts.port}"
    try:
        creds = _credentials(opts)
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc's "Failed to bind": in use, or not an address of this machine
        if pool is not None:
            pool.close(patience=0)
        raise PortUnavailable("port", opts.host, opts.port, "the address is in use or not this machine's") from exc
    except Exception:
        if pool is not None:
            pool.close(patience=0)
        raise
    service = Service(opts, server, port, health_servicer, engine, registry, config, metrics, pool, creds is not None)
    if opts.http_port is not None:
        service.http_app = build_http_app(
            engine,
            config.limits,
            config.http,
            config.default_reward,
            tokens=tokens,
            metrics=metrics,
            admission=admission,
            coalescer=coalescer,
        )
    return service


#: How long past `--grace` the process may take to exit: the faces' ends, the workers' stop, the exit
#: itself. Kubernetes' terminationGracePeriodSeconds (deploy/k8s) leaves room for preStop + grace + this.
SHUTDOWN_MARGIN_SECONDS = 3.0
#: Workers' time to finish what they hold at exit, within the margin.
POOL_PATIENCE_SECONDS = 1.0


def exit_deadline(seconds: float) -> threading.Timer:
    """A timer that ends the process (status 0) if it is still there `seconds` from now: a grading thread
    (a synchronous grader in the server process, a sandbox's wait) or a stuck worker's join would otherwise
    hold the interpreter's exit past the grace period the orchestrator was promised."""

    def force() -> None:
        still = [t.name for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
        log.warning("exiting %.1f s after the drain began; still running: %s", seconds, ", ".join(still) or "-")
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()
    return timer


#: glibc's `mallopt` parameter for the size from which an allocation gets its own memory map.
M_MMAP_THRESHOLD = -3
LARGE_ALLOCATION_BYTES = 1024 * 1024


def return_large_buffers_to_the_os() -> None:
    """Large answers (a chunk's serialized results, up to the message limit) get their own memory maps, so
    the memory goes back to the system when they are freed: a call ended for a stalled reader leaves
    nothing behind. glibc otherwise raises this threshold to the largest buffer freed (up to 32 MiB) and
    keeps later ones on its heap, where freed memory stays in the process. Not glibc: nothing to do."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, LARGE_ALLOCATION_BYTES)


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, and return it. Every HTTP and gRPC
    connection, every sandbox's pipes and every worker's take descriptors; the soft limit is often 1,024
    (systemd, many shells) where the hard one is far higher, and running out fails whatever asks next (a
    new client, a sandbox). Workers and sandboxes started later inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, OPEN_FILES_WANTED)
        with contextlib.suppress(ValueError, OSError):  # some platforms refuse RLIM_INFINITY or above nr_open
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


#: How long a thread holding the GIL keeps it while the event loop waits for it (CPython's default: 5 ms).
#: A thread parsing a large HTTP body (http.limits) would otherwise delay each of the loop's steps by up
#: to 5 ms, and a gRPC call takes several: measured, gRPC calls answered during such a parse went from
#: 57-86/s to 180-220/s with this.
GIL_SWITCH_SECONDS = 0.0005

#: The soft open-files limit asked for when the hard limit is unlimited.
OPEN_FILES_WANTED = 1 << 20


async def serve(opts: ServeOptions) -> int:
    """Run until SIGTERM/SIGINT, then drain."""
    return_large_buffers_to_the_os()
    open_files = raise_open_files_limit()
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    service = build_server(opts)
    try:
        await service.start()
    except BaseException:
        if service.http_guard is not None:
            service.http_guard.close()
        if service.http_runner is not None:
            await service.http_runner.cleanup()
        await service.server.stop(None)
        if service.pool is not None:
            service.pool.close(patience=0)
        raise
    log.info("open files limit: %d", open_files)  # once serving: a refused start's message stays alone
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    exit_deadline(opts.grace_seconds + SHUTDOWN_MARGIN_SECONDS)
    await service.stop()
    return 0
