"""benchmarks.spec's run protocol (sequential, interleaved and lockstep repeats, on the real engine)
and its targets (benchmarks.spec_targets)."""

import pytest

from benchmarks import spec as bench
from benchmarks import spec_targets as targets


def test_interleaved_repeats_go_round_both_ways_and_sequential_ones_do_not(monkeypatch):
    order = []

    class FakeRun:
        def __init__(self, loaded, prompts, max_tokens, spec, spec_tokens, budget, attention, batch_size, gemm_dtype,
                     draft_gemm_dtype):
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

    got = list(bench.run_settings(None, [[1]], 8, settings, repeats=2, schedule="interleave"))
    assert [s for s, _ in got] == settings and all(f == {"runs": 2} for _, f in got)
    runs = [name for what, name in order if what == "run"]
    assert runs == names + names[::-1]  # the second round backwards: drift falls both ways
    assert [what for what, _ in order[:3]] == ["build"] * 3  # every engine exists before the first run

    order.clear()
    got = list(bench.run_settings(None, [[1]], 8, settings, repeats=2, schedule="sequential"))
    assert [f for _, f in got] == [{"runs": 2}] * 3
    assert [name for what, name in order if what == "run"] == [n for n in names for _ in range(2)]
    assert order[:4] == [("build", names[0]), ("run", names[0]), ("run", names[0]), ("close", names[0])]


def test_interleaved_runs_are_lossless_on_the_real_engine(loaded_model):
    """Two engines alive at once, alternating: greedy n-gram output equals no speculation and
    each engine's repeats agree (SettingRun raises otherwise)."""
    tok = loaded_model.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": "Count from 1 to 12."}]),
                          add_special_tokens=False)]
    for schedule in ("interleave", "lockstep"):
        got = dict(bench.run_settings(loaded_model, prompts, 24, bench.parse_settings("none,ngram:4"), repeats=2,
                                      schedule=schedule))
        none, ngram = got[("none", 0, "fixed")], got[("ngram", 4, "fixed")]
        assert ngram["outputs"] == none["outputs"] and len(none["outputs"][0]) == 24
        assert len(none["tokens_per_s_runs"]) == len(ngram["tokens_per_s_runs"]) == 2
        assert ngram["mean_acceptance_length"] > 1.0 and none["mean_acceptance_length"] == 0.0
    with pytest.raises(ValueError, match="schedule"):
        list(bench.run_settings(loaded_model, prompts, 24, bench.parse_settings("none"), schedule="shuffled"))


def test_lockstep_engines_take_turns_step_by_step_both_ways():
    """Three runs, two repeats: every decode starts before any step; the engines then step one at
    a time, round by round, the order reversing every round (and every repeat), a run that has
    finished dropping out; each run times only its own steps."""
    order = []

    class FakeRun:
        def __init__(self, name, steps):
            self.name, self.steps, self.left = name, steps, 0

        def begin(self):
            order.append(("begin", self.name))
            self.left = self.steps

        @property
        def decoding(self):
            return self.left > 0

        def advance(self):
            order.append(("step", self.name))
            self.left -= 1

    runs = [FakeRun("a", 2), FakeRun("b", 3), FakeRun("c", 1)]
    bench.repeat_runs(runs, 2, lockstep=True)
    steps = [name for what, name in order if what == "step"]
    assert order[:3] == [("begin", "a"), ("begin", "b"), ("begin", "c")]
    first = ["a", "b", "c", "b", "a", "b"]  # round 1 forwards, round 2 backwards (c done), round 3: b
    second = ["c", "b", "a", "a", "b", "b"]  # the repeat starts from the other end
    assert steps == first + second
    assert order[9:12] == [("begin", "c"), ("begin", "b"), ("begin", "a")]


