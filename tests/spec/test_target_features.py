"""Batched feature extraction against one prefill per sequence: the same hidden states for every
sequence, whatever its neighbours in the batch, and the store's contents equal either way."""

import pytest
import torch

from services.decoder.model.llama import LlamaModel
from services.decoder.spec.training.distill import Record
from services.decoder.spec.training.features import extract_features, load_features
from services.decoder.spec.training.target_features import (
    CHUNK_TOKENS,
    batch_target_features,
    target_features,
)

LAYERS = (2, 15)


@pytest.fixture(scope="module")
def model(loaded_model):
    return LlamaModel(loaded_model.config, loaded_model.weights, torch.float32)


def random_ids(length: int, seed: int) -> list[int]:
    return torch.randint(0, 49152, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_batch_gives_each_sequence_its_own_prefill(model):
    # lengths off and on page boundaries, the longest a whole chunk: a ragged group, keys padded
    sequences = [random_ids(n, seed) for seed, n in enumerate((5, 16, 97, CHUNK_TOKENS))]
    batched = batch_target_features(model, sequences, LAYERS)
    for ids, got in zip(sequences, batched):
        alone = target_features(model, ids, LAYERS)
        assert got.shape == alone.shape == (len(ids), 2 * 576)
        # fp32; only the attention's padded key count changes the reduction order
        torch.testing.assert_close(got, alone, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="at most"):
        batch_target_features(model, [random_ids(CHUNK_TOKENS + 1, 9)], LAYERS)


def test_extraction_batches_short_sequences_and_chunks_long_ones(model, tmp_path):
    lengths = (40, 700, 33, 120, 64)  # 700: chunked alone, between batches in length order
    records = [Record(f"k{i}", "chat", "train", random_ids(8, 100 + i), random_ids(n - 8, i), "length")
               for i, n in enumerate(lengths)]
    stats = extract_features(model, records, tmp_path, LAYERS, batch_tokens=256, progress=False)
    assert stats == {"sequences": 5, "tokens": sum(lengths), "total_sequences": 5}
    stored = load_features(tmp_path, LAYERS)
    for record in records:
        alone = target_features(model, record.token_ids, LAYERS)
        torch.testing.assert_close(stored[record.key].float(), alone.half().float(), rtol=2e-3, atol=2e-3)
