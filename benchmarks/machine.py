"""What every benchmark result records about where it ran, and where results go."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
from pathlib import Path

import torch


def machine_info() -> dict:
    info = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_kib"] = int(f.readline().split()[1])
        with open("/proc/cpuinfo") as f:
            info["cpu_model"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    return info


def machine_kind() -> str:
    """``cuda`` or ``cpu<cores>``: what result folders are named by."""
    return "cuda" if torch.cuda.is_available() else f"cpu{os.cpu_count()}"


def results_dir(root: str | os.PathLike = "results") -> Path:
    """``results/<date>-<machine kind>/``, created if missing."""
    path = Path(root) / f"{_dt.date.today().isoformat()}-{machine_kind()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, payload: dict) -> Path:
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def measured_read_bandwidth_bytes_per_s(device: str = "cpu", num_bytes: int = 512 * 2**20, repeats: int = 7) -> float:
    """Best-of-N streaming read bandwidth of ``device``'s memory (fp32 sum over a buffer larger
    than caches; on a GPU the sum's scalar is read back, which waits for the device)."""
    import time

    buf = torch.ones(num_bytes // 4, device=device)
    buf.sum().item()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum().item()
        best = min(best, time.perf_counter() - t0)
    return num_bytes / best