def test_a_setting_run_keeps_batch_size_prompts_in_flight():
    """``--prompts 3 --concurrency 2``: two in flight; the third starts in the step after the
    first one finishes (as under a server's fixed concurrency), not after the whole batch; the
    figures count every prompt's tokens and verify steps, in prompt order."""
    from types import SimpleNamespace

    class FakeEngine:
        """Prompt ``[n]`` finishes after ``n`` steps with its prompt three times over."""

        host_tier = None

        def __init__(self):
            self.requests, self.added, self.steps = {}, [], 0

        def add_request(self, ids, params):
            request_id = f"r{len(self.added)}"
            self.added.append((self.steps, ids))
            self.requests[request_id] = SimpleNamespace(ids=ids, left=ids[0], is_finished=False, output_ids=[])
            return request_id

        def step(self):
            self.steps += 1
            for request in self.requests.values():
                request.left -= 1
                request.is_finished = request.left <= 0
                request.output_ids.append(0)  # a request's first step is its prefill, emitting one token

        def pop_finished(self, request_id):
            request = self.requests.pop(request_id)
            stats = SimpleNamespace(as_dict=lambda n: {"accepted_tokens": 2, "num_verify_steps": 1})
            return SimpleNamespace(output_ids=request.ids * 3, stats=stats)

    engine = FakeEngine()
    run = bench.SettingRun.__new__(bench.SettingRun)
    run.name, run.prompts, run.batch_size, run.params = "x", [[3], [1], [2]], 2, None
    run.llm = SimpleNamespace(engine=engine)
    run.rates, run.decode_rates, run.accepted, run.verify_steps, run.outputs, run._in_flight = [], [], 0, 0, None, {}
    run.run()
    # [1] finishes in step 1, so [2] joins after it; [3] and [2] finish in step 3
    assert engine.added == [(0, [3]), (0, [1]), (1, [2])] and engine.steps == 3 and not run.decoding
    figures = run.figures()
    assert figures["tokens"] == 9 and figures["outputs"] == [[3] * 3, [1] * 3, [2] * 3]
    assert figures["mean_acceptance_length"] == 3.0  # (2 accepted + 1 bonus) per verify step
    # only step 3 began with both in-flight requests past their first step: its 2 tokens are the decode phase
    assert run._decode_tokens == 2 and len(run.decode_rates) == 1 and figures["decode_tokens_per_s"] > 0


def test_adaptive_targets_compare_like_with_like():
    def row(spec, budget, kind, c, tps, speedup):
        return {"spec": spec, "verify_budget": budget, "attention": "dense", "kind": kind, "concurrency": c,
                "tokens_per_s": tps, "speedup_vs_none": speedup}

    rows = [row("none", "fixed", "chat", 1, 30.0, 1.0), row("dspark", "fixed", "chat", 1, 24.0, 0.8),
            row("dspark", "adaptive", "chat", 1, 30.3, 1.01), row("dspark", "fixed", "chat", 4, 80.0, 1.1),
            row("dspark", "adaptive", "chat", 4, 75.0, 1.03), row("ngram", "adaptive", "chat", 1, 29.7, 0.99)]
    assert targets.adaptive_targets(rows) == {
        "dspark_adaptive_never_below_none": True,
        "dspark_adaptive_within_5pct_of_best_fixed": False,  # 75 < 0.95 * 80 at c=4
        "ngram_adaptive_never_below_none": False,  # no fixed ngram rows: nothing to compare with
    }


def test_never_below_none_allows_what_the_same_runs_a_a_control_reads_and_no_more():
    """A second ``none`` row in a group is an A/A control: at c=16 it reads 0.996, so an adaptive
    row at 0.997 is within the noise there; at c=4 the control reads 1.002 and 0.997 fails, as
    does every row below 1 in a run without a control."""
    def row(spec, budget, c, speedup):
        return {"spec": spec, "verify_budget": budget, "attention": "dense", "kind": "chat", "concurrency": c,
                "tokens_per_s": 30.0 * speedup, "speedup_vs_none": speedup}

    c16 = [row("none", "fixed", 16, 1.0), row("dspark", "adaptive", 16, 0.997), row("none", "fixed", 16, 0.996)]
    assert targets.aa_band(c16[1], c16) == pytest.approx(0.004)
    assert targets.adaptive_targets(c16)["dspark_adaptive_never_below_none"] is True
    c4 = [row("none", "fixed", 4, 1.0), row("dspark", "adaptive", 4, 0.997), row("none", "fixed", 4, 1.002)]
    assert targets.adaptive_targets(c16 + c4)["dspark_adaptive_never_below_none"] is False
    assert targets.adaptive_targets(c16[:2])["dspark_adaptive_never_below_none"] is False
    assert targets.aa_band(c16[1], c16[:2]) == 0.0


