"""The held-out acceptance evaluator (``services/decoder/spec/training/evaluate.py``) on hand-made
drafts and sequences: acceptance lengths, anchors, n-gram lookup and the decoding walk."""

import pytest
import torch

from services.decoder.spec.training.dataset import Sequence
from services.decoder.spec.training.evaluate import (
    acceptance_lengths,
    eval_anchors,
    ngram_acceptance,
    summarise_lengths,
    walk_lengths,
)


def test_acceptance_length_of_hand_made_drafts():
    truth = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]])
    drafts = torch.tensor([[1, 2, 3], [1, 9, 3], [9, 2, 3], [1, 2, -1]])
    assert acceptance_lengths(drafts, truth).tolist() == [4, 2, 1, 3]
    assert eval_anchors(9, 4, 3).tolist() == [4, 5, 6]
    assert eval_anchors(9, 0, 3).tolist() == [1, 2, 3, 4, 5, 6]


def test_ngram_acceptance_on_a_hand_made_sequence():
    # anchors 4, 5, 6 (block 3: two drafted tokens each). Prompt lookup proposes [11, 12] at 4
    # (truth 11, 12: 3), [12, 13] at 5 (truth 12, 14: 2), [13, 10] at 6 (truth 14, 15: 1).
    ids = torch.tensor([10, 11, 12, 13, 10, 11, 12, 14, 15])
    seq = Sequence("s", "chat", "heldout", ids, torch.zeros(9, 4), answer_start=4)
    # Decoding verifies at anchor 4, commits 3 tokens and has no anchor left: one step of 3.
    out = ngram_acceptance([seq], block_size=3)
    assert out["anchors"] == 3 and out["verify_steps"] == 1
    assert out["per_anchor_mean_acceptance_length"] == pytest.approx(2.0)
    assert out["mean_acceptance_length"] == pytest.approx(3.0)
    assert out["by_kind"]["chat"]["mean_acceptance_length"] == pytest.approx(3.0)


def test_the_decoding_walk_skips_the_anchors_a_step_commits():
    lengths = torch.tensor([3, 8, 7, 1, 2, 5, 1, 1])
    # anchor 0 commits 3 -> anchor 3 commits 1 -> anchor 4 commits 2 -> anchor 6 -> anchor 7
    assert walk_lengths(lengths).tolist() == [3, 1, 2, 1, 1]
    assert walk_lengths(torch.tensor([8, 1, 1])).tolist() == [8]
    assert walk_lengths(torch.zeros(0, dtype=torch.int64)).tolist() == []
    # pooled over sequences: committed tokens / verify steps, per kind and overall
    seqs = {"chat": [lengths, torch.tensor([2, 1, 4])], "code": [torch.tensor([1, 1])]}
    out = summarise_lengths(seqs)
    assert out["by_kind"]["chat"]["verify_steps"] == 5 + 2 and out["by_kind"]["code"]["verify_steps"] == 2
    assert out["by_kind"]["chat"]["mean_acceptance_length"] == pytest.approx((8 + 2 + 4) / 7)
    assert out["mean_acceptance_length"] == pytest.approx((8 + 6 + 2) / 9)
    assert out["per_anchor_mean_acceptance_length"] == pytest.approx((28 + 7 + 2) / 13)
