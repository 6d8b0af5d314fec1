"""Model shapes: what one token costs in weights, FLOPs, KV bytes and digest bytes.

Dense GQA models (Llama-3.1-8B, Qwen3-8B) are counted from their config dimensions. The
GLM-5-like shape is an MLA + MoE model whose numbers are assumptions (see ``GLM5_LIKE``).

Conventions:
- A KV *row* is one token in one layer: ``2 x num_kv_heads x head_dim`` values for GQA (K and V),
  ``kv_latent_dim`` values for MLA (one compressed latent serves as K and V).
- A *digest* is per page, per layer, per kv head: elementwise min and max of the keys
  (design.md §1), so ``2 x num_kv_heads x key_dim`` values per page per layer.
- Weights read per step: every parameter except the input-embedding table (only the batch's rows
  of it are read, which we neglect); the LM head is read. Activations are not counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool = False
    weight_bytes_per_param: int = 2  # bf16
    kv_bytes_per_value: int = 2  # bf16 KV cache
    # MLA: values per token per layer of the compressed KV (latent + rope part); None for GQA.
    kv_latent_dim: int | None = None
    kv_rope_dim: int = 0
    # MoE: parameters used per token and stored in total (None: dense, counted from dimensions).
    active_params: float | None = None
    total_params: float | None = None
    # Fraction of the weights this GPU holds (expert parallelism across a node); 1.0 = all.
    weight_shard_fraction: float = 1.0
    notes: str = ""

    # --- parameters ---------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_latent_dim is not None

    @property
    def params_per_layer(self) -> int:
        """Dense GQA layer: q, k, v, o projections, gated MLP (3 matrices), two RMSNorms."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_q_heads * d + 2 * h * self.num_kv_heads * d + self.num_q_heads * d * h
        mlp = 3 * h * self.intermediate_size
        return attn + mlp + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def dense_total_params(self) -> int:
        lm_head = 0 if self.tied_embeddings else self.embedding_params
        return self.num_layers * self.params_per_layer + self.embedding_params + lm_head + self.hidden_size

    @property
    def resident_weight_bytes(self) -> float:
        """Bytes of weights this GPU keeps in HBM."""
        total = self.total_params if self.total_params is not None else self.dense_total_params
        return total * self.weight_bytes_per_param * self.weight_shard_fraction

    @property
    def weight_bytes_read_per_step(self) -> float:
        """Bytes of weights one decode step streams from HBM (once, whatever the batch).

        Dense: everything but the input embedding table (tied embeddings: the table is the LM
        head and is read). MoE (``total_params`` set): ASSUMED every resident expert is touched
        at a batch of >= 128 tokens with top-8-of-256 routing, so all resident weights are read.
        """
        if self.total_params is not None:
            return self.resident_weight_bytes
        unread = 0 if self.tied_embeddings else self.embedding_params
        return (self.dense_total_params - unread) * self.weight_bytes_per_param

    @property
    def matmul_flops_per_token(self) -> float:
        """2 FLOPs per multiply-add over the parameters one token uses (embedding lookup excluded)."""
        if self.active_params is not None:
            return 2.0 * self.active_params
        used = self.dense_total_params - (0 if self.tied_embeddings else self.embedding_params)
        return 2.0 * used

    # --- KV cache and digests -------------------------------------------------------------------
    @property
    def kv_values_per_token_per_layer(self) -> int:
        if self.is_mla:
            return self.kv_latent_dim + self.kv_rope_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return self.kv_values_per_token_per_layer * self.kv_bytes_per_value

    @property
    def kv_bytes_per_token(self) -> int:
        """All layers."""
        return self.kv_bytes_per_token_per_layer * self.num_layers

    def kv_bytes_per_page_per_layer(self, page_size: int) -> int:
        return page_size * self.kv_bytes_per_token_per_layer

    def kv_bytes_per_page(self, page_size: int) -> int:
        """One slot of the hot pool: a page in every layer."""
        return self.kv_bytes_per_page_per_layer(page_size) * self.num_layers

    @property
    def key_values_per_token_per_layer(self) -> int:
        """Values that make up one token's keys in one layer (what a digest summarises)."""
        if self.is_mla:
            return self.kv_latent_dim + self.kv_rope_dim
        return self.num_kv_heads * self.head_dim

    def digest_bytes_per_page_per_layer(self, digest_bytes_per_value: int) -> int:
        return 2 * self.key_values_per_token_per_layer * digest_bytes_per_value  # min and max

    def digest_bytes_per_page(self, digest_bytes_per_value: int) -> int:
        return self.digest_bytes_per_page_per_layer(digest_bytes_per_value) * self.num_layers

    # --- attention FLOPs ------------------------------------------------------------------------
    @property
    def attention_flops_per_attended_token_per_layer(self) -> float:
        """One query token against one context token in one layer: scores and weighted values,
        2 FLOPs per multiply-add. MLA with absorbed projections attends in latent space."""
        if self.is_mla:
            score = self.num_q_heads * (self.kv_latent_dim + self.kv_rope_dim)
            value = self.num_q_heads * self.kv_latent_dim
            return 2.0 * (score + value)
        return 2.0 * 2 * self.num_q_heads * self.head_dim

    @property
    def digest_flops_per_page_per_layer(self) -> float:
        """Scoring one page's digest for one query token: ``sum_d max(q_d*min_d, q_d*max_d)``,
        two products, a max and an add per value per q head."""
        key_dim = self.kv_latent_dim + self.kv_rope_dim if self.is_mla else self.head_dim
        return 4.0 * self.num_q_heads * key_dim

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(
            resident_weight_bytes=self.resident_weight_bytes,
            weight_bytes_read_per_step=self.weight_bytes_read_per_step,
            kv_bytes_per_token_per_layer=self.kv_bytes_per_token_per_layer,
            matmul_flops_per_token=self.matmul_flops_per_token,
        )
        return d


