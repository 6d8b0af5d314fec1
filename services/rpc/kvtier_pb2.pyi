from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CudaIpcHandle(_message.Message):
    __slots__ = ("device", "handle", "storage_size_bytes", "storage_offset_bytes", "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_HANDLE_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    EVENT_SYNC_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    device: int
    handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    def __init__(self, device: _Optional[int] = ..., handle: _Optional[bytes] = ..., storage_size_bytes: _Optional[int] = ..., storage_offset_bytes: _Optional[int] = ..., ref_counter_handle: _Optional[bytes] = ..., ref_counter_offset: _Optional[int] = ..., event_handle: _Optional[bytes] = ..., event_sync_required: _Optional[bool] = ...) -> None: ...

class ExportHotPoolRequest(_message.Message):
    __slots__ = ("decoder_id", "ipc", "shape")
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    IPC_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    ipc: CudaIpcHandle
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, decoder_id: _Optional[str] = ..., ipc: _Optional[_Union[CudaIpcHandle, _Mapping]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ExportHotPoolResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WriteBackItem(_message.Message):
    __slots__ = ("request_id", "page_index", "slot")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    page_index: int
    slot: int
    def __init__(self, request_id: _Optional[str] = ..., page_index: _Optional[int] = ..., slot: _Optional[int] = ...) -> None: ...

class WriteBackRequest(_message.Message):
    __slots__ = ("decoder_id", "items")
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    items: _containers.RepeatedCompositeFieldContainer[WriteBackItem]
    def __init__(self, decoder_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[WriteBackItem, _Mapping]]] = ...) -> None: ...

class WriteBackResponse(_message.Message):
    __slots__ = ("num_pages",)
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    num_pages: int
    def __init__(self, num_pages: _Optional[int] = ...) -> None: ...

