"""The decoder's gRPC adapter: translates proto messages to ``EngineLoop`` calls and back.

``serve(config)`` loads the engine, starts the loop, the gRPC server and (with ``redis_url``) the
Redis heartbeat, and on SIGTERM/SIGINT drains: it stops admitting, tells gateways (heartbeat
``draining``), lets in-flight requests finish for up to ``drain_timeout_s``, hands the rest off
to kvtier (their streams end with finish_reason "handoff"; a gateway resumes them elsewhere with
``GenerateRequest.resume``), then exits.
"""

from __future__ import annotations

import logging
import queue
import re
import signal
import socket
import threading
import time
import uuid
from concurrent import futures

import grpc

from services.decoder.config import DecoderConfig
from services.decoder.engine.sampling_params import InvalidRequestError, SamplingParams
from services.decoder.model.tokenizer import Tokenizer
from services.decoder.service.engine_loop import DrainingError, EngineLoop, QueueFullError, Resume
from services.decoder.service.output import Output
from services.rpc import decoder_pb2 as pb
from services.rpc import decoder_pb2_grpc as pb_grpc
from services.rpc.auth import InternalSecurity

log = logging.getLogger(__name__)


def prompt_ids_of(request: pb.GenerateRequest, tokenizer: Tokenizer) -> list[int]:
    """Token ids of the request's prompt (ids as given, text encoded, chat messages templated)."""
    which = request.WhichOneof("prompt")
    if which == "prompt_token_ids":
        ids = list(request.prompt_token_ids.ids)
    elif which == "text":
        if not request.text:
            raise InvalidRequestError("prompt is empty")
        ids = tokenizer.encode(request.text)
    elif which == "messages":
        messages = [{"role": m.role, "content": m.content} for m in request.messages.messages]
        if not messages:
            raise InvalidRequestError("messages is empty")
        try:
            ids = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from exc
    else:
        raise InvalidRequestError("a prompt is required (prompt_token_ids, text or messages)")
    if request.max_prompt_tokens and len(ids) > request.max_prompt_tokens:
        raise InvalidRequestError(
            f"the prompt has {len(ids)} tokens; this server accepts at most {request.max_prompt_tokens}")
    return ids


def sampling_params_of(proto: pb.SamplingParams) -> SamplingParams:
    return SamplingParams(
        max_tokens=proto.max_tokens or 16,
        temperature=proto.temperature,
        top_p=proto.top_p or 1.0,
        top_k=proto.top_k,
        seed=proto.seed if proto.HasField("seed") else None,
        stop=tuple(proto.stop),
        stop_token_ids=tuple(proto.stop_token_ids),
        ignore_eos=proto.ignore_eos,
        include_stop_str_in_output=proto.include_stop_str_in_output,
    )


def chunk_of(outputs: list[Output]) -> pb.GenerateChunk:
    """Merges consecutive outputs of one request into one chunk."""
    last = outputs[-1]
    chunk = pb.GenerateChunk(
        request_id=last.request_id,
        token_ids=[t for o in outputs for t in o.token_ids],
        text_delta="".join(o.text_delta for o in outputs),
        finish_reason=last.finish_reason or "" if last.finished else "",
        usage=pb.Usage(prompt_tokens=last.num_prompt_tokens, completion_tokens=last.num_output_tokens),
        resumable=last.resumable,
    )
    if last.residency is not None:
        chunk.residency.CopyFrom(pb.ResidencyStats(**last.residency))
    if last.timing:
        t = last.timing
        chunk.timing.CopyFrom(pb.Timing(queue_s=t["queue_s"], prefill_s=t["prefill_s"], decode_s=t["decode_s"],
                                        num_preemptions=t["num_preemptions"],
                                        num_prefill_tokens=t.get("num_prefill_tokens", 0)))
        chunk.speculation.CopyFrom(pb.SpeculationStats(num_draft_tokens=t["num_draft_tokens"],
                                                       num_accepted_tokens=t["num_accepted_tokens"],
                                                       num_verify_steps=t["num_verify_steps"]))
    return chunk


class DecoderServicer(pb_grpc.DecoderServicer):
    def __init__(self, loop: EngineLoop, tokenizer: Tokenizer, config: DecoderConfig, decoder_id: str):
        self.loop = loop
        self.tokenizer = tokenizer
        self.config = config
        self.decoder_id = decoder_id
        self.started_s = time.monotonic()

    def Generate(self, request, context):
        request_id = request.request_id or f"dec-{uuid.uuid4().hex}"
        resume = None
        if request.HasField("resume"):
            resume = Resume(list(request.resume.output_token_ids), request.resume.num_streamed_chars)
        try:
            prompt_ids = prompt_ids_of(request, self.tokenizer)
        except InvalidRequestError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            handle = self.loop.submit(prompt_ids, sampling_params_of(request.sampling), request_id, resume=resume)
        except InvalidRequestError as exc:
            # a resume this decoder cannot honour (no kvtier, request unknown or still owned): another may
            code = grpc.StatusCode.INVALID_ARGUMENT if resume is None else grpc.StatusCode.FAILED_PRECONDITION
            context.abort(code, str(exc))
        except QueueFullError as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except DrainingError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        # Runs when the RPC ends for any reason; a no-op for requests that already finished.
        context.add_callback(lambda: self.loop.cancel(request_id))
        finished = False
        while not finished:
            outputs = [handle.get()]
            while not outputs[-1].finished:  # coalesce what piled up while the client was slow
                try:
                    outputs.append(handle.get(timeout=0))
                except queue.Empty:
                    break
            finished = outputs[-1].finished
            yield chunk_of(outputs)

    def Cancel(self, request, context):
        known = self.loop.is_active(request.request_id)
        self.loop.cancel(request.request_id)
        return pb.CancelResponse(cancelled=known)

    def Health(self, request, context):
        status = pb.HealthResponse.DRAINING if self.loop.draining else pb.HealthResponse.SERVING
        if not self.loop.is_alive():
            status = pb.HealthResponse.UNKNOWN
        return pb.HealthResponse(status=status, decoder_id=self.decoder_id, model=self.config.served_model_name)

    def Stats(self, request, context):
        s = self.loop.stats()
        return pb.StatsResponse(
            decoder_id=self.decoder_id, model=self.config.served_model_name,
            num_running=s.num_running, num_waiting=s.num_waiting,
            max_num_seqs=self.config.max_num_seqs, max_num_waiting=self.config.max_num_waiting,
            num_free_slots=s.num_free_slots, num_total_slots=s.num_total_slots, page_size=self.config.page_size,
            num_requests_finished=s.num_requests_finished, num_generated_tokens=s.num_generated_tokens,
            num_prompt_tokens=s.num_prompt_tokens, num_steps=s.num_steps, draining=s.draining,
            residency_mode_counts=s.residency_mode_counts, uptime_s=time.monotonic() - self.started_s,
            num_prefill_tokens=s.num_prefill_tokens, num_resumed_requests=s.num_resumed_requests,
            num_handed_off_requests=s.num_handed_off_requests,
        )


