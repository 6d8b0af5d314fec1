"""First-principles projection of one decode step on one H200 at 100K context x 128 requests.

Modules: ``constants`` (every assumption, named, with its source), ``shapes`` (model shapes:
weights, FLOPs, KV and digest bytes per token), ``traces`` (hit-rate / union / acceptance inputs
from CPU traces, scaled to the projected context), ``step_model`` (bytes, FLOPs and time of one
step), ``modes`` (dense-resident, always-sparse, adaptive; PCIe break-even buffer), ``run`` (CLI).

Run: ``python -m benchmarks.h200_projection [--trace trace.json] [--out DIR]``.
"""
