"""What a request's handle receives from the engine loop each step: ``Output``, with the
request's KV residency after the step and, on the final one, its timing and speculation totals."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Output:
    """What the engine produced for one request in one step (or its end)."""

    request_id: str
    token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int  # cumulative
    timing: dict | None = None  # on the final output: ``finished_stats``
    residency: dict | None = None  # ``residency_stats`` of the request after this step
    resumable: bool = False  # the request's pages outlive this decoder in kvtier


def residency_stats(request, bytes_per_page: int, num_layers: int) -> dict:
    """The request's KV residency: mode, hot pages held (pinned + SPARSE buffer), buffer hits and
    misses (summed over layers), bytes copied host -> hot and hot -> host so far."""
    stats = request.stats
    fetched = stats.num_buffer_misses * (bytes_per_page // num_layers) + stats.num_swapped_in_pages * bytes_per_page
    return {"mode": request.mode.value, "num_hot_pages": len(request.hot_slots()), "num_hot_hits": stats.num_buffer_hits,
            "num_hot_misses": stats.num_buffer_misses, "num_bytes_fetched": fetched,
            "num_bytes_written": request.num_host_pages * bytes_per_page}


def finished_stats(stats, num_output_tokens: int) -> dict:
    """Timing and speculation totals of a finished request (``RequestStats`` fields; absent ones 0)."""
    timing = stats.as_dict(num_output_tokens)
    return {
        "queue_s": timing.get("queue_s", 0.0), "prefill_s": timing.get("prefill_s", 0.0),
        "decode_s": timing.get("decode_s", 0.0), "num_preemptions": int(timing.get("num_preemptions", 0)),
        "num_draft_tokens": int(getattr(stats, "drafted_tokens", 0)),
        "num_accepted_tokens": int(getattr(stats, "accepted_tokens", 0)),
        "num_verify_steps": int(getattr(stats, "num_verify_steps", 0)),
        "num_prefill_tokens": int(getattr(stats, "num_prefill_tokens", 0)),
    }
