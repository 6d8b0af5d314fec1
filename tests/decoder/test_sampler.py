import pytest
import torch

from services.decoder.engine.sampling_params import InvalidRequestError, SamplingParams
from services.decoder.model.sampler import sample_next, sampling_probs


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 3.0, -1.0, 2.9])
    assert sample_next(logits, 0.0, 0, 1.0, None) == 1


def test_top_k_keeps_exactly_k_tokens():
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0, 0.0])
    probs = sampling_probs(logits, 1.0, top_k=2, top_p=1.0)
    assert (probs > 0).tolist() == [False, True, True, False, False]
    assert probs.sum().item() == pytest.approx(1.0)


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs_in.log()
    kept = sampling_probs(logits, 1.0, top_k=0, top_p=0.8) > 0
    assert kept.tolist() == [True, True, False, False]
    kept = sampling_probs(logits, 1.0, top_k=0, top_p=0.81) > 0
    assert kept.tolist() == [True, True, True, False]
    kept = sampling_probs(logits, 1.0, top_k=0, top_p=0.1) > 0
    assert kept.tolist() == [True, False, False, False]


def test_temperature_scales_distribution():
    logits = torch.tensor([1.0, 2.0])
    p = sampling_probs(logits, 0.5, 0, 1.0)
    expected = torch.softmax(logits / 0.5, dim=-1)
    assert torch.allclose(p, expected)


def test_seeded_sampling_is_reproducible_and_matches_distribution():
    logits = torch.tensor([0.0, 1.0, 2.0])
    draws_a = [sample_next(logits, 1.0, 0, 1.0, torch.Generator().manual_seed(7)) for _ in range(3)]
    draws_b = [sample_next(logits, 1.0, 0, 1.0, torch.Generator().manual_seed(7)) for _ in range(3)]
    assert draws_a == draws_b
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([sample_next(logits, 1.0, 0, 1.0, g) for _ in range(4000)]), minlength=3)
    expected = torch.softmax(logits, -1) * 4000
    assert torch.all((counts - expected).abs() < 5 * expected.sqrt())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_invalid_sampling_params(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs)
