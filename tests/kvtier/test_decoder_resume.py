"""A decoder that dies mid-request and is restarted resumes from its kvtier pages: no second
prefill, the same greedy tokens as the uninterrupted run without speculation (real kvtier
process, real weights), also when both decoders speculate (the resumed request's drafter starts
from the recomputed tail only: what it drafts changes, the tokens do not)."""

import pytest

from dhisparse import LLM, InvalidRequestError, SamplingParams
from tests.decoder.prompts import long_document
from tests.kvtier.test_decoder_host_tier import SMOLLM_LAYOUT


@pytest.mark.parametrize(("attention", "spec"), [("dense", "none"), ("sparse", "none"), ("dense", "dflash"),
                                                  ("sparse", "ngram")])
def test_restarted_decoder_resumes_without_a_second_prefill(loaded_model, kvtier_process, llm, attention, spec):
    kvtier = kvtier_process(**SMOLLM_LAYOUT, host_pool_pages=256, lease_ttl_s=60)
    settings = dict(attention=attention, top_k_tokens=64, sink_pages=1, recent_pages=2)
    prompt = loaded_model.tokenizer.encode(long_document(30))
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    reference = LLM(loaded=loaded_model, **settings).generate([prompt], params)[0].token_ids
    settings.update(spec=spec, spec_tokens=7)

    first = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id="dec-r", resumable_requests=True,
                **settings).engine
    rid = first.add_request(prompt, params, request_id="conv-1")
    while len(first.requests[rid].output_ids) < 17:
        first.step()
    delivered = list(first.requests[rid].output_ids)
    assert first.requests[rid].stats.num_prefill_tokens == len(prompt)
    first.host_tier.client.stop_heartbeat()  # the decoder dies: no free, no detach, no more calls
    first.host_tier.client._channel.close()

    # restarted with its identity (another decoder may claim only once the lease has expired)
    second = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id="dec-r", **settings).engine
    with pytest.raises(InvalidRequestError, match="cannot resume"):
        second.resume_request("no-such-request", prompt, [], params)
    second.resume_request(rid, prompt, delivered, params)
    request = second.requests[rid]
    assert request.num_computed_tokens >= len(prompt) - 16  # whole pages came back from the host
    while second.has_unfinished():
        second.step()
    assert request.output_ids == reference
    # no second prefill: only the tail after the last written-back page is recomputed, the unsealed
    # page's 0..15 tokens plus the last delivered token (no KV yet): at most one page
    assert request.stats.num_prefill_tokens <= second.config.page_size
    assert request.stats.num_swapped_in_pages > 0
    if spec != "none":
        assert request.stats.num_verify_steps > 0  # the resumed request did speculate
    second.step()
    stats = second.host_tier.client.stats(check_integrity=True)
    second.close()
    assert stats["integrity_ok"] and stats["num_used_pages"] == 0, stats
