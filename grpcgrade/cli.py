"""The `grpcgrade` command: serve, graders, eval, health, bench, new-plugin, version."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import __version__


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(max(logging.INFO, root.level))  # grpc's own per-call debug chatter


# -- serve -------------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from grpcgrade.service.server import ServeOptions, serve
    except ModuleNotFoundError as exc:  # `pip install grpcgrade` is the client only
        print(
            f"grpcgrade serve: {exc.name} is missing; the server needs: pip install 'grpcgrade[server]'",
            file=sys.stderr,
        )
        return 2

    opts = ServeOptions(
        host=args.host,
        port=args.port,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        workers=args.workers,
        config=args.config,
        kolibrify_config=args.kolibrify_config,
        grace_seconds=args.grace,
        grader_timeout_seconds=args.grader_timeout,
        auth_token_file=args.auth_token_file,
        tls_cert=args.tls_cert,
        http_host=args.http_host,
        http_port=args.http_port,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
    )
    return asyncio.run(serve(opts))


# -- graders -----------------------------------------------------------------------------------------


def cmd_graders(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    if args.target:
        from .client import GradingClient

        with GradingClient(args.target, token=args.token) as client:
            listing = client.list_graders()
    else:
        from grpcgrade.core.registry import get_registry
        from grpcgrade.service.catalog import list_graders

        listing = list_graders(get_registry(), {})
    data = MessageToDict(listing, preserving_proto_field_name=True)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    for g in data.get("graders", []):
        aliases = f" (aliases: {', '.join(g['aliases'])})" if g.get("aliases") else ""
        mode = g.get("mode", "").replace("GRADER_MODE_", "").lower()
        print(f"{g['name']}{aliases}  [{mode}]  from {g.get('plugin')} ({g.get('distribution')} {g.get('version')})")
        if g.get("description"):
            print(f"    {g['description']}")
        params = ", ".join(
            f"{p['name']}{'' if p.get('required') else '=' + json.dumps(p.get('default'))}" for p in g.get("params", [])
        )
        if params:
            print(f"    params: {params}")
    failed = [p for p in data.get("plugins", []) if p.get("status") == "failed"]
    for p in failed:
        print(f"FAILED plugin {p['name']} ({p.get('distribution')} {p.get('version', '')}): {p.get('error')}")
    for r in data.get("rewards", []):
        print(f"reward {r['name']}: {', '.join(g['name'] for g in r.get('graders', []))}")
    return 0


# -- eval --------------------------------------------------------------------------------------------


def _progress(done: int, total: int, started: float) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    rate = done / max(time.perf_counter() - started, 1e-9)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {rate:,.0f} samples/s")
    sys.stderr.flush()


def cmd_eval(args: argparse.Namespace) -> int:
    from .client import GradingClient, result_to_dict

    with open(args.input) as fh:
        samples = [json.loads(line) for line in fh if line.strip()]
    graders: list[Any] = []
    for name in args.grader or []:
        graders.append({"name": name, "params": json.loads(args.params) if args.params else {}})
    started = time.perf_counter()
    out = open(args.output, "w") if args.output else sys.stdout  # noqa: SIM115 - closed below
    try:
        with GradingClient(args.target, token=args.token, timeout=args.timeout) as client:
            results = client.batch_evaluate(
                samples,
                graders=graders,
                reward=args.reward or "",
                on_progress=None if args.quiet else lambda d, t: _progress(d, t, started),
            )
        for sample, result in zip(samples, results, strict=True):
            out.write(json.dumps({"sample": sample, **result_to_dict(result)}) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    if not args.quiet:
        sys.stderr.write("\n")
    return 0


# -- health ------------------------------------------------------------------------------------------


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the server says SERVING: a container HEALTHCHECK with no extra binary."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(args.target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"unhealthy: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import bench_stream_memory, run_bench

    if args.per_call:
        from .bench import bench_per_call

        rows = bench_per_call()
        if args.json:
            print(json.dumps(rows, indent=2))
        for r in [] if args.json else rows:
            label = f"{r['grader']} {json.dumps(r['params']) if r['params'] else ''}"
            ref = f"{r['reference_us']:>10.1f} us  x{r['speedup']:.2f}" if "reference_us" in r else ""
            print(f"{label:<45} {r['ours_us']:>10.1f} us  {ref}")
        return 0
    if args.stream:
        result = bench_stream_memory(args.stream, workers=args.workers or 0)
        print(json.dumps(result, indent=None if args.json else 2))
        return 0

    report = run_bench(
        args.grader,
        samples=args.samples,
        workers=args.workers,
        unary_calls=args.unary_calls,
        concurrency=args.concurrency,
        compare_metrics=args.compare_metrics,
        unary_rate=args.unary_rate,
    )
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.text())
    return 0


def cmd_new_plugin(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .scaffold import new_plugin

    try:
        root = new_plugin(args.name, Path(args.directory))
    except (ValueError, FileExistsError) as exc:
        print(f"grpcgrade new-plugin: {exc}", file=sys.stderr)
        return 1
    print(f"created {root}\nnext: pip install -e {root} && pytest {root}")
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(f"grpcgrade {__version__}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpcgrade", description="Reward graders served over gRPC.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    common.add_argument("--log-format", default="text", choices=["text", "json"], help="json: one object per line")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", parents=[common], help="run the gRPC server")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 in containers)")
    p.add_argument("--port", type=int, default=50051, help="gRPC port (0: pick a free one and log it)")
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: off)")
    p.add_argument("--workers", type=int, default=None, help="worker processes for heavy graders (default: cores)")
    p.add_argument("--config", help="YAML file with named rewards and limits")
    p.add_argument("--kolibrify-config", help="a Kolibrify RL dataserver YAML: each dataset becomes a reward")
    p.add_argument("--grace", type=float, default=25.0, help="seconds in-flight calls may finish after SIGTERM")
    p.add_argument("--grader-timeout", type=float, default=None, help="per-grader, per-sample time limit")
    p.add_argument("--auth-token-file", help="file of accepted bearer tokens, one per line")
    p.add_argument("--http-host", default="127.0.0.1")
    p.add_argument(
        "--http-port", type=int, default=None, help="HTTP/JSON face for OpenRLHF's remote reward (default: off)"
    )
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--tls-client-ca", help="require client certificates signed by this CA (mutual TLS)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("graders", parents=[common], help="list graders, their plugins and parameters")
    p.add_argument("--json", action="store_true")
    p.add_argument("--target", help="ask a running server instead of this installation")
    p.add_argument("--token", help="bearer token for --target")
    p.set_defaults(func=cmd_graders)

    p = sub.add_parser("eval", parents=[common], help="grade a JSONL file of samples through a server")
    p.add_argument("input")
    p.add_argument("--grader", action="append", help="grader name (repeatable)")
    p.add_argument("--params", help="JSON construction params for the grader(s)")
    p.add_argument("--reward", help="a reward configured on the server, instead of --grader")
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--token")
    p.add_argument("--timeout", type=float, default=300.0, help="deadline per call in seconds")
    p.add_argument("-o", "--output", help="JSONL output (default stdout)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("health", parents=[common], help="check a server's gRPC health (exit 0 when SERVING)")
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--service", default="")
    p.add_argument("--timeout", type=float, default=3.0)
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("bench", parents=[common], help="measure throughput against the bare library loop")
    p.add_argument("--grader", default="json_validator", choices=["json_validator", "chrf", "rougeL"])
    p.add_argument("--samples", type=int, help="samples per run (default: 200000 cheap, 3000 heavy)")
    p.add_argument("--workers", type=int, help="server worker processes (default: cores)")
    p.add_argument("--unary-calls", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=32, help="concurrent unary callers")
    p.add_argument(
        "--unary-rate",
        type=float,
        default=2_500.0,
        help="then offer this many unary calls/s, open loop, and report their latency (0: skip)",
    )
    p.add_argument("--compare-metrics", action="store_true", help="also run the batch with metrics off")
    p.add_argument("--per-call", action="store_true", help="instead: µs per call of every built-in grader")
    p.add_argument("--stream", type=int, metavar="N", help="instead: stream N samples and report the server's RSS")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("new-plugin", parents=[common], help="write a ready grader plugin package grpcgrade-NAME/")
    p.add_argument("name", help="the plugin's short name, also its grader's name")
    p.add_argument("--directory", default=".", help="where to create grpcgrade-NAME/ (default: here)")
    p.set_defaults(func=cmd_new_plugin)

    p = sub.add_parser("version", parents=[common], help="print the version")
    p.set_defaults(func=cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
