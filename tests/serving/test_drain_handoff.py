"""Drain hand-off through the gateway (real processes: Redis, kvtier, two decoders, the gateway).

A greedy stream runs on one decoder; that decoder gets SIGTERM (drain timeout 0.3 s) while the
request still has well over 100 tokens to go. At the deadline it leaves the request in kvtier and
ends its stream with "handoff"; the gateway resumes it on the other decoder, which claims the
committed pages from kvtier instead of computing the prompt again. The client sees one stream: the same text as an
uninterrupted run, no token twice or missing, the usage of the whole request."""

from __future__ import annotations

import signal

from dhisparse.stack import free_port
from tests.reliability.test_stack_faults import assert_pages_all_freed
from tests.serving.resume_stack import (
    MAX_TOKENS,
    PAGE_SIZE,
    decoder_stats,
    join_second_decoder,
    prompt_tokens,
    start_stack,
    stream,
)


def test_sigterm_mid_stream_hands_the_request_to_another_decoder(tmp_path):
    stack = start_stack(tmp_path / "stack", decoder_args=["--drain-timeout-s", "0.3"])
    port = free_port()
    b = f"127.0.0.1:{port}"
    log_path = tmp_path / "decoder-b.log"
    process = join_second_decoder(stack, port, log_path, kv_cache_tokens=16384, extra_args=["--drain-timeout-s", "0.3"])
    try:
        num_prompt_tokens = prompt_tokens(stack.url)
        assert num_prompt_tokens > 20 * PAGE_SIZE
        reference = stream(stack.url)  # uninterrupted
        assert reference["usage"]["completion_tokens"] == MAX_TOKENS
        decoders = {"a": (stack.processes["decoder"], stack.decoder_address, tmp_path / "stack" / "decoder.log"),
                    "b": (process, b, log_path)}
        before = {name: decoder_stats(stack, address) for name, (_, address, _) in decoders.items()}
        drained = []

        def on_event(n: int) -> None:
            if n == 3:  # SIGTERM the decoder that serves the request
                running = [name for name, (_, address, _) in decoders.items()
                           if decoder_stats(stack, address).num_running == 1]
                assert len(running) == 1, running
                drained.append(running[0])
                decoders[running[0]][0].send_signal(signal.SIGTERM)

        result = stream(stack.url, on_event)
        gone, = drained
        resumer, = set(decoders) - {gone}
        assert decoders[gone][0].wait(timeout=30) == 0
        after, before = decoder_stats(stack, decoders[resumer][1]), before[resumer]
        gone_log = decoders[gone][2].read_text()
        assert "handed off 1 requests to kvtier, 0 to restart" in gone_log, gone_log[-3000:]
        # one stream, exactly the uninterrupted tokens: nothing repeated, nothing lost
        assert result["text"] == reference["text"]
        assert result["finish_reason"] == "length"
        assert result["usage"] == reference["usage"] == {
            "prompt_tokens": num_prompt_tokens, "completion_tokens": MAX_TOKENS,
            "total_tokens": num_prompt_tokens + MAX_TOKENS}
        # the other decoder resumed it from kvtier: only the tail after the last committed page is
        # computed again: the unsealed page's 0..15 tokens plus the last delivered token, which has no
        # KV yet, so 1..PAGE_SIZE tokens (PAGE_SIZE when the unsealed page held 15)
        assert after.num_resumed_requests - before.num_resumed_requests == 1
        assert after.num_requests_finished - before.num_requests_finished == 1
        assert after.num_prefill_tokens - before.num_prefill_tokens <= PAGE_SIZE
        assert_pages_all_freed(stack)  # the claimed pages were freed when the request finished
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stack.stop()
