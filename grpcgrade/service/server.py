"""Assembling and running the gRPC server: health, reflection, interceptors, metrics, drain on SIGTERM.

An aio server: no thread per open stream, and measured as fast as the sync server for this work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from grpcgrade.core import tokens as token_counts
from grpcgrade.core.admission import Admission
from grpcgrade.core.cached_grading import CachedGrading
from grpcgrade.core.canaries import CanaryResult, run_canaries, watch
from grpcgrade.core.coalesce import ServerCoalescer
from grpcgrade.core.config import MAX_GRPC_PROCESSES, MAX_HTTP_PROCESSES, ServerConfig
from grpcgrade.core.engine import Engine
from grpcgrade.core.errors import ConfigError, InvalidParams, PortUnavailable, UnknownGrader
from grpcgrade.core.executors import Executor
from grpcgrade.core.registry import Registry, get_registry, warm
from grpcgrade.core.workers import WorkerPool
from grpcgrade.llm.models import close_clients as close_judge_clients
from grpcgrade.llm.models import configure as configure_models
from grpcgrade.v1 import admin_pb2_grpc
from grpcgrade.v1 import grading_pb2 as pb

from .admin import SERVICE_NAME as ADMIN_SERVICE_NAME
from .admin import AdminServicer
from .faces import FaceProcesses
from .interceptors import ServiceInterceptor
from .lifecycle import POOL_PATIENCE_SECONDS, SHUTDOWN_MARGIN_SECONDS, exit_deadline, settle_heap, tune_process
from .loop_watch import install_from_env as watch_the_loop
from .metrics import Metrics
from .options import ServeOptions, public_server_options, read_config, read_tokens, server_credentials
from .ports import check_free
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
    #: The face processes (`faces`), and the server they grade through: the same servicer on a Unix-domain
    #: socket in `engine_dir`, a directory only this user can enter (None without a face). With gRPC face
    #: processes, `server` itself is that private server: the faces own the public port.
    faces: FaceProcesses | None = None
    engine_server: grpc.aio.Server | None = None
    engine_dir: str | None = None
    #: The HTTP face's bound port once started (None without one).
    http_port: int | None = None
    #: The periodic canary runs (None without canaries), and whether a canary failed at the last run.
    canary_task: asyncio.Task[None] | None = None
    #: Watches whether the worker pool can grade (`Executor.trouble`): the health check says so, and the
    #: calls' admission (`admission`, which every call passes, whatever its face) refuses them meanwhile.
    pool_task: asyncio.Task[None] | None = None
    pool_failing: bool = False
    admission: Admission | None = None
    canaries_failing: bool = False

    async def start(self) -> None:
        if self.metrics is not None:
            self.metrics.set_plugins(self.registry.plugins)
            if self.pool is not None:
                pool = self.pool
                self.metrics.watch_workers(pool.alive, lambda: pool.restarts, pool.healthy)
            host, port = self.options.metrics_host, self.options.metrics_port
            try:
                self.metrics.serve(host, port)
            except OSError as exc:
                raise PortUnavailable("metrics_port", host, port, exc.strerror or str(exc)) from exc
        for name in ("", SERVICE_NAME):  # grpc's health service starts out SERVING: not before we are
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        if self.pool is not None:  # every worker up, plugins loaded, graders warmed (`registry.warm`)
            await self.pool.ready()
        # This process's own graders warmed before SERVING too, as each worker's are: without workers every
        # grader, else the server-only ones (only this process has them). In a thread: health checks are
        # answered meanwhile.
        own = None if self.pool is None else set(self.config.server_only_graders)
        if own is None or own:
            await asyncio.to_thread(warm, self.registry, own)
        if self.faces is not None:  # listening before SERVING
            if self.engine_server is not None:
                await self.engine_server.start()
            await self.faces.start()
            self.http_port = self.faces.port
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
        if self.faces is not None and self.faces.native is not None:
            log.info("native gRPC face (%d cores) on %s:%d", self.faces.grpc, self.options.host, self.port)
        elif self.faces is not None and self.faces.grpc:
            log.info("gRPC face processes: %d on %s:%d", self.faces.grpc, self.options.host, self.port)
        if self.faces is not None and self.faces.port is not None:
            n = self.faces.http
            face = f"HTTP face on {self.options.http_host}:{self.faces.port}"
            log.info("%s (%d %s)", face, n, "process" if n == 1 else "processes")

    async def _set_health(self) -> None:
        """SERVING, unless a canary fails and the configuration makes that fail the health check."""
        if self.health.draining:
            return
        failing = (self.canaries_failing and self.config.canary.fail_health) or self.pool_failing
        status = health_pb2.HealthCheckResponse.NOT_SERVING if failing else health_pb2.HealthCheckResponse.SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _watch_pool(self, pool: Executor) -> None:
        """NOT_SERVING while the worker pool cannot grade (no worker stays up), and every call refused
        UNAVAILABLE (`Admission.cannot_grade`) rather than held until its deadline; SERVING again once it
        can."""
        while True:
            await asyncio.sleep(POOL_HEALTH_SECONDS)
            trouble = pool.trouble()
            if self.admission is not None:
                self.admission.cannot_grade = trouble
            failing = trouble is not None
            if failing != self.pool_failing:
                self.pool_failing = failing
                if failing:
                    log.error("the worker pool cannot grade (%s): NOT_SERVING, calls refused UNAVAILABLE", trouble)
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
        if self.faces is not None and self.faces.grpc:
            # The gRPC face processes own the public port: they drain first, through `server`, which then stops.
            await self._stop_http(grace)
            await self.server.stop(0.5)
        else:
            # The two faces drain at once, each for the grace period: one after the other took twice as long.
            await asyncio.gather(self._stop_http(grace), self.server.stop(grace))
        await close_judge_clients()  # nothing is judged any more: the judge endpoints' connections close
        if self.pool is not None:  # what workers still hold after the grace, nobody waits for any more
            self.pool.close(patience=max(0.0, min(POOL_PATIENCE_SECONDS, end - loop.time() - 1.5)))
        log.info("stopped")

    async def _stop_http(self, grace: float) -> None:
        """The face processes drain (each for up to `grace`), then the engine's private server stops: it
        answers the faces' in-flight requests until they are done."""
        if self.faces is not None:
            await self.faces.stop(grace)
        if self.engine_server is not None:
            await self.engine_server.stop(0.5)
        self._remove_engine_dir()

    def _remove_engine_dir(self) -> None:
        if self.engine_dir is not None:
            shutil.rmtree(self.engine_dir, ignore_errors=True)
            self.engine_dir = None

    async def abandon(self) -> None:
        """A start that failed: everything started so far ended at once."""
        if self.faces is not None:
            self.faces.close()
        if self.engine_server is not None:
            await self.engine_server.stop(None)
        self._remove_engine_dir()
        await self.server.stop(None)
        if self.pool is not None:
            self.pool.close(patience=0)


