"""benchmarks.spec_peer: transformers' prompt lookup as the speculative peer, side by side."""

import json

from benchmarks import spec_peer
from benchmarks.peers.transformers_hf import greedy
from benchmarks.report import build
from benchmarks.spec_prompts import build_prompts


def test_both_engines_side_by_side_on_a_copy_prompt(loaded_model, hf_oracle):
    """The whole flow on one code-edit prompt: each engine's speculation is lossless (transformers'
    prompt lookup included), our greedy tokens equal transformers' (the oracle), n-gram drafts
    are accepted, and every comparison is computed from the rows."""
    rows = spec_peer.run(loaded_model, hf_oracle, ["code_edit"], [4], num_prompts=1, max_tokens=24, repeats=1)
    assert {(r["engine"], r["setting"]) for r in rows} == {
        ("ours", "none"), ("ours", "ngram:4"), ("ours", "ngram:4:adaptive"),
        ("transformers", "none"), ("transformers", "lookup:4")}
    assert all(r["lossless"] for r in rows)
    assert all(r["outputs_equal_across_engines"] == 1.0 for r in rows)
    assert all(r["tokens"] == 24 for r in rows)
    ours = {r["setting"]: r for r in rows if r["engine"] == "ours"}
    assert ours["ngram:4"]["mean_acceptance_length"] > 1.5  # the answer copies the prompt's code
    comparisons = spec_peer.comparisons(rows)
    assert [c["compare"] for c in comparisons] == ["none", "k=4", "best"]
    k4 = comparisons[1]
    theirs = next(r for r in rows if r["setting"] == "lookup:4")
    assert k4["ratio"] == ours["ngram:4"]["tokens_per_s"] / theirs["tokens_per_s"]


def test_prompt_lookup_peer_equals_plain_greedy_and_stops_at_eos(loaded_model, hf_oracle):
    eos = tuple(loaded_model.config.eos_token_ids)
    tok = loaded_model.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? "
                                                  "Answer in one word."}]), add_special_tokens=False)
    plain = greedy(hf_oracle, prompt, 64, eos)
    assert plain[-1] in eos and len(plain) < 64  # the short answer ends with <|im_end|>
    assert greedy(hf_oracle, prompt, 64, eos, lookup_tokens=8) == plain
    copy = build_prompts(tok, "code_edit", 1)[0]
    assert len(greedy(hf_oracle, copy, 24, eos, lookup_tokens=4)) == 24  # never past max_new_tokens


def test_report_rows(tmp_path):
    def row(engine, setting, k, tok_s, speedup):
        return {"kind": "code_edit", "engine": engine, "setting": setting, "draft_tokens": k, "tokens_per_s": tok_s,
                "speedup_vs_own_none": speedup, "lossless": True, "outputs_equal_across_engines": 0.75}

    rows = [row("ours", "none", 0, 30.0, 1.0), row("ours", "ngram:4", 4, 60.0, 2.0),
            row("ours", "ngram:4:adaptive", 4, 75.0, 2.5),
            row("transformers", "none", 0, 20.0, 1.0), row("transformers", "lookup:4", 4, 40.0, 2.0)]
    (tmp_path / "spec_peer.json").write_text(json.dumps({"rows": rows, "comparisons": spec_peer.comparisons(rows)}))
    lines = build(tmp_path).splitlines()
    name = "speculation vs transformers"
    assert f"| {name} | no speculation vs transformers, code_edit, batch 1 | tok/s | 30 | 20 | 1.5 |  |  |" in lines
    assert (f"| {name} | n-gram vs prompt lookup, k=4 (ngram:4 vs lookup:4), code_edit, batch 1 | tok/s | 60 | 40 | "
            "1.5 |  |  |") in lines
    assert (f"| {name} | best speculative setting (ngram:4:adaptive vs lookup:4), code_edit, batch 1 | tok/s | 75 | "
            "40 | 1.88 |  |  |") in lines
    assert (f"| {name} | speedup over own no-speculation, ngram:4:adaptive vs lookup:4, code_edit, batch 1 | x | "
            "2.5 | 2 | 1.25 |  |  |") in lines
    assert f"| {name} | greedy outputs equal to transformers', code_edit prompts | fraction | 0.75 |  |  |  |  |" in lines