GRPC_SPARE_WORKERS = 16  # threads beyond the admitted streams: Health, Stats, Cancel, refusals


def grpc_workers(config: DecoderConfig) -> int:
    """gRPC server threads: ``grpc_max_workers``, but at least one per stream the engine may admit
    (``max_num_seqs + max_num_waiting``) plus ``GRPC_SPARE_WORKERS``. Each open Generate stream holds
    a thread for its whole life; with fewer threads the streams past them queued unseen in the
    executor (the decoder's queue never reached ``max_num_waiting``, so nothing was refused) and
    Health, Stats and Cancel waited behind them for as long as a generation takes (found by
    tests/reliability/test_overload.py: with the defaults, 64 threads for 32 + 64 streams)."""
    return max(config.grpc_max_workers, config.max_num_seqs + config.max_num_waiting + GRPC_SPARE_WORKERS)


def probe(address: str, timeout_s: float = 2.0, security: InternalSecurity | None = None) -> bool:
    """True when the decoder at ``address`` answers Health with SERVING (used by health checks);
    ``security``: the internal token / TLS the decoder expects."""
    with (security or InternalSecurity()).channel(address) as channel:
        try:
            reply = pb_grpc.DecoderStub(channel).Health(pb.HealthRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == pb.HealthResponse.SERVING


def serve(config: DecoderConfig | None = None, install_signal_handlers: bool = True) -> int:
    """Runs a decoder until SIGTERM/SIGINT; returns the exit code."""
    from services.decoder.engine.engine import Engine

    config = config or DecoderConfig()
    security = InternalSecurity.of(config)  # before the model loads: bad TLS files fail at once
    engine = Engine(config)
    loop = EngineLoop(engine, config.max_num_waiting).start()
    server = security.make_server(futures.ThreadPoolExecutor(max_workers=grpc_workers(config)),
                                  # gateways ping open streams (keepalive) to detect a frozen decoder,
                                  # also while a long prefill sends no data: never GOAWAY them for it
                                  options=[("grpc.so_reuseport", 0), ("grpc.http2.max_ping_strikes", 0)])
    port = security.add_port(server, f"{config.host}:{config.port}")
    hostname = socket.gethostname()
    decoder_id = config.decoder_id or re.sub(r"[^A-Za-z0-9_.-]", "-", f"{hostname}-{port}")[:128]
    # gateways dial the advertised address: a wildcard bind is reachable by hostname, any other
    # bind (loopback by default) only at the bound address itself
    address = config.advertise_address or f"{hostname if config.host in ('0.0.0.0', '::') else config.host}:{port}"
    servicer = DecoderServicer(loop, engine.tokenizer, config, decoder_id)
    pb_grpc.add_DecoderServicer_to_server(servicer, server)
    server.start()

    heartbeat = None
    if config.redis_url:
        import redis

        from services.decoder.service.heartbeat import DecoderIdentity, Heartbeat
        from services.metadata.keys import Keys

        identity = DecoderIdentity(decoder_id, address, config.served_model_name, config.max_num_seqs,
                                   config.max_num_waiting)
        heartbeat = Heartbeat(redis.Redis.from_url(config.redis_url), identity, loop.stats,
                              config.heartbeat_interval_s, config.heartbeat_ttl_s, Keys(config.namespace)).start()
    log.info("decoder %s serving %s on %s:%d", decoder_id, config.served_model_name, config.host, port)
    print(f"decoder {decoder_id} ready on port {port}", flush=True)

    stop = threading.Event()
    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        if not loop.is_alive():
            log.error("the engine loop died: %s", loop._error)
            break

    log.info("draining: %d requests in flight", loop.num_in_flight)
    loop.drain()
    if heartbeat is not None:
        heartbeat.beat()  # gateways see draining=true at once
    clean = loop.stop(timeout=config.drain_timeout_s)
    server.stop(grace=2).wait()
    if heartbeat is not None:
        heartbeat.stop(deregister=True)
    log.info("decoder stopped (%s)", "drained" if clean else "handed off or aborted what was left")
    return 0 if loop._error is None else 1
