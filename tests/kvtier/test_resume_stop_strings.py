"""Resuming a request whose stream was cut while text was held back as a possible stop string
(real kvtier process, real weights, engine level like ``test_decoder_resume.py``).

The stop checker streams no text that could be the start of a stop string until it knows. When
the decoder dies at such a moment, the client has fewer characters than the tokens it got spell;
the resume carries that count (``num_streamed_chars``), and the resuming decoder streams exactly
the rest: the held-back text once, when the stop string does not complete, and nothing of it when
it does. The client's text and finish reason equal the uninterrupted run's."""

from __future__ import annotations

import pytest

from dhisparse import LLM, SamplingParams
from tests.decoder.prompts import long_document
from tests.kvtier.test_decoder_host_tier import SMOLLM_LAYOUT

MAX_TOKENS = 40


def a_stop_window(tokenizer, token_ids: list[int], text: str) -> tuple[int, str]:
    """A stretch of the output spanning 3 tokens that occurs nowhere earlier: ``(start, text)``."""
    for first in range(12, 30):
        start, end = len(tokenizer.decode(token_ids[:first])), len(tokenizer.decode(token_ids[:first + 3]))
        window = text[start:end]
        if text.startswith(tokenizer.decode(token_ids[:first + 3])) and window.strip() and text.find(window) == start:
            return start, window
    raise AssertionError(f"no usable stop window in {text!r}")


@pytest.mark.parametrize("completes", [True, False], ids=["stop-string-completes", "stop-string-never-completes"])
def test_resume_streams_exactly_the_held_back_text(loaded_model, kvtier_process, completes):
    kvtier = kvtier_process(**SMOLLM_LAYOUT, host_pool_pages=128, lease_ttl_s=60)
    tokenizer = loaded_model.tokenizer
    prompt = tokenizer.encode(long_document(10))
    plain = LLM(loaded=loaded_model)
    free_run = plain.generate([prompt], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    start, window = a_stop_window(tokenizer, free_run.token_ids, free_run.text)
    stop = window if completes else window + "\u2603"  # the snowman never comes: the prefix is released
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, stop=(stop,))
    reference = plain.generate([prompt], params)[0]
    assert reference.text == (free_run.text[:start] if completes else free_run.text)
    assert reference.finish_reason == ("stop" if completes else "length")

    first = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id="dec-stop",
                resumable_requests=True).engine
    rid = first.add_request(prompt, params, request_id=f"held-{completes}")
    request, streamed = first.requests[rid], ""
    while not (request.stop_checker.num_streamed_chars < len(request.stop_checker.text)):
        assert not request.is_finished, "the run never held text back"
        streamed += "".join(e.text_delta for e in first.step() if e.request_id == rid)
    delivered = list(request.output_ids)
    assert len(streamed) == request.stop_checker.num_streamed_chars < len(request.stop_checker.text)
    assert streamed == reference.text[:len(streamed)]
    first.host_tier.client.stop_heartbeat()  # the decoder dies: no free, no detach, no more calls
    first.host_tier.client._channel.close()

    second = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id="dec-stop").engine
    second.resume_request(rid, prompt, delivered, params, num_streamed_chars=len(streamed))
    rest, reason = "", None
    while second.has_unfinished():
        for event in second.step():
            rest += event.text_delta
            reason = event.finish_reason or reason
    assert streamed + rest == reference.text  # the held-back text once, or not at all after the cut
    assert reason == reference.finish_reason
    assert second.requests[rid].output_ids == reference.token_ids
    second.step()
    stats = second.host_tier.client.stats(check_integrity=True)
    second.close()
    assert stats["integrity_ok"] and stats["num_used_pages"] == 0, stats
