"""Serving fixtures: one real stack per session (embedded Redis, kvtier when runnable, a decoder
and the gateway as separate processes, on free ports) and the in-process reference ``LLM``.

Start-up costs ~10 s on 2 shared cores (the decoder loads the model); the reference LLM ~5 s.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

API_KEY = "test-key"
MODEL = "SmolLM2-135M-Instruct"
MAX_BODY_BYTES = 64 * 1024
MAX_TOKENS_LIMIT = 512
MAX_PROMPT_TOKENS = 12288  # the gateway's limit; above the model's context (8192), so both can be hit


@pytest.fixture(scope="session")
def stack():
    from dhisparse.stack import LocalStack, StackOptions, free_port
    from services.decoder.model.model_store import pull_default_model

    pull_default_model(progress=lambda _msg: None)
    options = StackOptions(
        gateway_port=free_port(), decoder_port=free_port(), kvtier_port=free_port(), kvtier_pool_gib=0.05,
        api_keys=[API_KEY],
        # One intra-op thread: the machine has 2 shared cores, and 2-thread OpenMP regions stall badly
        # when another process holds a core; the reference below runs with 1 thread too (same numerics).
        decoder_args=["--kv-cache-tokens", "16384", "--max-num-seqs", "16", "--threads", "1"],
        gateway_args=["--max-body-bytes", str(MAX_BODY_BYTES), "--max-tokens-limit", str(MAX_TOKENS_LIMIT),
                      "--max-prompt-tokens", str(MAX_PROMPT_TOKENS)],
    )
    local = LocalStack(options).start(log=lambda _msg: None)
    yield local
    local.stop()


@pytest.fixture(scope="session")
def client(stack):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def reference_llm():
    """The in-process engine with the decoder's default settings: the oracle for greedy output."""
    from dhisparse import LLM

    with one_thread():
        return LLM()


@pytest.fixture(scope="session")
def reference(reference_llm):
    """``reference(prompt, max_tokens, chat=False, stop=())`` -> the in-process ``RequestOutput``
    (greedy, one intra-op thread like the stack's decoder; the process's thread count is restored)."""
    from dhisparse import SamplingParams

    def run(prompt, max_tokens, chat=False, stop=()):
        prompts = [prompt] if chat or not isinstance(prompt, str) else prompt  # one message / id list
        with one_thread():
            return reference_llm.generate(prompts, SamplingParams(max_tokens=max_tokens, stop=tuple(stop)),
                                          chat=chat)[0]

    return run


@contextlib.contextmanager
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def decoder_stats(stack):
    """A function returning the decoder's Stats (gRPC)."""
    from services.rpc import decoder_pb2 as pb
    from services.rpc import decoder_pb2_grpc as pb_grpc

    channel = stack.security.channel(stack.decoder_address)  # the stack's internal token
    stub = pb_grpc.DecoderStub(channel)
    yield lambda: stub.Stats(pb.StatsRequest(), timeout=5)
    channel.close()
