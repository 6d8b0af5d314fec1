"""Async gRPC client of the decoders: opens a Generate stream on the least-loaded healthy decoder.

``open`` routes (``routing.choose_decoder``), starts the stream and waits for its first chunk,
so refusals surface before any HTTP response starts: a decoder that is draining or whose queue is
full is skipped for the next one (up to ``max_attempts``); bad requests become 400s.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable

import grpc

from services.gateway.errors import APIError, invalid_request, no_decoder, saturated
from services.gateway.routing import DecoderRegistry, DecoderView, choose_decoder
from services.rpc import decoder_pb2 as pb
from services.rpc import decoder_pb2_grpc as pb_grpc
from services.rpc.auth import InternalSecurity

log = logging.getLogger(__name__)

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE: "unavailable", grpc.StatusCode.RESOURCE_EXHAUSTED: "saturated"}


HANDOFF = "handoff"  # finish_reason of a stream whose decoder left the request in kvtier


class DecoderStream:
    """One open Generate stream. Iterate for chunks (the first one already received); ``cancel``
    stops it and frees the request on the decoder.

    The stream outlives its decoder: when the decoder hands the request off (drain deadline, a
    chunk with finish_reason "handoff") or its stream breaks (killed, connection reset) while the
    request is resumable, it re-opens the request on a live decoder with ``resume`` set to the
    tokens and text already received (``DecoderClient.reopen``), so the caller sees one stream
    with no token missing or repeated. Without a resumable request, or when no decoder takes it
    within ``resume_timeout_s``, iteration raises ``APIError`` 503 (a clean error event)."""

    def __init__(self, client: DecoderClient, decoder: DecoderView, request: pb.GenerateRequest, call,
                 first: pb.GenerateChunk, model: str | None = None):
        self.client = client
        self.decoder = decoder
        self.request = request
        self.request_id = request.request_id
        self.model = model
        self._call = call
        self._first: pb.GenerateChunk | None = first
        self._holding = True  # counted in client.in_flight[decoder.address]
        self._resume_reason: str | None = None  # set: re-open before reading on
        self.finished = first.finish_reason not in ("", HANDOFF)
        self.output_ids: list[int] = []  # tokens delivered so far (over every decoder)
        self.num_streamed_chars = 0
        self.resumable = False
        self.num_resumes = 0

    def __aiter__(self):
        return self

    async def __anext__(self) -> pb.GenerateChunk:
        while True:
            if self._first is not None:
                chunk, self._first = self._first, None
            elif self.finished:
                raise StopAsyncIteration
            elif self._resume_reason is not None:
                await self._reopen()
                continue
            else:
                try:
                    chunk = await self._call.read()
                except grpc.aio.AioRpcError as exc:
                    self._broken(f"the decoder failed mid-generation: {exc.details()}")
                    continue
                if chunk is grpc.aio.EOF:
                    self._broken("the decoder ended the stream early")
                    continue
            if chunk.finish_reason == HANDOFF:
                self._resume_reason = HANDOFF
                chunk.finish_reason = ""
                self._seen(chunk)
                if chunk.token_ids or chunk.text_delta:
                    return chunk
                continue
            self._seen(chunk)
            self.finished = bool(chunk.finish_reason)
            return chunk

    def _seen(self, chunk: pb.GenerateChunk) -> None:
        self.output_ids.extend(chunk.token_ids)
        self.num_streamed_chars += len(chunk.text_delta)
        self.resumable = self.resumable or chunk.resumable

    def _broken(self, message: str) -> None:
        if not (self.resumable and self.output_ids and self.client.resume_timeout_s > 0):
            raise APIError(503, message, "server_error")
        log.warning("stream of %s on %s broke (%s): resuming elsewhere", self.request_id, self.decoder.address,
                    message)
        self._resume_reason = message

    async def _reopen(self) -> None:
        """Continues the request on a live decoder: with ``resume`` once tokens were delivered, as
        a fresh request when the decoder handed it off before its first token."""
        handed_off = self._resume_reason == HANDOFF
        cause = "handoff" if handed_off else "decoder_lost"
        self.client._release(self.decoder.address)
        self._holding = False
        request = pb.GenerateRequest()
        request.CopyFrom(self.request)
        if self.output_ids:
            request.resume.CopyFrom(pb.ResumeFrom(output_token_ids=self.output_ids,
                                                  num_streamed_chars=self.num_streamed_chars))
        # a draining decoder is out of routing anyway; a killed one may come back at its address
        exclude = frozenset({self.decoder.address}) if handed_off else frozenset()
        try:
            self.decoder, self._call, self._first = await self.client.reopen(request, self.model, exclude)
        except APIError:
            self.client.on_resume(cause, "failed")
            raise
        self.client.on_resume(cause, "resumed")
        self._holding = True
        self._resume_reason = None
        self.num_resumes += 1
        log.info("request %s resumed on %s after %d tokens", self.request_id, self.decoder.address,
                 len(self.output_ids))

    def close(self) -> None:
        """Ends bookkeeping for this stream; cancels it on the decoder if it is unfinished."""
        if self._holding:
            self._holding = False
            self.client._release(self.decoder.address)
        if not self.finished:
            self.finished = True
            self._call.cancel()  # the decoder's RPC-done callback aborts the request
            self.client.cancel_soon(self.decoder.address, self.request_id)


class DecoderClient:
    def __init__(self, registry: DecoderRegistry, max_attempts: int = 3, retry_after_s: int = 1,
                 security: InternalSecurity | None = None, resume_timeout_s: float = 60.0,
                 on_resume: Callable[[str, str], None] = lambda cause, outcome: None, keepalive_s: float = 10.0):
        self.keepalive_s = keepalive_s  # HTTP/2 ping interval and ping timeout of streams to decoders
        self.on_resume = on_resume  # (cause "handoff" | "decoder_lost", outcome "resumed" | "failed")
        self.security = security or InternalSecurity()  # the decoders' internal token / TLS
        self.registry = registry
        self.max_attempts = max_attempts
        self.retry_after_s = retry_after_s
        self.resume_timeout_s = resume_timeout_s  # how long a broken or handed-off stream looks for a decoder
        self.in_flight: dict[str, int] = defaultdict(int)  # address -> requests this gateway has open
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.DecoderStub] = {}
        self._background: set[asyncio.Task] = set()

    def stub(self, address: str) -> pb_grpc.DecoderStub:
        if address not in self._stubs:
            # while a call is open, ping every keepalive_s and drop the connection when a ping is not
            # answered within keepalive_s: a frozen decoder (SIGSTOP, a hung host, a cut network)
            # keeps its TCP connection, and its streams would otherwise hang forever. The broken
            # stream then fails (or resumes elsewhere, if resumable) like a killed decoder's.
            ms = int(self.keepalive_s * 1000)
            self._channels[address] = self.security.aio_channel(address, options=[
                ("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms),
                # every ping's ack deadline (gRPC's own flow-control pings included: 60 s by default,
                # and a keepalive ping waits behind one that is unanswered)
                ("grpc.http2.ping_timeout_ms", ms),
                ("grpc.keepalive_permit_without_calls", 0), ("grpc.http2.max_pings_without_data", 0)])
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
            try:
                call, first = await self._start(decoder, request)
            except grpc.aio.AioRpcError as exc:
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
            return DecoderStream(self, decoder, request, call, first, model)
        if last_refusal == "saturated":
            raise saturated(self.retry_after_s)
        raise no_decoder()

    async def _start(self, decoder: DecoderView, request: pb.GenerateRequest):
        """Starts ``request`` on ``decoder`` and reads its first chunk (counted in ``in_flight``
        unless it raises ``AioRpcError``)."""
        self.in_flight[decoder.address] += 1
        call = self.stub(decoder.address).Generate(request)
        try:
            return call, await call.read()
        except BaseException:  # refused, or the caller was cancelled while waiting
            self._release(decoder.address)
            call.cancel()
            raise

    async def reopen(self, request: pb.GenerateRequest, model: str | None,
                     exclude: frozenset[str] = frozenset()) -> tuple[DecoderView, object, pb.GenerateChunk]:
        """Re-opens a request whose decoder went away (``request.resume`` set once tokens were
        delivered) on any live decoder but ``exclude``, trying every 0.5 s (a killed decoder may be
        restarting; another may claim the request only once the dead one's kvtier lease expired)
        for up to ``resume_timeout_s``. Raises ``APIError`` 503 when none takes it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.resume_timeout_s
        while True:
            self.registry.invalidate()
            try:
                decoder = choose_decoder(await self.registry.decoders(), self.in_flight, model, exclude,
                                         self.retry_after_s)
                call, first = await self._start(decoder, request)
            except APIError as exc:
                reason = exc.message
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise APIError(503, f"the request could not be resumed: {exc.details()}", "server_error") from exc
                reason = f"{exc.code().name}: {exc.details()}"
            else:
                if first is not grpc.aio.EOF:
                    return decoder, call, first
                self._release(decoder.address)
                reason = "the decoder ended the stream at once"
            if loop.time() + 0.5 > deadline:
                raise APIError(503, f"the decoder went away mid-generation and no decoder resumed the request "
                                    f"within {self.resume_timeout_s:g} s ({reason})", "server_error")
            await asyncio.sleep(0.5)

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
