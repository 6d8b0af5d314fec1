"""Our own llama-family transformer (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5 with qkv bias,
Qwen3 with per-head q/k norm): RMSNorm, RoPE, GQA, SwiGLU, tied or untied embeddings.

K/V never live in a per-request tensor: each layer writes and reads the engine's paged hot pool
through ``PagedAttention`` and the step's ``AttentionMetadata``. Projections are fused at load
time (q|k|v and gate|up) so that one decode step issues few, large matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.decoder.model.attention import AttentionMetadata, PagedAttention
from services.decoder.model.config import ModelConfig
from services.decoder.model.gemm_plan import GemmPlan, apply_plan, plan_for
from services.decoder.model.linear import Linear
from services.decoder.model.model_store import cache_dir
from services.decoder.model.rope import RotaryEmbedding


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # weight [(num_heads + 2 * num_kv_heads) * head_dim, hidden], bias only for Qwen2
    q_norm: torch.Tensor | None  # [head_dim]
    k_norm: torch.Tensor | None  # [head_dim]
    o_proj: Linear  # [hidden, num_heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: Linear  # [2 * intermediate, hidden]
    down: Linear  # [hidden, intermediate]

    @property
    def weight_bytes(self) -> int:
        norms = [self.input_norm, self.post_norm, self.q_norm, self.k_norm]
        total = sum(t.numel() * t.element_size() for t in norms if t is not None)
        return total + sum(lin.weight_bytes for lin in (self.qkv, self.o_proj, self.gate_up, self.down))


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        gemm_plan: GemmPlan | str = "measured",
        max_positions: int | None = None,
        device: torch.device | str = "cpu",
        gemm_dtype: torch.dtype | None = None,
    ):
        """``dtype``: embeddings, norms, residual stream, attention and the KV pool;
        ``gemm_dtype``: the projections' weights (q|k|v, o, gate|up, down, LM head) and the
        precision their inputs are rounded to, accumulation in fp32 (default: ``dtype``; bf16
        inside an fp32 model runs the oneDNN bf16 path of model/linear.py);
        ``max_positions``: RoPE table length (default: the model's trained context);
        ``device``: where the weights live (the forward's inputs must be there too);
        ``gemm_plan``: the projections' kernel per row count (``model/gemm_plan.py``): a plan,
        ``"measured"`` (on a CPU: measured on these weights once per machine, cached) or
        ``"default"`` (``model/linear.default_kernel``)."""
        self.config = config
        self.dtype = dtype
        self.gemm_dtype = gemm_dtype or dtype
        self.device = torch.device(device)

        def to_device(t: torch.Tensor, to_dtype: torch.dtype = dtype) -> torch.Tensor:
            return t.to(device=self.device, dtype=to_dtype).contiguous()

        def w(name: str, to_dtype: torch.dtype = dtype) -> torch.Tensor:
            return to_device(weights[name], to_dtype)

        def proj(*names: str) -> torch.Tensor:
            return to_device(torch.cat([weights[n] for n in names]), self.gemm_dtype)

        self.embed_tokens = w("model.embed_tokens.weight")  # [vocab, hidden]
        lm_head = self.embed_tokens if config.tie_word_embeddings else weights["lm_head.weight"]
        self.lm_head = Linear(to_device(lm_head, self.gemm_dtype))  # tied + same dtype: shared
        self.final_norm = w("model.norm.weight")
        self.layers: list[LayerWeights] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            qkv_names = [p + f"self_attn.{x}_proj" for x in ("q", "k", "v")]
            bias = None
            if config.attention_bias:
                bias = proj(*(n + ".bias" for n in qkv_names))
            self.layers.append(
                LayerWeights(
                    input_norm=w(p + "input_layernorm.weight"),
                    qkv=Linear(proj(*(n + ".weight" for n in qkv_names)), bias),
                    q_norm=w(p + "self_attn.q_norm.weight") if config.qk_norm else None,
                    k_norm=w(p + "self_attn.k_norm.weight") if config.qk_norm else None,
                    o_proj=Linear(proj(p + "self_attn.o_proj.weight")),
                    post_norm=w(p + "post_attention_layernorm.weight"),
                    gate_up=Linear(proj(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")),
                    down=Linear(proj(p + "mlp.down_proj.weight")),
                )
            )
        self.rope = RotaryEmbedding(config, dtype, max_positions, self.device)
        self.scale = config.head_dim**-0.5
        self.gemm_plan: GemmPlan | None = None
        if isinstance(gemm_plan, GemmPlan):
            self.gemm_plan = gemm_plan
        elif gemm_plan == "measured":
            if self.device.type == "cpu":
                self.gemm_plan = plan_for(self.projections, cache_dir() / "gemm_plans")
        elif gemm_plan != "default":
            raise ValueError(f"gemm_plan must be a GemmPlan, 'measured' or 'default', not {gemm_plan!r}")
        if self.gemm_plan is not None:
            apply_plan(self.projections, self.gemm_plan)

    @property
    def projections(self) -> list[Linear]:
        """Every projection in the order a step runs them (the LM head last)."""
        out = [lin for layer in self.layers for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
        return out + [self.lm_head]

    @property
    def weight_bytes_per_step(self) -> int:
        """Bytes of weights one decode step reads (every matrix once; one embedding row ignored)."""
        total = sum(layer.weight_bytes for layer in self.layers) + self.lm_head.weight_bytes
        return total + self.final_norm.numel() * self.final_norm.element_size()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        attention: PagedAttention,
        logit_rows: torch.Tensor | None = None,
        capture_layers: tuple[int, ...] = (),
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``input_ids: [num_tokens]`` -> logits ``[len(logit_rows), vocab]`` in fp32 (all rows
        when ``logit_rows`` is None). K/V of every token are written into the pool.
        With ``capture_layers`` (a drafter's feature layers) it returns ``(logits, features)``,
        ``features: [num_tokens, len(capture_layers) * hidden]``: the hidden states after each of
        those layers, concatenated in the order given."""
        cfg = self.config
        num_heads, num_kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        num_tokens = input_ids.shape[0]
        hidden = torch.index_select(self.embed_tokens, 0, input_ids)  # [num_tokens, hidden]
        rope_tables = self.rope.tables(meta.positions)  # shared by every layer of this step
        q_width = num_heads * head_dim
        kv_width = num_kv_heads * head_dim
        captured: dict[int, torch.Tensor] = {}
        for layer_idx, layer in enumerate(self.layers):
            h = F.rms_norm(hidden, (hidden.shape[-1],), layer.input_norm, eps)
            qkv = layer.qkv(h)  # [num_tokens, (H + 2 * KVH) * head_dim]
            if layer.q_norm is not None:
                q = F.rms_norm(qkv[:, :q_width].reshape(num_tokens, num_heads, head_dim), (head_dim,), layer.q_norm, eps)
                k = F.rms_norm(
                    qkv[:, q_width : q_width + kv_width].reshape(num_tokens, num_kv_heads, head_dim),
                    (head_dim,),
                    layer.k_norm,
                    eps,
                )
                q = self.rope.rotate(q, rope_tables)
                k = self.rope.rotate(k, rope_tables)
            else:
                qk = qkv[:, : q_width + kv_width].view(num_tokens, num_heads + num_kv_heads, head_dim)
                qk = self.rope.rotate(qk, rope_tables)  # [num_tokens, H + KVH, head_dim]
                q = qk[:, :num_heads]
                k = qk[:, num_heads:]
            v = qkv[:, q_width + kv_width :].view(num_tokens, num_kv_heads, head_dim)
            attn = attention.forward(layer_idx, q, k, v, meta)  # [num_tokens, H * head_dim]
            hidden = hidden + layer.o_proj(attn)
            h = F.rms_norm(hidden, (hidden.shape[-1],), layer.post_norm, eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            hidden = hidden + layer.down(F.silu(gate) * up)
            if layer_idx in capture_layers:
                captured[layer_idx] = hidden
        if logit_rows is not None:
            hidden = torch.index_select(hidden, 0, logit_rows)
        hidden = F.rms_norm(hidden, (hidden.shape[-1],), self.final_norm, eps)
        logits = self.lm_head(hidden).float()
        if capture_layers:
            return logits, torch.cat([captured[i] for i in capture_layers], dim=-1)
        return logits
