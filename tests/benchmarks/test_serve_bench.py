"""Serving benchmark pieces that need no server: workloads, arrivals, the summary maths."""

from __future__ import annotations

import pytest

from benchmarks.serve.load import RequestRecord, percentiles_ms, summarize
from benchmarks.serve.workload import arrival_offsets_s, build_prompts


def test_prompt_sets():
    short = build_prompts("short_chat", 30)
    assert len(short) == 30 and short[0][0]["role"] == "user" and short[0] == short[24]
    docs = build_prompts("long_doc", 2, doc_words=300, seed=1)
    assert len(docs[0][0]["content"].split()) > 300 and docs[0] != docs[1]
    with pytest.raises(ValueError):
        build_prompts("nope", 1)


def test_arrivals():
    assert arrival_offsets_s(3, float("inf")) == [0.0, 0.0, 0.0]
    assert arrival_offsets_s(3, 2.0, "fixed") == [0.0, 0.5, 1.0]
    poisson = arrival_offsets_s(2000, 10.0, "poisson", seed=3)
    assert poisson == sorted(poisson) and 180 < poisson[-1] < 220  # mean gap 0.1 s


def test_summary_percentiles_and_goodput():
    assert percentiles_ms([0.001 * i for i in range(1, 101)])["p50"] == pytest.approx(50.0, abs=1)
    fast = RequestRecord(ok=True, ttft_s=0.1, latency_s=1.0, completion_tokens=10, chunk_gaps_s=[0.1] * 9)
    slow = RequestRecord(ok=True, ttft_s=3.0, latency_s=4.0, completion_tokens=10)
    failed = RequestRecord(ok=False, error="HTTP 503")
    summary = summarize([fast, slow, failed], duration_s=2.0, slo_ttft_ms=1000, slo_tpot_ms=200)
    assert fast.tpot_s == pytest.approx(0.1)
    assert summary["num_ok"] == 2 and summary["output_tokens"] == 20 and summary["output_tokens_per_s"] == 10
    assert summary["goodput_requests_per_s"] == 0.5 and summary["errors"] == ["HTTP 503"]
    assert summary["itl_ms"]["p50"] == pytest.approx(100)
