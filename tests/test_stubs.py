"""The committed stubs are what `make proto` makes of proto/ today: grpcio-tools 1.62.3, old enough that the
stubs load under the client's lowest supported grpcio and protobuf (see pyproject.toml)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_stubs_match_the_proto(tmp_path: Path, oldest_python: Path):
    subprocess.run(
        [
            str(oldest_python),
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(ROOT / "proto"),
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            "grpcgrade/v1/grading.proto",
            "grpcgrade/v1/admin.proto",
        ],
        check=True,
    )
    names = [f"{proto}{suffix}" for proto in ("grading", "admin") for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]
    for name in names:
        fresh = (tmp_path / "grpcgrade" / "v1" / name).read_text()
        committed = (ROOT / "grpcgrade" / "v1" / name).read_text()
        assert fresh == committed, f"grpcgrade/v1/{name} is stale: run `make proto`"
