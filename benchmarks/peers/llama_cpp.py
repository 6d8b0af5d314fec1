"""llama.cpp (through ``llama-cpp-python``) as a decode peer on the same GGUF file.

Optional: ``pip install -e '.[llamacpp]'`` builds llama.cpp from source (about 10 minutes on two
cores). Without it, ``LlamaCppPeer`` raises ``PeerUnavailable`` with that instruction, and the
benchmarks record the reason instead of figures.

What it measures: greedy decode of ``n_seq`` sequences at once through llama.cpp's own batch API
(``llama_batch`` with one sequence id per row, one ``llama_decode`` per step, argmax of each row's
logits), prefill excluded. llama.cpp computes on the GGUF's own quantized weights (SmolLM2's
default file is Q4_1) with its CPU kernels; dhisparse dequantizes them to fp32 (or bf16), so
llama.cpp reads about a sixth of the weight bytes per step. Results state both dtypes.
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import Self

import numpy as np


class PeerUnavailable(RuntimeError):
    pass


def _import():
    try:
        import llama_cpp
    except ImportError as exc:
        raise PeerUnavailable("llama-cpp-python is not installed: pip install -e '.[llamacpp]' builds it "
                              f"from source ({exc})") from exc
    return llama_cpp


class LlamaCppPeer:
    """One llama.cpp model + context for up to ``n_seq`` sequences of ``n_ctx_per_seq`` tokens."""

    def __init__(self, gguf_path: str | Path, n_ctx_per_seq: int, n_seq: int = 1, threads: int = 2,
                 n_batch: int = 512):
        lib = self.lib = _import()
        lib.llama_backend_init()
        lib.llama_log_set(_SILENT, None)
        self.model = lib.llama_model_load_from_file(str(gguf_path).encode(), lib.llama_model_default_params())
        if not self.model:
            raise PeerUnavailable(f"llama.cpp could not load {gguf_path}")
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx_per_seq * n_seq
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = True
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise PeerUnavailable(f"llama.cpp could not make a {params.n_ctx}-token context")
        self.n_seq, self.n_batch = n_seq, n_batch
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.batch = lib.llama_batch_init(n_batch, 0, 1)
        self.version = getattr(lib, "__version__", "?")

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _decode(self, rows: list[tuple[int, int, int, bool]]) -> list[int]:
        """``rows``: (token, position, sequence, wants logits), at most ``n_batch``. Returns the
        argmax token of every row that wanted logits, in row order."""
        b = self.batch
        for i, (token, pos, seq, wants) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, wants
            b.seq_id[i][0] = seq
        b.n_tokens = len(rows)
        status = self.lib.llama_decode(self.ctx, b)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status} (context full?)")
        out = []
        for i, (_, _, _, wants) in enumerate(rows):
            if wants:
                logits = self.lib.llama_get_logits_ith(self.ctx, i)
                out.append(int(np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).argmax()))
        return out

    def greedy(self, prompts: list[list[int]], decode_tokens: int) -> tuple[list[list[int]], float]:
        """Prefills every prompt (one sequence each), then decodes ``decode_tokens`` greedy tokens
        for all of them, one batched step per token. Returns (tokens per sequence, decode seconds:
        from the first decode step to the last, prefill excluded)."""
        if len(prompts) > self.n_seq:
            raise ValueError(f"{len(prompts)} prompts, context made for {self.n_seq}")
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        nexts = []
        for seq, prompt in enumerate(prompts):
            for start in range(0, len(prompt), self.n_batch):
                chunk = prompt[start:start + self.n_batch]
                last = start + len(chunk) == len(prompt)
                rows = [(t, start + i, seq, last and i == len(chunk) - 1) for i, t in enumerate(chunk)]
                got = self._decode(rows)
            nexts.append(got[0])
        outputs = [[t] for t in nexts]
        start_s = time.perf_counter()
        for step in range(decode_tokens - 1):
            rows = [(out[-1], len(p) + step, seq, True) for seq, (p, out) in enumerate(zip(prompts, outputs))]
            for out, token in zip(outputs, self._decode(rows)):
                out.append(token)
        return outputs, time.perf_counter() - start_s

    def decode_tokens_per_s(self, prompts: list[list[int]], decode_tokens: int) -> float:
        """Aggregate decode tok/s: sequences x (decode_tokens - 1) steps / decode seconds."""
        _, seconds = self.greedy(prompts, decode_tokens)
        return len(prompts) * (decode_tokens - 1) / max(seconds, 1e-9)


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _SILENT(level, text, user_data):  # a C callback that drops llama.cpp's log lines
    pass
