"""The `grpcgrade` command: serve, graders, eval, health, quarantine, bench, new-plugin, version.

Every user error is a message of a line or two and an exit status: 2 when the command line (or a file it
names) is wrong, 1 when the run failed. `--debug` (or GRPCGRADE_DEBUG=1) shows the traceback instead.
The client commands (health, graders --target, eval, quarantine) take the Python client's connection options; each
also reads an environment variable, so a container's HEALTHCHECK can reach a TLS server.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib
import json
import math
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from . import __version__
from .logs import LEVELS, setup_logging

DEBUG_ENV = "GRPCGRADE_DEBUG"
DEFAULT_TARGET = "127.0.0.1:50051"
#: Connection options and the environment variables they default to.
CONNECTION_ENV = {
    "target": "GRPCGRADE_TARGET",
    "tls_ca": "GRPCGRADE_TLS_CA",
    "tls_cert": "GRPCGRADE_TLS_CERT",
    "tls_key": "GRPCGRADE_TLS_KEY",
    "tls_server_name": "GRPCGRADE_TLS_SERVER_NAME",
    "auth_token_file": "GRPCGRADE_AUTH_TOKEN_FILE",
}


class UsageError(Exception):
    """The command line, or a file it names, is wrong (exit status 2)."""


class RunFailed(Exception):
    """The run failed for a reason the message says (exit status 1)."""


#: The largest port number.
MAX_PORT = 65_535
#: The longest drain `--grace` allows: a day (gRPC takes it in milliseconds, as a 32-bit integer).
MAX_GRACE_SECONDS = 86_400.0


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def port_number(text: str) -> int:
    """A TCP port, or 0 (pick a free one): gRPC would bind 99999 as 34463 (99999 mod 65536), unasked."""
    value = int(text)
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be a port number, 0 to {MAX_PORT}, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):  # nan and inf too: a limit that never ends is not one
        raise argparse.ArgumentTypeError(f"must be a number more than 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number, 0 or more, got {text}")
    return value


def grace_seconds(text: str) -> float:
    value = non_negative_float(text)
    if value > MAX_GRACE_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_GRACE_SECONDS:g} seconds, got {text}")
    return value


# -- connecting ----------------------------------------------------------------------------------------


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """GradingClient keyword arguments from the connection options (and `--target` checked: a usage error)."""
    from .client import channel_target, read_token, tls_credentials

    try:
        channel_target(args.target)
    except ValueError as exc:
        raise UsageError(f"--target: {str(exc).removeprefix('grpcgrade: ')}") from None
    tls = args.tls or any((args.tls_ca, args.tls_cert, args.tls_key))
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together: the client certificate and its key")
    for flag, path in (("--tls-ca", args.tls_ca), ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path and not os.path.isfile(path):
            raise UsageError(f"{flag} {path}: no such file")
    token = args.token
    if args.auth_token_file:
        try:
            token = read_token(args.auth_token_file)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--auth-token-file: {exc}") from exc
    return {
        "token": token,
        "timeout": args.timeout,
        # A command waits for a server that is not there (yet) no longer than its deadline, not the library's
        # 60 s for a training run riding out a restart: `--timeout 2` at a terminal answers within seconds.
        "unavailable_seconds": args.timeout,
        "credentials": tls_credentials(args.tls_ca, args.tls_cert, args.tls_key) if tls else None,
        "server_name": args.tls_server_name,
    }


def rpc_message(exc: Any, target: str) -> str:
    code, details = exc.code(), exc.details() or ""
    hint = ""
    if code.name == "UNAVAILABLE":
        hint = " (is a server listening there? a TLS server needs --tls-ca, mutual TLS also --tls-cert/--tls-key)"
    elif code.name == "UNAUTHENTICATED":
        hint = " (give the token with --auth-token-file)"
    return f"{target}: {code.name}: {details}{hint}"


# -- serve -------------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from grpcgrade.service.server import ServeOptions, serve
    except ModuleNotFoundError as exc:  # `pip install grpcgrade` is the client only
        raise UsageError(f"{exc.name} is missing; the server needs: pip install 'grpcgrade[server]'") from exc

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
        http_processes=args.http_processes,
        grpc_processes=args.grpc_processes,
        grpc_face=args.grpc_face,
        ray_address=args.ray,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        tokenizer=args.tokenizer,
    )
    for flag, path in (
        ("--config", opts.config),
        ("--kolibrify-config", opts.kolibrify_config),
        ("--auth-token-file", opts.auth_token_file),
        ("--tls-cert", opts.tls_cert),
        ("--tls-key", opts.tls_key),
        ("--tls-client-ca", opts.tls_client_ca),
    ):
        if path and not os.path.isfile(path):
            raise UsageError(f"{flag} {path}: no such file")
    from grpcgrade.core.config import GRPC_FACES

    if opts.grpc_face is not None and opts.grpc_face not in GRPC_FACES:
        raise UsageError(f"--grpc-face {opts.grpc_face}: one of {', '.join(GRPC_FACES)}")
    if bool(opts.tls_cert) != bool(opts.tls_key):
        raise UsageError("--tls-cert and --tls-key go together: the server certificate and its key")
    if opts.ray_address:
        try:  # the server imports it anyway; here to say what is missing (by name: an optional extra)
            importlib.import_module("ray")
        except ImportError as exc:
            raise UsageError(f"--ray needs Ray, which is missing ({exc}): pip install 'grpcgrade[ray]'") from None
    return asyncio.run(serve(opts))


# -- graders -----------------------------------------------------------------------------------------


def _number(value: Any, type_name: str = "int") -> Any:
    """JSON (a protobuf Value) has one number type: show an int param's integral numbers as ints."""
    if isinstance(value, list):
        return [_number(v, type_name) for v in value]
    if isinstance(value, dict):
        return {k: _number(v, type_name) for k, v in value.items()}
    if isinstance(value, float) and value.is_integer() and "int" in type_name and "float" not in type_name:
        return int(value)
    return value


