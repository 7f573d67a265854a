"""The committed stubs are what grpcio-tools makes of proto/ today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_generated_stubs_match_the_proto(tmp_path: Path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(ROOT / "proto"),
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            "grpcgrade/v1/grading.proto",
        ],
        check=True,
    )
    for name in ("grading_pb2.py", "grading_pb2.pyi", "grading_pb2_grpc.py"):
        fresh = (tmp_path / "grpcgrade" / "v1" / name).read_text()
        committed = (ROOT / "grpcgrade" / "v1" / name).read_text()
        assert fresh == committed, f"grpcgrade/v1/{name} is stale: run `make proto`"
