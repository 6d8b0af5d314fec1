"""The draft vocabulary written next to a trained checkpoint (``draft_vocab.json``): the tokens
drafts are drawn from, so the drafter's head multiplies ``size`` rows of the target's LM head
instead of all of them (16,384 of 49,152 for SmolLM2: a third of the bytes per drafted step).
Verification is unaffected: a token outside it is simply never drafted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


def draft_vocabulary(sequences: Iterable[list[int]], size: int, vocab_size: int) -> list[int]:
    """Every token seen in ``sequences`` (most frequent first, ties by id), then the lowest ids
    not seen yet (a BPE vocabulary's merge order roughly follows frequency) until ``size`` ids.
    A training set with more distinct tokens than ``size`` keeps its ``size`` most frequent."""
    if not 0 < size <= vocab_size:
        raise ValueError(f"size must be in [1, {vocab_size}], got {size}")
    counts = Counter(t for seq in sequences for t in seq)
    seen = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][:size]
    chosen = set(seen)
    filler = (t for t in range(vocab_size) if t not in chosen)
    return seen + [next(filler) for _ in range(size - len(seen))]