def listing_data(listing: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    data = MessageToDict(listing, preserving_proto_field_name=True)
    for grader in data.get("graders", []):
        for param in grader.get("params", []):
            if "default" in param:
                param["default"] = _number(param["default"], param.get("type", ""))
    return data


def _param_text(p: dict[str, Any]) -> str:
    text = f"{p['name']}: {p.get('type', 'any')}"
    if p.get("required"):
        return text + " (required)"
    if p.get("default") is not None:
        text += f" = {json.dumps(p['default'])}"
    return text


def _origin(item: dict[str, Any]) -> str:
    """`distribution version` for installed packages; configuration-defined graders have no version."""
    version = item.get("version")
    return f"{item.get('distribution', '')} {version}" if version else f"defined by {item.get('distribution', '')}"


def _spec_text(spec: dict[str, Any]) -> str:
    parts = [spec["name"]]
    if spec.get("key"):
        parts.append(f"key {spec['key']}")
    if "weight" in spec:
        parts.append(f"weight {spec['weight']:g}")
    if spec.get("gate"):
        parts.append("gate")
    if spec.get("params"):  # types unknown here: integral numbers shown as written in YAML, 200 not 200.0
        parts.append(f"params {json.dumps(_number(spec['params']), sort_keys=True)}")
    return ", ".join(parts)


def print_listing(data: dict[str, Any], where: str) -> None:
    print(where)
    for g in data.get("graders", []):
        aliases = f" (aliases: {', '.join(g['aliases'])})" if g.get("aliases") else ""
        mode = g.get("mode", "").replace("GRADER_MODE_", "").lower()
        print(f"\n{g['name']}{aliases}  [{mode}]  plugin {g.get('plugin')}, {_origin(g)}")
        if g.get("description"):
            print(f"    {g['description']}")
        if g.get("params"):
            print(f"    params: {', '.join(_param_text(p) for p in g['params'])}")
    print("\nplugins:")
    for p in data.get("plugins", []):
        detail = f": {p['error']}" if p.get("error") else ""
        print(f"  {p['name']}  {_origin(p)}  {p.get('status')}{detail}")
    rewards = data.get("rewards", [])
    if rewards:
        print("\nrewards:")
    for r in rewards:
        print(f"  {r['name']}" + (f": {r['description']}" if r.get("description") else ""))
        for spec in r.get("graders", []):
            print(f"    {_spec_text(spec)}")


def cmd_graders(args: argparse.Namespace) -> int:
    if args.target:
        import grpc

        from .client import GradingClient

        with GradingClient(args.target, **client_options(args)) as client:
            try:
                listing = client.list_graders()
            except grpc.RpcError as exc:
                raise RunFailed(rpc_message(exc, args.target)) from exc
        where = f"The graders, plugins and rewards of the server at {args.target}:"
    else:
        try:
            from grpcgrade.core.registry import get_registry
            from grpcgrade.service.catalog import list_graders

            listing = list_graders(get_registry(), {})
        except ModuleNotFoundError as exc:  # `pip install grpcgrade`: the client, without the graders' packages
            raise UsageError(
                f"{exc.name} is missing: this installation is the client only, which grades nothing itself. "
                "List a server's graders with --target HOST:PORT, or install the graders: "
                "pip install 'grpcgrade[server]'"
            ) from exc
        where = "The graders and plugins of this installation (a server's: --target HOST:PORT):"
    data = listing_data(listing)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print_listing(data, where)
    return 0


# -- eval --------------------------------------------------------------------------------------------


def _params(text: str, grader: str) -> dict[str, Any]:
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentError(None, f"params of grader {grader!r} are not JSON: {exc.msg}: {text}") from exc
    if not isinstance(params, dict):
        raise argparse.ArgumentError(None, f"params of grader {grader!r} must be a JSON object, got {text}")
    return params


class GraderAction(argparse.Action):
    """--grader NAME or --grader 'NAME:{"param": value}', repeatable."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        name, sep, raw = str(value).partition(":")
        if not name:
            parser.error(f"--grader {value!r}: no grader name")
        try:
            params = _params(raw, name) if sep else {}
        except argparse.ArgumentError as exc:
            parser.error(str(exc))
        specs = list(getattr(namespace, self.dest) or [])
        specs.append({"name": name, "params": params})
        setattr(namespace, self.dest, specs)


class ParamsAction(argparse.Action):
    """--params JSON: the params of the --grader just before it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, value: Any, option: Any = None) -> None:
        specs = getattr(namespace, "graders", None)
        if not specs:
            parser.error("--params must follow the --grader it is for: --grader NAME --params JSON")
        if specs[-1]["params"]:
            parser.error(f"grader {specs[-1]['name']!r} has params already")
        try:
            specs[-1]["params"] = _params(str(value), specs[-1]["name"])
        except argparse.ArgumentError as exc:
            parser.error(str(exc))


