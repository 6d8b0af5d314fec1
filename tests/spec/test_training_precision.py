"""Training with bf16 matmuls (``TrainOptions.dtype``): a step's loss is fp32's up to bf16
rounding, bf16 really ran (the loss differs from fp32's), and the weights, their gradients and
the optimizer state stay fp32."""

from __future__ import annotations

import pytest
import torch

from services.decoder.model.linear import onednn_bf16_supported
from services.decoder.spec.training.trainer import Trainer, TrainOptions
from tests.spec.test_draft_vocab_loss import _net, _sequence


def _one_step(dtype: str, run_dir) -> tuple[Trainer, dict]:
    seq, embed, _ = _sequence()
    trainer = Trainer(_net("dspark"), embed, [seq], TrainOptions(steps=1, seqs_per_step=2, anchors_per_seq=4,
                                                                 warmup_steps=1, dtype=dtype), run_dir)
    return trainer, trainer.train_step()


def test_a_bf16_step_tracks_the_fp32_step_with_fp32_state(tmp_path):
    fp32, exact = _one_step("float32", tmp_path / "a")
    bf16, rounded = _one_step("bfloat16", tmp_path / "b")
    # the same sequence and anchors (the trainer's sampler is seeded), so the CE differs by the
    # rounding of bf16 matmul inputs only: 8 mantissa bits, ~4e-3 relative per product, averaged
    # over the reductions of a one-layer forward
    assert rounded["ce"] == pytest.approx(exact["ce"], rel=2e-2)
    assert rounded["ce"] != exact["ce"]  # autocast ran: fp32's exact value would mean it did not
    for (name, a), b in zip(fp32.net.named_parameters(), bf16.net.parameters()):
        assert b.dtype == torch.float32 and (b.grad is None or b.grad.dtype == torch.float32), name
        assert torch.allclose(a, b, atol=5e-3), name  # one AdamW step of lr 6e-4 from the same start
    assert all(s.dtype == torch.float32 for state in bf16.optim.state.values() for s in state.values()
               if torch.is_tensor(s) and s.is_floating_point())


def test_auto_means_bf16_where_onednn_has_bf16_kernels_and_bad_names_are_refused():
    assert TrainOptions(dtype="auto").autocast_bf16("cpu") is onednn_bf16_supported()
    assert TrainOptions(dtype="auto").autocast_bf16("cuda")  # every CUDA device autocasts to bf16
    assert TrainOptions(dtype="bfloat16").autocast_bf16() and not TrainOptions().autocast_bf16()
    with pytest.raises(ValueError, match="dtype must be"):
        TrainOptions(dtype="fp16")
