"""The gateway's Prometheus metrics (one registry per app, so tests can build several apps).

Latency definitions (as in ``vllm bench serve``): TTFT = request arrival at the gateway to the
first generated token; ITL = gap between consecutive token arrivals (a chunk of k tokens counts
as k gaps of gap/k); TPOT = (last token - first token) / (completion tokens - 1).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from services.gateway.routing import DecoderRegistry

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20,
                    40, 80)


class _DecoderCollector:
    """Per-decoder gauges from the registry's last heartbeat read (no Redis call at scrape time)."""

    def __init__(self, registry: DecoderRegistry):
        self.registry = registry

    def collect(self):
        running = GaugeMetricFamily("dhisparse_decoder_running_requests", "running requests", labels=["decoder"])
        waiting = GaugeMetricFamily("dhisparse_decoder_waiting_requests", "queued requests (queue depth)",
                                    labels=["decoder"])
        free = GaugeMetricFamily("dhisparse_decoder_free_slots", "free hot-pool slots", labels=["decoder"])
        modes = GaugeMetricFamily("dhisparse_decoder_requests_by_residency_mode", "live requests per residency mode",
                                  labels=["decoder", "mode"])
        for d in self.registry.last_seen():
            running.add_metric([d.decoder_id], d.num_running)
            waiting.add_metric([d.decoder_id], d.num_waiting)
            free.add_metric([d.decoder_id], d.num_free_slots)
            for mode, count in (d.residency_mode_counts or {}).items():
                modes.add_metric([d.decoder_id, mode], count)
        yield from (running, waiting, free, modes)


class GatewayMetrics:
    def __init__(self, decoders: DecoderRegistry | None = None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("dhisparse_gateway_requests", "finished HTTP requests", ["endpoint", "status"],
                                registry=r)
        self.in_flight = Gauge("dhisparse_gateway_requests_in_flight", "requests being served (gateway queue depth)",
                               registry=r)
        self.ttft = Histogram("dhisparse_gateway_time_to_first_token_seconds", "TTFT", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.tpot = Histogram("dhisparse_gateway_time_per_output_token_seconds", "TPOT", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.itl = Histogram("dhisparse_gateway_inter_token_latency_seconds", "ITL", buckets=_LATENCY_BUCKETS,
                             registry=r)
        self.e2e = Histogram("dhisparse_gateway_e2e_request_latency_seconds", "end-to-end latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("dhisparse_gateway_prompt_tokens", "prompt tokens", registry=r)
        self.generation_tokens = Counter("dhisparse_gateway_generation_tokens", "generated tokens", registry=r)
        self.draft_tokens = Counter("dhisparse_gateway_spec_draft_tokens", "drafted tokens", registry=r)
        self.accepted_tokens = Counter("dhisparse_gateway_spec_accepted_tokens", "accepted draft tokens", registry=r)
        self.acceptance_length = Histogram("dhisparse_gateway_spec_acceptance_length",
                                           "tokens committed per verify step (accepted + bonus), per request",
                                           buckets=(1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8), registry=r)
        self.hot_hits = Counter("dhisparse_gateway_hot_hits", "hot-pool page hits", registry=r)
        self.hot_misses = Counter("dhisparse_gateway_hot_misses", "hot-pool page misses", registry=r)
        self.bytes_fetched = Counter("dhisparse_gateway_kv_bytes_fetched", "bytes host pool -> hot pool", registry=r)
        self.bytes_written = Counter("dhisparse_gateway_kv_bytes_written", "bytes hot pool -> host pool", registry=r)
        self.residency = Counter("dhisparse_gateway_requests_by_residency_mode", "finished requests per final mode",
                                 ["mode"], registry=r)
        self.resumes = Counter("dhisparse_gateway_stream_resumes",
                               "streams re-opened on another (or a restarted) decoder, by cause (handoff: drain "
                               "deadline; decoder_lost: stream broke) and outcome (resumed, failed)",
                               ["cause", "outcome"], registry=r)
        if decoders is not None:
            r.register(_DecoderCollector(decoders))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def finish(self, last_chunk) -> None:
        """Counts the speculation and residency totals of a finished request (its last chunk)."""
        spec, res = last_chunk.speculation, last_chunk.residency
        self.draft_tokens.inc(spec.num_draft_tokens)
        self.accepted_tokens.inc(spec.num_accepted_tokens)
        if spec.num_verify_steps:
            # tokens committed per verify step, bonus token included
            self.acceptance_length.observe((spec.num_accepted_tokens + spec.num_verify_steps) / spec.num_verify_steps)
        self.hot_hits.inc(res.num_hot_hits)
        self.hot_misses.inc(res.num_hot_misses)
        self.bytes_fetched.inc(res.num_bytes_fetched)
        self.bytes_written.inc(res.num_bytes_written)
        self.residency.labels(res.mode or "full").inc()


class RequestTimer:
    """Token timing of one request; feeds TTFT, ITL, TPOT and e2e into ``metrics`` on ``finish``."""

    def __init__(self, metrics: GatewayMetrics):
        self.metrics = metrics
        self.arrival_s = time.perf_counter()
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.num_tokens = 0

    def tokens(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        now = time.perf_counter()
        if self.first_token_s is None:
            self.first_token_s = now
            self.metrics.ttft.observe(now - self.arrival_s)
            num_gaps = num_tokens - 1
        else:
            num_gaps = num_tokens
        if num_gaps and self.last_token_s is not None:
            gap = (now - self.last_token_s) / num_gaps
            for _ in range(num_gaps):
                self.metrics.itl.observe(gap)
        self.last_token_s = now
        self.num_tokens += num_tokens

    def finish(self) -> None:
        self.metrics.e2e.observe(time.perf_counter() - self.arrival_s)
        if self.num_tokens > 1:
            self.metrics.tpot.observe((self.last_token_s - self.first_token_s) / (self.num_tokens - 1))
