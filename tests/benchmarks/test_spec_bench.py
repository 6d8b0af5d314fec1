"""benchmarks.spec's run protocol: sequential vs interleaved repeats, on the real engine."""

from benchmarks import spec as bench


def test_interleaved_repeats_go_round_both_ways_and_sequential_ones_do_not(monkeypatch):
    order = []

    class FakeRun:
        def __init__(self, loaded, prompts, max_tokens, spec, spec_tokens, budget, attention, batch_size, gemm_dtype):
            self.name = f"{spec}:{spec_tokens}:{budget}"
            order.append(("build", self.name))
            self.count = 0

        def run(self):
            order.append(("run", self.name))
            self.count += 1

        def close(self):
            order.append(("close", self.name))

        def figures(self):
            return {"runs": self.count}

    monkeypatch.setattr(bench, "SettingRun", FakeRun)
    settings = bench.parse_settings("none,ngram:4,dflash:7:adaptive")
    names = ["none:1:fixed", "ngram:4:fixed", "dflash:7:adaptive"]

    got = list(bench.run_settings(None, [[1]], 8, settings, repeats=2, interleave=True))
    assert [s for s, _ in got] == settings and all(f == {"runs": 2} for _, f in got)
    runs = [name for what, name in order if what == "run"]
    assert runs == names + names[::-1]  # the second round backwards: drift falls both ways
    assert [what for what, _ in order[:3]] == ["build"] * 3  # every engine exists before the first run

    order.clear()
    got = list(bench.run_settings(None, [[1]], 8, settings, repeats=2, interleave=False))
    assert [f for _, f in got] == [{"runs": 2}] * 3
    assert [name for what, name in order if what == "run"] == [n for n in names for _ in range(2)]
    assert order[:4] == [("build", names[0]), ("run", names[0]), ("run", names[0]), ("close", names[0])]


def test_interleaved_runs_are_lossless_on_the_real_engine(loaded_model):
    """Two engines alive at once, alternating: greedy n-gram output equals no speculation and
    each engine's repeats agree (SettingRun raises otherwise)."""
    tok = loaded_model.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": "Count from 1 to 12."}]),
                          add_special_tokens=False)]
    got = dict(bench.run_settings(loaded_model, prompts, 24, bench.parse_settings("none,ngram:4"), repeats=2,
                                  interleave=True))
    none, ngram = got[("none", 0, "fixed")], got[("ngram", 4, "fixed")]
    assert ngram["outputs"] == none["outputs"] and len(none["outputs"][0]) == 24
    assert len(none["tokens_per_s_runs"]) == len(ngram["tokens_per_s_runs"]) == 2
    assert ngram["mean_acceptance_length"] > 1.0 and none["mean_acceptance_length"] == 0.0


def test_a_setting_run_decodes_its_prompts_batch_size_at_a_time():
    """``--prompts 3 --concurrency 2``: batches of 2 then 1, one after another; the figures count
    every prompt's tokens and verify steps."""
    from types import SimpleNamespace

    calls = []

    class FakeLLM:
        def generate(self, prompts, params):
            calls.append(list(prompts))
            return [SimpleNamespace(token_ids=p * 3, stats={"accepted_tokens": 2, "num_verify_steps": 1}) for p in prompts]

    run = bench.SettingRun.__new__(bench.SettingRun)
    run.name, run.prompts, run.batch_size, run.llm, run.params = "x", [[1], [2], [3]], 2, FakeLLM(), None
    run.rates, run.accepted, run.verify_steps, run.outputs = [], 0, 0, None
    run.run()
    assert calls == [[[1], [2]], [[3]]]
    figures = run.figures()
    assert figures["tokens"] == 9 and figures["outputs"] == [[1] * 3, [2] * 3, [3] * 3]
    assert figures["mean_acceptance_length"] == 3.0  # (2 accepted + 1 bonus) per verify step


