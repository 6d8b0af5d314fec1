"""Public entry points of the page digest op.

Two forms, one contract:

* ``page_digest(k_pool, slot_ids) -> (k_min, k_max)`` allocates ``[num_pages, num_kv_heads,
  head_dim]`` outputs.
* ``page_digest_into(k_pool, slot_ids, digest_min, digest_max, dst_rows)`` writes page ``i``'s
  digest into row ``dst_rows[i]`` of an existing table ``[num_rows, num_kv_heads, head_dim]``.
  A per-request table ``[batch, max_pages, num_kv_heads, head_dim]`` is passed as
  ``table.view(-1, num_kv_heads, head_dim)`` with ``dst_rows = req_row * max_pages + page``.

The digest of a page is the elementwise min and max of its keys over its ``page_size`` tokens,
in ``k_pool``'s dtype (exact: min/max never round). Only sealed (full) pages may be digested.
Index tensors are int32 or int64. A ``slot_ids`` entry of -1 is a padding lane: it is skipped
(``page_digest`` fills that output row with zeros; ``page_digest_into`` leaves the table row
untouched and ignores ``dst_rows`` there).

Dispatch: CUDA tensors run the Triton kernel, CPU tensors the torch reference. Nothing falls back.
"""

from __future__ import annotations

import torch

from kernels.page_digest import reference
from kernels.validation import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_index_range,
    check_no_duplicates,
    check_same_device,
    check_tensor,
)

_POOL_DOC = "[num_slots, page_size, num_kv_heads, head_dim]"


def _check_pool_and_slots(k_pool: torch.Tensor, slot_ids: torch.Tensor) -> None:
    check_tensor("k_pool", k_pool, shape=(None, None, None, None), shape_doc=_POOL_DOC, dtypes=FLOAT_DTYPES)
    check_tensor("slot_ids", slot_ids, shape=(None,), shape_doc="[num_pages]", dtypes=INDEX_DTYPES)


def _dispatch(k_pool, slot_ids, digest_min, digest_max, dst_rows) -> None:
    if k_pool.is_cuda:
        from kernels.page_digest import triton as triton_impl

        triton_impl.page_digest_into(k_pool, slot_ids, digest_min, digest_max, dst_rows)
    else:
        reference.page_digest_into(k_pool, slot_ids, digest_min, digest_max, dst_rows)


def page_digest(
    k_pool: torch.Tensor, slot_ids: torch.Tensor, *, check_indices: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Digest the sealed pages held in ``slot_ids``.

    Args:
        k_pool: [num_slots, page_size, num_kv_heads, head_dim] fp32/fp16/bf16 key pool of a layer.
        slot_ids: [num_pages] int32/int64 slots of sealed pages; -1 marks a padding lane.
        check_indices: check slot range (reads the tensor; syncs on CUDA).

    Returns:
        (k_min, k_max): [num_pages, num_kv_heads, head_dim] each, in k_pool's dtype; zeros on
        padding lanes.
    """
    _check_pool_and_slots(k_pool, slot_ids)
    check_same_device(k_pool=k_pool, slot_ids=slot_ids)
    if check_indices:
        check_index_range("slot_ids", slot_ids, high=k_pool.shape[0], allow_padding=True, what="slots of k_pool")
    num_pages = slot_ids.shape[0]
    shape = (num_pages, k_pool.shape[2], k_pool.shape[3])
    k_min = torch.zeros(shape, dtype=k_pool.dtype, device=k_pool.device)
    k_max = torch.zeros(shape, dtype=k_pool.dtype, device=k_pool.device)
    dst_rows = torch.arange(num_pages, dtype=slot_ids.dtype, device=slot_ids.device)
    _dispatch(k_pool, slot_ids, k_min, k_max, dst_rows)
    return k_min, k_max


def page_digest_into(
    k_pool: torch.Tensor,
    slot_ids: torch.Tensor,
    digest_min: torch.Tensor,
    digest_max: torch.Tensor,
    dst_rows: torch.Tensor,
    *,
    check_indices: bool = True,
) -> None:
    """Write the digest of page ``slot_ids[i]`` into row ``dst_rows[i]`` of digest_min/max.

    Args:
        k_pool: [num_slots, page_size, num_kv_heads, head_dim] fp32/fp16/bf16.
        slot_ids: [num_pages] int32/int64; -1 = padding lane (skipped, its dst_rows entry ignored).
        digest_min, digest_max: [num_rows, num_kv_heads, head_dim], k_pool's dtype, same strides;
            mutated in place on the rows named by valid lanes.
        dst_rows: [num_pages] int32/int64 rows in [0, num_rows), distinct over valid lanes.
        check_indices: check ranges and distinctness (reads the tensors; syncs on CUDA).
    """
    _check_pool_and_slots(k_pool, slot_ids)
    num_pages = slot_ids.shape[0]
    _, _, num_kv_heads, head_dim = k_pool.shape
    table_doc = f"[num_rows, num_kv_heads={num_kv_heads}, head_dim={head_dim}]"
    for name, table in (("digest_min", digest_min), ("digest_max", digest_max)):
        check_tensor(name, table, shape=(None, num_kv_heads, head_dim), shape_doc=table_doc)
        if table.dtype != k_pool.dtype:
            raise TypeError(f"{name} must have k_pool's dtype {k_pool.dtype}, got {table.dtype}")
    if digest_min.shape != digest_max.shape or digest_min.stride() != digest_max.stride():
        raise ValueError(
            f"digest_min and digest_max must have equal shapes and strides, got "
            f"{tuple(digest_min.shape)}/{digest_min.stride()} and {tuple(digest_max.shape)}/{digest_max.stride()}"
        )
    check_tensor("dst_rows", dst_rows, shape=(num_pages,), shape_doc=f"[num_pages={num_pages}]", dtypes=INDEX_DTYPES)
    check_same_device(k_pool=k_pool, slot_ids=slot_ids, digest_min=digest_min, digest_max=digest_max, dst_rows=dst_rows)
    if check_indices:
        check_index_range("slot_ids", slot_ids, high=k_pool.shape[0], allow_padding=True, what="slots of k_pool")
        valid_rows = dst_rows[slot_ids >= 0]
        check_index_range(
            "dst_rows", valid_rows, high=digest_min.shape[0], allow_padding=False, what="rows of digest_min"
        )
        check_no_duplicates("dst_rows", valid_rows)
    _dispatch(k_pool, slot_ids, digest_min, digest_max, dst_rows)
