"""The load generator: streams chat completions through the gateway and records token timing;
``summarize`` turns the records into TTFT / TPOT / ITL percentiles, throughput and goodput."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

from benchmarks.progress import progress


@dataclass
class RequestRecord:
    ok: bool = False
    error: str = ""
    start_s: float = 0.0
    ttft_s: float | None = None
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunk_gaps_s: list[float] = field(default_factory=list)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.completion_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.completion_tokens - 1)


async def one_request(client: httpx.AsyncClient, url: str, body: dict, headers: dict) -> RequestRecord:
    record = RequestRecord(start_s=time.perf_counter())
    last_s = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                now = time.perf_counter()
                if event.get("usage"):
                    record.prompt_tokens = event["usage"]["prompt_tokens"]
                    record.completion_tokens = event["usage"]["completion_tokens"]
                if event.get("choices") and event["choices"][0].get("delta", {}).get("content"):
                    if record.ttft_s is None:
                        record.ttft_s = now - record.start_s
                    else:
                        record.chunk_gaps_s.append(now - last_s)
                    last_s = now
        record.ok = record.completion_tokens > 0
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        record.error = repr(exc)
    record.latency_s = time.perf_counter() - record.start_s
    return record


async def run_load(base_url: str, model: str, prompts: list[list[dict]], offsets_s: list[float], max_tokens: int,
                   max_concurrency: int, api_key: str | None = None,
                   desc: str | None = None) -> tuple[list[RequestRecord], float]:
    """Sends every prompt at its offset (at most ``max_concurrency`` open); returns the records
    and the wall time from the first send to the last completion. With ``desc``, a progress bar
    (stderr) counts the completed requests."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max_concurrency + 4, max_keepalive_connections=max_concurrency + 4)
    semaphore = asyncio.Semaphore(max_concurrency)
    bar = progress(desc=desc, total=len(prompts), unit="req") if desc else None
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        start = time.perf_counter()

        async def send(messages, offset):
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            async with semaphore:
                body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
                record = await one_request(client, f"{base_url}/v1/chat/completions", body, headers)
            if bar is not None:
                bar.update()
            return record

        records = await asyncio.gather(*(send(m, o) for m, o in zip(prompts, offsets_s)))
        duration_s = time.perf_counter() - start
    if bar is not None:
        bar.close()
    return list(records), duration_s


def percentiles_ms(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    ordered = sorted(values)

    def at(q):  # linear interpolation between closest ranks (numpy's default)
        position = q * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return (ordered[low] + (ordered[high] - ordered[low]) * (position - low)) * 1000

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "mean": sum(ordered) / len(ordered) * 1000}


def summarize(records: list[RequestRecord], duration_s: float, slo_ttft_ms: float, slo_tpot_ms: float) -> dict:
    ok = [r for r in records if r.ok]
    output_tokens = sum(r.completion_tokens for r in ok)
    good = [r for r in ok if r.ttft_s * 1000 <= slo_ttft_ms and (r.tpot_s is None or r.tpot_s * 1000 <= slo_tpot_ms)]
    return {
        "num_requests": len(records), "num_ok": len(ok), "errors": [r.error for r in records if not r.ok][:5],
        "duration_s": duration_s,
        "output_tokens": output_tokens, "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens_per_s": output_tokens / duration_s if duration_s else 0.0,
        "requests_per_s": len(ok) / duration_s if duration_s else 0.0,
        "goodput_requests_per_s": len(good) / duration_s if duration_s else 0.0,
        "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms, "fraction_met": len(good) / len(records)},
        "ttft_ms": percentiles_ms([r.ttft_s for r in ok]),
        "tpot_ms": percentiles_ms([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_ms": percentiles_ms([g for r in ok for g in r.chunk_gaps_s]),
        "e2e_ms": percentiles_ms([r.latency_s for r in ok]),
    }
