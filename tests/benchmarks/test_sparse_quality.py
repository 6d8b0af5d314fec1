"""Pure parts of benchmarks/sparse_quality (no model loading)."""

import math

import pytest
import torch

from benchmarks.sparse_quality.tasks import (
    FILLER,
    PASSKEY_SENTENCE,
    agreement,
    make_key,
    nll_sum,
    passkey_correct,
    passkey_depth,
    passkey_text,
    perplexity,
)


def test_perplexity_matches_hand_computed_value():
    # row 0: uniform over 4 -> p(target) = 1/4; row 1: logits [ln 3, 0, 0, 0] -> p(target 0) = 3/6 = 1/2
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, 0.0, 0.0]])
    targets = torch.tensor([2, 0])
    assert nll_sum(logits, targets) == pytest.approx(math.log(4) + math.log(2))
    assert perplexity(logits, targets) == pytest.approx(math.sqrt(8.0))  # exp((ln 4 + ln 2) / 2)


def test_perplexity_of_a_certain_prediction_is_one():
    logits = torch.full((3, 5), -1e4)
    targets = torch.tensor([1, 4, 0])
    logits[torch.arange(3), targets] = 0.0
    assert perplexity(logits, targets) == pytest.approx(1.0)


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_passkey_text_places_the_key_at_the_depth(depth):
    key = make_key(3)
    text = passkey_text(40, depth, key)
    assert text.count(PASSKEY_SENTENCE.format(key=key)) == 1
    assert text.count(FILLER) == 40
    assert passkey_depth(text, key) == pytest.approx(round(depth * 40) / 40)
    body_chars = text.index(PASSKEY_SENTENCE.format(key=key))
    assert abs(body_chars / len(text) - depth) < 0.1


def test_passkey_text_rejects_bad_depth():
    with pytest.raises(ValueError):
        passkey_text(10, 1.5, "12345")


def test_passkey_keys_are_five_digits_and_distinct():
    keys = [make_key(i) for i in range(9)]
    assert all(len(k) == 5 and k.isdigit() for k in keys)
    assert len(set(keys)) == len(keys)


def test_passkey_scorer_detects_the_digits():
    assert passkey_correct(" 68142. Remember it.", "68142")
    assert passkey_correct("The pass key is 68,142", "68142")
    assert passkey_correct("6 8 1 4 2", "68142")
    assert not passkey_correct("The pass key is 68143.", "68142")
    assert not passkey_correct("I don't know", "68142")


def test_agreement_prefix_and_positionwise():
    assert agreement([1, 2, 3, 4], [1, 2, 9, 4]) == {"tokens": 4, "prefix_match": 2, "positionwise": 0.75}
    assert agreement([1, 2], [1, 2]) == {"tokens": 2, "prefix_match": 2, "positionwise": 1.0}
    assert agreement([5, 6, 7], [1]) == {"tokens": 3, "prefix_match": 0, "positionwise": 0.0}


def _synthetic_figures():
    from benchmarks.sparse_quality.driver import Settings

    settings = Settings(budgets=[1024, 2048], ppl_windows=[4096, 8192], passkey_contexts=[2048, 8192],
                        passkey_depths=[0.1, 0.9])
    ppl = {
        "dense": {"4096": {"perplexity": 2.0}, "8192": {"perplexity": 4.0}},
        "sparse1024": {"4096": {"perplexity": 2.1}, "8192": {"perplexity": 4.2}},
        "sparse2048": {"4096": {"perplexity": 2.02}, "8192": {"perplexity": 4.04}},
    }
    greedy = {"dense": [[1, 2, 3, 4]], "sparse1024": [[1, 2, 0, 4]], "sparse2048": [[1, 2, 3, 4]]}

    def cases(correct):
        ctxs = [2048, 2048, 8192, 8192]
        return [{"context": c, "correct": ok} for c, ok in zip(ctxs, correct)]

    passkey = {"dense": cases([True, True, True, False]), "sparse1024": cases([True, False, True, True]),
               "sparse2048": cases([True, True, True, True])}
    return settings, ppl, greedy, passkey


def test_summarize_relative_perplexity_agreement_and_targets():
    from benchmarks.sparse_quality.report import summarize

    summary, targets = summarize(*_synthetic_figures())
    assert summary["perplexity_increase"]["sparse1024"]["8192"] == pytest.approx(0.05)
    assert summary["perplexity_increase"]["sparse2048"]["8192"] == pytest.approx(0.01)
    assert summary["greedy_agreement"]["sparse1024"]["mean_prefix_match"] == 2
    assert summary["greedy_agreement"]["sparse1024"]["mean_positionwise"] == pytest.approx(0.75)
    assert summary["passkey_accuracy"]["dense"]["by_context"] == {"2048": 1.0, "8192": 0.5}
    # sparse1024 misses a case dense answers (and answers one dense misses: that does not count)
    assert summary["passkey_accuracy"]["sparse1024"]["matches_dense_where_dense_correct"] is False
    assert targets["ppl_increase_at_2048_on_8k"]["pass"] is True
    assert targets["passkey_1024_matches_dense"]["pass"] is False
    assert targets["passkey_2048_matches_dense"]["pass"] is True
    assert targets["passkey_2048_matches_dense"]["vacuous"] is False


def test_report_and_plot_from_synthetic_result(tmp_path, capsys):
    from dataclasses import asdict

    from benchmarks.sparse_quality.report import plot, print_report, summarize

    settings, ppl, greedy, passkey = _synthetic_figures()
    summary, targets = summarize(settings, ppl, greedy, passkey)
    result = {"model": "synthetic", "settings": asdict(settings), "perplexity": ppl, "summary": summary,
              "targets": targets, "timings_s": {"total": 0.0}}
    print_report(result)
    out = capsys.readouterr().out
    assert "ppl_increase_at_2048_on_8k" in out and "PASS" in out and "FAIL" in out
    plot(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0
