"""Plain messages of the kvtier service (the gRPC servicer translates them to and from proto)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Codes of KvtierError, named as the gRPC status codes they map to.
INVALID_ARGUMENT = "INVALID_ARGUMENT"
NOT_FOUND = "NOT_FOUND"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
FAILED_PRECONDITION = "FAILED_PRECONDITION"


class KvtierError(Exception):
    """A rejected call; raised before any state changed. ``code`` is one of the constants above."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class PageLayout:
    """What one host page holds; a decoder's must equal the instance's."""

    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int  # tokens


@dataclass(frozen=True)
class AttachInfo:
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


@dataclass(frozen=True)
class AllocateItem:
    request_id: str
    num_pages: int


@dataclass(frozen=True)
class CommitItem:
    request_id: str
    num_committed_pages: int


@dataclass(frozen=True)
class AllocatedPages:
    request_id: str
    first_page_index: int  # logical index of host_page_ids[0] within the request
    host_page_ids: list[int]


@dataclass(frozen=True)
class StepResult:
    allocated: list[AllocatedPages] = field(default_factory=list)
    num_freed_pages: int = 0
    num_free_host_pages: int = 0


@dataclass(frozen=True)
class RequestPagesInfo:
    request_id: str
    host_page_ids: list[int]
    num_committed_pages: int
    owner_decoder_id: str
    resumable: bool


@dataclass(frozen=True)
class Stats:
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
