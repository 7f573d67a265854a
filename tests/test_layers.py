"""The layers stay visible: the core (and the built-in graders it loads) never imports grpc or protobuf, so
workers, graders and in-process users do not pay for them, and the service stays the only translator."""

import json
import pkgutil
import subprocess
import sys

import grpcgrade.core


def _loaded_after(code: str) -> set[str]:
    script = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_core_and_the_built_in_graders_load_without_grpc_or_protobuf() -> None:
    core = [m.name for m in pkgutil.iter_modules(grpcgrade.core.__path__, "grpcgrade.core.")]
    assert "grpcgrade.core.engine" in core and "grpcgrade.core.registry" in core
    imports = "\n".join(f"import {name}" for name in core)
    # Building the registry imports every built-in grader family, as a worker process does.
    loaded = _loaded_after(f"{imports}\nfrom grpcgrade.core.registry import get_registry\nget_registry()")
    assert "grpcgrade.graders.text" in loaded and "grpcgrade.graders.kolibrify" in loaded
    assert not {m for m in loaded if m == "grpc" or m.startswith(("grpc.", "google.protobuf"))}


def test_the_service_layer_does_load_grpc() -> None:
    """The check above can fail: the same probe sees grpc where it is imported."""
    assert "grpc" in _loaded_after("import grpcgrade.service.servicer")