class Progress:
    """A tqdm bar on stderr, moved as results arrive (from the client's threads) and redrawn at least every
    second, so the rate and ETA stay current while a slow chunk is out. tqdm comes with the server extra;
    a client-only install (`pip install grpcgrade`) grades without a bar."""

    def __init__(self, path: str, enabled: bool) -> None:
        self.bar: Any = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ModuleNotFoundError:
            print("grpcgrade eval: no progress bar without tqdm (pip install tqdm)", file=sys.stderr)
            return
        from .jsonl import count_samples

        total = count_samples(path)
        self.bar = tqdm(total=total, unit=" samples", file=sys.stderr, mininterval=0.2)
        threading.Thread(target=self._tick, name="grpcgrade-progress", daemon=True).start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self.bar.refresh()

    def advance(self, n: int) -> None:
        if self.bar is not None:
            with self._lock:
                self.bar.update(n)

    def close(self) -> None:
        self._stop.set()
        if self.bar is not None:
            with self._lock:
                self.bar.close()


def cmd_eval(args: argparse.Namespace) -> int:
    import grpc

    from .client import GradingClient, result_to_dict
    from .jsonl import atomic_output, open_input, read_samples

    graders = args.graders or []
    if not graders and not args.reward:
        raise UsageError("say what to grade with: --grader NAME (repeatable) or --reward NAME")
    if graders and args.reward:
        raise UsageError("give --grader or --reward, not both")
    if args.output not in (None, "-") and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise UsageError(f"-o {args.output}: no such directory")
    options = client_options(args)
    try:
        source = open_input(args.input)
    except OSError as exc:
        raise UsageError(f"{args.input}: {exc.strerror}") from exc
    name = "stdin" if args.input == "-" else args.input
    progress = Progress(args.input, enabled=not args.quiet)
    in_flight: collections.deque[dict[str, Any]] = collections.deque()  # samples sent, result not yet written

    def samples() -> Any:
        from grpcgrade.service.convert import sample_to_pb

        from .jsonl import InputError

        for number, sample in read_samples(source, name):
            try:
                message = sample_to_pb(sample)
            except (TypeError, ValueError) as exc:
                raise InputError(f"{name}, line {number}: {exc}") from exc
            in_flight.append(sample)
            yield message

    try:
        with atomic_output(args.output) as out, GradingClient(args.target, **options, chunk_size=args.chunk_size) as c:
            results = c.evaluate_stream(
                samples(),
                graders,
                reward=args.reward or "",
                grader_timeout=args.grader_timeout,
                on_progress=progress.advance,
            )
            try:
                with contextlib.closing(results):  # on any error the calls still in flight are cancelled
                    for result in results:
                        out.write(json.dumps({"sample": in_flight.popleft(), **result_to_dict(result)}) + "\n")
                        if out is sys.stdout:
                            out.flush()  # a reader of the pipe sees each result as it comes
            except grpc.RpcError as exc:
                raise RunFailed(rpc_message(exc, args.target)) from exc
    finally:
        progress.close()
        if source is not sys.stdin:
            source.close()
    return 0


