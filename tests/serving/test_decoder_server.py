"""The decoder servicer's translation: proto request -> prompt ids + SamplingParams, outputs -> chunk."""

from __future__ import annotations

import pytest

from services.decoder.engine.sampling_params import InvalidRequestError
from services.decoder.service.output import Output
from services.decoder.service.server import chunk_of, prompt_ids_of, sampling_params_of
from services.rpc import decoder_pb2 as pb


class FakeTokenizer:
    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    def apply_chat_template(self, messages):
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"


def test_prompt_forms():
    tok = FakeTokenizer()
    assert prompt_ids_of(pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[5, 6])), tok) == [5, 6]
    assert prompt_ids_of(pb.GenerateRequest(text="ab"), tok) == [1, 97, 98]
    chat = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="x")]))
    assert prompt_ids_of(chat, tok) == [ord(c) for c in "user:x|assistant:"]  # no BOS: the template has it
    for bad in (pb.GenerateRequest(), pb.GenerateRequest(text=""), pb.GenerateRequest(messages=pb.ChatMessages()),
                pb.GenerateRequest(text="abcd", max_prompt_tokens=3)):
        with pytest.raises(InvalidRequestError):
            prompt_ids_of(bad, tok)


def test_sampling_params():
    params = sampling_params_of(pb.SamplingParams(max_tokens=7, temperature=0.5, stop=["x"], seed=3))
    assert (params.max_tokens, params.temperature, params.top_p, params.stop, params.seed) == (7, 0.5, 1.0, ("x",), 3)
    assert sampling_params_of(pb.SamplingParams()).seed is None
    with pytest.raises(InvalidRequestError):
        sampling_params_of(pb.SamplingParams(temperature=-1))


def test_chunk_merges_outputs():
    timing = {"queue_s": 0.1, "prefill_s": 0.2, "decode_s": 0.3, "num_preemptions": 0, "num_draft_tokens": 8,
              "num_accepted_tokens": 5, "num_verify_steps": 2}
    chunk = chunk_of([Output("r", [4], "a", False, None, 3, 1), Output("r", [5], "b", True, "stop", 3, 2, timing)])
    assert list(chunk.token_ids) == [4, 5] and chunk.text_delta == "ab" and chunk.finish_reason == "stop"
    assert (chunk.usage.prompt_tokens, chunk.usage.completion_tokens) == (3, 2)
    assert chunk.speculation.num_accepted_tokens == 5 and chunk.timing.decode_s == pytest.approx(0.3)
    assert chunk_of([Output("r", [4], "a", False, None, 3, 1)]).finish_reason == ""