def test_adaptive_targets_compare_like_with_like():
    def row(spec, budget, kind, c, tps, speedup):
        return {"spec": spec, "verify_budget": budget, "attention": "dense", "kind": kind, "concurrency": c,
                "tokens_per_s": tps, "speedup_vs_none": speedup}

    rows = [row("none", "fixed", "chat", 1, 30.0, 1.0), row("dspark", "fixed", "chat", 1, 24.0, 0.8),
            row("dspark", "adaptive", "chat", 1, 30.3, 1.01), row("dspark", "fixed", "chat", 4, 80.0, 1.1),
            row("dspark", "adaptive", "chat", 4, 75.0, 1.03), row("ngram", "adaptive", "chat", 1, 29.7, 0.99)]
    assert bench.adaptive_targets(rows) == {
        "dspark_adaptive_never_below_none": True,
        "dspark_adaptive_within_5pct_of_best_fixed": False,  # 75 < 0.95 * 80 at c=4
        "ngram_adaptive_never_below_none": False,  # no fixed ngram rows: nothing to compare with
    }


def test_a_paired_speedup_is_the_median_of_per_repeat_ratios():
    """Interleaved repeats: repeat i of each setting ran back to back, so the ratios pair up. A
    machine that got 1.5x faster between the two repeats: paired ratios 1.05 and 1.05 -> 1.05;
    the ratio of the medians mixes the drift into it."""
    import pytest

    base = {"tokens_per_s": 50.0, "tokens_per_s_runs": [40.0, 60.0]}
    faster = {"tokens_per_s": 52.5, "tokens_per_s_runs": [42.0, 63.0]}
    assert bench.speedup(faster, base, paired=True) == pytest.approx(1.05)
    drifted = {"tokens_per_s": 55.0, "tokens_per_s_runs": [38.0, 72.0]}  # 0.95x, then 1.2x
    assert bench.speedup(drifted, base, paired=True) == pytest.approx((0.95 + 1.2) / 2)
    assert bench.speedup(drifted, base, paired=False) == pytest.approx(1.1)
    assert bench.paired_ratios(drifted, base) == pytest.approx([0.95, 1.2])
    with pytest.raises(ValueError, match="differ in number"):
        bench.speedup({"tokens_per_s_runs": [1.0]}, base, paired=True)


def test_paired_adaptive_rows_compare_with_the_best_fixed_repeat_by_repeat():
    """Best fixed: 1.10x of none. Adaptive's three repeats are 0.98, 0.967 and 0.757 of the fixed
    one's, repeat by repeat (one bad repeat): median 0.967, within 5%. Unpaired, the median tok/s
    (53 vs 60) pick different repeats and read 0.883: not within."""
    import statistics

    def row(spec, budget, runs, speedup, paired):
        return {"spec": spec, "verify_budget": budget, "attention": "dense", "kind": "chat", "concurrency": 4,
                "tokens_per_s": statistics.median(runs), "tokens_per_s_runs": runs, "speedup_vs_none": speedup,
                "paired": paired}

    for paired, within in ((True, True), (False, False)):
        rows = [row("none", "fixed", [45.0, 55.0, 64.0], 1.0, paired),
                row("dspark", "fixed", [50.0, 60.0, 70.0], 1.1, paired),
                row("dspark", "adaptive", [49.0, 58.0, 53.0], 1.02, paired)]
        assert bench.adaptive_targets(rows)["dspark_adaptive_within_5pct_of_best_fixed"] is within


def test_block8_acceptance_reads_fixed_rows_and_net_speedup_any_row():
    """dspark on chat at c=1: fixed k=7 accepts 2.1 per verify at 0.9x; adaptive (drafts cut,
    1.6 per verify) runs 1.1x. Block-8 acceptance is the fixed row's (pass), the net speedup
    the best of both (pass); a run with only the adaptive row has no block-8 figure at all."""
    def row(budget, acc, speedup):
        return {"spec": "dspark", "verify_budget": budget, "spec_tokens": 7, "attention": "dense", "kind": "chat",
                "concurrency": 1, "tokens_per_s": 30.0 * speedup, "speedup_vs_none": speedup,
                "mean_acceptance_length": acc, "lossless": True}

    none = {**row("fixed", 0.0, 1.0), "spec": "none", "spec_tokens": 0}
    got = bench.spec_targets([none, row("fixed", 2.1, 0.9), row("adaptive", 1.6, 1.1)])
    assert got["dspark_acceptance_length_chat_block8>=2.0"] is True
    assert got["dspark_net_speedup_chat_c1"] is True and got["all_lossless"] is True
    got = bench.spec_targets([none, row("adaptive", 1.6, 1.1)])
    assert "dspark_acceptance_length_chat_block8>=2.0" not in got and got["dspark_net_speedup_chat_c1"] is True
