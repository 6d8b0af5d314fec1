"""benchmarks/linear_rows.py: every candidate kernel computes the same product as ``F.linear``,
and each runs only where it can (MKL packs at 4-64 rows)."""

import torch
import torch.nn.functional as F

from benchmarks.linear_rows import CANDIDATES, _kernel, time_candidates
from services.decoder.model.linear import Linear


def test_every_candidate_is_the_same_product_and_each_row_count_is_timed():
    gen = torch.Generator().manual_seed(0)
    layers = [Linear(torch.randn(64, 48, generator=gen)), Linear(torch.randn(32, 48, generator=gen),
                                                                 bias=torch.randn(32, generator=gen))]
    x = torch.randn(5, 48, generator=gen)
    for name in CANDIDATES:
        kernel = _kernel(name)
        for layer in layers:
            y = layer(x) if kernel is None else layer.run(x, kernel)
            torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias), msg=name)
    rows = time_candidates(layers, [1, 5], repeats=2)
    assert [r["rows"] for r in rows] == [1, 5]
    assert "mkl_pack_ms" not in rows[0] and rows[1]["mkl_pack_ms"] > 0  # no pack serves one row
    for r in rows:
        for name in (c for c in CANDIDATES if f"{c}_ms" in r):
            assert r[f"{name}_ms"] > 0 and r[f"{name}_max_abs_diff"] < 1e-4
