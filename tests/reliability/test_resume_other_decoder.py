"""kill -9 of a decoder under a live SSE stream of a resumable request, and the decoder is NOT
restarted (real processes: Redis, kvtier, two decoders with ``--resumable-requests``, the gateway;
kvtier's lease TTL shortened to 3 s through its environment variable).

The gateway's read fails; it retries the request with ``resume`` every 0.5 s. The other decoder
may claim the request's kvtier pages only once the dead decoder's kvtier lease has run out (until
then kvtier refuses the claim: "owned by live decoder"), so the stream resumes there after about
one lease TTL, without computing the prompt again, and the client's text and usage equal the
uninterrupted run's."""

from __future__ import annotations

import signal
import time

from dhisparse.stack import free_port
from tests.reliability.test_stack_faults import assert_pages_all_freed, kvtier_stats
from tests.serving.resume_stack import (
    MAX_TOKENS,
    PAGE_SIZE,
    decoder_stats,
    join_second_decoder,
    prompt_tokens,
    start_stack,
    stream,
)

LEASE_TTL_S = 3.0
ENV = {"DHISPARSE_KVTIER_LEASE_TTL_S": str(LEASE_TTL_S), "DHISPARSE_DECODER_HEARTBEAT_INTERVAL_S": "0.5",
       "DHISPARSE_DECODER_HEARTBEAT_TTL_S": "2", "DHISPARSE_DECODER_RESUMABLE_REQUESTS": "true"}


def test_a_killed_decoders_request_resumes_on_another_decoder_after_its_lease_expired(tmp_path):
    stack = start_stack(tmp_path / "stack", env=ENV)  # decoder A: resumable through ENV
    port = free_port()
    b_address = f"127.0.0.1:{port}"
    b_log = tmp_path / "decoder-b.log"
    b = join_second_decoder(stack, port, b_log)
    try:
        num_prompt_tokens = prompt_tokens(stack.url)
        assert num_prompt_tokens > 20 * PAGE_SIZE
        reference = stream(stack.url)  # uninterrupted
        assert reference["usage"]["completion_tokens"] == MAX_TOKENS
        decoders = {stack.decoder_address: stack.processes["decoder"], b_address: b}
        before = {address: decoder_stats(stack, address) for address in decoders}
        killed = {}

        def on_event(n: int) -> None:
            if n == 3:  # kill -9 the decoder that serves the request; nobody restarts it
                running = [a for a in decoders if decoder_stats(stack, a).num_running == 1]
                assert len(running) == 1, running
                pages = kvtier_stats(stack)
                assert pages.num_requests == 1 and pages.num_used_pages > 20, pages
                process = decoders[running[0]]
                process.send_signal(signal.SIGKILL)
                process.wait()
                killed["address"], killed["at"] = running[0], time.monotonic()

        result = stream(stack.url, on_event)  # fails on an error event
        resumed_s = time.monotonic() - killed["at"]
        (resumer,) = set(decoders) - {killed["address"]}
        after = decoder_stats(stack, resumer)
        # one stream, exactly the uninterrupted tokens and usage
        assert result["text"] == reference["text"]
        assert result["finish_reason"] == "length"
        assert result["usage"] == reference["usage"] == {
            "prompt_tokens": num_prompt_tokens, "completion_tokens": MAX_TOKENS,
            "total_tokens": num_prompt_tokens + MAX_TOKENS}
        # the other decoder claimed the pages (only the tail after the last committed page, plus at
        # most the page whose commit the kill cut off, is computed again) ...
        assert after.num_resumed_requests - before[resumer].num_resumed_requests == 1
        assert after.num_requests_finished - before[resumer].num_requests_finished == 1
        assert after.num_prefill_tokens - before[resumer].num_prefill_tokens <= 2 * PAGE_SIZE
        # ... only after the dead decoder's lease ran out (until then kvtier refuses the claim and
        # the gateway retries), and the expiry left the resumable request in kvtier for the claim
        assert resumed_s > LEASE_TTL_S - 0.5, resumed_s
        killed_id = "decoder-b" if killed["address"] == b_address else f"decoder-{stack.options.instance}"
        kvtier_log = (tmp_path / "stack" / "kvtier.log").read_text(errors="replace")
        assert f"lease of decoder '{killed_id}' expired: freed 0 requests" in kvtier_log, kvtier_log
        gateway_log = (tmp_path / "stack" / "gateway.log").read_text(errors="replace")
        assert "resuming elsewhere" in gateway_log
        assert_pages_all_freed(stack)  # the resumer freed the claimed pages when the request finished
        assert kvtier_stats(stack).num_live_decoders == 1
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()
        stack.stop()