# SPEC: meta-llama/Llama-3.1-8B config.json (untied embeddings; 8.03B parameters).
LLAMA_3_1_8B = ModelShape(
    name="Llama-3.1-8B", num_layers=32, hidden_size=4096, num_q_heads=32, num_kv_heads=8, head_dim=128,
    intermediate_size=14336, vocab_size=128256,
)

# SPEC: Qwen/Qwen3-8B config.json (untied embeddings; ~8.2B parameters). q/k RMSNorm weights
# (2 x 128 per layer) are left out: 9K parameters, below the model's resolution.
QWEN3_8B = ModelShape(
    name="Qwen3-8B", num_layers=36, hidden_size=4096, num_q_heads=32, num_kv_heads=8, head_dim=128,
    intermediate_size=12288, vocab_size=151936,
)

# ASSUMED GLM-5-like shape. Public descriptions of GLM-5 (Feb 2026 model card, NVIDIA Megatron
# Bridge docs): 744B total / 40B active parameters, 78 layers, 64 attention heads, hidden 6144,
# 256 routed experts top-8, MLA + DeepSeek Sparse Attention (top-k 2048), FP8 checkpoint served
# on 8 GPUs. ASSUMED beyond that: the MLA cache is DeepSeek-V3's 512-value latent + 64-value rope
# key per token per layer, in bf16; weights in FP8 (1 byte) with expert parallelism over an
# 8-GPU node, so this GPU holds 1/8 of the weights and runs data-parallel attention for its own
# 128 requests (all-to-all traffic over NVLink not modelled). Selection uses dhisparse page
# digests over the latent, not DSA's per-token lightning indexer. vocab (GLM-4.5's) is unused
# because total/active parameters are given directly.
GLM5_LIKE = ModelShape(
    name="GLM-5-like (MLA+MoE, ASSUMED)", num_layers=78, hidden_size=6144, num_q_heads=64, num_kv_heads=1,
    head_dim=576, intermediate_size=0, vocab_size=151552, weight_bytes_per_param=1,
    kv_latent_dim=512, kv_rope_dim=64, active_params=40e9, total_params=744e9, weight_shard_fraction=1 / 8,
    notes="every number ASSUMED from public descriptions; per-GPU slice of an 8-GPU expert-parallel node",
)

MODELS = {"llama-3.1-8b": LLAMA_3_1_8B, "qwen3-8b": QWEN3_8B, "glm5-like": GLM5_LIKE}
