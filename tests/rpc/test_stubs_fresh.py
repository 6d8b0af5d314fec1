"""The committed stubs under services/rpc/ are exactly what scripts/gen_protos.sh generates now."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTOS = sorted((ROOT / "proto").glob("*.proto"))


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rpc")
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run([str(ROOT / "scripts" / "gen_protos.sh"), str(out)], check=True, env=env, capture_output=True)
    return out


def test_there_is_a_proto():
    assert any(p.stem == "kvtier" for p in PROTOS)


@pytest.mark.parametrize("proto", PROTOS, ids=[p.stem for p in PROTOS])
def test_committed_stubs_equal_regenerated(proto: Path, regenerated: Path):
    for suffix in ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"):
        name = proto.stem + suffix
        fresh = regenerated / name
        committed = ROOT / "services" / "rpc" / name
        assert fresh.exists(), f"gen_protos.sh did not produce {name}"
        assert committed.exists(), f"services/rpc/{name} missing: run scripts/gen_protos.sh"
        assert committed.read_bytes() == fresh.read_bytes(), f"services/rpc/{name} is stale: run scripts/gen_protos.sh"


def test_generated_grpc_module_imports_package_relative():
    import importlib

    for proto in PROTOS:
        module = importlib.import_module(f"services.rpc.{proto.stem}_pb2_grpc")
        assert module.__name__.startswith("services.rpc.")
