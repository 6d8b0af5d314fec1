"""Distillation data shipped with the repository.

The target's greedy answers cost hours of CPU time and only a few MB of token ids, so each data
round lands as one shard, ``distilled/<target>/<name>.jsonl.xz``: xz-compressed JSONL, one
record per line exactly as in the cache (``distill.Record``). ``train-drafter`` seeds its cache
from the shipped shards before it distils anything, so a fresh machine continues where the last
round stopped instead of generating the same answers again. Features are not shipped (3.4 KB
per token): ``features.extract_features`` recomputes the missing ones with one dense prefill.

``export_shard`` writes the cache's records that no shipped shard holds yet (the new round).
"""

from __future__ import annotations

import json
import lzma
import os
from pathlib import Path

from services.decoder.spec.dflash.drafter import DEFAULT_TARGET
from services.decoder.spec.training.distill import Record, append_new, read_records

SHIPPED_DATA_DIR = Path(__file__).resolve().parent / "distilled" / DEFAULT_TARGET
SHARD_SUFFIX = ".jsonl.xz"
SPLITS = ("train", "heldout")


def shipped_shards(directory: str | Path = SHIPPED_DATA_DIR) -> list[Path]:
    """The shards of ``directory`` in name order (empty when there is none)."""
    directory = Path(directory)
    return sorted(directory.glob("*" + SHARD_SUFFIX)) if directory.is_dir() else []


def _checked(record: Record, vocab_size: int, where: str) -> Record:
    ids_ok = all(isinstance(i, int) and 0 <= i < vocab_size for i in record.prompt_ids + record.answer_ids)
    if not ids_ok:
        raise ValueError(f"{where}: token ids must be integers in [0, {vocab_size}) (another target's data?)")
    if record.split not in SPLITS or not record.answer_ids:
        raise ValueError(f"{where}: split must be one of {SPLITS} and answer_ids non-empty")
    return record


def read_shard(path: str | Path, vocab_size: int) -> list[Record]:
    """Every record of one shard, validated against the target's vocabulary; a malformed line
    raises ``ValueError`` naming the file and line."""
    path = Path(path)
    records = []
    try:
        with lzma.open(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                where = f"{path}:{number}"
                try:
                    record = Record(**json.loads(line))
                except (json.JSONDecodeError, TypeError) as exc:
                    raise ValueError(f"{where}: not a distillation record ({exc})") from None
                records.append(_checked(record, vocab_size, where))
    except (lzma.LZMAError, EOFError) as exc:
        raise ValueError(f"{path}: not an xz-compressed shard ({exc})") from None
    return records


def import_shards(data_dir: str | Path, shards: list[Path], vocab_size: int) -> int:
    """Appends to the cache the shards' records whose keys it lacks; returns how many. Every
    shard is read and checked before the cache is touched, so a bad shard changes nothing."""
    incoming = [record for shard in shards for record in read_shard(shard, vocab_size)]
    return append_new(data_dir, incoming)  # a key two shards share is taken once, from the first


def export_shard(data_dir: str | Path, out: str | Path, shipped: list[Path], vocab_size: int) -> int:
    """Writes the cache's records that none of ``shipped`` holds to the new shard ``out``
    (atomically: a temporary file renamed into place); returns how many. Refuses to overwrite."""
    out = Path(out)
    if not out.name.endswith(SHARD_SUFFIX):
        raise ValueError(f"{out}: a shard's name ends in {SHARD_SUFFIX}")
    if out.exists():
        raise ValueError(f"{out} exists: shards are written once (name the new round)")
    known = {r.key for shard in shipped for r in read_shard(shard, vocab_size)}
    new = [r for r in read_records(data_dir) if r.key not in known]
    if not new:
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with lzma.open(tmp, "wt", encoding="utf-8", preset=9) as f:
        for record in new:
            f.write(_checked(record, vocab_size, str(data_dir)).to_json() + "\n")
    os.replace(tmp, out)
    return len(new)
