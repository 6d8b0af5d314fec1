"""The speculative-decoding benchmark's targets (issue #5) and its paired speedups, over the
rows ``benchmarks/spec.py`` writes: each row one setting at one attention, prompt kind and
concurrency, with ``speedup_vs_none`` and, for paired (interleaved or lockstep) runs, the
per-repeat ``tokens_per_s_runs``."""

from __future__ import annotations

import math
import statistics

from services.decoder.spec.drafter import LEARNED_DRAFTERS


def spec_targets(rows: list[dict]) -> dict[str, bool]:
    """The issue's targets over a run's rows: lossless everywhere, n-gram >= 1.5x on copy-heavy
    prompts at c=1, each learned drafter's block-8 acceptance on chat (fixed k=7 rows) and its net
    speedup at c=1 (any length or budget), and ``adaptive_targets``."""
    copy_c1 = [r for r in rows if r["kind"] == "code_edit" and r["concurrency"] == 1 and r["spec"] == "ngram"]
    targets = {"all_lossless": all(r["lossless"] for r in rows)}
    if copy_c1:
        targets["ngram_speedup_copy_heavy_c1>=1.5"] = max(r["speedup_vs_none"] for r in copy_c1) >= 1.5
    for drafter in LEARNED_DRAFTERS:
        # block 8 = 7 drafted tokens verified whole: fixed rows (an adaptive row's drafts are cut)
        chat = [r for r in rows if r["spec"] == drafter and r["kind"] == "chat" and r["spec_tokens"] == 7
                and r["verify_budget"] == "fixed"]
        if chat:
            targets[f"{drafter}_acceptance_length_chat_block8>=2.0"] = min(r["mean_acceptance_length"] for r in chat) >= 2.0
        c1 = [r for r in rows if r["spec"] == drafter and r["kind"] == "chat" and r["concurrency"] == 1]
        if c1:  # any draft length or budget of this drafter
            targets[f"{drafter}_net_speedup_chat_c1"] = max(r["speedup_vs_none"] for r in c1) > 1.0
    targets.update(adaptive_targets(rows))
    return targets


def speedup(figures: dict, base: dict, paired: bool, key: str = "tokens_per_s") -> float:
    """``figures``' tok/s (``key``: end-to-end, or ``decode_tokens_per_s``) over ``base``'s.
    Paired (interleaved repeats: repeat i of every setting ran back to back): the median of the
    per-repeat ratios, which the machine's slow drift (+-10% between repeats on 2 shared cores)
    moves far less than a ratio of medians; otherwise the ratio of the median tok/s."""
    if paired:
        return statistics.median(paired_ratios(figures, base, key))
    return figures[key] / base[key]


def paired_ratios(figures: dict, base: dict, key: str = "tokens_per_s") -> list[float]:
    """Repeat i's tok/s over ``base``'s repeat i, for interleaved repeats (the spread that
    ``speedup``'s median is taken over: what a reader needs to judge a margin of a few %)."""
    runs, base_runs = figures[f"{key}_runs"], base[f"{key}_runs"]
    if len(runs) != len(base_runs):
        raise ValueError(f"paired repeats differ in number: {len(runs)} vs {len(base_runs)}")
    return [a / b for a, b in zip(runs, base_runs)]


def _group(row: dict) -> tuple:
    """The attention, kind and concurrency a row's setting ran at (what its speedups compare within)."""
    return row.get("attention", "dense"), row["kind"], row["concurrency"]


def versus_best_fixed(row: dict, rows: list[dict]) -> tuple[dict, float] | None:
    """The fixed-length row of ``row``'s drafter, attention, kind and concurrency with the best
    speedup, and ``row``'s speedup over it (paired when both are, see ``speedup``); None when
    ``rows`` has no such fixed row."""
    fixed = [f for f in rows if f["spec"] == row["spec"] and _group(f) == _group(row)
             and f.get("verify_budget", "fixed") == "fixed"]
    if not fixed:
        return None
    best = max(fixed, key=lambda f: f["speedup_vs_none"])
    return best, speedup(row, best, row.get("paired", False) and best.get("paired", False))


def aa_band(row: dict, rows: list[dict]) -> float:
    """How far below 1 an adaptive row of ``row``'s group may read and still count as no slower
    than no speculation: the noise of the run's A/A control, a second ``none`` setting in the
    same run (``--settings none,...,none``), whose speedup over the first is the same statistic as
    every other row's with nothing to measure but noise. 0 when the run has none.

    The band is the larger of the A/A's distance from 1 and two standard errors of a median of
    its paired repeat ratios (``1.2533 * stdev / sqrt(repeats)``). The distance alone is one
    draw of that noise: an adaptive engine identical to none reads below 1 - |A/A - 1| one run in
    four, and an A/A that lands on 1.000 (dense chat c=16: repeats 0.998-1.003) called a
    never-drafting engine at 0.998 slower than none. At c=16 on dense chat, the drafters'
    adaptive rows read 0.998-1.001 over 4 lockstep repeats where identical engines read 0.99-1.02
    repeat by repeat, so a strict ``>= 1`` called noise a failure."""
    nones = [r for r in rows if r["spec"] == "none" and _group(r) == _group(row)]
    band = 0.0
    for control in nones[1:]:
        band = max(band, abs(1.0 - control["speedup_vs_none"]))
        repeats = control.get("speedup_runs") or []
        if len(repeats) >= 2:
            band = max(band, 2 * 1.2533 * statistics.stdev(repeats) / math.sqrt(len(repeats)))
    return band


def adaptive_targets(rows: list[dict]) -> dict[str, bool]:
    """Per drafter with adaptive rows: never below no speculation (every adaptive row's speedup
    >= 1, less the same run's A/A band where it has one: ``aa_band``), and within 5% of the best
    fixed length of the same drafter at the same attention, kind and concurrency (where the run
    has fixed rows to compare with; paired rows compare their repeats pairwise, see ``speedup``)."""
    targets = {}
    for drafter in sorted({r["spec"] for r in rows if r["verify_budget"] == "adaptive"}):
        adaptive = [r for r in rows if r["spec"] == drafter and r["verify_budget"] == "adaptive"]
        targets[f"{drafter}_adaptive_never_below_none"] = all(
            r["speedup_vs_none"] >= 1.0 - aa_band(r, rows) for r in adaptive)
        versus = [versus_best_fixed(r, rows) for r in adaptive]
        within = [ratio >= 0.95 for _best, ratio in filter(None, versus)]
        if within:
            targets[f"{drafter}_adaptive_within_5pct_of_best_fixed"] = all(within)
    return targets
