"""Package-level contracts: CPU calls never import triton; the GPU check script's dry run."""

import json
import subprocess
import sys

import pytest
import torch

from kernels import gpu_check

CPU_CALLS_WITHOUT_TRITON = """
import sys, torch, kernels
q = torch.randn(2, 4, 16); d = torch.zeros(1, 4, 2, 16)
pos = torch.tensor([20, 40]); req = torch.zeros(2, dtype=torch.int32)
sel, num = kernels.page_select(q, d, d, req, pos, top_k_pages=1, sink_pages=1, recent_pages=1)
pool = torch.randn(4, 16, 2, 16)
kernels.sparse_paged_attention(q, pool, pool, sel, sel, pos, scale=0.25)
kernels.page_digest(pool, torch.tensor([1]))
kernels.gather_pages(pool, pool.clone(), torch.tensor([0]), torch.tensor([1]))
kernels.resolve_residency(sel[:1], torch.full((1, 4), -1), torch.full((1, 4), -1),
                          torch.tensor([[7, 8, 9, -1]]))
assert "triton" not in sys.modules, "a CPU call imported triton"
"""


def test_cpu_calls_never_import_triton():
    subprocess.run([sys.executable, "-c", CPU_CALLS_WITHOUT_TRITON], check=True, timeout=120)


def test_gpu_check_dry_run_writes_report(tmp_path):
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["ok"] and report["dry_run"]
    ops = {r["op"] for r in report["checks"]}
    assert ops == {
        "page_digest", "page_select", "sparse_paged_attention", "resolve_residency", "gather_pages", "api_dispatch"
    }


def test_gpu_check_argument_parsing(tmp_path):
    with pytest.raises(SystemExit):
        gpu_check.main(["--no-such-flag"])
    if not torch.cuda.is_available():
        assert gpu_check.main(["--out", str(tmp_path)]) == 2  # refuses to run without CUDA
