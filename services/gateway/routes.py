"""HTTP routes: parse, authorize, hand over to ``GenerationService``, translate errors."""

from __future__ import annotations

import contextlib
import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from services.gateway import openapi
from services.gateway.auth import require_api_key
from services.gateway.errors import APIError, body_too_large
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest, parse_request


async def read_body(request: Request) -> bytes:
    """The request body; 413 once it passes ``max_body_bytes`` (declared or streamed)."""
    limit = request.app.state.config.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


api = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
ops = APIRouter()


async def _serve(request: Request, req) -> Response:
    service = request.app.state.generation
    if req.stream:
        events = await service.stream(req)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return JSONResponse(await service.complete(req, request.is_disconnected))


@api.post("/completions", response_model=None, responses=openapi.generate_responses(openapi.CompletionResponse))
async def completions(request: Request) -> Response:
    return await _serve(request, parse_request(CompletionRequest, await read_body(request)))


@api.post("/chat/completions", response_model=None,
          responses=openapi.generate_responses(openapi.ChatCompletionResponse))
async def chat_completions(request: Request) -> Response:
    return await _serve(request, parse_request(ChatCompletionRequest, await read_body(request)))


@api.get("/models", response_model=None, responses=openapi.MODELS_RESPONSES)
async def models(request: Request) -> dict:
    config = request.app.state.config
    return {"object": "list", "data": [{"id": config.model_name, "object": "model",
                                        "created": request.app.state.started, "owned_by": "dhisparse"}]}


@ops.get("/health", response_model=None, responses=openapi.HEALTH_RESPONSES)
async def health(request: Request) -> Response:
    decoders = [d for d in await request.app.state.registry.decoders() if not d.draining]
    body = {"status": "ok" if decoders else "no_decoder", "num_decoders": len(decoders), "time": int(time.time())}
    return JSONResponse(body, status_code=200 if decoders else 503)


@ops.get("/metrics", response_class=PlainTextResponse, responses=openapi.METRICS_RESPONSES)
async def metrics(request: Request) -> Response:
    with contextlib.suppress(APIError):  # Redis down: the per-decoder gauges keep their last read
        await request.app.state.registry.decoders()  # refresh the per-decoder gauges
    return Response(request.app.state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def api_error_handler(request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
