"""CUDA only: decoders' hot pools imported through CUDA IPC, and write-back that kvtier drives
from them into its host pool (which it page-locks with cudaHostRegister once, so ``gather_pages``
writes it zero-copy from the GPU).

A decoder exports one CUDA allocation shaped ``[num_layers, 2 (K, V), num_slots, page_size,
num_kv_heads, head_dim]``; kvtier opens it with the same primitive torch.multiprocessing uses
(``UntypedStorage._new_shared_cuda``) from plain handle fields, never from pickled bytes.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from kernels import gather_pages

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CudaHotPools:
    def __init__(self, host_mapping, layout):
        """``host_mapping``: the host pool's mmap; ``layout``: its HostPoolLayout."""
        self._mapping = host_mapping
        self._layout = layout
        self._pools: dict[str, torch.Tensor] = {}
        self._host: torch.Tensor | None = None  # [pages, layers, 2, page, heads, dim], registered
        self._lock = threading.Lock()

    def _host_pool(self) -> torch.Tensor:
        if self._host is None:
            lay = self._layout
            raw = torch.from_numpy(np.frombuffer(self._mapping, dtype=np.uint8))
            err = int(torch.cuda.cudart().cudaHostRegister(raw.data_ptr(), raw.numel(), 0))
            if err != 0:
                raise RuntimeError(f"cudaHostRegister of the host pool failed with error {err}")
            shape = (lay.num_host_pages, lay.num_layers, 2, lay.page_size, lay.num_kv_heads, lay.head_dim)
            self._host = raw[: lay.num_host_pages * lay.host_page_bytes].view(DTYPES[lay.dtype]).view(shape)
        return self._host

    def import_pool(self, decoder_id: str, ipc, shape: tuple[int, ...]) -> None:
        """Opens the decoder's exported hot pool. Raises ValueError on a shape that does not fit
        the layout (nothing changes)."""
        lay = self._layout
        want = (lay.num_layers, 2, None, lay.page_size, lay.num_kv_heads, lay.head_dim)
        if len(shape) != 6 or any(w is not None and w != s for w, s in zip(want, shape)) or shape[2] <= 0:
            raise ValueError(f"hot pool shape {list(shape)} does not match [num_layers, 2, num_slots, page_size, "
                             f"num_kv_heads, head_dim] = {list(want)}")
        dtype = DTYPES[lay.dtype]
        numel = int(np.prod(shape))
        if numel * torch.empty((), dtype=dtype).element_size() > ipc.storage_size_bytes:
            raise ValueError(f"hot pool shape {list(shape)} is larger than the exported allocation")
        torch.cuda._lazy_init()
        storage = torch.UntypedStorage._new_shared_cuda(
            ipc.device, ipc.handle, ipc.storage_size_bytes, ipc.storage_offset_bytes, ipc.ref_counter_handle,
            ipc.ref_counter_offset, ipc.event_handle, ipc.event_sync_required)
        typed = torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)
        pool = torch._utils._rebuild_tensor(typed, 0, tuple(shape), torch.empty(shape, device="meta").stride())
        with self._lock:
            self._pools[decoder_id] = pool

    def has_pool(self, decoder_id: str) -> bool:
        return decoder_id in self._pools

    def write_back(self, decoder_id: str, slots: list[int], host_page_ids: list[int]) -> None:
        """Copies (every layer, K and V) hot ``slots`` of the decoder's pool into ``host_page_ids``."""
        pool = self._pools[decoder_id]
        num_slots = pool.shape[2]
        if any(not 0 <= s < num_slots for s in slots):
            raise ValueError(f"slots must be in [0, {num_slots})")
        host = self._host_pool()
        dev = pool.device
        src = torch.tensor(slots, dtype=torch.int64, device=dev)
        dst = torch.tensor(host_page_ids, dtype=torch.int64, device=dev)
        with torch.cuda.device(dev):
            for layer in range(pool.shape[0]):
                for kv in (0, 1):
                    gather_pages(pool[layer, kv], host[:, layer, kv], src, dst, check_indices=False)
            torch.cuda.synchronize(dev)

    def drop(self, decoder_id: str) -> None:
        with self._lock:
            self._pools.pop(decoder_id, None)
