"""The gateway's OpenAPI document: every status a route can answer, with its body schema.

The /v1 POST routes read their raw body themselves (to enforce ``max_body_bytes`` before parsing),
so FastAPI cannot see their request models; ``install(app)`` adds the request bodies from
``schemas`` to the generated document. The response models here are documentation only: the
bodies are built in ``openai_format`` and ``errors``, and tests check them against this document
(``tests/reliability/test_gateway_fuzz.py``).
"""

from __future__ import annotations

from typing import Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from services.gateway.schemas import ChatCompletionRequest, CompletionRequest


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str
    refusal: None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "no_decoder"]
    num_decoders: int
    time: int


def _error(description: str, headers: dict | None = None) -> dict:
    out: dict = {"model": ErrorResponse, "description": description}
    if headers:
        out["headers"] = headers
    return out


_UNAUTHORIZED = {401: _error("missing or wrong Bearer API key (only when keys are configured)")}
# One server-sent event (OpenAPI < 3.2: the schema of a text/event-stream describes each event).
_SSE = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a chunk's JSON, an error body, or [DONE] last"},
                   "event": {"type": "string", "const": "message"}},
}}}


def generate_responses(model: type[BaseModel]) -> dict:
    """Responses of /v1/completions and /v1/chat/completions (``model``: the 200 JSON body)."""
    return {
        200: {"model": model, "content": _SSE, "description": "the completion; an SSE stream when stream is true"},
        400: _error("invalid request: bad JSON, wrong types, out-of-range or unsupported parameters"),
        **_UNAUTHORIZED,
        404: _error("unknown model"),
        413: _error("body larger than max_body_bytes"),
        429: _error("every decoder is at capacity",
                    {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}),
        503: _error("no decoder available, or it stopped before the request finished"),
    }


MODELS_RESPONSES = {200: {"model": ModelList}, **_UNAUTHORIZED}
HEALTH_RESPONSES = {200: {"model": Health}, 503: {"model": Health, "description": "no decoder available"}}
METRICS_RESPONSES = {200: {"description": "Prometheus text format"}}

REQUEST_BODIES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}


def install(app: FastAPI) -> None:
    """Makes ``app.openapi()`` include the request bodies of the /v1 POST routes."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = doc.setdefault("components", {}).setdefault("schemas", {})
            for path, model in REQUEST_BODIES.items():
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(schema.pop("$defs", {}))
                components[model.__name__] = schema
                doc["paths"][path]["post"]["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
                }
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