def build_server(opts: ServeOptions) -> Service:
    """Everything `serve` runs, assembled: configuration read, rewards resolved (a broken one fails here,
    not on the first call), workers started, the port bound. Raises for a bad configuration."""
    check_free("port", opts.host, opts.port)  # before grpc tries: its C core logs its own lines first
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
        pool_close(pool)
        raise

    tokens = read_tokens(opts.auth_token_file)
    grpc_faces = config.grpc.processes if opts.grpc_processes is None else opts.grpc_processes
    native = (opts.grpc_face or config.grpc.face) == "native"
    if native and not grpc_faces:  # the native face (one process) with every core
        grpc_faces = os.cpu_count() or 1
    if grpc_faces > MAX_GRPC_PROCESSES:
        pool_close(pool)
        raise ConfigError(f"--grpc-processes {grpc_faces}: at most {MAX_GRPC_PROCESSES}")
    if grpc_faces:  # the faces own the public port and count its calls: this server is the private one
        server = grpc.aio.server(
            interceptors=[ServiceInterceptor(None, tokens, observe=False)], options=_private_options(config)
        )
    else:
        server = grpc.aio.server(
            interceptors=[ServiceInterceptor(metrics, tokens)],
            options=public_server_options(opts, config, shared=False),
        )
    admission = Admission(config.limits)
    if metrics is not None:
        metrics.watch_admission(admission)
    linger = config.coalesce_linger_seconds
    coalescer = ServerCoalescer(engine, linger) if linger > 0 else None
    servicer = GradingServicer(engine, config.limits, metrics, admission, coalescer)
    add_to_server(servicer, server)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(cached, registry), server)
    health_servicer = DrainingHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    services = (SERVICE_NAME, ADMIN_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(services, server)

    if grpc_faces:
        service = _with_grpc_faces(opts, server, health_servicer, engine, registry, config, metrics, pool)
    else:
        address = f"{opts.host}:{opts.port}"
        try:
            creds = server_credentials(opts)
            port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc's "Failed to bind": in use, or not an address of this machine
            pool_close(pool)
            raise PortUnavailable("port", opts.host, opts.port, "the address is in use or not this machine's") from exc
        except Exception:
            pool_close(pool)
            raise
        tls = creds is not None
        service = Service(opts, server, port, health_servicer, engine, registry, config, metrics, pool, tls)
    if grpc_faces or opts.http_port is not None:
        try:
            _add_faces(service, servicer, tokens, grpc_faces, native)
        except Exception:
            pool_close(pool)
            raise
    service.admission = admission
    native_face = service.faces.native if service.faces is not None else None
    coalescing = [c for c in (coalescer, service.faces, native_face) if c is not None]
    if metrics is not None and coalescing:
        metrics.watch_coalescer(*coalescing)
    return service


#: The engine's private socket, in a directory of its own (`Service.engine_dir`).
ENGINE_SOCKET = "engine.sock"


def pool_close(pool: Executor | None) -> None:
    if pool is not None:
        pool.close(patience=0)


def _private_options(config: ServerConfig) -> list[tuple[str, int]]:
    """The engine's private server's options: the message and pending-call limits of the public port."""
    max_bytes, pending = config.limits.max_message_bytes, config.limits.max_pending_calls
    return [
        ("grpc.max_receive_message_length", max_bytes),
        ("grpc.max_send_message_length", max_bytes),
        ("grpc.server.max_pending_requests", pending),
        ("grpc.server.max_pending_requests_hard_limit", pending),
    ]


def _with_grpc_faces(
    opts: ServeOptions,
    server: grpc.aio.Server,
    health_servicer: DrainingHealthServicer,
    engine: Engine,
    registry: Registry,
    config: ServerConfig,
    metrics: Metrics | None,
    pool: Executor | None,
) -> Service:
    """The Service whose `server` listens only on the engine's private socket (its directory made here)."""
    directory = tempfile.mkdtemp(prefix="grpcgrade-engine-")  # mode 0700
    server.add_insecure_port(f"unix:{os.path.join(directory, ENGINE_SOCKET)}")
    tls = bool(opts.tls_cert and opts.tls_key)
    service = Service(opts, server, opts.port, health_servicer, engine, registry, config, metrics, pool, tls)
    service.engine_dir = directory
    return service


def _add_faces(
    service: Service, servicer: GradingServicer, tokens: list[str], grpc_faces: int, native: bool = False
) -> None:
    """The face processes (`grpc_faces` serving the public gRPC port, and the HTTP face's when it is on)
    and the private server they grade through: the same servicer (engine, admission, coalescer) behind the
    same token check, on a Unix-domain socket in a directory only this user can enter. Without gRPC faces
    that is a server of its own, with GradingService only, whose calls are not counted as the gRPC port's
    (each HTTP request is counted by its face); with them, `service.server` is already that server.
    `native`: the gRPC port is the native face's (`native_face`), with `grpc_faces` cores."""
    opts, config = service.options, service.config
    http_faces = 0
    if opts.http_port is not None:
        http_faces = opts.http_processes or config.http.processes
        if http_faces > MAX_HTTP_PROCESSES:
            raise ConfigError(f"--http-processes {http_faces}: at most {MAX_HTTP_PROCESSES}")
    if service.engine_dir is None:
        directory = tempfile.mkdtemp(prefix="grpcgrade-engine-")  # mode 0700
        engine_server = grpc.aio.server(
            interceptors=[ServiceInterceptor(None, tokens, observe=False)], options=_private_options(config)
        )
        add_to_server(servicer, engine_server)
        engine_server.add_insecure_port(f"unix:{os.path.join(directory, ENGINE_SOCKET)}")
        service.engine_server, service.engine_dir = engine_server, directory
    path = os.path.join(service.engine_dir, ENGINE_SOCKET)
    try:
        service.faces = FaceProcesses(
            opts, f"unix:{path}", http_faces, grpc_faces, service.metrics, config if native else None
        )
    except Exception:
        shutil.rmtree(service.engine_dir, ignore_errors=True)
        raise
    if service.faces.grpc_port is not None:
        service.port = service.faces.grpc_port


async def serve(opts: ServeOptions) -> int:
    """Run until SIGTERM/SIGINT, then drain."""
    open_files = tune_process()
    watch_the_loop()  # GRPCGRADE_SLOW_CALLBACK_MS: diagnosis only
    service = build_server(opts)
    try:
        await service.start()
    except BaseException:
        await service.abandon()
        raise
    log.info("open files limit: %d", open_files)  # once serving: a refused start's message stays alone
    settle_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    exit_deadline(opts.grace_seconds + SHUTDOWN_MARGIN_SECONDS)
    await service.stop()
    return 0
