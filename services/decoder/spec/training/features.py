"""Target features for drafter training, extracted once per sequence and kept on disk.

Layout under ``<data_dir>/features-<layers>/`` (one folder per choice of target layers):
``shard-NNNNN.safetensors`` files, each holding several sequences as ``<key>.features``
(``[T, len(layers) * hidden]`` fp16), and ``index.json`` naming the layers and, per sequence
key, its shard and length. A shard is written whole and only then entered in the index
(written atomically), so a killed run loses at most the shard it was filling and a rerun
continues after the last indexed one.

Two writers fill the store: ``distill.py`` captures the features while it generates (the
engine's ``capture_layers``, as a drafter receives them), and ``extract_features`` runs dense
prefills (``target_features``, several sequences to a forward) for every sequence still missing
(text files, older caches).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from services.decoder.spec.training.target_features import (
    CHUNK_TOKENS,
    batch_target_features,
    target_features,
)

if TYPE_CHECKING:
    from services.decoder.spec.training.distill import Record

INDEX_FILE = "index.json"
DEFAULT_SHARD_BYTES = 128 << 20
DEFAULT_BATCH_TOKENS = 4096  # padded tokens per batched prefill: a few MB of activations per layer


def features_dir(data_dir: str | Path, layers: tuple[int, ...]) -> Path:
    return Path(data_dir) / ("features-" + "-".join(str(i) for i in layers))


def read_index(directory: str | Path, layers: tuple[int, ...] | None = None) -> dict:
    path = Path(directory) / INDEX_FILE
    if not path.is_file():
        return {"layers": list(layers or ()), "sequences": {}, "shards": []}
    index = json.loads(path.read_text())
    if layers is not None and tuple(index["layers"]) != tuple(layers):
        raise ValueError(f"{path}: features of layers {index['layers']}, not {list(layers)}")
    return index


def _write_index(directory: Path, index: dict) -> None:
    tmp = directory / (INDEX_FILE + ".tmp")
    tmp.write_text(json.dumps(index))
    os.replace(tmp, directory / INDEX_FILE)


class FeatureStore:
    """Appends sequences' features to shards of about ``shard_bytes``; a shard enters the index
    (rewritten atomically) only once written whole. Shard files the index does not list are
    leftovers of a killed run and get overwritten."""

    def __init__(self, data_dir: str | Path, layers: tuple[int, ...], shard_bytes: int = DEFAULT_SHARD_BYTES):
        self.directory = features_dir(data_dir, layers)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.index = read_index(self.directory, layers)
        self.index["layers"] = list(layers)
        self.shard_bytes = shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0

    def __contains__(self, key: str) -> bool:
        return key in self.index["sequences"] or f"{key}.features" in self.pending

    def add(self, key: str, features: torch.Tensor) -> None:
        """``features: [T, len(layers) * hidden]`` of one sequence (stored fp16)."""
        stored = features.to("cpu", torch.float16).contiguous()  # captured on a GPU: kept in host memory
        if not torch.isfinite(stored).all():
            raise ValueError(f"features of {key} overflow fp16 (max |x| = {float(features.abs().max()):.0f})")
        self.pending[f"{key}.features"] = stored
        self.pending_bytes += features.numel() * 2
        if self.pending_bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        name = f"shard-{len(self.index['shards']):05d}.safetensors"
        save_file(self.pending, str(self.directory / name))
        self.index["shards"].append(name)
        for tensor_name, tensor in self.pending.items():
            self.index["sequences"][tensor_name.rpartition(".")[0]] = {"shard": name, "length": tensor.shape[0]}
        _write_index(self.directory, self.index)
        self.pending, self.pending_bytes = {}, 0


def extract_features(model, records: list[Record], data_dir: str | Path, layers: tuple[int, ...], *,
                     shard_bytes: int = DEFAULT_SHARD_BYTES, batch_tokens: int = DEFAULT_BATCH_TOKENS,
                     progress: bool = True) -> dict:
    """Extracts the features of every record not yet stored. ``model``: the target
    ``LlamaModel``. Sequences of at most ``CHUNK_TOKENS`` run several to a forward, by length,
    at most ``batch_tokens`` padded tokens (count x longest) each; longer ones alone, chunked.
    Returns ``{"sequences": extracted now, "tokens": ..., "total_sequences": ...}``."""
    store = FeatureStore(data_dir, layers, shard_bytes)
    todo = sorted((r for r in records if r.key not in store), key=lambda r: len(r.token_ids))
    stats = {"sequences": 0, "tokens": 0}
    bar = tqdm(total=sum(len(r.token_ids) for r in todo), desc="features", unit="tok",
               disable=not progress, dynamic_ncols=True)

    def stored(batch: list[Record], features: list[torch.Tensor]) -> None:
        for record, feats in zip(batch, features):
            store.add(record.key, feats)
            stats["sequences"] += 1
            stats["tokens"] += len(record.token_ids)
            bar.update(len(record.token_ids))

    try:
        batch: list[Record] = []
        for record in todo:  # ascending length: the newest is the longest of its batch
            length = len(record.token_ids)
            if batch and (length > CHUNK_TOKENS or (len(batch) + 1) * length > batch_tokens):
                stored(batch, batch_target_features(model, [r.token_ids for r in batch], layers))
                batch = []
            if length > CHUNK_TOKENS:
                stored([record], [target_features(model, record.token_ids, layers)])
            else:
                batch.append(record)
        if batch:
            stored(batch, batch_target_features(model, [r.token_ids for r in batch], layers))
    finally:
        store.flush()
        bar.close()
    stats["total_sequences"] = len(store.index["sequences"])
    return stats


def load_features(data_dir: str | Path, layers: tuple[int, ...], keys: set[str] | None = None) -> dict[str, torch.Tensor]:
    """``key -> features [T, F]`` (fp16) for the indexed sequences (those in ``keys`` when
    given), read shard by shard."""
    directory = features_dir(data_dir, layers)
    index = read_index(directory, layers)
    wanted_shards = sorted({m["shard"] for k, m in index["sequences"].items() if keys is None or k in keys})
    out = {}
    for name in wanted_shards:
        tensors = load_file(str(directory / name))
        for tensor_name, tensor in tensors.items():
            key, _, part = tensor_name.rpartition(".")
            if part != "features" or (keys is not None and key not in keys) or key not in index["sequences"]:
                continue
            out[key] = tensor
    return out
