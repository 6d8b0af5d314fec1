"""Verification math: greedy acceptance and rejection sampling (lossless in distribution)."""

import torch

from services.decoder.model.sampler import sampling_probs
from services.decoder.spec.ngram import NgramDrafter
from services.decoder.spec.verify import accept_greedy, accept_sampled


def test_accept_greedy_exact_cases():
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted + bonus
    assert accept_greedy([5, 9, 7, 8], [5, 6, 7]) == [5, 9]  # first mismatch: target's token
    assert accept_greedy([4, 6, 7, 8], [5, 6, 7]) == [4]
    assert accept_greedy([3], []) == [3]


def test_ngram_proposes_the_continuation_of_the_latest_match():
    drafter = NgramDrafter(min_n=1, max_n=3)
    assert drafter.propose([1, 2, 3, 4, 9, 1, 2, 3], 3) == [4, 9, 1]
    # the longest n wins over a more recent shorter match
    assert drafter.propose([7, 8, 5, 0, 8, 6, 7, 8], 2) == [5, 0]
    assert drafter.propose([1, 2, 3], 4) == []
    assert drafter.propose([1, 2, 1, 2], 0) == []
    # latest occurrence of the suffix (not the first)
    assert drafter.propose([3, 1, 3, 2, 3], 1) == [2]


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "sampled a token of probability zero"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def _run(sampler, logits, draft, num_samples, generator):
    """Counts of the first committed token, and of the second one given the first was draft[0]."""
    vocab = logits.shape[-1]
    first = torch.zeros(vocab)
    second = torch.zeros(vocab)
    for _ in range(num_samples):
        out = sampler(logits, draft, 1.0, 0, 1.0, generator)
        first[out[0]] += 1
        if out[0] == draft[0] and len(out) > 1:
            second[out[1]] += 1
    return first, second


# chi-square critical value for 5 degrees of freedom at p = 0.001 (6 tokens)
CRITICAL = 20.5


def test_rejection_sampling_preserves_the_target_distribution():
    g = torch.Generator().manual_seed(1234)
    logits = torch.randn(3, 6, generator=g) * 1.5  # positions 0..2, vocabulary of 6
    p0 = sampling_probs(logits[0], 1.0, 0, 1.0)
    p1 = sampling_probs(logits[1], 1.0, 0, 1.0)
    for draft in ([int(p0.argmax()), 2], [int(p0.argmin()), 4]):
        first, second = _run(accept_sampled, logits, draft, 6000, torch.Generator().manual_seed(7))
        assert _chi_square(first, p0) < CRITICAL
        assert _chi_square(second, p1) < CRITICAL


def test_a_broken_sampler_fails_the_same_check():
    def always_accept(logits, draft, temperature, top_k, top_p, generator):
        probs = sampling_probs(logits[len(draft)], temperature, top_k, top_p)
        return list(draft) + [int(torch.multinomial(probs, 1, generator=generator))]

    def residual_keeps_draft_mass(logits, draft, temperature, top_k, top_p, generator):
        probs = sampling_probs(logits[0], temperature, top_k, top_p)
        if float(torch.rand((), generator=generator)) < float(probs[draft[0]]):
            return [draft[0], 0]
        return [int(torch.multinomial(probs, 1, generator=generator))]  # should drop draft[0]'s mass

    g = torch.Generator().manual_seed(1234)
    logits = torch.randn(3, 6, generator=g) * 1.5
    p0 = sampling_probs(logits[0], 1.0, 0, 1.0)
    draft = [int(p0.argmin()), 4]
    for broken in (always_accept, residual_keeps_draft_mass):
        first, _ = _run(broken, logits, draft, 6000, torch.Generator().manual_seed(7))
        assert _chi_square(first, p0) > CRITICAL
