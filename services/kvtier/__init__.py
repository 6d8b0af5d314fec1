"""kvtier: the standalone service that owns the host KV pool.

Modules: ``config`` (KvtierConfig), ``host_pool`` (the shm segment and its byte layout),
``allocator`` (host page ids, FIFO), ``page_table`` (per-request pages, persisted in Redis),
``leases`` (decoder liveness), ``instance`` (open/re-attach/remove an instance), ``service``
(KvtierService: the logic), ``server`` (gRPC adapter and ``serve()``), ``cli_args`` (flags).
"""
