"""Argument checks shared by every op's ``api.py``.

Each check raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape, device, or
index value) with a message that names the argument and what was expected. Index-value checks
read the tensor (``min``/``max``/sort), which on a CUDA tensor synchronises the stream; the ops
expose ``check_indices=False`` to skip them on a hot path whose caller guarantees the ranges.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return "/".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    name: str,
    t: object,
    *,
    shape: Sequence[int | None],
    shape_doc: str,
    dtypes: Sequence[torch.dtype] | None = None,
) -> torch.Tensor:
    """Check that ``t`` is a tensor of ``len(shape)`` dims matching ``shape`` (None = any size).

    ``shape_doc`` is the symbolic shape shown in the message, e.g. ``"[num_tokens, num_heads,
    head_dim]"``. Returns ``t`` for chaining.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {shape_doc}, got {type(t).__name__}")
    if t.dim() != len(shape) or any(
        want is not None and got != want for got, want in zip(t.shape, shape)
    ):
        raise ValueError(f"{name} must have shape {shape_doc}, got {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {_dtype_names(dtypes)}, got {t.dtype}")
    return t


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device; returns it."""
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listing = ", ".join(f"{n}={d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")
    return first


def check_positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_index_range(
    name: str, idx: torch.Tensor, *, high: int, allow_padding: bool, what: str
) -> None:
    """Every entry in ``[0, high)``, or ``-1`` where ``allow_padding``; ``what`` names the range."""
    if idx.numel() == 0:
        return
    low = -1 if allow_padding else 0
    bad = (idx < low) | (idx >= high)
    if allow_padding:
        bad &= idx != -1
    if bool(bad.any()):
        first = int(idx[bad].flatten()[0])
        pad = " or -1 (padding)" if allow_padding else ""
        raise ValueError(f"{name} entries must be in [0, {high}) ({what}){pad}; found {first}")


def check_no_duplicates(name: str, idx: torch.Tensor) -> None:
    """No repeated non-negative entry in the flat tensor ``idx`` (``-1`` padding ignored)."""
    flat = idx.flatten()
    flat = flat[flat >= 0]
    if flat.numel() < 2:
        return
    ordered = torch.sort(flat).values
    dup = ordered[1:] == ordered[:-1]
    if bool(dup.any()):
        raise ValueError(f"{name} must not repeat an index; {int(ordered[1:][dup][0])} appears twice")


def check_rows_packed(name: str, idx: torch.Tensor, *, ascending: bool) -> None:
    """Each row of 2-D ``idx``: valid entries (``>= 0``) first, ``-1`` padding after.

    With ``ascending`` the valid entries must also be strictly increasing (hence distinct).
    """
    if idx.shape[-1] < 2:
        return
    valid = idx >= 0
    if bool((~valid[:, :-1] & valid[:, 1:]).any()):
        raise ValueError(f"{name}: each row must hold its valid entries first and -1 padding after")
    if ascending and bool((valid[:, 1:] & (idx[:, 1:] <= idx[:, :-1])).any()):
        raise ValueError(f"{name}: valid entries of each row must be strictly ascending")


def check_rows_distinct(name: str, idx: torch.Tensor) -> None:
    """No row of 2-D ``idx`` repeats a non-negative entry."""
    if idx.shape[-1] < 2:
        return
    ordered = torch.sort(idx, dim=-1).values
    dup = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    if bool(dup.any()):
        row = int(dup.any(dim=-1).nonzero()[0, 0])
        raise ValueError(f"{name}: row {row} repeats an entry; entries of a row must be distinct")
