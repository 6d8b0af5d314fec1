"""The gateway's side of resuming (fake in-process decoders, no model): a stream whose decoder
hands the request off, or breaks while the request is resumable, is re-opened on another decoder
with ``resume`` (the tokens and characters already streamed); the client sees one stream with
every word once. A non-resumable break, or a resume no decoder accepts, is a clean error event."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from dhisparse.stack import free_port
from services.rpc import decoder_pb2 as pb
from services.rpc import decoder_pb2_grpc as pb_grpc
from tests.serving.test_gateway_app import MODEL, WORDS, gateway, sse_events

BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}


class ScriptedDecoder(pb_grpc.DecoderServicer):
    """Streams WORDS (token 100 + i each). A fresh request stops after ``cut`` words: ``"handoff"``
    ends the stream with a hand-off chunk carrying the cut-th word; ``"break"`` aborts the RPC
    with UNAVAILABLE. A resume continues after the tokens it names; ``refuse_resume`` refuses it."""

    def __init__(self, cut_mode=None, cut=2, resumable=True, refuse_resume=False):
        self.cut_mode, self.cut, self.resumable, self.refuse_resume = cut_mode, cut, resumable, refuse_resume
        self.requests = []

    def Generate(self, request, context):
        self.requests.append(request)
        start = len(request.resume.output_token_ids) if request.HasField("resume") else 0
        if start and self.refuse_resume:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "cannot resume: owned by a live decoder")
        for i in range(start, len(WORDS)):
            chunk = pb.GenerateChunk(request_id=request.request_id, token_ids=[100 + i], text_delta=WORDS[i],
                                     usage=pb.Usage(prompt_tokens=5, completion_tokens=i + 1),
                                     resumable=self.resumable)
            if not start and self.cut_mode == "handoff" and i == self.cut:
                chunk.finish_reason = "handoff"  # a last coalesced token rides on the hand-off chunk
                yield chunk
                return
            if not start and self.cut_mode == "break" and i == self.cut:
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
            chunk.finish_reason = "stop" if i == len(WORDS) - 1 else ""
            yield chunk


@pytest.fixture
def start_decoder():
    servers = []

    def start(fake):
        server = grpc.server(futures.ThreadPoolExecutor(4))
        pb_grpc.add_DecoderServicer_to_server(fake, server)
        port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(None)


def resume_count(metrics: str, cause: str, outcome: str) -> float:
    """The gateway's ``dhisparse_gateway_stream_resumes_total`` sample for (cause, outcome); 0 if absent."""
    prefix = f'dhisparse_gateway_stream_resumes_total{{cause="{cause}",outcome="{outcome}"}} '
    return sum(float(line[len(prefix):]) for line in metrics.splitlines() if line.startswith(prefix))


def streamed(response) -> tuple[str, list]:
    events = sse_events(response.text)
    return "".join(c["text"] for e in events for c in e.get("choices", [])), events


@pytest.mark.parametrize("cut_mode", ["handoff", "break"])
def test_a_resumable_stream_continues_on_another_decoder(start_decoder, cut_mode):
    first, second = ScriptedDecoder(cut_mode), ScriptedDecoder(cut_mode)
    addresses = [start_decoder(first), start_decoder(second)]
    with gateway(addresses, resume_timeout_s=5) as client:
        text, events = streamed(client.post("/v1/completions", json=BODY))
        metrics = client.get("/metrics").text
    assert text == "".join(WORDS)  # every word once, in order
    cause = "handoff" if cut_mode == "handoff" else "decoder_lost"
    assert resume_count(metrics, cause, "resumed") == 1 and resume_count(metrics, cause, "failed") == 0
    assert events[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert [e["choices"][0]["finish_reason"] for e in events if e.get("choices")][-1] == "stop"
    served = [f for f in (first, second) if f.requests and not f.requests[0].HasField("resume")]
    assert len(served) == 1
    resumes = [r for f in (first, second) for r in f.requests if r.HasField("resume")]
    assert len(resumes) == 1
    resume = resumes[0]
    cut = 3 if cut_mode == "handoff" else 2  # the hand-off chunk delivered the third word itself
    assert list(resume.resume.output_token_ids) == [100 + i for i in range(cut)]
    assert resume.resume.num_streamed_chars == len("".join(WORDS[:cut]))
    assert resume.request_id == served[0].requests[0].request_id and resume.text == "hi"
    if cut_mode == "handoff":  # never back to the decoder that handed it off
        assert resume in (second.requests if served[0] is first else first.requests)


def test_a_non_resumable_break_is_a_clean_error_event(start_decoder):
    fakes = [ScriptedDecoder("break", resumable=False), ScriptedDecoder("break", resumable=False)]
    addresses = [start_decoder(f) for f in fakes]
    with gateway(addresses, resume_timeout_s=5) as client:
        text, events = streamed(client.post("/v1/completions", json=BODY))
    assert text == "".join(WORDS[:2])
    assert events[-1]["error"]["type"] == "server_error" and "connection reset" in events[-1]["error"]["message"]
    assert sum(len(f.requests) for f in fakes) == 1  # no resume was tried


def test_a_resume_no_decoder_accepts_ends_with_an_error_after_the_timeout(start_decoder):
    fakes = [ScriptedDecoder("handoff", refuse_resume=True), ScriptedDecoder("handoff", refuse_resume=True)]
    addresses = [start_decoder(f) for f in fakes]
    with gateway(addresses, resume_timeout_s=1) as client:
        text, events = streamed(client.post("/v1/completions", json=BODY))
        metrics = client.get("/metrics").text
    assert text == "".join(WORDS[:3])
    assert resume_count(metrics, "handoff", "failed") == 1 and resume_count(metrics, "handoff", "resumed") == 0
    error = events[-1]["error"]
    assert error["type"] == "server_error" and "no decoder resumed" in error["message"], error
    assert "cannot resume" in error["message"]
    assert sum(r.HasField("resume") for f in fakes for r in f.requests) >= 2  # retried until the timeout