def test_the_a_a_band_is_at_least_two_standard_errors_of_the_controls_repeats():
    """An A/A whose median lands on 1.000 while its repeats read 0.998-1.003 is no proof of zero
    noise: the band is two standard errors of a median of its 4 paired ratios (0.0034), so a row
    at 0.997 passes and one at 0.995 fails; a control that reads far from 1 keeps its distance."""
    def row(spec, c, speedup, runs):
        return {"spec": spec, "verify_budget": "adaptive" if spec != "none" else "fixed", "attention": "dense",
                "kind": "chat", "concurrency": c, "tokens_per_s": 30.0 * speedup, "speedup_vs_none": speedup,
                "speedup_runs": runs}

    aa = row("none", 16, 1.0005, [0.9985, 0.9981, 1.0025, 1.0034])
    rows = [row("none", 16, 1.0, [1.0] * 4), row("dspark", 16, 0.997, None), aa]
    assert targets.aa_band(rows[1], rows) == pytest.approx(2 * 1.2533 * 0.002715 / 2, rel=0.01)  # stdev 0.0027
    assert targets.adaptive_targets(rows)["dspark_adaptive_never_below_none"] is True
    rows[1] = row("dspark", 16, 0.995, None)
    assert targets.adaptive_targets(rows)["dspark_adaptive_never_below_none"] is False
    far = row("none", 16, 0.990, [0.9899, 0.9901, 0.9900])
    assert targets.aa_band(rows[1], rows[:2] + [far]) == pytest.approx(0.010)


def test_a_paired_speedup_is_the_median_of_per_repeat_ratios():
    """Interleaved repeats: repeat i of each setting ran back to back, so the ratios pair up. A
    machine that got 1.5x faster between the two repeats: paired ratios 1.05 and 1.05 -> 1.05;
    the ratio of the medians mixes the drift into it."""
    import pytest

    base = {"tokens_per_s": 50.0, "tokens_per_s_runs": [40.0, 60.0]}
    faster = {"tokens_per_s": 52.5, "tokens_per_s_runs": [42.0, 63.0]}
    assert targets.speedup(faster, base, paired=True) == pytest.approx(1.05)
    drifted = {"tokens_per_s": 55.0, "tokens_per_s_runs": [38.0, 72.0]}  # 0.95x, then 1.2x
    assert targets.speedup(drifted, base, paired=True) == pytest.approx((0.95 + 1.2) / 2)
    assert targets.speedup(drifted, base, paired=False) == pytest.approx(1.1)
    assert targets.paired_ratios(drifted, base) == pytest.approx([0.95, 1.2])
    with pytest.raises(ValueError, match="differ in number"):
        targets.speedup({"tokens_per_s_runs": [1.0]}, base, paired=True)


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
        assert targets.adaptive_targets(rows)["dspark_adaptive_within_5pct_of_best_fixed"] is within


def test_block8_acceptance_reads_fixed_rows_and_net_speedup_any_row():
    """dspark on chat at c=1: fixed k=7 accepts 2.1 per verify at 0.9x; adaptive (drafts cut,
    1.6 per verify) runs 1.1x. Block-8 acceptance is the fixed row's (pass), the net speedup
    the best of both (pass); a run with only the adaptive row has no block-8 figure at all."""
    def row(budget, acc, speedup):
        return {"spec": "dspark", "verify_budget": budget, "spec_tokens": 7, "attention": "dense", "kind": "chat",
                "concurrency": 1, "tokens_per_s": 30.0 * speedup, "speedup_vs_none": speedup,
                "mean_acceptance_length": acc, "lossless": True}

    none = {**row("fixed", 0.0, 1.0), "spec": "none", "spec_tokens": 0}
    got = targets.spec_targets([none, row("fixed", 2.1, 0.9), row("adaptive", 1.6, 1.1)])
    assert got["dspark_acceptance_length_chat_block8>=2.0"] is True
    assert got["dspark_net_speedup_chat_c1"] is True and got["all_lossless"] is True
    got = targets.spec_targets([none, row("adaptive", 1.6, 1.1)])
    assert "dspark_acceptance_length_chat_block8>=2.0" not in got and got["dspark_net_speedup_chat_c1"] is True
