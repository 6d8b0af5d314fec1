"""The decoder's side of kvtier: gRPC control calls plus a mapping of the host pool.

Control: every call is batched (``step`` carries a whole engine step: commits, frees and
allocations of many requests in one RPC); a ``Step`` also renews the lease, so a decoder that
steps regularly needs no separate heartbeat.

Data: after ``attach()`` the host pool segment is mapped into this process and
``host_pages(layer)`` gives layer views ``k, v: [num_host_pages, page_size, num_kv_heads,
head_dim]`` (each page contiguous) for ``gather_pages(src=host k, dst=hot k)`` and back.
Writes through these views land directly in kvtier's pool. The byte layout is the one in
``AttachResponse`` (see proto/kvtier.proto). The views keep the mapping alive: the numpy array
under them holds a buffer export of the mmap, so it is unmapped only when the last view is gone
(``torch.frombuffer`` would not do this). The segment is opened under /dev/shm directly, not via
``multiprocessing.shared_memory``, so Python's resource tracker never learns of it and cannot
unlink it when this process exits.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Self

import grpc
import numpy as np
import torch

from services.rpc import kvtier_pb2 as pb
from services.rpc import kvtier_pb2_grpc as pb_grpc
from services.rpc.auth import InternalSecurity

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class KvtierClientError(RuntimeError):
    """A kvtier call failed; ``code`` is the gRPC status code, ``detail`` kvtier's reason."""

    def __init__(self, code: grpc.StatusCode, detail: str):
        super().__init__(f"{code.name}: {detail}")
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class KvLayout:
    """What one page holds in this decoder: must equal the kvtier instance's layout."""

    dtype: torch.dtype
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int  # tokens

    @classmethod
    def of_hot_pool(cls, hot_pool) -> KvLayout:
        return cls(hot_pool.dtype, hot_pool.num_layers, hot_pool.num_kv_heads, hot_pool.head_dim, hot_pool.page_size)

    def to_proto(self) -> pb.PageLayout:
        return pb.PageLayout(dtype=DTYPE_NAMES[self.dtype], num_layers=self.num_layers,
                             num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, page_size=self.page_size)


@dataclass(frozen=True)
class RequestPages:
    request_id: str
    host_page_ids: list[int]  # logical order
    num_committed_pages: int
    owner_decoder_id: str
    resumable: bool


@dataclass(frozen=True)
class StepOutcome:
    allocated: dict[str, list[int]]  # request -> new host page ids, appended in logical order
    num_freed_pages: int
    num_free_host_pages: int


class HostPoolView:
    """This process's mapping of the host pool: ``pool[num_host_pages, num_layers, 2, page_size,
    num_kv_heads, head_dim]`` (2 = K, V) as one torch tensor over shared memory."""

    def __init__(self, attach: pb.AttachResponse, layout: KvLayout):
        path = os.path.join(SHM_DIR, attach.segment_name)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            size = st.st_size
            self.inode = st.st_ino  # a kvtier that started fresh made a new segment of the same name
            if size != attach.segment_bytes:
                raise KvtierClientError(grpc.StatusCode.FAILED_PRECONDITION,
                                        f"{path} has {size} bytes, kvtier announced {attach.segment_bytes}")
            self._mmap: mmap.mmap | None = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            os.close(fd)
        self.segment_name = attach.segment_name
        self.num_host_pages = attach.num_host_pages
        self.host_page_bytes = attach.host_page_bytes
        shape = (attach.num_host_pages, layout.num_layers, 2, layout.page_size, layout.num_kv_heads, layout.head_dim)
        raw = torch.from_numpy(np.frombuffer(self._mmap, dtype=np.uint8))  # keeps the mmap exported
        start = attach.pool_offset_bytes
        pool = raw[start : start + attach.num_host_pages * attach.host_page_bytes].view(layout.dtype).view(shape)
        element_bytes = pool.element_size()
        expected = (attach.host_page_bytes, attach.layer_stride_bytes, attach.kv_stride_bytes)
        if tuple(s * element_bytes for s in pool.stride()[:3]) != expected or element_bytes != attach.element_bytes:
            raise KvtierClientError(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"host pool strides {expected} (bytes) do not match this decoder's layout {shape}")
        self.pool = pool  # [num_host_pages, num_layers, 2, page_size, num_kv_heads, head_dim]
        self._cuda_registered = False

    def host_pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s K and V: each ``[num_host_pages, page_size, num_kv_heads, head_dim]``."""
        return self.pool[:, layer, 0], self.pool[:, layer, 1]

    def page(self, host_page_id: int) -> torch.Tensor:
        """One host page, every layer: ``[num_layers, 2, page_size, num_kv_heads, head_dim]``."""
        return self.pool[host_page_id]

    def register_with_cuda(self) -> None:
        """Page-locks the mapping (cudaHostRegister) so CUDA kernels read and write it zero-copy."""
        if self._cuda_registered:
            return
        ptr, nbytes = self.pool.data_ptr(), self.pool.numel() * self.pool.element_size()
        err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of the host pool failed with error {int(err)}")
        self._cuda_registered = True

    def close(self) -> None:
        """Drops this object's views; the mapping goes once no other view of it is alive."""
        if self._cuda_registered:
            torch.cuda.cudart().cudaHostUnregister(self.pool.data_ptr())
            self._cuda_registered = False
        self.pool = None
        mapping, self._mmap = self._mmap, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # views still alive elsewhere: they keep the mapping until they are freed


