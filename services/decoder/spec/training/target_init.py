"""Initialising the draft layers from the target's own last layers (an optional warm start).

With little self-distillation data (what a CPU can generate), a draft trained from random
weights overfits; the target's top layers are a pretrained starting point of exactly the right
shape when the draft copies the target's dims (hidden, heads, head_dim, intermediate size).
Draft layer ``i`` takes target layer ``L - num_layers + i``'s attention, MLP and norms; the final
norm is the target's; ``fc`` starts as the selector of the deepest captured feature layer (the
residual stream those layers read) and ``hidden_norm`` as the first copied layer's input norm,
so each draft layer's context keys/values start as that target layer would compute them (up to
the draft's per-head q/k norms, which the target lacks and which start as identity scales).
"""

from __future__ import annotations

import torch

from services.decoder.spec.dflash.model import DraftNet


def init_from_target(net: DraftNet, model) -> list[int]:
    """Copies weights from ``model`` (a ``LlamaModel``) into ``net``; returns the target layers
    used. Raises ``ValueError`` when the shapes differ."""
    cfg, tcfg = net.cfg, model.config
    if (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size) != (
            tcfg.hidden_size, tcfg.num_heads, tcfg.num_kv_heads, tcfg.head_dim, tcfg.intermediate_size):
        raise ValueError("--init-target-layers needs the draft layers to have the target's shapes "
                         f"(intermediate_size={tcfg.intermediate_size}, heads {tcfg.num_heads}/{tcfg.num_kv_heads})")
    if getattr(tcfg, "qk_norm", False) or getattr(tcfg, "attention_bias", False):
        raise ValueError("--init-target-layers supports Llama-style targets (no q/k norm, no attention bias)")
    hd, nh, nkv, inter = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size
    sources = list(range(tcfg.num_layers - cfg.num_layers, tcfg.num_layers))
    deepest = max(range(len(cfg.target_layer_ids)), key=lambda i: cfg.target_layer_ids[i])
    with torch.no_grad():
        for layer, source in zip(net.layers, sources):
            t = model.layers[source]
            q, k, v = t.qkv.weight.float().split([nh * hd, nkv * hd, nkv * hd])
            attn = layer.self_attn
            attn.q_proj.weight.copy_(q)
            attn.k_proj.weight.copy_(k)
            attn.v_proj.weight.copy_(v)
            attn.o_proj.weight.copy_(t.o_proj.weight.float())
            gate, up = t.gate_up.weight.float().split([inter, inter])
            layer.mlp.gate_proj.weight.copy_(gate)
            layer.mlp.up_proj.weight.copy_(up)
            layer.mlp.down_proj.weight.copy_(t.down.weight.float())
            layer.input_layernorm.weight.copy_(t.input_norm.float())
            layer.post_attention_layernorm.weight.copy_(t.post_norm.float())
        net.norm.weight.copy_(model.final_norm.float())
        net.hidden_norm.weight.copy_(model.layers[sources[0]].input_norm.float())
        h = cfg.hidden_size
        net.fc.weight.zero_()
        net.fc.weight[:, deepest * h : (deepest + 1) * h] = torch.eye(h)
    return sources
