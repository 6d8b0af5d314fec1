"""Working set vs hot buffer of SPARSE requests: hits, misses, LRU victims, slots, new LRU."""

from kernels.resolve_residency.api import resolve_residency
from kernels.resolve_residency.plan import ResidencyPlan

__all__ = ["ResidencyPlan", "resolve_residency"]
