import tempfile
from pathlib import Path

import pytest

from services.metadata.redis_server import RedisServer


def test_embedded_redis_starts_is_reused_and_stops():
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        server = RedisServer(directory=directory).start()
        assert server.url.startswith("unix://")
        server.client().set("k", "v")
        reused = RedisServer(directory=directory).start()  # already listening: no second server
        assert reused.client().get("k") == b"v"
        external = RedisServer(url=server.url).start()
        external.stop()  # never stops a server it did not embed
        assert server.ping()
        reused.stop()
        assert not server.ping()


def test_external_url_that_does_not_answer_fails_clearly():
    with pytest.raises(RuntimeError, match="no Redis answers"):
        RedisServer(url="unix:///tmp/does-not-exist.sock").start()
    with pytest.raises(ValueError):
        RedisServer()


def test_persistent_redis_keeps_every_acknowledged_write_through_kill9():
    """persist=True logs every write (AOF) before answering it: a SIGKILL right after a write
    loses nothing, and a restart with the same directory finds it (a snapshot every second would
    have lost it)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        server = RedisServer(directory=directory, persist=True).start()
        with server.client() as r:
            for i in range(200):
                r.rpush("pages", i)
            r.hset("pt", mapping={"owner": "a", "num_committed": 7})
        server._process.kill()  # no shutdown, no save
        server._process.wait()
        restarted = RedisServer(directory=directory, persist=True).start()
        with restarted.client() as r:
            assert [int(p) for p in r.lrange("pages", 0, -1)] == list(range(200))
            assert r.hgetall("pt") == {b"owner": b"a", b"num_committed": b"7"}
        restarted.stop()


def test_persistent_redis_with_only_a_snapshot_loads_it_and_turns_aof_on():
    """A directory written by an older version (snapshot, no AOF) keeps its data, and from then on
    survives a kill -9."""
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        old = RedisServer(directory=directory).start()
        with old.client() as r:
            r.set("info", "kept")
            r.save()
        old.stop()
        assert not (Path(directory) / "appendonly.aof").exists()
        server = RedisServer(directory=directory, persist=True).start()
        assert (Path(directory) / "appendonly.aof").exists()
        with server.client() as r:
            assert r.get("info") == b"kept"
            r.set("later", "too")
        server._process.kill()
        server._process.wait()
        restarted = RedisServer(directory=directory, persist=True).start()
        with restarted.client() as r:
            assert r.get("info") == b"kept" and r.get("later") == b"too"
        restarted.stop()
