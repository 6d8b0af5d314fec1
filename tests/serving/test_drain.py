"""A second decoder joins the running stack through Redis, takes traffic, and on SIGTERM drains:
its in-flight stream finishes in full, it leaves the registry, and the gateway routes on."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx

from dhisparse.stack import free_port
from services.decoder.service.server import probe
from tests.serving.conftest import API_KEY, MODEL
from tests.serving.resume_stack import wait_for

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def decoder_b_stats(port: int):
    import grpc

    from services.rpc import decoder_pb2 as pb
    from services.rpc import decoder_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return pb_grpc.DecoderStub(channel).Stats(pb.StatsRequest(), timeout=5)


def test_second_decoder_takes_traffic_and_drains_on_sigterm(stack, tmp_path):
    port = free_port()
    log = open(tmp_path / "decoder-b.log", "wb")
    # twice the session decoder's pool: more free slots, so the gateway prefers it while both are idle
    process = subprocess.Popen(
        [sys.executable, "-m", "services.decoder.service", "--host", "127.0.0.1", "--port", str(port),
         "--advertise-address", f"127.0.0.1:{port}", "--decoder-id", "decoder-b", "--redis-url", stack.redis.url,
         "--kv-cache-tokens", "32768", "--threads", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: process.poll() is not None or probe(f"127.0.0.1:{port}", 1.0), 120, "decoder-b")
        assert process.poll() is None, (tmp_path / "decoder-b.log").read_text()
        wait_for(lambda: httpx.get(f"{stack.url}/health").json()["num_decoders"] == 2, 10, "two decoders")

        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, headers=HEADERS, timeout=60) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert '"text"' in first
            assert decoder_b_stats(port).num_running == 1  # routed to the preferred decoder
            process.send_signal(signal.SIGTERM)  # mid-stream: the decoder must finish this request
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert '"completion_tokens":40' in rest[-2]
        assert process.wait(timeout=30) == 0
        wait_for(lambda: httpx.get(f"{stack.url}/health").json()["num_decoders"] == 1, 10, "decoder-b to leave")
        reply = httpx.post(f"{stack.url}/v1/completions", headers=HEADERS, timeout=60,
                           json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0})
        assert reply.status_code == 200
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
