import tempfile

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
