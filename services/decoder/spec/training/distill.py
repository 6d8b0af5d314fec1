"""Self-distillation data: the target's own greedy answers to the built-in prompts, plus user
text chunks, appended to a JSONL cache of token ids.

One record per line: ``{"key", "kind", "split", "prompt_ids", "answer_ids", "finish_reason"}``.
``answer_ids`` is the region drafting is trained and evaluated on (the greedy answer, EOS
included; for a text chunk the whole chunk, with empty ``prompt_ids``). The cache is resumable:
keys already present are skipped, and a torn last line (a killed run) is ignored and rewritten.
Generation runs our own engine with continuous batching (``concurrency`` requests in flight,
a finished one replaced at once) so the CPU stays busy. With a ``FeatureStore`` it also keeps the
target features of every sequence as the engine computes them (a ``FeatureRecorder`` attached
as the engine's drafter: it proposes nothing and observes the committed positions' hidden
states), so they need no second prefill.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from services.decoder.spec.drafter import Draft, Drafter, DraftRequest
from services.decoder.spec.training.features import FeatureStore
from services.decoder.spec.training.prompts import Prompt, text_file_chunks

CACHE_FILE = "distill.jsonl"
DEFAULT_MAX_NEW_TOKENS = 256


@dataclass
class Record:
    key: str
    kind: str
    split: str
    prompt_ids: list[int]
    answer_ids: list[int]
    finish_reason: str

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.answer_ids

    @property
    def answer_start(self) -> int:
        return len(self.prompt_ids)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))


def read_records(data_dir: str | Path) -> list[Record]:
    """Every complete record of the cache in file order, one per key (the last written wins: two
    writers that raced on one cache), a torn last line skipped."""
    path = Path(data_dir) / CACHE_FILE
    if not path.is_file():
        return []
    records = []
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if not line.endswith("\n"):
                break  # torn write of a killed run
            try:
                records.append(Record(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a distillation record ({exc})") from None
    last = {r.key: i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r.key] == i]


class RecordWriter:
    """Appends records, one flushed line each; truncates a torn last line first."""

    def __init__(self, data_dir: str | Path):
        path = Path(data_dir) / CACHE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                path.write_bytes(data[: data.rfind(b"\n") + 1])
        self.file = path.open("a")

    def write(self, record: Record) -> None:
        self.file.write(record.to_json() + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class FeatureRecorder(Drafter):
    """Collects the target features the engine hands a drafter, per request; drafts nothing.
    The engine never computes the last committed token's hidden states (nor, when the request
    finishes, those of the step that finished it), so ``take`` pads the missing tail with zeros:
    training and evaluation only show a block the positions before its anchor, and anchors stop
    ``block_size - 1`` tokens before the end."""

    name = "feature-recorder"

    def __init__(self, layers: tuple[int, ...]):
        self.feature_layers = tuple(layers)
        self.rows: dict[str, list[torch.Tensor]] = {}
        self.next_pos: dict[str, int] = {}
        self.broken: set[str] = set()

    def propose_batch(self, requests: list[DraftRequest]) -> list[Draft]:
        return [Draft([]) for _ in requests]

    def observe(self, request_id: str, start: int, features: torch.Tensor) -> None:
        if start != self.next_pos.get(request_id, 0):
            self.broken.add(request_id)  # recomputed positions: fall back to a dense prefill
        self.rows.setdefault(request_id, []).append(features.detach().to(torch.float16).clone())
        self.next_pos[request_id] = start + features.shape[0]

    def take(self, request_id: str, length: int) -> torch.Tensor | None:
        rows = self.rows.pop(request_id, [])
        self.next_pos.pop(request_id, None)
        if request_id in self.broken or not rows:
            self.broken.discard(request_id)
            return None
        features = torch.cat(rows)[:length]
        if features.shape[0] < length:
            pad = features.new_zeros(length - features.shape[0], features.shape[1])
            features = torch.cat([features, pad])
        return features

    def release(self, request_id: str) -> None:
        """Keeps the rows: ``take`` collects them after the engine releases the request."""


def append_new(data_dir: str | Path, records: Iterable[Record]) -> int:
    """Appends the records whose keys the cache lacks (of two with one key, the first); returns
    how many. The cache is not opened for writing when none is new."""
    done = {r.key for r in read_records(data_dir)}
    new = []
    for record in records:
        if record.key not in done:
            done.add(record.key)
            new.append(record)
    if new:
        writer = RecordWriter(data_dir)
        try:
            for record in new:
                writer.write(record)
        finally:
            writer.close()
    return len(new)


def add_text_files(data_dir: str | Path, paths: Iterable[str | Path], encode, chunk_tokens: int = 512) -> int:
    """Appends the chunks of user text files not yet cached; returns how many were added."""
    chunks = text_file_chunks(list(paths), encode, chunk_tokens)
    return append_new(data_dir, (Record(key, "text", "train", [], ids, "text") for key, ids in chunks))


def _attach_recorder(engine, recorder: FeatureRecorder) -> None:
    """Installs the recorder as the engine's drafter (speculation with empty drafts is plain
    decoding) and makes the runner capture its layers."""
    if engine.speculator is not None:
        raise ValueError("distillation with feature capture needs an engine without speculation (spec='none')")
    engine.attach_drafter(recorder, spec_tokens=1)


def distill(llm, prompts: list[Prompt], data_dir: str | Path, *, concurrency: int = 16,
            max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, minutes: float | None = None,
            progress: bool = True, features: FeatureStore | None = None) -> dict:
    """Generates greedy answers for the prompts not yet in the cache. ``llm``: an ``LLM`` without
    a drafter (its engine should allow ``concurrency`` running requests). Stops queueing new
    prompts after ``minutes`` (in-flight ones finish). With ``features``, stores each sequence's
    target features as captured during generation. Returns counts of this call."""
    from services.decoder.engine.sampling_params import SamplingParams

    done = {r.key for r in read_records(data_dir)}
    todo = [p for p in prompts if p.key not in done]
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
    engine = llm.engine
    recorder = None
    if features is not None:
        recorder = FeatureRecorder(tuple(features.index["layers"]))
        _attach_recorder(engine, recorder)
    writer = RecordWriter(data_dir)
    deadline = None if minutes is None else time.monotonic() + minutes * 60
    in_flight: dict[str, tuple[Prompt, list[int]]] = {}
    stats = {"prompts": 0, "answer_tokens": 0, "skipped": len(prompts) - len(todo)}
    bar = tqdm(total=len(todo), desc="distill", unit="prompt", disable=not progress, dynamic_ncols=True)
    queue = iter(todo)
    exhausted = False
    try:
        while True:
            while not exhausted and len(in_flight) < concurrency and (deadline is None or time.monotonic() < deadline):
                prompt = next(queue, None)
                if prompt is None:
                    exhausted = True
                    break
                ids = llm.encode_prompt(prompt.text, chat=True)
                in_flight[engine.add_request(ids, params)] = (prompt, ids)
            if not in_flight:
                break
            for event in engine.step():
                if not event.finished:
                    continue
                prompt, ids = in_flight.pop(event.request_id)
                request = engine.pop_finished(event.request_id)
                record = Record(prompt.key, prompt.kind, prompt.split, ids, list(request.output_ids),
                                request.finish_reason)
                if recorder is not None:
                    captured = recorder.take(event.request_id, len(record.token_ids))
                    if captured is not None:
                        features.add(record.key, captured)
                writer.write(record)
                stats["prompts"] += 1
                stats["answer_tokens"] += len(request.output_ids)
                bar.update(1)
                bar.set_postfix(answer_tokens=stats["answer_tokens"])
    finally:
        for request_id in in_flight:
            engine.abort(request_id)
        if recorder is not None:
            engine.attach_drafter(None, spec_tokens=1)
            features.flush()
        bar.close()
        writer.close()
    return stats


def summary(records: list[Record]) -> dict:
    out = {"sequences": len(records), "tokens": 0, "answer_tokens": 0, "heldout_sequences": 0, "heldout_answer_tokens": 0}
    for r in records:
        out["tokens"] += len(r.prompt_ids) + len(r.answer_ids)
        out["answer_tokens"] += len(r.answer_ids)
        if r.split == "heldout":
            out["heldout_sequences"] += 1
            out["heldout_answer_tokens"] += len(r.answer_ids)
    return out
