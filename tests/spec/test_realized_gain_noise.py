"""The noise margin of the adaptive budget's shortfall check (``RealizedGain.noise``): a spell of
scattered step times barely raises the bar, a lasting shortfall does."""

import math
import statistics

import pytest

from services.decoder.spec.realized_gain import RealizedGain


def test_the_shortfall_is_raised_by_the_standard_error_of_the_steps_log_ratios():
    """Five drafting steps (a plain mean): the factor is the averages' ratio times exp of one
    standard error of the steps' log taken / promised (population variance over 5 steps)."""
    ratios = [1.0, 1.1, 0.95, 1.2, 1.05]  # taken / promised, none beyond MAX_JUMP of the recent ones
    gain, averages_only = RealizedGain(), RealizedGain()
    averages_only.NOISE_MARGIN = 0.0
    for ratio in ratios:
        gain.observe(0.050, 0.050 * ratio)
        averages_only.observe(0.050, 0.050 * ratio)
    noise = math.sqrt(statistics.pvariance([math.log(r) for r in ratios]) / len(ratios))
    assert gain.noise == pytest.approx(noise)
    assert averages_only.factor < 1.0
    assert gain.factor == pytest.approx(min(averages_only.factor * math.exp(noise), 1.0))


def test_a_spell_of_scattered_steps_barely_lifts_the_bar_where_a_lasting_shortfall_does():
    """Steps scattered by ~15% around their price, three slow ones in a row among them (a spell
    of this 2-core machine), against a lasting 30% shortfall scattered alike: the spell's bar
    stays within the noise of the averages, the lasting one is learnt."""
    scatter = [1.0, 0.85, 1.15, 0.9, 1.1, 1.2, 0.8, 1.05, 0.95, 1.0] * 3
    spell, lasting = RealizedGain(), RealizedGain()
    for ratio in scatter + [1.25, 1.25, 1.25]:
        spell.observe(0.050, 0.050 * ratio)
    for ratio in scatter:
        lasting.observe(0.050, 0.050 * 1.3 * ratio)
    assert spell.required_gain(0.02) < 0.055  # ~0.02 + the spell's 3% beyond one standard error
    spell.NOISE_MARGIN = 0.0
    assert spell.required_gain(0.02) > 0.085  # the averages alone
    assert lasting.required_gain(0.02) > 0.25
