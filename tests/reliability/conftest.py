"""Reliability fixtures: the gateway app in-process over a fake gRPC decoder on loopback (the
``FakeDecoder`` of ``tests/serving/test_gateway_app.py``: no model), and the kvtier fixtures
(embedded Redis, kvtier as a real subprocess) of ``tests/kvtier/conftest.py``."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from dhisparse.stack import free_port
from services.gateway.app import create_app
from services.gateway.config import GatewayConfig
from services.rpc import decoder_pb2_grpc as pb_grpc
from tests.kvtier.conftest import kvtier_process, make_service, namespace, redis_server  # noqa: F401 - fixtures
from tests.serving.test_gateway_app import MODEL, FakeDecoder

__all__ = ["MODEL"]


@pytest.fixture
def fake_decoder():
    """``(address, fake)``: a fake decoder serving on loopback; ``fake.requests`` lists every
    GenerateRequest that reached it."""
    fake = FakeDecoder()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_DecoderServicer_to_server(fake, server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    server.start()
    yield f"127.0.0.1:{port}", fake
    server.stop(None)


@pytest.fixture
def gateway_app(fake_decoder):
    """``make(**config)`` -> a gateway FastAPI app routed to the fake decoder."""
    address, _ = fake_decoder
    return lambda **config: create_app(GatewayConfig(decoder_addresses=[address], **config))
