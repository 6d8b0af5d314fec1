"""The draft checkpoint's configuration, read from z-lab's DFlash ``config.json`` format.

A DFlash checkpoint is a Qwen3-style config (hidden_size, num_hidden_layers, heads, head_dim,
intermediate_size, rms_norm_eps, rope theta) plus a ``dflash_config`` block: ``block_size``,
``mask_token_id``, ``target_layer_ids`` (whose hidden states, concatenated, condition the draft),
and optionally ``output_multiplier``, ``final_logit_softcapping``, ``input_embedding_scale``.
DFlash2 adds ``conv_kernel_size``/``conv_group_size`` (dynamic depthwise convolution) and
``selector_rank``/``selector_top_k`` (candidate path selector); their presence switches them on.
DSpark (ours) adds a ``dspark_config`` block: ``markov_rank`` (low-rank Markov head over the
previous token) and ``confidence_head`` (per-position survival probability).

``context_window``: how many past positions of projected target features the drafter attends
over. z-lab's sliding layers use ``sliding_window``; full-attention checkpoints get
``DEFAULT_CONTEXT_WINDOW``, so the drafter's context never grows with the request (at 100K tokens
it stays a fixed ``window x layers`` K/V per request; see ``drafter.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_CONTEXT_WINDOW = 1024


class DraftCheckpointError(ValueError):
    """A draft checkpoint that cannot be used: missing or malformed config or weights."""


def _require(raw: dict, key: str, kind: type, where: str = "config.json"):
    if key not in raw:
        raise DraftCheckpointError(f"{where}: missing {key!r}")
    value = raw[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise DraftCheckpointError(f"{where}: {key!r} must be {kind.__name__}, got {value!r}")
    return value


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    context_window: int = DEFAULT_CONTEXT_WINDOW
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    input_embedding_scale: float = 1.0
    conv_kernel_size: int | None = None  # DFlash2
    conv_group_size: int | None = None
    selector_rank: int | None = None  # DFlash2
    selector_top_k: int | None = None
    markov_rank: int | None = None  # DSpark
    confidence_head: bool = False
    num_target_layers: int | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def kind(self) -> str:
        if self.markov_rank is not None or self.confidence_head:
            return "dspark"
        if self.selector_rank is not None or self.conv_kernel_size is not None:
            return "dflash2"
        return "dflash"

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features: ``len(target_layer_ids) * hidden_size``."""
        return len(self.target_layer_ids) * self.hidden_size

    @classmethod
    def from_json(cls, raw: dict) -> DraftConfig:
        if not isinstance(raw, dict):
            raise DraftCheckpointError("config.json must hold a JSON object")
        block = raw.get("dflash_config", {})
        if not isinstance(block, dict):
            raise DraftCheckpointError("config.json: 'dflash_config' must be an object")

        def draft(key: str, default=None):
            return block.get(key, raw.get(key, default))

        hidden = _require(raw, "hidden_size", int)
        heads = _require(raw, "num_attention_heads", int)
        layer_ids = draft("target_layer_ids")
        if not isinstance(layer_ids, list) or not layer_ids or not all(isinstance(i, int) and i >= 0 for i in layer_ids):
            raise DraftCheckpointError("config.json: dflash_config.target_layer_ids must be a non-empty list of layer indices")
        mask = draft("mask_token_id")
        if not isinstance(mask, int) or mask < 0:
            raise DraftCheckpointError(f"config.json: dflash_config.mask_token_id must be a token id, got {mask!r}")
        rope = raw.get("rope_parameters") or {}
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        window = DEFAULT_CONTEXT_WINDOW
        layer_types = raw.get("layer_types") or []
        if raw.get("sliding_window") and (raw.get("use_sliding_window") or "sliding_attention" in layer_types):
            window = int(raw["sliding_window"])
        window = int(raw.get("context_window", window))
        spark = raw.get("dspark_config") or {}
        if not isinstance(spark, dict):
            raise DraftCheckpointError("config.json: 'dspark_config' must be an object")

        def optional_int(value, name: str) -> int | None:
            if value is None:
                return None
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise DraftCheckpointError(f"config.json: {name} must be a positive integer, got {value!r}")
            return value

        cfg = cls(
            hidden_size=hidden,
            num_layers=_require(raw, "num_hidden_layers", int),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads", heads)),
            head_dim=int(raw.get("head_dim", hidden // heads)),
            intermediate_size=_require(raw, "intermediate_size", int),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            vocab_size=_require(raw, "vocab_size", int),
            block_size=int(draft("block_size", 16)),
            mask_token_id=mask,
            target_layer_ids=tuple(layer_ids),
            context_window=window,
            output_multiplier=float(draft("output_multiplier", 1.0)),
            final_logit_softcapping=(float(draft("final_logit_softcapping")) if draft("final_logit_softcapping") else None),
            input_embedding_scale=float(draft("input_embedding_scale", 1.0)),
            conv_kernel_size=optional_int(draft("conv_kernel_size"), "conv_kernel_size"),
            conv_group_size=optional_int(draft("conv_group_size"), "conv_group_size"),
            selector_rank=optional_int(draft("selector_rank"), "selector_rank"),
            selector_top_k=optional_int(draft("selector_top_k"), "selector_top_k"),
            markov_rank=optional_int(spark.get("markov_rank"), "dspark_config.markov_rank"),
            confidence_head=bool(spark.get("confidence_head", False)),
            num_target_layers=raw.get("num_target_layers"),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise DraftCheckpointError(f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads={self.num_kv_heads}")
        if self.block_size < 2:
            raise DraftCheckpointError(f"block_size must be >= 2 (an anchor plus drafted positions), got {self.block_size}")
        if self.context_window < 1:
            raise DraftCheckpointError(f"context_window must be >= 1, got {self.context_window}")
        if (self.conv_kernel_size is None) != (self.conv_group_size is None):
            raise DraftCheckpointError("conv_kernel_size and conv_group_size come together (DFlash2 convolution)")
        if self.conv_group_size is not None and self.hidden_size % self.conv_group_size:
            raise DraftCheckpointError(f"hidden_size={self.hidden_size} is not a multiple of conv_group_size={self.conv_group_size}")
        if (self.selector_rank is None) != (self.selector_top_k is None):
            raise DraftCheckpointError("selector_rank and selector_top_k come together (DFlash2 candidate selector)")
        if self.mask_token_id >= self.vocab_size:
            raise DraftCheckpointError(f"mask_token_id={self.mask_token_id} is outside the vocabulary ({self.vocab_size})")

    def check_target(self, num_target_layers: int, hidden_size: int, vocab_size: int) -> None:
        """Raises when the checkpoint was not made for this target."""
        if hidden_size != self.hidden_size:
            raise DraftCheckpointError(f"draft hidden_size={self.hidden_size} != target hidden_size={hidden_size}")
        if vocab_size != self.vocab_size:
            raise DraftCheckpointError(f"draft vocab_size={self.vocab_size} != target vocab_size={vocab_size}")
        bad = [i for i in self.target_layer_ids if i >= num_target_layers]
        if bad:
            raise DraftCheckpointError(f"target_layer_ids {bad} do not exist in a {num_target_layers}-layer target")

    def to_json(self) -> dict:
        """z-lab's layout: Qwen3-style top level, draft settings in ``dflash_config``."""
        raw = {
            "architectures": [{"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel", "dspark": "DSparkDraftModel"}[self.kind]],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "vocab_size": self.vocab_size,
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": True,
            "context_window": self.context_window,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {
                "block_size": self.block_size,
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
                "output_multiplier": self.output_multiplier,
                "input_embedding_scale": self.input_embedding_scale,
            },
        }
        block = raw["dflash_config"]
        if self.final_logit_softcapping is not None:
            block["final_logit_softcapping"] = self.final_logit_softcapping
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            if getattr(self, key) is not None:
                block[key] = getattr(self, key)
        if self.kind == "dspark":
            raw["dspark_config"] = {"markov_rank": self.markov_rank, "confidence_head": self.confidence_head}
        return raw