# -- health ------------------------------------------------------------------------------------------


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the server says SERVING: a container HEALTHCHECK with no extra binary."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from .client import channel_options, channel_target
    from .v1 import grading_pb2 as pb

    service_name = pb.DESCRIPTOR.services_by_name["GradingService"].full_name

    options = client_options(args)
    target, creds = channel_target(args.target), options["credentials"]
    channel_args = channel_options(4 * 1024 * 1024, options["server_name"])
    channel = grpc.secure_channel(target, creds, channel_args) if creds else grpc.insecure_channel(target, channel_args)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]  # the stub package omits it
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                known = f"'' (the whole server) or {service_name!r}"
                print(f"unhealthy: {target} reports no service {args.service!r}; it reports {known}", file=sys.stderr)
            else:
                print(f"unhealthy: {rpc_message(exc, target)}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


# -- quarantine ----------------------------------------------------------------------------------------


def _when(seconds: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(seconds))


def cmd_quarantine(args: argparse.Namespace) -> int:
    """List or clear the inputs a server holds in quarantine (AdminService)."""
    import grpc

    from .client import GradingClient

    with GradingClient(args.target, **client_options(args)) as client:
        try:
            if args.action == "clear":
                cleared = client.clear_quarantine(args.grader)
                print(f"cleared {cleared} quarantined input{'s' * (cleared != 1)} at {args.target}")
                return 0
            listing = client.list_quarantine(args.grader)
        except grpc.RpcError as exc:
            raise RunFailed(rpc_message(exc, args.target)) from exc
    if args.json:
        from google.protobuf.json_format import MessageToDict

        print(json.dumps(MessageToDict(listing, preserving_proto_field_name=True), indent=2))
        return 0
    if not listing.enabled:
        print(f"the server at {args.target} has the quarantine turned off (quarantine: {{enabled: false}})")
        return 0
    print(
        f"{len(listing.entries)} quarantined input{'s' * (len(listing.entries) != 1)} at {args.target} "
        f"({listing.bytes:,} of {listing.max_bytes:,} bytes)"
    )
    for e in listing.entries:
        since, until = _when(e.since_unix_seconds), _when(e.expires_unix_seconds)
        print(f"  {e.grader} {e.params} {e.code} since {since}, until {until}, answered {e.hits}x")
        print(f"    {e.preview}")
    return 0


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
    if args.per_sample:
        from .bench_crowd import run_per_sample

        try:
            crowd = run_per_sample(
                args.grader, calls=args.samples or 20_000, callers=args.callers, workers=args.workers
            )
        except RuntimeError as exc:
            print(f"grpcgrade bench: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(crowd, indent=None if args.json else 2))
        return 0
    if args.sandbox:
        try:
            from .bench import bench_sandbox

            figures = bench_sandbox(args.sandbox)
        except ImportError:
            print("grpcgrade bench --sandbox needs the grpcgrade-code plugin (plugins/grpcgrade-code)", file=sys.stderr)
            return 2
        print(json.dumps(figures, indent=None if args.json else 2))
        return 0
    if args.judges:
        from .bench_judges import bench_judges

        figures = bench_judges(args.judges, args.judge_rpm)
        print(json.dumps(figures, indent=None if args.json else 2))
        return 0
    if args.http_stall:
        from .bench_stall import run_http_stall, text

        stall = run_http_stall(seconds=args.stall_seconds, workers=args.workers)
        print(json.dumps(stall, indent=2) if args.json else text(stall))
        return 0
    if args.stream:
        result = bench_stream_memory(args.stream, workers=args.workers or 0)
        print(json.dumps(result, indent=None if args.json else 2))
        return 0

    if args.goals:
        from .bench_goals import run_goals

        goals = run_goals(
            samples=args.samples or 100_000,
            heavy_samples=args.heavy_samples,
            workers=args.workers,
            step_reps=args.step_reps,
            unary_rate=args.unary_rate or 1_000.0,
            unary_seconds=args.unary_calls / (args.unary_rate or 1_000.0),
            judge_samples=args.judge_samples,
            stall_seconds=args.stall_seconds,
        )
        print(json.dumps(goals.as_dict(), indent=2) if args.json else goals.text())
        return 0
    report = run_bench(
        args.grader,
        samples=args.samples,
        workers=args.workers,
        unary_calls=args.unary_calls,
        concurrency=args.concurrency,
        compare_metrics=args.compare_metrics,
        unary_rate=2_500.0 if args.unary_rate is None else args.unary_rate,
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


def _env(option: str) -> str | None:
    return os.environ.get(CONNECTION_ENV[option]) or None


def add_connection(p: argparse.ArgumentParser, target: str | None, timeout: float) -> None:
    """The Python client's connection options; each defaults to its environment variable when set."""
    g = p.add_argument_group("connection (each also read from the environment variable named)")
    g.add_argument(
        "--target",
        default=_env("target") or target,
        help=f"the server's HOST:PORT, or a gRPC name such as dns:///svc:50051 (${CONNECTION_ENV['target']}; "
        + (f"default {target})" if target else "default: this installation, no server)"),
    )
    g.add_argument("--tls", action="store_true", help="connect with TLS, trusting the system's CA certificates")
    for option, metavar, text in (
        ("tls_ca", "FILE", "connect with TLS, trusting this CA (PEM)"),
        ("tls_cert", "FILE", "mutual TLS: this client's certificate (PEM), with --tls-key"),
        ("tls_key", "FILE", "mutual TLS: the client certificate's private key (PEM)"),
        ("tls_server_name", "NAME", "check the server's certificate for this name instead of the target's host"),
        ("auth_token_file", "FILE", "send the bearer token in this file (its first line; a server's token file works)"),
    ):
        flag = "--" + option.replace("_", "-")
        g.add_argument(flag, default=_env(option), metavar=metavar, help=f"{text} (${CONNECTION_ENV[option]})")
    g.add_argument("--token", help="send this bearer token (visible to other users in `ps`: prefer --auth-token-file)")
    g.add_argument(
        "--timeout",
        type=positive_float,
        default=timeout,
        help=f"deadline per call in seconds, also for a server that is not up (default {timeout:g})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpcgrade",
        description="Reward graders served over gRPC. Exit status: 0 done, 1 the run failed, 2 a usage error.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level", default="info", choices=LEVELS, help="grpcgrade's own log level (debug: every library's too)"
    )
    common.add_argument(
        "--library-log-level",
        choices=LEVELS,
        help="the log level of other libraries (httpx, grpc, plugins' dependencies); default warning",
    )
    common.add_argument("--log-format", default="text", choices=["text", "json"], help="json: one object per line")
    common.add_argument(
        "--debug", action="store_true", help=f"on an error, show the Python traceback (also ${DEBUG_ENV}=1)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", parents=[common], help="run the gRPC server")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 in containers)")
    p.add_argument(
        "--port", type=port_number, default=50051, help="gRPC port (default 50051; 0: pick a free one and log it)"
    )
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of the /metrics endpoint (default 127.0.0.1)")
    p.add_argument("--metrics-port", type=port_number, default=0, help="Prometheus /metrics port (default 0: off)")
    p.add_argument(
        "--workers", type=non_negative_int, default=None, help="worker processes for heavy graders (default: cores)"
    )
    p.add_argument("--config", metavar="FILE", help="YAML file with named rewards, limits and models")
    p.add_argument(
        "--kolibrify-config", metavar="FILE", help="a Kolibrify RL dataserver YAML: each dataset becomes a reward"
    )
    p.add_argument("--grace", type=grace_seconds, default=25.0, help="seconds in-flight calls may finish after SIGTERM")
    p.add_argument(
        "--grader-timeout", type=positive_float, default=None, help="per-grader, per-sample time limit in seconds"
    )
    p.add_argument("--auth-token-file", metavar="FILE", help="require a bearer token: the accepted ones, one per line")
    p.add_argument("--http-host", default="127.0.0.1", help="address of the HTTP/JSON face (default 127.0.0.1)")
    p.add_argument(
        "--http-port", type=port_number, default=None, help="HTTP/JSON face for OpenRLHF's remote reward (default: off)"
    )
    p.add_argument(
        "--http-processes",
        type=positive_int,
        default=None,
        metavar="N",
        help="processes serving the HTTP face, sharing its port (default: the config's http.processes, 1)",
    )
    p.add_argument(
        "--grpc-processes",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="face processes serving the gRPC port, sharing it (0: the server's own process serves it; default: "
        "the config's grpc.processes, 0)",
    )
    p.add_argument(
        "--grpc-face",
        default=None,
        metavar="python|native",
        help="who serves the gRPC port beside the server's process: python (--grpc-processes face processes) or "
        "native (the Go face, `make native-face`, with --grpc-processes cores, 0: all); default: the config's "
        "grpc.face, python",
    )
    p.add_argument(
        "--tokenizer",
        metavar="SPEC",
        help="count a sample's completion_tokens when the trainer sends none (length gates): tiktoken:ENCODING "
        "or the path of a model's tokenizer.json; overrides the config's `tokenizer:`",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the workers as actors on this Ray cluster (host:port of its head; the grpcgrade[ray] extra), "
        "one per cluster CPU unless --workers says how many",
    )
    p.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate (PEM), with --tls-key")
    p.add_argument("--tls-key", metavar="FILE", help="the server certificate's private key (PEM)")
    p.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA (mutual TLS)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("graders", parents=[common], help="list graders, their plugins and parameters, and rewards")
    p.add_argument("--json", action="store_true", help="print the ListGraders message as JSON")
    add_connection(p, None, 10.0)
    p.set_defaults(func=cmd_graders)

    p = sub.add_parser("eval", parents=[common], help="grade a JSONL file of samples through a server")
    p.add_argument("input", help="JSONL file of samples, one JSON object a line (-: stdin)")
    p.add_argument(
        "--grader",
        dest="graders",
        action=GraderAction,
        metavar="NAME[:JSON]",
        help="a grader to run, with its params after a colon (repeatable)",
    )
    p.add_argument("--params", action=ParamsAction, metavar="JSON", help="params of the --grader just before")
    p.add_argument("--reward", help="a reward configured on the server, instead of --grader")
    p.add_argument(
        "-o", "--output", metavar="FILE", help="JSONL output, replaced only when the run succeeds (-: stdout)"
    )
    p.add_argument(
        "--grader-timeout",
        type=non_negative_float,
        default=0.0,
        help="per-grader, per-sample time limit (0: the server's)",
    )
    p.add_argument("--chunk-size", type=positive_int, default=1024, help="samples per call (default 1024)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_connection(p, DEFAULT_TARGET, 300.0)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("health", parents=[common], help="check a server's gRPC health (exit 0 when SERVING)")
    p.add_argument("--service", default="", help="the service to ask about (default '': the whole server)")
    add_connection(p, DEFAULT_TARGET, 3.0)
    p.set_defaults(func=cmd_health)

    p = sub.add_parser(
        "quarantine", parents=[common], help="list or clear the inputs a server answers from its quarantine"
    )
    p.add_argument("action", choices=["list", "clear"], help="list the quarantined inputs, or clear them")
    p.add_argument("--grader", default="", help="only this grader's entries (default: every grader's)")
    p.add_argument("--json", action="store_true", help="list: print the ListQuarantine answer as JSON")
    add_connection(p, DEFAULT_TARGET, 10.0)
    p.set_defaults(func=cmd_quarantine)

    p = sub.add_parser("bench", parents=[common], help="measure throughput against the bare library loop")
    p.add_argument(
        "--grader",
        default="json_validator",
        choices=["json_validator", "chrf", "rougeL", "math_verify"],
        help="the grader to time",
    )
    p.add_argument("--samples", type=positive_int, help="samples per run (default: 200000 cheap, 3000 heavy)")
    p.add_argument("--workers", type=non_negative_int, help="server worker processes (default: cores)")
    p.add_argument("--unary-calls", type=positive_int, default=20_000, help="Evaluate calls in the unary run")
    p.add_argument("--concurrency", type=positive_int, default=32, help="concurrent unary callers")
    p.add_argument(
        "--unary-rate",
        type=non_negative_float,
        help="then offer this many unary calls/s, open loop, and report their latency "
        "(default 2500, with --goals 1000; 0: skip)",
    )
    p.add_argument(
        "--goals",
        action="store_true",
        help="instead: every figure of the performance goals in one run, each beside its goal "
        "(cheap and heavy graders, a step's fixed cost, unary latency, the client's CPU per sample)",
    )
    p.add_argument("--heavy-samples", type=positive_int, default=2_000, help="with --goals: samples per heavy grader")
    p.add_argument("--step-reps", type=positive_int, default=500, help="with --goals: timed 8-sample steps")
    p.add_argument("--compare-metrics", action="store_true", help="also run the batch with metrics off")
    p.add_argument("--per-call", action="store_true", help="instead: µs per call of every built-in grader")
    p.add_argument(
        "--per-sample",
        action="store_true",
        help="instead: one-sample calls from a crowd of callers, gRPC and HTTP, as ratios to a plain FastAPI "
        "per-sample server grading the same grader (--samples calls, default 20000)",
    )
    p.add_argument("--callers", type=positive_int, default=4_000, help="with --per-sample: concurrent callers")
    p.add_argument(
        "--stream", type=positive_int, metavar="N", help="instead: stream N samples and report the server's RSS"
    )
    p.add_argument(
        "--http-stall",
        action="store_true",
        help="instead: gRPC callers' latency alone and while hostile HTTP clients send bodies at the limit "
        "(the worst added stall against its 100 ms goal, and the server's event-loop callbacks of 10 ms or more)",
    )
    p.add_argument(
        "--stall-seconds",
        type=non_negative_float,
        default=6.0,
        help="with --http-stall: seconds per hostile shape; with --goals: seconds of all of them at once (0: skip)",
    )
    p.add_argument(
        "--sandbox",
        type=positive_int,
        metavar="N",
        help="instead: N trivial programs in the code sandbox and N bare: runs/s and the start-up overhead",
    )
    p.add_argument(
        "--judges",
        type=positive_int,
        metavar="N",
        help="instead: N LLM judgments against a fake endpoint that enforces --judge-rpm: throughput as a share "
        "of what its limit allows",
    )
    p.add_argument(
        "--judge-samples", type=non_negative_int, default=2_000, help="with --goals: LLM judgments (0: skip)"
    )
    p.add_argument(
        "--judge-rpm",
        type=non_negative_float,
        default=6000.0,
        help="with --judges: the endpoint's requests/minute (0: no limit, every judgment in flight at once, each "
        "answered in 1 s: the judge client's own cost)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("new-plugin", parents=[common], help="write a ready grader plugin package grpcgrade-NAME/")
    p.add_argument("name", help="the plugin's short name, also its grader's name")
    p.add_argument("--directory", default=".", help="where to create grpcgrade-NAME/ (default: here)")
    p.set_defaults(func=cmd_new_plugin)

    p = sub.add_parser("version", parents=[common], help="print the version")
    p.set_defaults(func=cmd_version)
    return parser


def describe(exc: BaseException, args: argparse.Namespace) -> tuple[int, str]:
    """Exit status and message for an error (no traceback)."""
    from grpcgrade.core.errors import ClusterUnreachable, ConfigError, PortUnavailable

    from .jsonl import InputError

    if isinstance(exc, UsageError):
        return 2, str(exc)
    if isinstance(exc, ConfigError):
        return 2, str(exc)
    if isinstance(exc, (RunFailed, InputError)):
        return 1, str(exc)
    if isinstance(exc, ClusterUnreachable):
        return 1, f"--ray {exc.address}: {exc}"
    if isinstance(exc, PortUnavailable):
        flag = "--" + exc.option.replace("_", "-")
        return 1, f"{flag} {exc.port}: {exc}; pick another port with {flag}"
    import grpc

    if isinstance(exc, grpc.RpcError):
        return 1, rpc_message(exc, getattr(args, "target", ""))
    if isinstance(exc, OSError) and exc.filename:
        return 1, f"{exc.filename}: {exc.strerror}"
    return 1, f"{type(exc).__name__}: {exc} (--debug shows the traceback)"


def _quiet_stdout() -> None:
    """After the reader of our stdout went away (`| head`): send what is left nowhere, so the interpreter's
    final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format, args.library_log_level)
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if debug:
            raise
        code, message = describe(exc, args)
        print(f"grpcgrade {args.command}: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
