"""Serves one OpenAI completion or chat completion request over a decoder stream.

Routes only parse and hand over; this class validates against the configured limits, builds the
``GenerateRequest``, collects the result (non-streaming) or formats SSE events (streaming), keeps
the metrics, and cancels the generation when the client goes away.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from services.gateway import openai_format as fmt
from services.gateway.config import GatewayConfig
from services.gateway.decoder_client import DecoderClient, DecoderStream
from services.gateway.errors import APIError, invalid_request, model_not_found
from services.gateway.metrics import GatewayMetrics, RequestTimer
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest
from services.rpc import decoder_pb2 as pb

Request = CompletionRequest | ChatCompletionRequest


class GenerationService:
    def __init__(self, config: GatewayConfig, client: DecoderClient, metrics: GatewayMetrics):
        self.config = config
        self.client = client
        self.metrics = metrics

    # ---- request -> GenerateRequest -------------------------------------------------------
    def check_model(self, model: str) -> None:
        if model != self.config.model_name:
            raise model_not_found(model)

    def max_tokens_of(self, req: Request) -> int:
        if isinstance(req, ChatCompletionRequest):
            requested = req.requested_max_tokens
            param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        else:
            requested, param = req.max_tokens, "max_tokens"
        if requested is None:
            return min(self.config.default_max_tokens, self.config.max_tokens_limit)
        if requested > self.config.max_tokens_limit:
            raise invalid_request(f"{param} is {requested}; this server allows at most "
                                  f"{self.config.max_tokens_limit}", param)
        return requested

    def generate_request(self, req: Request, request_id: str) -> pb.GenerateRequest:
        self.check_model(req.model)
        sampling = pb.SamplingParams(
            max_tokens=self.max_tokens_of(req),
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(req.top_k, 0),
            stop=req.stop_list,
            stop_token_ids=req.stop_token_ids or [],
            ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output,
        )
        if req.seed is not None:
            sampling.seed = req.seed
        out = pb.GenerateRequest(request_id=request_id, sampling=sampling,
                                 max_prompt_tokens=self.config.max_prompt_tokens)
        if isinstance(req, ChatCompletionRequest):
            out.messages.CopyFrom(pb.ChatMessages(messages=[pb.ChatMessage(**m) for m in req.template_messages()]))
        else:
            prompt = req.single_prompt
            if isinstance(prompt, str):
                out.text = prompt
            else:  # ids are in uint32 range (schemas)
                out.prompt_token_ids.ids.extend(prompt)
        return out

    # ---- serving ----------------------------------------------------------------------------
    async def _open(self, req: Request) -> tuple[str, DecoderStream, RequestTimer]:
        chat = isinstance(req, ChatCompletionRequest)
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        timer = RequestTimer(self.metrics)
        stream = await self.client.open(self.generate_request(req, response_id), self.config.model_name)
        return response_id, stream, timer

    def _account(self, stream: DecoderStream, chunk: pb.GenerateChunk, timer: RequestTimer) -> None:
        timer.tokens(len(chunk.token_ids))
        self.metrics.generation_tokens.inc(len(chunk.token_ids))
        if chunk.finish_reason:
            self.metrics.prompt_tokens.inc(chunk.usage.prompt_tokens)
            self.metrics.finish(chunk)
            timer.finish()

    async def complete(self, req: Request, is_disconnected: Callable[[], Awaitable[bool]]) -> dict:
        """The whole response body; cancels the generation if the client disconnects first."""
        response_id, stream, timer = await self._open(req)
        collect = asyncio.ensure_future(self._collect(stream, timer))
        try:
            while not collect.done():
                await asyncio.wait([collect], timeout=0.25)
                if not collect.done() and await is_disconnected():
                    collect.cancel()
                    raise asyncio.CancelledError("client disconnected")
            text, last = collect.result()
        finally:
            if not collect.done():
                collect.cancel()
            stream.close()
        if last.finish_reason == "abort":
            raise APIError(503, "the decoder stopped before the request finished", "server_error")
        build = fmt.chat_response if isinstance(req, ChatCompletionRequest) else fmt.completion_response
        return build(response_id, int(time.time()), req.model, text, last.finish_reason,
                     last.usage.prompt_tokens, last.usage.completion_tokens)

    async def _collect(self, stream: DecoderStream, timer: RequestTimer) -> tuple[str, pb.GenerateChunk]:
        parts = []
        async for chunk in stream:
            self._account(stream, chunk, timer)
            parts.append(chunk.text_delta)
            last = chunk
        return "".join(parts), last

    async def stream(self, req: Request) -> AsyncIterator[str]:
        """Opens the generation (raising ``APIError`` before any byte is sent) and returns the SSE
        event iterator. Closing the iterator early (client gone) cancels the generation."""
        response_id, stream, timer = await self._open(req)
        chat = isinstance(req, ChatCompletionRequest)
        formatter = fmt.ChunkFormatter(chat, response_id, int(time.time()), req.model, req.include_usage_in_stream)
        return self._events(stream, formatter, timer)

    async def _events(self, stream: DecoderStream, formatter: fmt.ChunkFormatter,
                      timer: RequestTimer) -> AsyncIterator[str]:
        try:
            if formatter.chat:
                yield formatter.role()
            async for chunk in stream:
                self._account(stream, chunk, timer)
                if chunk.finish_reason == "abort":
                    yield formatter.error(APIError(503, "the decoder stopped before the request finished",
                                                   "server_error").body())
                    break
                if chunk.text_delta and chunk.finish_reason:  # OpenAI ends with a separate empty delta
                    yield formatter.delta(chunk.text_delta)
                    yield formatter.delta("", chunk.finish_reason)
                elif chunk.text_delta or chunk.finish_reason:
                    yield formatter.delta(chunk.text_delta, chunk.finish_reason or None)
                if chunk.finish_reason and formatter.include_usage:
                    yield formatter.usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
            yield fmt.SSE_DONE
        except APIError as exc:
            yield formatter.error(exc.body())
            yield fmt.SSE_DONE
        finally:
            stream.close()
