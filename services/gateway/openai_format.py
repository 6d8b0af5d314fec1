"""OpenAI response bodies and SSE framing for completions and chat completions.

Streaming wire format (as OpenAI sends it): each event is ``data: <json>\\n\\n``; the stream ends
with ``data: [DONE]\\n\\n``. With ``stream_options.include_usage`` every chunk carries
``"usage": null`` and one extra chunk with ``"choices": []`` and the usage comes before [DONE].
"""

from __future__ import annotations

import json

SSE_DONE = "data: [DONE]\n\n"


def sse_event(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_response(response_id: str, created: int, model: str, text: str, finish_reason: str,
                        prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "id": response_id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chat_response(response_id: str, created: int, model: str, text: str, finish_reason: str,
                  prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "id": response_id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage(prompt_tokens, completion_tokens),
    }


class ChunkFormatter:
    """Builds the SSE events of one streamed response (completion or chat)."""

    def __init__(self, chat: bool, response_id: str, created: int, model: str, include_usage: bool):
        self.chat = chat
        self.response_id = response_id
        self.created = created
        self.model = model
        self.include_usage = include_usage

    def _chunk(self, choices: list[dict]) -> dict:
        chunk = {"id": self.response_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def role(self) -> str:
        """Chat only: the first chunk, announcing the assistant role."""
        return sse_event(self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None}]))

    def delta(self, text: str, finish_reason: str | None = None) -> str:
        if self.chat:
            choice = {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return sse_event(self._chunk([choice]))

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        chunk = self._chunk([])
        chunk["usage"] = usage(prompt_tokens, completion_tokens)
        return sse_event(chunk)

    @staticmethod
    def error(body: dict) -> str:
        return sse_event(body)
