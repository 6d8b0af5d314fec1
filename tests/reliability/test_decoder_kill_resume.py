"""kill -9 of the decoder under a live SSE stream of a resumable request (real processes: Redis,
kvtier, the decoder with ``--resumable-requests``, the gateway): the decoder is restarted, the
gateway re-opens the request on it with the tokens already streamed, the restarted decoder claims
the request's committed pages from kvtier instead of computing the prompt again, and the client's
stream ends with exactly the text of an uninterrupted run (no duplicated or missing token) and the
usage of the whole request. Non-resumable requests keep the clean error event
(``test_decoder_kill.py``)."""

from __future__ import annotations

import signal

from tests.reliability.test_stack_faults import assert_pages_all_freed
from tests.serving.resume_stack import MAX_TOKENS, PAGE_SIZE, decoder_stats, prompt_tokens, start_stack, stream


def test_killed_decoder_restarts_and_the_stream_resumes_without_prefill(tmp_path):
    stack = start_stack(tmp_path / "stack", decoder_args=["--resumable-requests"])
    try:
        num_prompt_tokens = prompt_tokens(stack.url)
        assert num_prompt_tokens > 20 * PAGE_SIZE
        reference = stream(stack.url)  # uninterrupted
        assert reference["usage"]["completion_tokens"] == MAX_TOKENS
        killed = []

        def on_event(n: int) -> None:
            if n == 3:
                decoder = stack.processes["decoder"]
                decoder.send_signal(signal.SIGKILL)
                decoder.wait()
                killed.append(n)
                stack.respawn("decoder")  # same identity: it may claim its own requests at once

        result = stream(stack.url, on_event)
        assert killed == [3]
        stats = decoder_stats(stack, stack.decoder_address)  # the restarted decoder
        assert result["text"] == reference["text"]
        assert result["finish_reason"] == "length"
        assert result["usage"] == reference["usage"] == {
            "prompt_tokens": num_prompt_tokens, "completion_tokens": MAX_TOKENS,
            "total_tokens": num_prompt_tokens + MAX_TOKENS}
        # the restarted decoder ran only the resumed request, and computed again at most the last
        # page whose commit the kill cut off plus the tail after it, not the ~400-token prompt
        assert stats.num_resumed_requests == 1 and stats.num_requests_finished == 1
        assert stats.num_prefill_tokens < 2 * PAGE_SIZE
        assert_pages_all_freed(stack)
    finally:
        stack.stop()
