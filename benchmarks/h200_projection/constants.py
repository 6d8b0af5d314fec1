"""Every number the projection rests on, one named constant each, with where it comes from.

Three kinds of source, always said in the comment:
- SPEC: a vendor data sheet figure.
- MEASURED: a figure measured on the real hardware (by us or stated in issue 7).
- ASSUMED: our judgement, no measurement behind it yet. These are the figures a run on a lent
  H200 (``scripts/gpu_bench.sh``) or a CPU trace (``--trace``) should replace.

``Hardware`` and ``Workload`` bundle them so that tests and the CLI can vary one at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# --- H200 (SXM, 141 GB) ----------------------------------------------------------------------
# SPEC: NVIDIA H200 data sheet, "GPU memory bandwidth 4.8 TB/s".
HBM_BANDWIDTH_BYTES_PER_S = 4.8e12
# SPEC: NVIDIA H200 data sheet, "GPU memory 141 GB" (decimal gigabytes).
HBM_CAPACITY_BYTES = 141e9
# ASSUMED: CUDA context, cuBLAS/attention workspaces, activations, CUDA graphs, allocator
# fragmentation take ~10% (vLLM's default gpu_memory_utilization is 0.9 for the same reason).
HBM_USABLE_FRACTION = 0.90
# MEASURED (issue 7): dense bf16 GEMM throughput on an H200 (spec sheet: 989 TFLOP/s dense).
BF16_DENSE_FLOPS_PER_S = 790e12
# SPEC/practical: PCIe Gen5 x16 is 64 GB/s raw one way; ~50 GB/s is what pinned/registered
# host-to-device copies reach in practice (issue 7). Full duplex: H2D and D2H each get this.
PCIE_ONE_WAY_BYTES_PER_S = 50e9

# --- kernel efficiency: fraction of the peak each kind of kernel reaches ----------------------
# ASSUMED: weight streaming in decode GEMMs (large contiguous reads) reaches ~85% of HBM peak.
WEIGHTS_HBM_EFFICIENCY = 0.85
# ASSUMED: dense paged attention (FlashAttention/FlashInfer decode) streams KV at ~80% of peak.
KV_DENSE_HBM_EFFICIENCY = 0.80
# ASSUMED: sparse paged attention gathers 16-token pages (4-64 KiB contiguous runs): ~65%.
KV_SPARSE_HBM_EFFICIENCY = 0.65
# ASSUMED: decode-shaped GEMMs (M = batch tokens, a few hundred rows) reach ~60% of 790 TFLOP/s.
COMPUTE_EFFICIENCY = 0.60
# ASSUMED: PCIe copies run on their own copy engine and overlap HBM/compute work of the same
# step (True -> step = max(hbm, compute, pcie)); False -> step = max(hbm, compute) + pcie.
PCIE_OVERLAPPED = True
# ASSUMED: per-step fixed cost under CUDA graphs (scheduling, sampling, launch gaps): 1 ms.
STEP_OVERHEAD_S = 1e-3

# --- workload (issue 7 and design.md) --------------------------------------------------------
CONTEXT_TOKENS = 100_000  # issue 7: 100K context
NUM_REQUESTS = 128  # issue 7: 128 concurrent requests
PAGE_SIZE_TOKENS = 16  # design.md: page_size default 16
TOP_K_TOKENS = 2048  # design.md / issue 7 brief: top-k budget 2,048 tokens = 128 pages
SINK_PAGES = 1  # design.md: sink pages
RECENT_PAGES = 4  # design.md: recent window pages
# design.md §1: digest = elementwise min and max of keys, per page, per layer, per kv head, kept
# in the key dtype (bf16: 2 bytes). ASSUMED dtype; fp8 digests (1 byte) halve their cost.
DIGEST_BYTES_PER_VALUE = 2

# --- speculation -----------------------------------------------------------------------------
# ASSUMED: verify block of 8 draft tokens (DFlash block 8, design.md §6) -> 9 query tokens.
SPEC_GAMMA = 8
# ASSUMED: mean acceptance length (tokens committed per verify step, bonus token included).
# design.md §6 measured 1.46 (DFlash, held out) to 3.09 (n-gram hybrid) on SmolLM2-135M on CPU;
# 2.5 is a mid value for 8B targets. Replace with --trace.
SPEC_ACCEPTANCE_LENGTH = 2.5
# ASSUMED: the union of the 9 query tokens' selections is 1.5x one token's selection (adjacent
# positions pick mostly the same pages). Replace with --trace.
SPEC_WORKING_SET_UNION_FACTOR = 1.5
# ASSUMED: the block drafter costs 10% of a target step (a 2-layer drafter beside a 32-layer target).
SPEC_DRAFTER_OVERHEAD_FRACTION = 0.10

# --- hot buffer ------------------------------------------------------------------------------
# ASSUMED hit-rate curve hit(buffer / working set): fraction of a step's working-set pages
# already resident in an LRU hot buffer of that size. Sink and recent pages always hit; the
# top-k selection of consecutive steps overlaps ~80% (Quest/InfiniGen-style observations), more
# with room to keep older pages. Beyond the last point the curve rises linearly to 1.0 at
# "every page of the context hot". Replace with --trace (hit rate measured on CPU runs).
DEFAULT_HIT_CURVE_RATIOS = (
    (0.0, 0.0),
    (0.5, 0.35),
    (1.0, 0.80),
    (2.0, 0.90),
    (4.0, 0.95),
    (8.0, 0.98),
    (16.0, 0.99),
)
# design.md §1: a SPARSE request keeps "an LRU hot buffer sized for the working set" (ratio 1).
SPARSE_BUFFER_RATIO = 1.0


@dataclass(frozen=True)
class Hardware:
    """One H200 as the projection sees it. Efficiencies multiply the matching peak."""

    hbm_bandwidth_bytes_per_s: float = HBM_BANDWIDTH_BYTES_PER_S
    hbm_capacity_bytes: float = HBM_CAPACITY_BYTES
    hbm_usable_fraction: float = HBM_USABLE_FRACTION
    bf16_flops_per_s: float = BF16_DENSE_FLOPS_PER_S
    pcie_one_way_bytes_per_s: float = PCIE_ONE_WAY_BYTES_PER_S
    weights_hbm_efficiency: float = WEIGHTS_HBM_EFFICIENCY
    kv_dense_hbm_efficiency: float = KV_DENSE_HBM_EFFICIENCY
    kv_sparse_hbm_efficiency: float = KV_SPARSE_HBM_EFFICIENCY
    compute_efficiency: float = COMPUTE_EFFICIENCY
    pcie_overlapped: bool = PCIE_OVERLAPPED
    step_overhead_s: float = STEP_OVERHEAD_S

    @property
    def usable_hbm_bytes(self) -> float:
        return self.hbm_capacity_bytes * self.hbm_usable_fraction

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Workload:
    """The serving point being projected: context, concurrency, sparse-attention budget."""

    context_tokens: int = CONTEXT_TOKENS
    num_requests: int = NUM_REQUESTS
    page_size: int = PAGE_SIZE_TOKENS
    top_k_tokens: int = TOP_K_TOKENS
    sink_pages: int = SINK_PAGES
    recent_pages: int = RECENT_PAGES
    digest_bytes_per_value: int = DIGEST_BYTES_PER_VALUE
    sparse_buffer_ratio: float = SPARSE_BUFFER_RATIO

    @property
    def context_pages(self) -> int:
        return -(-self.context_tokens // self.page_size)

    @property
    def selected_pages(self) -> int:
        """Pages one query token attends to in one layer (sink + recent + top-k), at most all."""
        return min(self.context_pages, self.sink_pages + self.recent_pages + -(-self.top_k_tokens // self.page_size))

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Speculation:
    """Block verification: ``gamma`` draft tokens verified in one step, ``acceptance_length``
    tokens committed per step on average (bonus token included, so 1 <= tau <= gamma + 1)."""

    gamma: int = SPEC_GAMMA
    acceptance_length: float = SPEC_ACCEPTANCE_LENGTH
    working_set_union_factor: float = SPEC_WORKING_SET_UNION_FACTOR
    drafter_overhead_fraction: float = SPEC_DRAFTER_OVERHEAD_FRACTION

    def __post_init__(self):
        if not 1.0 <= self.acceptance_length <= self.gamma + 1:
            raise ValueError(f"acceptance length {self.acceptance_length} outside [1, gamma + 1]")
        if self.working_set_union_factor < 1.0:
            raise ValueError("working-set union factor must be >= 1")

    @property
    def query_tokens(self) -> int:
        return self.gamma + 1

    def as_dict(self) -> dict:
        return asdict(self)


# Plain decode expressed as a degenerate "speculation": one query token, one token per step.
NO_SPECULATION = Speculation(gamma=0, acceptance_length=1.0, working_set_union_factor=1.0,
                             drafter_overhead_fraction=0.0)
