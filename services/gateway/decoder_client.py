"""Async gRPC client of the decoders: opens a Generate stream on the least-loaded healthy decoder.

``open`` routes (``routing.choose_decoder``), starts the stream and waits for its first chunk,
so refusals surface before any HTTP response starts: a decoder that is draining or whose queue is
full is skipped for the next one (up to ``max_attempts``); bad requests become 400s.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

import grpc

from services.gateway.errors import APIError, invalid_request, no_decoder, saturated
from services.gateway.routing import DecoderRegistry, DecoderView, choose_decoder
from services.rpc import decoder_pb2 as pb
from services.rpc import decoder_pb2_grpc as pb_grpc
from services.rpc.auth import InternalSecurity

log = logging.getLogger(__name__)

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE: "unavailable", grpc.StatusCode.RESOURCE_EXHAUSTED: "saturated"}


class DecoderStream:
    """One open Generate stream. Iterate for chunks (the first one already received); ``cancel``
    stops it and frees the request on the decoder."""

    def __init__(self, client: DecoderClient, decoder: DecoderView, request_id: str, call, first: pb.GenerateChunk):
        self.client = client
        self.decoder = decoder
        self.request_id = request_id
        self._call = call
        self._first: pb.GenerateChunk | None = first
        self.finished = bool(first.finish_reason)

    def __aiter__(self):
        return self

    async def __anext__(self) -> pb.GenerateChunk:
        if self._first is not None:
            chunk, self._first = self._first, None
            return chunk
        if self.finished:
            raise StopAsyncIteration
        try:
            chunk = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise APIError(503, f"the decoder failed mid-generation: {exc.details()}", "server_error") from exc
        if chunk is grpc.aio.EOF:
            raise APIError(503, "the decoder ended the stream early", "server_error")
        self.finished = bool(chunk.finish_reason)
        return chunk

    def close(self) -> None:
        """Ends bookkeeping for this stream; cancels it on the decoder if it is unfinished."""
        self.client._release(self.decoder.address)
        if not self.finished:
            self.finished = True
            self._call.cancel()  # the decoder's RPC-done callback aborts the request
            self.client.cancel_soon(self.decoder.address, self.request_id)


class DecoderClient:
    def __init__(self, registry: DecoderRegistry, max_attempts: int = 3, retry_after_s: int = 1,
                 security: InternalSecurity | None = None):
        self.security = security or InternalSecurity()  # the decoders' internal token / TLS
        self.registry = registry
        self.max_attempts = max_attempts
        self.retry_after_s = retry_after_s
        self.in_flight: dict[str, int] = defaultdict(int)  # address -> requests this gateway has open
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.DecoderStub] = {}
        self._background: set[asyncio.Task] = set()

    def stub(self, address: str) -> pb_grpc.DecoderStub:
        if address not in self._stubs:
            self._channels[address] = self.security.aio_channel(address)
            self._stubs[address] = pb_grpc.DecoderStub(self._channels[address])
        return self._stubs[address]

    async def open(self, request: pb.GenerateRequest, model: str | None = None) -> DecoderStream:
        """Starts ``request`` on a decoder. Raises ``APIError``: 400 (refused as invalid),
        429 (every decoder saturated), 503 (none alive)."""
        tried: set[str] = set()
        last_refusal = None
        for _ in range(self.max_attempts):
            try:
                decoder = choose_decoder(await self.registry.decoders(), self.in_flight, model,
                                         frozenset(tried), self.retry_after_s)
            except APIError:
                if last_refusal is None:
                    raise
                break
            tried.add(decoder.address)
            self.in_flight[decoder.address] += 1
            call = self.stub(decoder.address).Generate(request)
            try:
                first = await call.read()
            except grpc.aio.AioRpcError as exc:
                self._release(decoder.address)
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise invalid_request(exc.details()) from None
                last_refusal = _RETRYABLE.get(exc.code(), "unavailable")
                log.warning("decoder %s refused %s: %s %s", decoder.address, request.request_id, exc.code(),
                            exc.details())
                self.registry.invalidate()
                continue
            if first is grpc.aio.EOF:
                self._release(decoder.address)
                last_refusal = "unavailable"
                continue
            return DecoderStream(self, decoder, request.request_id, call, first)
        if last_refusal == "saturated":
            raise saturated(self.retry_after_s)
        raise no_decoder()

    def _release(self, address: str) -> None:
        self.in_flight[address] = max(self.in_flight[address] - 1, 0)

    async def cancel(self, address: str, request_id: str) -> bool:
        try:
            reply = await self.stub(address).Cancel(pb.CancelRequest(request_id=request_id), timeout=5)
        except grpc.aio.AioRpcError as exc:
            log.warning("cancel of %s on %s failed: %s", request_id, address, exc.details())
            return False
        return reply.cancelled

    def cancel_soon(self, address: str, request_id: str) -> None:
        """Sends Cancel without waiting (safe to call from a ``finally`` of a cancelled task)."""
        task = asyncio.get_running_loop().create_task(self.cancel(address, request_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()
