"""The gateway's FastAPI app factory: ``create_app(config)``."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.gateway import openapi
from services.gateway.config import GatewayConfig
from services.gateway.decoder_client import DecoderClient
from services.gateway.errors import APIError, invalid_request
from services.gateway.generation import GenerationService
from services.gateway.metrics import GatewayMetrics
from services.gateway.routes import api, api_error_handler, ops
from services.gateway.routing import DecoderRegistry
from services.metadata.keys import Keys
from services.rpc.auth import InternalSecurity


class _RequestMetricsMiddleware:
    """Counts finished /v1 requests by endpoint and status; tracks requests in flight (until the
    last byte of a streamed response)."""

    def __init__(self, app, metrics: GatewayMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(scope["path"], str(status["code"])).inc()


def create_app(config: GatewayConfig | None = None) -> FastAPI:
    config = config or GatewayConfig()
    redis_client = None
    if config.redis_url:
        import redis.asyncio as aioredis

        redis_client = aioredis.Redis.from_url(config.redis_url)
    registry = DecoderRegistry(redis_client, config.decoder_addresses, config.registry_refresh_s,
                               Keys(config.namespace))
    metrics = GatewayMetrics(registry)
    client = DecoderClient(registry, config.max_decoder_attempts, config.retry_after_s,
                           security=InternalSecurity.of(config), resume_timeout_s=config.resume_timeout_s,
                           on_resume=lambda cause, outcome: metrics.resumes.labels(cause, outcome).inc(),
                           keepalive_s=config.decoder_keepalive_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await client.close()
        if redis_client is not None:
            await redis_client.aclose()

    app = FastAPI(title="dhisparse gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.config = config
    app.state.registry = registry
    app.state.client = client
    app.state.metrics = metrics
    app.state.generation = GenerationService(config, client, metrics)
    app.state.started = int(time.time())
    app.include_router(api)
    app.include_router(ops)
    openapi.install(app)
    app.add_exception_handler(APIError, api_error_handler)

    async def validation_error(request, exc: RequestValidationError):
        return await api_error_handler(request, invalid_request(str(exc.errors()[0].get("msg", exc))))

    async def http_error(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return await api_error_handler(request, APIError(exc.status_code, str(exc.detail), "invalid_request_error",
                                                         None, code))

    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(_RequestMetricsMiddleware, metrics=metrics)
    return app
