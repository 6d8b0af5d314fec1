"""dhisparse: long-context LLM serving over a sparse, tiered KV cache."""

from services.decoder.engine.llm import LLM, RequestOutput
from services.decoder.engine.sampling_params import InvalidRequestError, SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams", "InvalidRequestError"]
