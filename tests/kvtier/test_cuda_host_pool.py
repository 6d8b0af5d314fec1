"""On CUDA: the decoder registers the mapped host pool with the driver, and gather_pages moves
pages between it and a device hot pool zero-copy; kvtier drives write-back from an exported hot
pool. The CUDA cases are skipped without a GPU."""

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


@pytest.mark.gpu
def test_kvtier_drives_write_back_from_an_exported_cuda_hot_pool(kvtier_process):
    """The decoder exports its CUDA hot pool through CUDA IPC; kvtier (another process) copies the
    sealed pages into the host pool itself; foreign requests and unallocated pages are refused."""
    from services.decoder.kv.host_tier import HostTier
    from services.decoder.kv.hot_pool import HotPool
    from services.decoder.kv.kvtier_client import KvtierClientError

    kv = kvtier_process()
    pool = HotPool(LAYOUT.num_layers, 6, LAYOUT.page_size, LAYOUT.num_kv_heads, LAYOUT.head_dim, device="cuda")
    pool.storage.normal_()
    client = KvtierClient(kv.address, "d0", "m", LAYOUT)
    tier = HostTier(client, pool)  # attaches, registers the host pool, exports the hot pool
    assert tier.kvtier_driven
    tier.sync({"r1": 3})
    tier.write_back([("r1", 0, 4), ("r1", 2, 1)])  # kvtier copies slots 4 and 1
    host = client.host_pool.pool  # [pages, layers, 2, page, heads, dim]
    ids = tier.host_pages["r1"]
    for page, slot in ((0, 4), (2, 1)):
        for layer in range(LAYOUT.num_layers):
            assert torch.equal(host[ids[page], layer, 0], pool.k[layer][slot].cpu())
            assert torch.equal(host[ids[page], layer, 1], pool.v[layer][slot].cpu())
    before = host.clone()
    with pytest.raises(KvtierClientError, match="no page 7"):
        client.write_back([("r1", 7, 0)])
    with pytest.raises(KvtierClientError, match="has no host pages"):
        client.write_back([("someone-else", 0, 0)])
    assert torch.equal(host, before)  # refused calls changed nothing
    tier.release("r1")
    tier.flush()
    client.detach()  # kvtier drops the imported pool before the exporting process ends
    client.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_whole_page_copies_round_trip_byte_exact(kvtier_process, device):
    """``kv/page_copy``: hot pool -> host pages -> other hot slots, every layer, K and V (CPU:
    per-page strided copies; CUDA: gather_pages from/to the registered host pool)."""
    from services.decoder.kv import page_copy
    from services.decoder.kv.hot_pool import HotPool

    kv = kvtier_process()
    with KvtierClient(kv.address, "d0", "m", LAYOUT) as client:
        client.attach()
        if device == "cuda":
            client.host_pool.register_with_cuda()
        ids = client.allocate({"r1": 3})["r1"]
        hot = HotPool(LAYOUT.num_layers, 6, LAYOUT.page_size, LAYOUT.num_kv_heads, LAYOUT.head_dim, device=device)
        hot.storage.normal_()
        page_copy.to_host(hot.storage, client.host_pool.pool, [5, 0, 3], ids)
        page_copy.from_host(client.host_pool.pool, hot.storage, ids, [1, 2, 4])
        if device == "cuda":
            torch.cuda.synchronize()
        for src, dst, host_id in zip([5, 0, 3], [1, 2, 4], ids):
            assert torch.equal(hot.storage[:, :, dst], hot.storage[:, :, src])
            assert torch.equal(client.host_pool.pool[host_id], hot.storage[:, :, src].cpu())
