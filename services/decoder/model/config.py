"""Model architecture description shared by the loaders and the runtime.

One frozen dataclass, filled from GGUF metadata or a Hugging Face ``config.json``.
Weights always use Hugging Face tensor names and orientation (``[out_features, in_features]``),
whatever the file format: see ``services.decoder.model.loader``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # one of SUPPORTED_ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    # Hugging Face style rope_scaling dict ("rope_type": linear | dynamic | llama3 | yarn), or None.
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = ""

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def kv_row_numel(self) -> int:
        """Values in one row (one token's K and V in one layer)."""
        return 2 * self.num_kv_heads * self.head_dim
