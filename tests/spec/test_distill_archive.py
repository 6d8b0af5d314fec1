"""Shipped distillation shards (``training/archive.py``): export -> import round trip, what a bad
shard does to the cache (nothing), and the shards this repository ships are sound."""

from __future__ import annotations

import lzma

import pytest

from services.decoder.spec.training.archive import (
    export_shard,
    import_shards,
    read_shard,
    shipped_shards,
)
from services.decoder.spec.training.distill import (
    CACHE_FILE,
    Record,
    RecordWriter,
    read_records,
)
from services.decoder.spec.training.prompts import chat_prompts

VOCAB = 100


def _record(key: str, split: str = "train", answer=(5, 6, 7)) -> Record:
    return Record(key, "chat", split, [1, 2, 3], list(answer), "stop")


def _fill(data_dir, records) -> None:
    writer = RecordWriter(data_dir)
    for record in records:
        writer.write(record)
    writer.close()


def test_export_then_import_round_trips_the_records(tmp_path):
    source, target, shards = tmp_path / "a", tmp_path / "b", tmp_path / "shards"
    records = [_record("k1"), _record("k2", "heldout", (9, 8)), _record("k3")]
    _fill(source, records)
    assert export_shard(source, shards / "r1.jsonl.xz", [], VOCAB) == 3
    assert read_shard(shards / "r1.jsonl.xz", VOCAB) == records
    assert import_shards(target, shipped_shards(shards), VOCAB) == 3
    assert read_records(target) == records
    assert import_shards(target, shipped_shards(shards), VOCAB) == 0  # keys present: nothing appended
    assert read_records(target) == records


def test_export_writes_only_what_no_shipped_shard_holds_and_never_overwrites(tmp_path):
    data, shards = tmp_path / "data", tmp_path / "shards"
    _fill(data, [_record("k1"), _record("k2")])
    export_shard(data, shards / "r1.jsonl.xz", [], VOCAB)
    _fill(data, [_record("k3")])
    assert export_shard(data, shards / "r2.jsonl.xz", shipped_shards(shards), VOCAB) == 1
    assert [r.key for r in read_shard(shards / "r2.jsonl.xz", VOCAB)] == ["k3"]
    assert export_shard(data, shards / "r3.jsonl.xz", shipped_shards(shards), VOCAB) == 0
    assert not (shards / "r3.jsonl.xz").exists()
    with pytest.raises(ValueError, match="exists"):
        export_shard(data, shards / "r1.jsonl.xz", [], VOCAB)
    with pytest.raises(ValueError, match="jsonl.xz"):
        export_shard(data, shards / "r4.json", [], VOCAB)


def test_a_key_two_shards_share_is_imported_once_from_the_first(tmp_path):
    shards = tmp_path / "shards"
    for name, answer in (("a", (5,)), ("b", (6,))):
        data = tmp_path / name
        _fill(data, [_record("same", answer=answer)])
        export_shard(data, shards / f"{name}.jsonl.xz", [], VOCAB)
    assert import_shards(tmp_path / "cache", shipped_shards(shards), VOCAB) == 1
    assert read_records(tmp_path / "cache")[0].answer_ids == [5]


@pytest.mark.parametrize("content, message", [
    (b'{"key": "k"}\n', "not a distillation record"),
    (b'{"key":"k","kind":"chat","split":"train","prompt_ids":[1],"answer_ids":[100],"finish_reason":"stop"}\n',
     r"token ids must be integers in \[0, 100\)"),
    (b'{"key":"k","kind":"chat","split":"test","prompt_ids":[1],"answer_ids":[3],"finish_reason":"stop"}\n',
     "split must be one of"),
    (None, "not an xz-compressed shard"),
])
def test_a_bad_shard_is_refused_and_leaves_the_cache_unchanged(tmp_path, content, message):
    cache = tmp_path / "cache"
    _fill(cache, [_record("k0")])
    before = (cache / CACHE_FILE).read_bytes()
    good, bad = tmp_path / "good.jsonl.xz", tmp_path / "bad.jsonl.xz"
    good.write_bytes(lzma.compress(_record("k1").to_json().encode() + b"\n"))
    bad.write_bytes(b"plain text, not xz" if content is None else lzma.compress(content))
    with pytest.raises(ValueError, match=message):
        import_shards(cache, [good, bad], VOCAB)
    assert (cache / CACHE_FILE).read_bytes() == before


def test_the_shipped_shards_are_the_default_target_and_keep_the_held_out_split():
    """Every shipped record's ids fit SmolLM2's vocabulary; a chat record is one of the built-in
    chat prompts, in that prompt's split (held-out answers never become training data)."""
    shards = shipped_shards()
    assert shards, "the repository ships its distillation data (services/decoder/spec/training/distilled/)"
    chat = {p.key: p.split for p in chat_prompts()}
    seen = set()
    for shard in shards:
        for record in read_shard(shard, 49152):
            assert record.key not in seen, f"{shard.name}: {record.key} shipped twice"
            seen.add(record.key)
            if record.kind == "chat":
                assert chat.get(record.key) == record.split, record.key
    assert any(split == "heldout" for split in chat.values())
