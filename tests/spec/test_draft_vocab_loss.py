"""Training over the draft vocabulary (``trainer.DraftVocabulary``): the loss equals the
full-vocabulary logits restricted to those ids (a torch reference), labels outside it carry no
CE and never count as hits, and the whole vocabulary in any order gives the unrestricted loss.
DFlash2: the selector's loss is the CE of the label among the top-K candidates scored as when
serving (a loop reference), and the net starts as the DFlash it is warm-started from."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.decoder.spec.dflash.config import DraftConfig
from services.decoder.spec.dflash.model import DraftNet
from services.decoder.spec.training.dataset import Sequence
from services.decoder.spec.training.trainer import (
    DraftVocabulary,
    TrainOptions,
    init_trainable,
    position_weights,
    sequence_loss,
)

V, H, BLOCK = 64, 32, 4
DFLASH2 = dict(conv_kernel_size=2, conv_group_size=8, selector_rank=8, selector_top_k=4)


def _net(kind: str) -> DraftNet:
    cfg = DraftConfig(hidden_size=H, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=48,
                      rms_norm_eps=1e-5, rope_theta=10000.0, vocab_size=V, block_size=BLOCK, mask_token_id=1,
                      target_layer_ids=(0, 1), context_window=64, num_target_layers=2,
                      markov_rank=8 if kind == "dspark" else None, confidence_head=kind == "dspark",
                      **(DFLASH2 if kind == "dflash2" else {}))
    torch.manual_seed(0)
    net = DraftNet(cfg)
    init_trainable(net, 0)
    with torch.no_grad():
        for head in (net.markov_head, net.candidate_selector):
            if head is not None:
                head.successor_codebook.normal_()  # a live transition term, not the zero start
    return net


def _sequence() -> tuple[Sequence, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, V, (40,), generator=gen)
    seq = Sequence("k", "chat", "train", ids, torch.randn(40, 2 * H, generator=gen).half(), answer_start=10)
    embed = torch.randn(V, H, generator=gen)
    return seq, embed, torch.arange(10, 30, 3)


def _reference(net: DraftNet, embed, seq, anchors, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The loss from full-vocabulary logits: columns ``ids`` kept, CE over the labels among them."""
    offsets = torch.arange(1, BLOCK)
    labels = seq.token_ids[anchors[:, None] + offsets]
    hidden = net.sequence_blocks(seq.features.float(), seq.token_ids, anchors, embed)
    logits = net.base_logits(hidden, embed)
    if net.markov_head is not None:
        logits = net.markov_head.logits(hidden, seq.token_ids[anchors[:, None] + offsets - 1], logits)
    logits = logits[..., ids]
    total, weight_sum, hits = torch.zeros(()), 0.0, []
    weights = position_weights(BLOCK - 1, TrainOptions().decay)
    for n in range(labels.shape[0]):
        for k in range(labels.shape[1]):
            rows = (ids == labels[n, k]).nonzero()
            if k == 0:
                hits.append(bool(len(rows)) and int(logits[n, 0].argmax()) == int(rows[0, 0]))
            if len(rows):
                total = total + weights[k] * F.cross_entropy(logits[n, k][None], rows[0])
                weight_sum += float(weights[k])
    return total / weight_sum, sum(hits) / len(hits)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_the_draft_vocabulary_loss_is_the_full_logits_restricted_to_it(kind):
    net, (seq, embed, anchors) = _net(kind), _sequence()
    labels = seq.token_ids[anchors[:, None] + torch.arange(1, BLOCK)]
    # a vocabulary without one of the labels, in a scrambled order
    ids = torch.tensor([i for i in torch.randperm(V, generator=torch.Generator().manual_seed(2)).tolist()
                        if i != int(labels[0, 0])][: V // 2])
    assert int(labels[0, 0]) not in ids.tolist() and (torch.isin(labels, ids)).any()
    loss, metrics = sequence_loss(net, embed, seq, anchors, TrainOptions(), DraftVocabulary(ids, V))
    expected, acc1 = _reference(net, embed, seq, anchors, ids)
    ce = loss if kind == "dflash" else loss - TrainOptions().bce_weight * metrics["bce"]  # DSpark: CE + BCE
    torch.testing.assert_close(ce, expected, rtol=1e-5, atol=1e-5)
    assert metrics["acc1"] == pytest.approx(acc1)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_the_whole_vocabulary_in_any_order_is_the_unrestricted_loss(kind):
    net, (seq, embed, anchors) = _net(kind), _sequence()
    full, full_metrics = sequence_loss(net, embed, seq, anchors, TrainOptions())
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(3))
    loss, metrics = sequence_loss(net, embed, seq, anchors, TrainOptions(), DraftVocabulary(ids, V))
    torch.testing.assert_close(loss, full, rtol=1e-5, atol=1e-5)
    assert metrics == pytest.approx(full_metrics, rel=1e-5)


def _selector_reference(net: DraftNet, embed, seq, anchors, ids: torch.Tensor) -> torch.Tensor:
    """Per drafted position: the draft-vocabulary logits' top-K, each candidate scored
    ``unary + <pred[true previous token] * proj(h), succ[candidate]>``, CE at the label's index
    among them (positions whose label is no candidate skipped); position-weighted mean."""
    sel = net.candidate_selector
    hidden = net.sequence_blocks(seq.features.float(), seq.token_ids, anchors, embed)
    logits = net.base_logits(hidden, embed)[..., ids]
    weights = position_weights(BLOCK - 1, TrainOptions().decay)
    total, weight_sum = torch.zeros(()), 0.0
    for n, a in enumerate(anchors.tolist()):
        for k in range(BLOCK - 1):
            unary, cols = torch.topk(logits[n, k], sel.top_k)
            prev, label = int(seq.token_ids[a + k]), int(seq.token_ids[a + k + 1])
            query = sel.predecessor_codebook[prev] * sel.hidden_projection(hidden[n, k])
            scores = torch.stack([unary[j] + query @ sel.successor_codebook[int(ids[c])] for j, c in enumerate(cols)])
            where = [j for j, c in enumerate(cols.tolist()) if int(ids[c]) == label]
            if where:
                total = total + weights[k] * F.cross_entropy(scores[None], torch.tensor(where[:1]))
                weight_sum += float(weights[k])
    assert weight_sum > 0
    return total / weight_sum


def test_the_dflash2_selector_loss_is_the_label_among_the_top_k_candidates():
    net, (seq, embed, anchors) = _net("dflash2"), _sequence()
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(4))[: V // 2]
    loss, metrics = sequence_loss(net, embed, seq, anchors, TrainOptions(), DraftVocabulary(ids, V))
    expected = _selector_reference(net, embed, seq, anchors, ids)
    assert metrics["selector_ce"] == pytest.approx(float(expected.detach()), rel=1e-5)
    torch.testing.assert_close(loss, torch.tensor(metrics["ce"]) + expected, rtol=1e-5, atol=1e-5)


def test_a_dflash2_net_starts_as_the_dflash_it_is_warm_started_from():
    dflash, (seq, embed, anchors) = _net("dflash"), _sequence()
    net = _net("dflash2")
    with torch.no_grad():
        net.candidate_selector.successor_codebook.zero_()  # the fresh start: no transition term
    missing, unexpected = net.load_state_dict(dflash.state_dict(), strict=False)
    assert not unexpected and missing and all("conv" in m or "candidate_selector" in m for m in missing)
    torch.testing.assert_close(net.sequence_blocks(seq.features.float(), seq.token_ids, anchors, embed),
                               dflash.sequence_blocks(seq.features.float(), seq.token_ids, anchors, embed))
    block = net.sequence_blocks(seq.features.float(), seq.token_ids, anchors, embed)
    picks, _ = net.choose(block, seq.token_ids[anchors], embed)
    assert torch.equal(picks, net.base_logits(block, embed).argmax(-1))
