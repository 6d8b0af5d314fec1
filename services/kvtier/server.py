"""kvtier's gRPC adapter: translates proto <-> ``KvtierService`` calls, nothing else; plus ``serve()``."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from concurrent import futures

import grpc
import redis

from services.kvtier.config import KvtierConfig
from services.kvtier.messages import (
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    AllocateItem,
    CommitItem,
    KvtierError,
    PageLayout,
)
from services.kvtier.service import KvtierService
from services.metadata.redis_server import RedisServer
from services.rpc import kvtier_pb2 as pb
from services.rpc import kvtier_pb2_grpc as pb_grpc
from services.rpc.auth import InternalSecurity

log = logging.getLogger(__name__)


def _translating(method):
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except KvtierError as exc:
            context.abort(getattr(grpc.StatusCode, exc.code), exc.detail)
        except redis.RedisError as exc:
            # every call persists before it applies in memory, so a failed write changed nothing;
            # UNAVAILABLE tells decoders to retry (they ride out a Redis restart like a kvtier one)
            log.warning("%s: Redis unavailable: %s", method.__name__, exc)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"kvtier's Redis is unavailable: {type(exc).__name__}")

    wrapper.__name__ = method.__name__
    return wrapper


def _step_response(result) -> pb.StepResponse:
    return pb.StepResponse(
        allocated=[pb.AllocatedPages(request_id=a.request_id, first_page_index=a.first_page_index,
                                     host_page_ids=a.host_page_ids) for a in result.allocated],
        num_freed_pages=result.num_freed_pages, num_free_host_pages=result.num_free_host_pages,
    )


def _allocations(items) -> list[AllocateItem]:
    return [AllocateItem(i.request_id, i.num_pages) for i in items]


def _commits(items) -> list[CommitItem]:
    return [CommitItem(i.request_id, i.num_committed_pages) for i in items]


class KvtierServicer(pb_grpc.KvtierServicer):
    def __init__(self, service: KvtierService):
        self.service = service
        self._cuda = None  # CudaHotPools, made on the first export (CUDA machines only)

    @_translating
    def Attach(self, request, context):
        lay = request.layout
        info = self.service.attach(
            request.decoder_id, request.model_id,
            PageLayout(lay.dtype, lay.num_layers, lay.num_kv_heads, lay.head_dim, lay.page_size),
        )
        return pb.AttachResponse(
            instance=info.instance, segment_name=info.segment_name, segment_bytes=info.segment_bytes,
            pool_offset_bytes=info.pool_offset_bytes, num_host_pages=info.num_host_pages,
            host_page_bytes=info.host_page_bytes, layer_stride_bytes=info.layer_stride_bytes,
            kv_stride_bytes=info.kv_stride_bytes, element_bytes=info.element_bytes,
            layout=pb.PageLayout(**vars(info.layout)), lease_ttl_s=info.lease_ttl_s,
        )

    @_translating
    def Detach(self, request, context):
        freed = self.service.detach(request.decoder_id)
        if self._cuda is not None:
            self._cuda.drop(request.decoder_id)
        return pb.DetachResponse(freed_request_ids=freed)

    @_translating
    def Heartbeat(self, request, context):
        return pb.HeartbeatResponse(lease_expires_unix_s=self.service.heartbeat(request.decoder_id))

    @_translating
    def Step(self, request, context):
        return _step_response(self.service.step(
            request.decoder_id, _commits(request.commits), list(request.free_request_ids), _allocations(request.allocations)
        ))

    @_translating
    def Allocate(self, request, context):
        return _step_response(self.service.allocate(request.decoder_id, _allocations(request.allocations)))

    @_translating
    def Commit(self, request, context):
        return _step_response(self.service.commit(request.decoder_id, _commits(request.commits)))

    @_translating
    def Free(self, request, context):
        return _step_response(self.service.free(request.decoder_id, list(request.request_ids)))

    @_translating
    def MarkResumable(self, request, context):
        self.service.mark_resumable(request.decoder_id, list(request.request_ids), request.resumable)
        return pb.MarkResumableResponse()

    @_translating
    def Lookup(self, request, context):
        found = self.service.lookup(request.decoder_id, list(request.request_ids), request.claim)
        return pb.LookupResponse(requests=[
            pb.RequestPages(request_id=r.request_id, host_page_ids=r.host_page_ids,
                            num_committed_pages=r.num_committed_pages, owner_decoder_id=r.owner_decoder_id,
                            resumable=r.resumable) for r in found
        ])

    @_translating
    def ExportHotPool(self, request, context):
        self.service.host_pages_for(request.decoder_id, [])  # the caller must hold a lease
        try:
            self._cuda_pools().import_pool(request.decoder_id, request.ipc, tuple(request.shape))
        except ValueError as exc:
            raise KvtierError(INVALID_ARGUMENT, str(exc)) from exc
        except RuntimeError as exc:  # no CUDA here, or the handle does not open
            raise KvtierError(FAILED_PRECONDITION, f"cannot open the exported hot pool: {exc}") from exc
        return pb.ExportHotPoolResponse()

    @_translating
    def WriteBack(self, request, context):
        items = [(i.request_id, i.page_index) for i in request.items]
        host_ids = self.service.host_pages_for(request.decoder_id, items)
        pools = self._cuda_pools()
        if not pools.has_pool(request.decoder_id):
            raise KvtierError(FAILED_PRECONDITION, f"decoder {request.decoder_id!r} exported no hot pool")
        try:
            pools.write_back(request.decoder_id, [i.slot for i in request.items], host_ids)
        except ValueError as exc:
            raise KvtierError(INVALID_ARGUMENT, str(exc)) from exc
        return pb.WriteBackResponse(num_pages=len(host_ids))

    def _cuda_pools(self):
        if self._cuda is None:
            from services.kvtier.cuda_hot_pools import CudaHotPools

            pool = self.service.pool
            self._cuda = CudaHotPools(pool._mapped(), pool.layout)
        return self._cuda

    @_translating
    def Stats(self, request, context):
        response = pb.StatsResponse(**vars(self.service.stats()))
        if request.check_integrity:
            problem = self.service.integrity_problem()
            response.integrity_checked = True
            response.integrity_ok = problem is None
            response.integrity_detail = problem or ""
        return response


def serve(config: KvtierConfig) -> int:
    """Runs kvtier until SIGTERM/SIGINT, then shuts down cleanly (segment and Redis keys removed).
    Prints one line ``kvtier ready <instance> <host>:<port> <segment>`` on stdout once serving."""
    security = InternalSecurity.of(config)  # first: bad TLS files fail before anything is created
    if config.redis_url:
        redis_server = RedisServer(url=config.redis_url).start()
    else:
        redis_server = RedisServer(directory=config.resolved_redis_dir, persist=True).start()
    client = redis_server.client()
    service = KvtierService(config, client)
    server = security.make_server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_KvtierServicer_to_server(KvtierServicer(service), server)
    port = security.add_port(server, f"{config.host}:{config.port}")
    if port == 0:
        service.shutdown(remove=service.pool.created)
        raise RuntimeError(f"cannot listen on {config.host}:{config.port}")
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    state = "re-attached" if service.recovered else "created"
    print(f"kvtier ready {config.instance} {config.host}:{port} {service.pool.segment_name} {state}", flush=True)
    while not stop.wait(config.resolved_reap_interval_s):
        try:
            service.reap_expired()
        except redis.RedisError as exc:  # Redis restarting: reap on a later round
            log.warning("lease reaping postponed: Redis unavailable: %s", exc)
    server.stop(grace=2.0).wait()
    service.shutdown(remove=True)
    client.close()
    if redis_server.embedded:
        redis_server.stop()
    print(f"kvtier stopped {config.instance}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    from services.kvtier.cli_args import config_from_args

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s kvtier %(levelname)s %(message)s")
    return serve(config_from_args(argv))
