"""The host pool: one POSIX shared-memory segment holding every host page of a kvtier instance.

Byte layout (the decoder maps it; AttachResponse carries the same numbers). Little-endian, C order,
no header, starting at byte 0 of ``/dev/shm/<segment_name>``::

    pool[num_host_pages, num_layers, 2 (0 = K, 1 = V), page_size, num_kv_heads, head_dim]  of dtype

    host_page_bytes    = num_layers * layer_stride_bytes         (one host page id = all layers)
    layer_stride_bytes = 2 * kv_stride_bytes
    kv_stride_bytes    = page_size * num_kv_heads * head_dim * element_bytes
    offset(p, l, kv, t, h, d) = p*host_page_bytes + l*layer_stride_bytes + kv*kv_stride_bytes
                                + ((t*num_kv_heads + h)*head_dim + d) * element_bytes

So ``pool[:, l, 0]`` is layer l's K as ``[num_host_pages, page_size, num_kv_heads, head_dim]`` with
every page contiguous, the form ``gather_pages`` copies to and from the hot pool.

The segment is created with ``O_EXCL`` and mode 0600, its tmpfs blocks reserved with
``posix_fallocate`` (so a full /dev/shm fails at start with ENOSPC instead of a SIGBUS later) and
pre-touched with ``MAP_POPULATE``. It is opened directly under /dev/shm (what glibc's shm_open
does) rather than through ``multiprocessing.shared_memory``: that module registers segments with
Python's resource tracker, whose exit would unlink them; here no process ever registers the
segment, so only an explicit ``unlink()`` removes it and it survives a kill -9 of kvtier.
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from services.kvtier.config import ELEMENT_BYTES

SHM_DIR = Path("/dev/shm")


@dataclass(frozen=True)
class HostPoolLayout:
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    num_host_pages: int

    def __post_init__(self) -> None:
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"dtype must be one of {sorted(ELEMENT_BYTES)}, got {self.dtype!r}")
        for name in ("num_layers", "num_kv_heads", "head_dim", "page_size", "num_host_pages"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def kv_stride_bytes(self) -> int:
        return self.page_size * self.num_kv_heads * self.head_dim * self.element_bytes

    @property
    def layer_stride_bytes(self) -> int:
        return 2 * self.kv_stride_bytes

    @property
    def host_page_bytes(self) -> int:
        return self.num_layers * self.layer_stride_bytes

    @property
    def segment_bytes(self) -> int:
        return self.num_host_pages * self.host_page_bytes

    def to_dict(self) -> dict:
        return asdict(self)


def segment_path(segment_name: str) -> Path:
    if not segment_name or "/" in segment_name:
        raise ValueError(f"bad shm segment name {segment_name!r}")
    return SHM_DIR / segment_name


class HostPool:
    """A mapped host-pool segment. Build with ``create`` or ``attach``; ``close()`` unmaps,
    ``unlink()`` also removes the segment."""

    def __init__(self, segment_name: str, layout: HostPoolLayout, mapping: mmap.mmap, created: bool):
        self.segment_name = segment_name
        self.layout = layout
        self._mmap: mmap.mmap | None = mapping
        self.created = created  # False: re-attached to a segment that survived a restart

    @classmethod
    def create(cls, segment_name: str, layout: HostPoolLayout) -> HostPool:
        """Creates a new zero-filled, pre-touched segment (owner-only). Raises FileExistsError if it
        exists, OSError(ENOSPC) if /dev/shm lacks room (the half-made segment is removed)."""
        path = segment_path(segment_name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.posix_fallocate(fd, 0, layout.segment_bytes)
            mapping = mmap.mmap(fd, layout.segment_bytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return cls(segment_name, layout, mapping, created=True)

    @classmethod
    def attach(cls, segment_name: str, layout: HostPoolLayout) -> HostPool:
        """Maps an existing segment (contents kept) after checking that this user owns it, that
        nobody else can open it, and that its size is exactly ``layout.segment_bytes``."""
        path = segment_path(segment_name)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid():
                raise PermissionError(f"{path} belongs to uid {st.st_uid}, not {os.getuid()}")
            if stat.S_IMODE(st.st_mode) & 0o077:
                raise PermissionError(f"{path} has mode {stat.S_IMODE(st.st_mode):o}; expected 600")
            if st.st_size != layout.segment_bytes:
                raise ValueError(f"{path} has {st.st_size} bytes; layout needs {layout.segment_bytes}")
            mapping = mmap.mmap(fd, layout.segment_bytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            os.close(fd)
        return cls(segment_name, layout, mapping, created=False)

    @staticmethod
    def exists(segment_name: str) -> bool:
        return segment_path(segment_name).exists()

    @property
    def path(self) -> Path:
        return segment_path(self.segment_name)

    def _mapped(self) -> mmap.mmap:
        if self._mmap is None:
            raise ValueError(f"host pool {self.segment_name} is closed")
        return self._mmap

    def read_page(self, host_page_id: int) -> bytes:
        """A copy of host page ``host_page_id``: ``host_page_bytes`` bytes (all layers, K and V)."""
        start = self._page_offset(host_page_id)
        return self._mapped()[start : start + self.layout.host_page_bytes]

    def write_page(self, host_page_id: int, data: bytes) -> None:
        if len(data) != self.layout.host_page_bytes:
            raise ValueError(f"a host page is {self.layout.host_page_bytes} bytes, got {len(data)}")
        start = self._page_offset(host_page_id)
        self._mapped()[start : start + self.layout.host_page_bytes] = data

    def _page_offset(self, host_page_id: int) -> int:
        if not 0 <= host_page_id < self.layout.num_host_pages:
            raise ValueError(f"host page {host_page_id} out of range [0, {self.layout.num_host_pages})")
        return host_page_id * self.layout.host_page_bytes

    def close(self) -> None:
        """Unmaps (the segment stays). Idempotent."""
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    def unlink(self) -> None:
        """Unmaps and removes the segment; mappings in other processes stay valid until unmapped."""
        self.close()
        self.path.unlink(missing_ok=True)
