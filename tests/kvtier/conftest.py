"""Fixtures: a real embedded Redis, kvtier services in-process, and kvtier as a real subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from services.kvtier.config import KvtierConfig
from services.kvtier.service import KvtierService
from services.metadata.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
# A tiny page: 2 layers x (K,V) x 4 tokens x 2 heads x 4 dims x fp32 = 512 bytes.
TINY = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 4, "page_size": 4, "dtype": "float32"}


@pytest.fixture(scope="session")
def redis_server():
    with tempfile.TemporaryDirectory(prefix="dhs-redis-", dir="/tmp") as directory:
        server = RedisServer(directory=directory).start()
        yield server
        server.stop()


@pytest.fixture
def namespace(redis_server):
    """A fresh Redis namespace per test; asserts at teardown that nothing of it is left in shm."""
    ns = "t" + uuid.uuid4().hex[:10]
    yield ns
    leftovers = [p for p in os.listdir("/dev/shm") if p.startswith(ns)]
    for p in leftovers:
        os.unlink(f"/dev/shm/{p}")


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_service(redis_server, namespace):
    """Builds in-process KvtierService objects over the real Redis; shuts them all down after."""
    made: list[KvtierService] = []

    def make(clock=None, **overrides) -> KvtierService:
        fields = dict(TINY, instance="svc", namespace=namespace, host_pool_pages=8, lease_ttl_s=5.0)
        fields.update(overrides)
        service = KvtierService(KvtierConfig(**fields), redis_server.client(), clock=clock or Clock())
        made.append(service)
        return service

    yield make
    for service in made:
        service.shutdown(remove=True)


class KvtierProcess:
    """``python -m services.kvtier`` on a free port, over the test Redis."""

    def __init__(self, redis_url: str, namespace: str, instance: str = "proc", **flags):
        self.args = [sys.executable, "-m", "services.kvtier", "--instance", instance, "--namespace", namespace,
                     "--port", "0", "--redis-url", redis_url]
        for name, value in {**TINY, "host_pool_pages": 16, **flags}.items():
            self.args += ["--" + name.replace("_", "-"), str(value)]
        self.segment_name = f"{namespace}-kvtier-{instance}"
        self.proc: subprocess.Popen | None = None
        self.address = ""
        self.state = ""

    def start(self) -> KvtierProcess:
        # a file, not a pipe: logs can never block kvtier; closed in cleanup()
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline().split()
        if not line or line[:2] != ["kvtier", "ready"]:
            self.proc.kill()
            self.proc.wait()
            self.log.seek(0)
            raise RuntimeError(f"kvtier did not start: {line} {self.log.read()}")
        self.address, self.state = line[3], line[5]
        return self

    def read_log(self) -> str:
        """What kvtier wrote to stderr so far (for a failure message)."""
        self.log.seek(0)
        return self.log.read()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self, sig=signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=20)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.terminate()
        if self.proc is not None:
            self.proc.stdout.close()
            self.log.close()


@pytest.fixture
def kvtier_process(redis_server, namespace):
    started: list[KvtierProcess] = []

    def start(**flags) -> KvtierProcess:
        proc = KvtierProcess(redis_server.url, namespace, **flags).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()
