"""On CUDA: the decoder registers the mapped host pool with the driver, and gather_pages moves
pages between it and a device hot pool zero-copy. Skipped without a GPU."""

import pytest
import torch

from kernels.gather_pages.api import gather_pages
from services.decoder.kv.kvtier_client import KvtierClient
from tests.kvtier.test_process import LAYOUT


@pytest.mark.gpu
def test_registered_host_pool_round_trips_through_a_cuda_hot_pool(kvtier_process):
    kv = kvtier_process()
    with KvtierClient(kv.address, "d0", "m", LAYOUT) as client:
        client.attach()
        client.host_pool.register_with_cuda()
        pages = client.allocate({"r1": 3})["r1"]
        host_k, _ = client.host_pages(1)
        assert host_k.is_pinned()
        shape = (4, LAYOUT.page_size, LAYOUT.num_kv_heads, LAYOUT.head_dim)
        hot = torch.randn(shape, device="cuda")
        slots = torch.tensor([2, 0, 3], device="cuda")
        gather_pages(hot, host_k, slots, torch.tensor(pages, device="cuda"))  # write-back
        torch.cuda.synchronize()
        assert torch.equal(host_k[pages], hot[slots].cpu())
        back = torch.zeros_like(hot)
        gather_pages(host_k, back, torch.tensor(pages, device="cuda"), slots)  # fetch
        torch.cuda.synchronize()
        assert torch.equal(back[slots], hot[slots])