_RENEWING = {"Attach", "Heartbeat", "Step"}  # calls that renew the lease when they succeed


class KvtierClient:
    def __init__(self, address: str, decoder_id: str, model_id: str, layout: KvLayout, timeout_s: float = 10.0,
                 security: InternalSecurity | None = None):
        self.address = address
        self.decoder_id = decoder_id
        self.model_id = model_id
        self.layout = layout
        self.timeout_s = timeout_s
        self._channel = (security or InternalSecurity()).channel(address)  # token / TLS of kvtier
        self._stub = pb_grpc.KvtierStub(self._channel)
        self.host_pool: HostPoolView | None = None
        self.attach_info: pb.AttachResponse | None = None
        self._heartbeat_stop: threading.Event | None = None
        self._heartbeat_thread: threading.Thread | None = None
        # monotonic time until which the lease is surely live: kvtier renews it for lease_ttl_s from
        # when it receives a renewing call, which is after this client sent it
        self.lease_valid_until = float("-inf")

    def _call(self, method: str, request):
        sent = time.monotonic()
        try:
            response = getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise KvtierClientError(exc.code(), exc.details() or "") from None
        if method in _RENEWING:
            ttl = response.lease_ttl_s if method == "Attach" else self.attach_info.lease_ttl_s
            self.lease_valid_until = max(self.lease_valid_until, sent + ttl)
        return response

    def lease_left_s(self) -> float:
        """Seconds the lease surely has left (negative: it may have expired, e.g. after this process
        was paused; the next renewing call tells)."""
        return self.lease_valid_until - time.monotonic()

    # --- handshake and lease ------------------------------------------------------------------
    def attach(self) -> HostPoolView:
        """Handshake (FAILED_PRECONDITION on a layout or model mismatch), lease, and mapping.
        Idempotent; call it again after kvtier restarts. The mapping is kept if the segment is the
        same one (a re-attached kvtier); otherwise it is replaced, and views taken from the old
        one must be dropped (they point at the removed segment)."""
        self.attach_info = self._call("Attach", pb.AttachRequest(
            decoder_id=self.decoder_id, model_id=self.model_id, layout=self.layout.to_proto()))
        if self.host_pool is not None and not self._is_current(self.host_pool):
            self.host_pool.close()
            self.host_pool = None
        if self.host_pool is None:
            self.host_pool = HostPoolView(self.attach_info, self.layout)
        return self.host_pool

    def _is_current(self, view: HostPoolView) -> bool:
        try:
            inode = os.stat(os.path.join(SHM_DIR, self.attach_info.segment_name)).st_ino
        except FileNotFoundError:
            return False
        return view.segment_name == self.attach_info.segment_name and view.inode == inode

    def host_pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k, v)`` of ``layer``, each ``[num_host_pages, page_size, num_kv_heads, head_dim]``."""
        if self.host_pool is None:
            raise RuntimeError("attach() first")
        return self.host_pool.host_pages(layer)

    def heartbeat(self) -> float:
        """Renews the lease; returns its expiry (unix s). NOT_FOUND: the lease was reaped, attach."""
        return self._call("Heartbeat", pb.HeartbeatRequest(decoder_id=self.decoder_id)).lease_expires_unix_s

    def start_heartbeat(self, interval_s: float | None = None) -> None:
        """Heartbeats from a daemon thread every ``interval_s`` (default: a third of the TTL). The
        thread holds the client weakly: a client dropped without ``close()`` (its engine gone) is
        collected, its mapping and channel with it, and its lease lapses as a dead decoder's does."""
        if self._heartbeat_thread is not None:
            return
        if interval_s is None:
            interval_s = (self.attach_info.lease_ttl_s if self.attach_info else 10.0) / 3
        stop = threading.Event()
        client_ref = weakref.ref(self)

        def loop():
            while not stop.wait(interval_s):
                client = client_ref()
                if client is None:
                    return
                try:
                    client.heartbeat()
                except KvtierClientError as exc:
                    log.warning("kvtier heartbeat failed: %s", exc)
                del client

        self._heartbeat_stop = stop
        self._heartbeat_thread = threading.Thread(target=loop, name="kvtier-heartbeat", daemon=True)
        self._heartbeat_thread.start()

    def stop_heartbeat(self) -> None:
        if self._heartbeat_thread is not None:
            self._heartbeat_stop.set()
            self._heartbeat_thread.join()
            self._heartbeat_thread = self._heartbeat_stop = None

    def detach(self) -> list[str]:
        """Gives the lease up; kvtier frees this decoder's non-resumable requests (ids returned)."""
        return list(self._call("Detach", pb.DetachRequest(decoder_id=self.decoder_id)).freed_request_ids)

    # --- pages (batched) ----------------------------------------------------------------------
    def step(
        self,
        commits: Mapping[str, int] | None = None,
        frees: Iterable[str] = (),
        allocations: Mapping[str, int] | None = None,
    ) -> StepOutcome:
        """One RPC for a whole engine step, all-or-nothing, applied as commits, frees, allocations.
        commits: request -> number of leading logical pages whose bytes are final (never lower);
        frees: finished requests; allocations: request -> number of pages to append."""
        response = self._call("Step", pb.StepRequest(
            decoder_id=self.decoder_id,
            commits=[pb.CommitItem(request_id=r, num_committed_pages=n) for r, n in (commits or {}).items()],
            free_request_ids=list(frees),
            allocations=[pb.AllocateItem(request_id=r, num_pages=n) for r, n in (allocations or {}).items()],
        ))
        return StepOutcome({a.request_id: list(a.host_page_ids) for a in response.allocated},
                           response.num_freed_pages, response.num_free_host_pages)

    def allocate(self, allocations: Mapping[str, int]) -> dict[str, list[int]]:
        return self.step(allocations=allocations).allocated

    def commit(self, commits: Mapping[str, int]) -> None:
        self.step(commits=commits)

    def free(self, request_ids: Iterable[str]) -> int:
        return self.step(frees=request_ids).num_freed_pages

    def mark_resumable(self, request_ids: Iterable[str], resumable: bool = True) -> None:
        self._call("MarkResumable", pb.MarkResumableRequest(
            decoder_id=self.decoder_id, request_ids=list(request_ids), resumable=resumable))

    def export_hot_pool(self, storage: torch.Tensor) -> None:
        """CUDA: hands kvtier an IPC handle of the hot pool ``storage: [num_layers, 2, num_slots,
        page_size, num_kv_heads, head_dim]`` (one contiguous CUDA allocation) for ``write_back``."""
        if not storage.is_cuda or not storage.is_contiguous():
            raise ValueError("only a contiguous CUDA hot pool can be exported")
        (device, handle, size, offset, rc_handle, rc_offset, event, sync) = storage.untyped_storage()._share_cuda_()
        ipc = pb.CudaIpcHandle(device=device, handle=handle, storage_size_bytes=size, storage_offset_bytes=offset,
                               ref_counter_handle=rc_handle, ref_counter_offset=rc_offset, event_handle=event,
                               event_sync_required=sync)
        self._call("ExportHotPool", pb.ExportHotPoolRequest(decoder_id=self.decoder_id, ipc=ipc,
                                                            shape=list(storage.shape)))

    def write_back(self, items: Iterable[tuple[str, int, int]]) -> int:
        """kvtier copies ``(request_id, logical page, hot slot)`` from the exported hot pool into
        the pages' host pages (every layer); returns the number of pages."""
        response = self._call("WriteBack", pb.WriteBackRequest(decoder_id=self.decoder_id, items=[
            pb.WriteBackItem(request_id=rid, page_index=page, slot=slot) for rid, page, slot in items]))
        return response.num_pages

    def lookup(self, request_ids: Iterable[str], claim: bool = False) -> dict[str, RequestPages]:
        """Pages and state of the requests (NOT_FOUND if one is unknown); ``claim`` takes them over."""
        response = self._call("Lookup", pb.LookupRequest(
            decoder_id=self.decoder_id, request_ids=list(request_ids), claim=claim))
        return {r.request_id: RequestPages(r.request_id, list(r.host_page_ids), r.num_committed_pages,
                                           r.owner_decoder_id, r.resumable) for r in response.requests}

    def stats(self, check_integrity: bool = False) -> dict:
        """Pool and table counters; with ``check_integrity`` kvtier also runs its integrity check
        (``integrity_ok``, ``integrity_detail``)."""
        response = self._call("Stats", pb.StatsRequest(check_integrity=check_integrity))
        return {f.name: getattr(response, f.name) for f in response.DESCRIPTOR.fields}

    def close(self) -> None:
        """Stops the heartbeat, unmaps (once no view is alive) and closes the channel; the lease
        stays until it expires (use ``detach()`` to give it up now)."""
        self.stop_heartbeat()
        if self.host_pool is not None:
            self.host_pool.close()
            self.host_pool = None
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
