"""Engines per budget and the teacher-forced decode driver that measures perplexity."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


# ---------------------------------------------------------------------------------------------
@dataclass
class Settings:
    budgets: list[int] = field(default_factory=lambda: [512, 1024, 2048])
    sink_pages: int = 1
    recent_pages: int = 4
    page_score: str = "center"  # kernels.page_select score: "center" | "quest"
    ppl_windows: list[int] = field(default_factory=lambda: [4096, 8192])
    ppl_documents: int = 4
    ppl_scored_tokens: int = 256
    greedy_window: int = 8192
    greedy_documents: int = 2
    greedy_tokens: int = 256
    passkey_contexts: list[int] = field(default_factory=lambda: [2048, 4096, 8192])
    passkey_depths: list[float] = field(default_factory=lambda: [0.1, 0.5, 0.9])
    passkey_tokens: int = 12
    max_num_batched_tokens: int = 2048
    threads: int = torch.get_num_threads()


QUICK = dict(
    budgets=[128, 256],
    ppl_windows=[1024],
    ppl_documents=1,
    ppl_scored_tokens=24,
    greedy_window=1024,
    greedy_documents=1,
    greedy_tokens=16,
    passkey_contexts=[1024],
    passkey_depths=[0.5],
    passkey_tokens=8,
    max_num_batched_tokens=1024,
)


def make_llm(loaded, settings: Settings, budget: int | None, max_tokens_in_flight: int):
    from dhisparse import LLM

    page = 16
    kv_tokens = max(16384, -(-(max_tokens_in_flight + 2 * page) // page) * page, 8192 + page)
    kwargs = dict(loaded=loaded, max_num_batched_tokens=settings.max_num_batched_tokens, kv_cache_tokens=kv_tokens)
    if budget is not None:
        kwargs.update(attention="sparse", top_k_tokens=budget, sink_pages=settings.sink_pages,
                      recent_pages=settings.recent_pages, page_score=settings.page_score)
    return LLM(**kwargs)


def reset_counters(llm) -> None:
    attention = llm.engine.runner.attention
    attention.num_selected_pages = 0
    attention.num_context_pages = 0


def selection_ratio(llm) -> float | None:
    attention = llm.engine.runner.attention
    if attention.num_context_pages == 0:
        return None
    return attention.num_selected_pages / attention.num_context_pages


def teacher_forced_nll(llm, docs: list[list[int]], scored: int) -> list[dict]:
    """Scores the last ``scored`` tokens of every document, each predicted by a one-token decode
    step over the true preceding text. Returns per document ``{"nll": sum, "tokens": n, "argmax_hits": k}``."""
    from dhisparse import SamplingParams

    engine = llm.engine
    model_forward = engine.model.forward
    build_inputs = engine.runner.build_inputs
    step_rows: list[tuple[object, int]] = []  # (request, input position) per logit row, this step
    step_logits: list[torch.Tensor] = []

    def recording_build_inputs(batch):
        input_ids, meta, ordered = build_inputs(batch)
        step_rows.clear()
        for sched in ordered:
            if sched.samples:
                step_rows.append((sched.request, sched.request.num_computed_tokens + sched.num_new_tokens - 1))
        return input_ids, meta, ordered

    def recording_forward(*args, **kwargs):
        logits = model_forward(*args, **kwargs)
        step_logits.clear()
        step_logits.append(logits)
        return logits

    engine.runner.build_inputs = recording_build_inputs
    engine.model.forward = recording_forward
    try:
        by_id = {}
        for i, doc in enumerate(docs):
            prompt = doc[: len(doc) - scored - 1]
            rid = engine.add_request(prompt, SamplingParams(max_tokens=scored + 1, ignore_eos=True), f"ppl-{i}")
            by_id[rid] = {"doc": doc, "prompt_len": len(prompt), "nll": 0.0, "tokens": 0, "argmax_hits": 0}
        while engine.has_unfinished():
            step_rows.clear()
            step_logits.clear()
            engine.step()
            if not step_rows:
                continue
            logits = step_logits[0]
            for row, (request, pos) in enumerate(step_rows):
                rec = by_id[request.request_id]
                doc = rec["doc"]
                target = doc[pos + 1]
                if pos >= rec["prompt_len"]:
                    lp = torch.log_softmax(logits[row].double(), dim=-1)
                    rec["nll"] += float(-lp[target])
                    rec["tokens"] += 1
                    rec["argmax_hits"] += int(int(torch.argmax(logits[row])) == target)
                if request.output_ids:
                    request.output_ids[-1] = target  # teacher forcing: feed the true token next
        for rid in by_id:
            if engine.pop_finished(rid).stats.num_preemptions:
                raise RuntimeError("a request was preempted (recomputed densely): raise kv_cache_tokens")
    finally:
        engine.runner.build_inputs = build_inputs
        engine.model.forward = model_forward
    return [{k: v for k, v in rec.items() if k not in ("doc",)} for rec in by_id.values()]
