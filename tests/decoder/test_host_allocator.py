"""glibc heap tuning: a freed large block stays in the heap for reuse, and loading a model tunes
the process before its weights are allocated. Each case runs in a fresh interpreter, since the
tuning is process-wide and once set stays set."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# 48 MiB: above glibc's largest dynamic mmap threshold (32 MiB), so an untuned process always
# maps such a block apart (``hblks`` counts mapped blocks) and a tuned one takes it from the heap
PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, sys

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    SETUP
    before = libc.mallinfo2().hblks
    block = libc.malloc(48 * 2**20)
    mapped = libc.mallinfo2().hblks - before
    libc.free(block)
    print(mapped)
""")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt / mallinfo2 are glibc's: the tuning applies on Linux only")


def _mapped_blocks(setup: str) -> int:
    """Blocks a 48 MiB malloc maps apart in a fresh interpreter after ``setup``."""
    code = PROBE.replace("SETUP", setup)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return int(done.stdout.split()[-1])


def test_untuned_glibc_maps_a_large_block_apart_and_the_tuning_keeps_it_in_the_heap():
    assert _mapped_blocks("pass") == 1
    assert _mapped_blocks("from services.decoder.host_allocator import keep_freed_memory_in_heap\n"
                          "assert keep_freed_memory_in_heap()") == 0


def test_loading_a_model_tunes_the_heap_before_its_weights_are_allocated():
    # benchmarks and tests load the weights once and build engines from them: tuned only at the
    # first engine's build, engines built later ran up to 2.5% faster than the first
    assert _mapped_blocks("from services.decoder.model.loader import load_model\n"
                          "from services.decoder.model.model_store import resolve_model_path\n"
                          "load_model(resolve_model_path(None))") == 0
