"""Opening and removing a kvtier instance: its shm segment and its Redis keys, together.

``open_instance`` decides between a fresh start and a re-attach:

| Redis info | segment | outcome |
| --- | --- | --- |
| present | present | re-attach (after checking the persisted layout equals the config's) |
| present | missing | the pages are gone (e.g. host reboot): drop the instance's keys, start fresh |
| missing | present | an orphan segment with no page table: remove it, start fresh |
| missing | missing | start fresh |

Only one kvtier process may serve an instance: ``InstanceLock`` holds an ``flock`` on
``<tmp>/dhisparse-<uid>/<segment>.lock`` for the life of the process (the kernel drops it when the
process dies, kill -9 included, so a restart is never blocked by a dead holder).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import redis

from services.kvtier.config import KvtierConfig
from services.kvtier.host_pool import HostPool, HostPoolLayout, segment_path
from services.metadata.keys import Keys

log = logging.getLogger(__name__)


class InstanceLock:
    """Exclusive, non-blocking lock of one instance (segment name) on this machine."""

    def __init__(self, segment_name: str):
        directory = Path(tempfile.gettempdir()) / f"dhisparse-{os.getuid()}"
        directory.mkdir(mode=0o700, exist_ok=True)
        self.path = directory / f"{segment_name}.lock"
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise RuntimeError(f"kvtier instance segment {segment_name!r} is already served by another process") from None

    def release(self, remove: bool) -> None:
        if self._fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def layout_of(config: KvtierConfig) -> HostPoolLayout:
    return HostPoolLayout(
        dtype=config.dtype, num_layers=config.num_layers, num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim, page_size=config.page_size, num_host_pages=config.num_host_pages,
    )


def delete_instance_keys(client: redis.Redis, keys: Keys, instance: str) -> int:
    """Deletes every Redis key of the instance; returns how many."""
    names = list(client.scan_iter(match=keys.kvtier_prefix(instance) + "*", count=1000))
    for start in range(0, len(names), 1000):
        client.delete(*names[start : start + 1000])
    return len(names)


def open_instance(config: KvtierConfig, client: redis.Redis, keys: Keys) -> tuple[HostPool, dict]:
    """Returns the mapped host pool and the instance info (``model_id`` may be empty).
    ``pool.created`` tells a fresh start from a re-attach. Raises RuntimeError when the persisted
    instance has another layout than the config (its pages would be misread)."""
    layout = layout_of(config)
    info_key = keys.kvtier_info(config.instance)
    raw = {k.decode(): v.decode() for k, v in client.hgetall(info_key).items()}
    segment = config.segment_name
    if raw and HostPool.exists(raw["segment_name"]):
        persisted = HostPoolLayout(**json.loads(raw["layout"]))
        if persisted != layout:
            raise RuntimeError(
                f"kvtier instance {config.instance!r} exists with layout {persisted.to_dict()} but the "
                f"config asks for {layout.to_dict()}; use another --instance or shut it down cleanly first"
            )
        pool = HostPool.attach(raw["segment_name"], layout)
        info = dict(raw, pid=str(os.getpid()))
        client.hset(info_key, "pid", info["pid"])
        log.info("re-attached to %s (%d host pages)", pool.path, layout.num_host_pages)
        return pool, info
    if raw:
        log.warning("instance %r has metadata but its segment %s is gone: starting fresh", config.instance, raw["segment_name"])
        delete_instance_keys(client, keys, config.instance)
    if HostPool.exists(segment):
        log.warning("removing orphan segment /dev/shm/%s (no page table in Redis)", segment)
        segment_path(segment).unlink()
    pool = HostPool.create(segment, layout)
    info = {
        "segment_name": segment,
        "num_host_pages": str(layout.num_host_pages),
        "layout": json.dumps(layout.to_dict(), sort_keys=True),
        "model_id": config.model_id,
        "pid": str(os.getpid()),
        "created_unix_s": repr(time.time()),
    }
    client.hset(info_key, mapping=info)
    log.info("created %s: %d host pages of %d bytes", pool.path, layout.num_host_pages, layout.host_page_bytes)
    return pool, info


def remove_instance(pool: HostPool, client: redis.Redis, keys: Keys, instance: str) -> None:
    """Clean shutdown: removes the segment and every Redis key of the instance."""
    pool.unlink()
    delete_instance_keys(client, keys, instance)
