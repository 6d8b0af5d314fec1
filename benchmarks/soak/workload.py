"""The soak's workload: client threads sending a mix of requests and tallying what came back."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

MODEL = "SmolLM2-135M-Instruct"


@dataclass
class SoakConfig:
    duration_s: float = 600.0
    num_clients: int = 6
    long_fraction: float = 0.25  # requests with a ~1-2K token prompt
    non_stream_fraction: float = 0.3
    cancel_fraction: float = 0.2  # requests whose client disconnects before the end
    short_max_tokens: int = 24
    sample_interval_s: float = 1.0
    warmup_s: float = 60.0  # RSS baseline: the samples of [warmup_s, warmup_s + window_s]
    window_s: float = 30.0  # RSS now: the samples of the last window_s of the run
    max_rss_growth_mib: float = 16.0  # gateway, kvtier, Redis
    # the decoder's RSS moves in steps of tens of MiB as new (prefill chunk, context) shapes raise
    # its allocator's high-water mark (one chunk's attention scores over 2.5K tokens: 45 MiB); its
    # KV pages and slots are accounted exactly by the slot and page checks instead
    max_decoder_rss_growth_mib: float = 64.0
    max_num_seqs: int = 3
    max_num_waiting: int = 2
    # a small hot pool (256 pages): the warm-up's 3 longest prompts need more, so they preempt and
    # swap through kvtier, and they write every slot once (the pool is calloc'ed: a slot's memory
    # enters the decoder's RSS when first written, which is no leak but would look like one)
    kv_cache_tokens: int = 4096
    max_model_len: int = 2560
    kvtier_pool_gib: float = 0.5
    seed: int = 0


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: Counter = field(default_factory=Counter)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    greedy: dict = field(default_factory=dict)  # (prompt index, max_tokens) -> first text
    problems: list = field(default_factory=list)  # unexpected answers (at most 20 kept)
    timeline: list = field(default_factory=list)  # (t, outcome)

    def add(self, t0: float, outcome: str, problem: str | None = None) -> None:
        with self.lock:
            self.counts[outcome] += 1
            self.timeline.append((round(time.monotonic() - t0, 2), outcome))
            if problem is not None and len(self.problems) < 20:
                self.problems.append(problem)


def prompts() -> tuple[list[str], list[str]]:
    from benchmarks.serve.workload import SHORT_CHAT, long_document

    # ~1.3 tokens per word: ~1.0K to ~2.0K token documents
    longs = [long_document(words, seed) + "\n\nSummary:" for seed, words in enumerate((800, 1000, 1250, 1500))]
    return SHORT_CHAT[:6], longs


def client(url: str, cfg: SoakConfig, index: int, t0: float, stop_at: float, tally: Tally) -> None:
    try:
        _requests(url, cfg, index, t0, stop_at, tally)
    except Exception as exc:  # noqa: BLE001 - a client bug must fail the soak, not vanish with its thread
        tally.add(t0, "error", f"client {index} crashed: {type(exc).__name__}: {exc}")


def _requests(url: str, cfg: SoakConfig, index: int, t0: float, stop_at: float, tally: Tally) -> None:
    """Client ``index``'s request loop. A request refused with 429 is sent again, unchanged, after
    its Retry-After: so the mix of admitted requests follows the configured fractions however many
    refusals a slow machine makes. The first request of clients 0 and 1 always disconnects (client
    0 mid-stream, client 1 mid-request), so both disconnect paths run in every soak."""
    rng = random.Random(cfg.seed * 1000 + index)
    shorts, longs = prompts()
    with httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0)) as http:
        first = True
        while time.monotonic() < stop_at:
            long = rng.random() < cfg.long_fraction
            which = rng.randrange(len(longs) if long else len(shorts))
            greedy = long or rng.random() < 0.7
            max_tokens = rng.choice((16, 32, 48)) if long else cfg.short_max_tokens
            body = {"model": MODEL, "prompt": (longs if long else shorts)[which], "max_tokens": max_tokens,
                    "ignore_eos": True, "temperature": 0 if greedy else 0.8}
            if not greedy:
                body["seed"] = rng.randrange(1 << 30)
            stream = rng.random() >= cfg.non_stream_fraction
            cancel = rng.random() < cfg.cancel_fraction
            cancel_after_tokens, disconnect_after_s = rng.randint(1, max_tokens - 1), rng.uniform(0.2, 2.0)
            if first and index < 2:
                stream, cancel, disconnect_after_s = index == 0, True, 0.3
            first = False
            outcome = _admitted(http, url, body, stream, cancel, cancel_after_tokens, disconnect_after_s,
                                t0, stop_at, tally)
            if outcome is None:
                return  # refused until the end of the run
            kind, text, usage, problem = outcome
            if kind == "ok":
                if usage["completion_tokens"] != max_tokens:
                    kind, problem = "error", f"{usage['completion_tokens']} tokens, asked {max_tokens}"
                with tally.lock:
                    tally.completion_tokens += usage["completion_tokens"]
                    tally.prompt_tokens += usage["prompt_tokens"]
                    key = (long, which, max_tokens)
                    if greedy and tally.greedy.setdefault(key, text) != text:
                        tally.counts["greedy_mismatch"] += 1
                        problem = f"greedy text of {key} changed: {text!r} != {tally.greedy[key]!r}"
            tally.add(t0, kind, problem)


def _admitted(http: httpx.Client, url: str, body: dict, stream: bool, cancel: bool, cancel_after_tokens: int,
              disconnect_after_s: float, t0: float, stop_at: float, tally: Tally):
    """Sends one request until it is not refused with 429 (each 429 tallied, Retry-After honoured);
    returns its outcome, or None when the run ended while it was being refused."""
    while time.monotonic() < stop_at:
        try:
            if stream:
                outcome = _streamed(http, url, body, cancel_after_tokens if cancel else None)
            else:
                outcome = _unary(http, url, body, disconnect_after_s if cancel else None)
        except httpx.HTTPError as exc:
            outcome = ("error", None, None, f"{type(exc).__name__}: {exc}")
        if outcome[0] != "429":
            return outcome
        tally.add(t0, "429")
        time.sleep(float(outcome[1]))
    return None


def _streamed(http: httpx.Client, url: str, body: dict, cancel_after: int | None):
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    text, usage, reason, n = [], None, None, 0
    with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            return _refused(response.status_code, response.headers, response.read())
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return "error", None, None, f"error event: {event}"
            for choice in event.get("choices", []):
                text.append(choice["text"])
                reason = choice.get("finish_reason") or reason
            usage = event.get("usage") or usage
            n += 1
            if cancel_after is not None and n >= cancel_after:
                return "cancelled", None, None, None  # leaving the block drops the connection
    if reason != "length" or usage is None:
        return "error", None, None, f"stream ended with finish_reason {reason!r}, usage {usage}"
    return "ok", "".join(text), usage, None


def _unary(http: httpx.Client, url: str, body: dict, disconnect_after_s: float | None):
    try:
        response = http.post(f"{url}/v1/completions", json=body,
                             timeout=disconnect_after_s if disconnect_after_s is not None else 300.0)
    except httpx.TimeoutException:
        if disconnect_after_s is None:
            raise
        return "cancelled", None, None, None
    if response.status_code != 200:
        return _refused(response.status_code, response.headers, response.content)
    choice = response.json()["choices"][0]
    if choice["finish_reason"] != "length":
        return "error", None, None, f"finish_reason {choice['finish_reason']!r}"
    return "ok", choice["text"], response.json()["usage"], None


def _refused(status: int, headers, content: bytes):
    if status == 429:
        error = json.loads(content).get("error", {})
        if headers.get("retry-after") is None or error.get("type") != "rate_limit_exceeded":
            return "error", None, None, f"429 without Retry-After or OpenAI error body: {content[:200]!r}"
        return "429", min(float(headers["retry-after"]), 2.0), None, None
    return "error", None, None, f"HTTP {status}: {content[:300]!r}"


def warm_up(url: str, cfg: SoakConfig) -> float:
    """The largest batch the workload can make, once, before the clock starts: ``max_num_seqs``
    longest prompts at once (each service's allocator reaches its high-water mark and the decoder
    writes every hot-pool slot here, not in the middle of the RSS measurement). Returns its duration."""
    started = time.monotonic()
    longest = prompts()[1][-1]

    def one(_):
        reply = httpx.post(f"{url}/v1/completions", timeout=600,
                           json={"model": MODEL, "prompt": longest, "max_tokens": 8, "temperature": 0})
        reply.raise_for_status()

    with ThreadPoolExecutor(cfg.max_num_seqs) as pool:
        list(pool.map(one, range(cfg.max_num_seqs)))
    # one step of 3-8, 9-16, 17-32 and 33-64 rows each: on CPU a GEMM kernel may build a re-laid-out
    # copy of the weights (~420 MiB; MKL packs: one per row bucket) on first use (services/decoder/model/linear.py)
    for rows in (6, 12, 24, 48):
        httpx.post(f"{url}/v1/completions", timeout=600, json={
            "model": MODEL, "prompt": list(range(1000, 1000 + rows)), "max_tokens": 1}).raise_for_status()
    return time.monotonic() - started
