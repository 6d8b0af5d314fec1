"""Offline Python API in the spirit of vLLM: ``LLM(...).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.decoder.config import DecoderConfig
from services.decoder.engine.engine import Engine, TokenEvent
from services.decoder.engine.sampling_params import InvalidRequestError, SamplingParams
from services.decoder.model.loader import LoadedModel


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated ids only
    text: str
    finish_reason: str
    stats: dict


class LLM:
    def __init__(self, model: str | None = None, loaded: LoadedModel | None = None, **config_fields):
        config = DecoderConfig(model=model, **config_fields)
        self.engine = Engine(config, loaded=loaded)
        self.tokenizer = self.engine.tokenizer

    def encode_prompt(self, prompt: str | Sequence[int] | list[dict], chat: bool = False) -> list[int]:
        """Text, token ids, or (with ``chat``) a message list / a user message string -> ids."""
        if chat:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            return self.tokenizer.encode(self.tokenizer.apply_chat_template(messages), add_special_tokens=False)
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt is empty")
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        chat: bool = False,
        on_event: Callable[[TokenEvent], None] | None = None,
    ) -> list[RequestOutput]:
        """Runs every prompt to completion with continuous batching; outputs in input order.
        All prompts are validated before any is queued."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise InvalidRequestError("got a different number of prompts and sampling params")
        encoded = [self.encode_prompt(p, chat=chat) for p in prompts]
        for ids in encoded:
            if not ids:
                raise InvalidRequestError("prompt is empty")
        request_ids: list[str] = []
        try:
            for ids, p in zip(encoded, params_list):
                request_ids.append(self.engine.add_request(ids, p))
        except InvalidRequestError:
            for rid in request_ids:
                self.engine.abort(rid)
                self.engine.pop_finished(rid)
            raise
        self.engine.run_until_done(on_event)
        outputs = []
        for rid in request_ids:
            request = self.engine.pop_finished(rid)
            outputs.append(
                RequestOutput(
                    request_id=rid,
                    prompt_token_ids=request.prompt_ids,
                    token_ids=request.output_ids,
                    text=request.text,
                    finish_reason=request.finish_reason,
                    stats=request.stats.as_dict(len(request.output_ids)),
                )
            )
        return outputs
