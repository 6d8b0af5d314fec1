"""``python -m benchmarks.soak --minutes 10 --out results/<dir>``: a bounded soak of the whole stack.

Starts ``dhisparse up``'s stack (each service a process; a decoder of small capacity on the real
weights) and runs, from several client threads, long (~1-2K token) and short prompts, streamed
and not, greedy and sampled, with random disconnects (mid-stream and mid-request) and back-off by
``Retry-After`` on 429, sampling every service's RSS. At the end it checks: kvtier's integrity is
true, the decoder holds no request and no slot, kvtier no page and no request, Redis no key of a
request, the gateway nothing in flight; no unexpected answer (5xx, error event, wrong finish,
changed greedy text); every service alive; RSS growth under the bound; after the stop no /dev/shm
segment of the instance and no service process. Writes ``soak.json`` and ``soak.png``; exits 1
when a check fails. RSS is ``VmRSS - RssShmem``: kvtier's host pool is shared memory, pre-touched
and mapped by the decoder too, no leak though it counts in VmRSS (recorded as well).
"""

from benchmarks.soak.probes import (
    SERVICES,
    decoder_stats,
    gateway_metric,
    kvtier_stats,
    proc_status_kib,
    request_keys,
    rss_mib,
    service_pids,
    wait_idle,
)
from benchmarks.soak.run import SoakConfig, plot, rss_growth, run_soak

__all__ = ["SERVICES", "SoakConfig", "decoder_stats", "gateway_metric", "kvtier_stats", "plot", "proc_status_kib",
           "request_keys", "rss_growth", "rss_mib", "run_soak", "service_pids", "wait_idle"]