class PageLayout(_message.Message):
    __slots__ = ("dtype", "num_layers", "num_kv_heads", "head_dim", "page_size")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    def __init__(self, dtype: _Optional[str] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("decoder_id", "model_id", "layout")
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    model_id: str
    layout: PageLayout
    def __init__(self, decoder_id: _Optional[str] = ..., model_id: _Optional[str] = ..., layout: _Optional[_Union[PageLayout, _Mapping]] = ...) -> None: ...

class AttachResponse(_message.Message):
    __slots__ = ("instance", "segment_name", "segment_bytes", "pool_offset_bytes", "num_host_pages", "host_page_bytes", "layer_stride_bytes", "kv_stride_bytes", "element_bytes", "layout", "lease_ttl_s")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_NAME_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    POOL_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_PAGES_FIELD_NUMBER: _ClassVar[int]
    HOST_PAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYER_STRIDE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_STRIDE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    instance: str
    segment_name: str
    segment_bytes: int
    pool_offset_bytes: int
    num_host_pages: int
    host_page_bytes: int
    layer_stride_bytes: int
    kv_stride_bytes: int
    element_bytes: int
    layout: PageLayout
    lease_ttl_s: float
    def __init__(self, instance: _Optional[str] = ..., segment_name: _Optional[str] = ..., segment_bytes: _Optional[int] = ..., pool_offset_bytes: _Optional[int] = ..., num_host_pages: _Optional[int] = ..., host_page_bytes: _Optional[int] = ..., layer_stride_bytes: _Optional[int] = ..., kv_stride_bytes: _Optional[int] = ..., element_bytes: _Optional[int] = ..., layout: _Optional[_Union[PageLayout, _Mapping]] = ..., lease_ttl_s: _Optional[float] = ...) -> None: ...

class DetachRequest(_message.Message):
    __slots__ = ("decoder_id",)
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    def __init__(self, decoder_id: _Optional[str] = ...) -> None: ...

class DetachResponse(_message.Message):
    __slots__ = ("freed_request_ids",)
    FREED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    freed_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, freed_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("decoder_id",)
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    def __init__(self, decoder_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lease_expires_unix_s",)
    LEASE_EXPIRES_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    lease_expires_unix_s: float
    def __init__(self, lease_expires_unix_s: _Optional[float] = ...) -> None: ...

class AllocateItem(_message.Message):
    __slots__ = ("request_id", "num_pages")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_pages: int
    def __init__(self, request_id: _Optional[str] = ..., num_pages: _Optional[int] = ...) -> None: ...

class CommitItem(_message.Message):
    __slots__ = ("request_id", "num_committed_pages")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_COMMITTED_PAGES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_committed_pages: int
    def __init__(self, request_id: _Optional[str] = ..., num_committed_pages: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("decoder_id", "commits", "free_request_ids", "allocations")
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    FREE_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    commits: _containers.RepeatedCompositeFieldContainer[CommitItem]
    free_request_ids: _containers.RepeatedScalarFieldContainer[str]
    allocations: _containers.RepeatedCompositeFieldContainer[AllocateItem]
    def __init__(self, decoder_id: _Optional[str] = ..., commits: _Optional[_Iterable[_Union[CommitItem, _Mapping]]] = ..., free_request_ids: _Optional[_Iterable[str]] = ..., allocations: _Optional[_Iterable[_Union[AllocateItem, _Mapping]]] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ("decoder_id", "allocations")
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    allocations: _containers.RepeatedCompositeFieldContainer[AllocateItem]
    def __init__(self, decoder_id: _Optional[str] = ..., allocations: _Optional[_Iterable[_Union[AllocateItem, _Mapping]]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("decoder_id", "commits")
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    commits: _containers.RepeatedCompositeFieldContainer[CommitItem]
    def __init__(self, decoder_id: _Optional[str] = ..., commits: _Optional[_Iterable[_Union[CommitItem, _Mapping]]] = ...) -> None: ...

class FreeRequest(_message.Message):
    __slots__ = ("decoder_id", "request_ids")
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, decoder_id: _Optional[str] = ..., request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AllocatedPages(_message.Message):
    __slots__ = ("request_id", "first_page_index", "host_page_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_PAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    HOST_PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    first_page_index: int
    host_page_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., first_page_index: _Optional[int] = ..., host_page_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("allocated", "num_freed_pages", "num_free_host_pages")
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    NUM_FREED_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_HOST_PAGES_FIELD_NUMBER: _ClassVar[int]
    allocated: _containers.RepeatedCompositeFieldContainer[AllocatedPages]
    num_freed_pages: int
    num_free_host_pages: int
    def __init__(self, allocated: _Optional[_Iterable[_Union[AllocatedPages, _Mapping]]] = ..., num_freed_pages: _Optional[int] = ..., num_free_host_pages: _Optional[int] = ...) -> None: ...

class MarkResumableRequest(_message.Message):
    __slots__ = ("decoder_id", "request_ids", "resumable")
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    RESUMABLE_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    resumable: bool
    def __init__(self, decoder_id: _Optional[str] = ..., request_ids: _Optional[_Iterable[str]] = ..., resumable: _Optional[bool] = ...) -> None: ...

class MarkResumableResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("decoder_id", "request_ids", "claim")
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    claim: bool
    def __init__(self, decoder_id: _Optional[str] = ..., request_ids: _Optional[_Iterable[str]] = ..., claim: _Optional[bool] = ...) -> None: ...

class RequestPages(_message.Message):
    __slots__ = ("request_id", "host_page_ids", "num_committed_pages", "owner_decoder_id", "resumable")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMMITTED_PAGES_FIELD_NUMBER: _ClassVar[int]
    OWNER_DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    RESUMABLE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    host_page_ids: _containers.RepeatedScalarFieldContainer[int]
    num_committed_pages: int
    owner_decoder_id: str
    resumable: bool
    def __init__(self, request_id: _Optional[str] = ..., host_page_ids: _Optional[_Iterable[int]] = ..., num_committed_pages: _Optional[int] = ..., owner_decoder_id: _Optional[str] = ..., resumable: _Optional[bool] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[RequestPages]
    def __init__(self, requests: _Optional[_Iterable[_Union[RequestPages, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("check_integrity",)
    CHECK_INTEGRITY_FIELD_NUMBER: _ClassVar[int]
    check_integrity: bool
    def __init__(self, check_integrity: _Optional[bool] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("instance", "num_host_pages", "num_used_pages", "num_free_pages", "num_committed_pages", "num_requests", "num_live_decoders", "host_page_bytes", "used_bytes", "free_bytes", "segment_bytes", "integrity_checked", "integrity_ok", "integrity_detail")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_USED_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_COMMITTED_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_LIVE_DECODERS_FIELD_NUMBER: _ClassVar[int]
    HOST_PAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_CHECKED_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_OK_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_DETAIL_FIELD_NUMBER: _ClassVar[int]
    instance: str
    num_host_pages: int
    num_used_pages: int
    num_free_pages: int
    num_committed_pages: int
    num_requests: int
    num_live_decoders: int
    host_page_bytes: int
    used_bytes: int
    free_bytes: int
    segment_bytes: int
    integrity_checked: bool
    integrity_ok: bool
    integrity_detail: str
    def __init__(self, instance: _Optional[str] = ..., num_host_pages: _Optional[int] = ..., num_used_pages: _Optional[int] = ..., num_free_pages: _Optional[int] = ..., num_committed_pages: _Optional[int] = ..., num_requests: _Optional[int] = ..., num_live_decoders: _Optional[int] = ..., host_page_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., segment_bytes: _Optional[int] = ..., integrity_checked: _Optional[bool] = ..., integrity_ok: _Optional[bool] = ..., integrity_detail: _Optional[str] = ...) -> None: ...
