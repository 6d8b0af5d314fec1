"""kill -9 of kvtier in the middle of generation: the engine rides out the restart (the new
kvtier re-attaches to the surviving segment) and every output equals the uninterrupted run."""

import threading
import time

from dhisparse import LLM, SamplingParams
from tests.decoder.prompts import SHORT_PROMPTS, long_document
from tests.kvtier.test_decoder_host_tier import SMOLLM_LAYOUT


def test_kvtier_kill9_mid_generation_then_restart_changes_no_token(loaded_model, kvtier_process, llm):
    kv = kvtier_process(**SMOLLM_LAYOUT, instance="crash-e", host_pool_pages=256)
    port = kv.address.rsplit(":", 1)[1]
    tok = loaded_model.tokenizer
    prompts = [tok.encode(long_document(20)), tok.encode(SHORT_PROMPTS[1])]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    reference = [o.token_ids for o in llm.generate(prompts, params)]

    engine = LLM(loaded=loaded_model, kvtier_address=kv.address, decoder_id="dec-k").engine
    ids = [engine.add_request(p, params) for p in prompts]
    while min(len(engine.requests[i].output_ids) for i in ids) < 10:
        engine.step()
    kv.kill9()
    restarted = {}

    def restart_after_a_second():
        time.sleep(1.0)
        restarted["kv"] = kvtier_process(**SMOLLM_LAYOUT, instance="crash-e", host_pool_pages=256, port=port)

    thread = threading.Thread(target=restart_after_a_second)
    thread.start()
    while engine.has_unfinished():
        engine.step()  # the steps during the outage wait in the kvtier call, then go on
    thread.join()
    assert [engine.pop_finished(i).output_ids for i in ids] == reference
    assert restarted["kv"].state == "re-attached"
    assert engine.host_tier.num_kvtier_retries > 0
    engine.step()  # flushes the last frees
    stats = engine.host_tier.client.stats(check_integrity=True)
    engine.close()
    assert stats["integrity_ok"] and stats["num_used_pages"] == 0, stats
