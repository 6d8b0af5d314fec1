"""Re-scoring a trained checkpoint with the current held-out evaluator (``evaluate.py``).

``dhisparse eval-drafter --checkpoint DIR`` scores the checkpoint's draft network (with its
draft vocabulary) and the n-gram drafter on the held-out sequences of a distillation cache, the
same way training ends. With ``--write`` it replaces the checkpoint's recorded held-out figures
(``config.json``, whose ``mean_acceptance_length`` also seeds the adaptive budget's survival
prior) and the card's generated part; sections of the card that training did not generate (a
hand-written training history) are kept.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from services.decoder.spec.dflash.checkpoint import (
    load_checkpoint,
    read_config,
    read_draft_vocab,
    read_facts,
    write_facts,
)
from services.decoder.spec.training.dataset import load_dataset
from services.decoder.spec.training.pipeline import evaluate, model_card

CARD_FILE = "README.md"
GENERATED_SECTIONS = ("Held-out acceptance",)  # the card's "## ..." sections that model_card writes


def rescore_checkpoint(directory: str | Path, data_dir: str | Path, embed: torch.Tensor) -> dict:
    """``embed: [V, H]`` the target's embeddings -> ``{"draft": ..., "ngram": ...}`` as
    ``pipeline.evaluate`` returns them. No held-out sequence with features is an error."""
    net = load_checkpoint(directory)
    cfg = net.cfg
    _, heldout = load_dataset(data_dir, cfg.target_layer_ids, cfg.block_size)
    if not heldout:
        raise ValueError(f"{data_dir}: no held-out sequence has features for layers {list(cfg.target_layer_ids)}")
    return evaluate(net, embed.float(), heldout, read_draft_vocab(directory, cfg.vocab_size))


def kept_sections(card: str) -> str:
    """The ``## `` sections of a card that training does not generate, in order, as text."""
    parts = re.split(r"(?m)^(?=## )", card)
    kept = [p for p in parts[1:] if not p[3:].startswith(GENERATED_SECTIONS)]
    return "".join(kept)


def write_rescored(directory: str | Path, acceptance: dict) -> None:
    """Records ``acceptance`` as the checkpoint's held-out figures and regenerates its card."""
    directory = Path(directory)
    net_cfg = read_config(directory)
    facts = read_facts(directory)
    if "train_sequences" not in facts:
        raise ValueError(f"{directory} was not written by train-drafter: no training facts to write a card from")
    facts["heldout_acceptance"] = acceptance
    write_facts(directory, facts)
    card_path = directory / CARD_FILE
    extra = kept_sections(card_path.read_text()) if card_path.is_file() else ""
    card = model_card(net_cfg.kind, net_cfg, facts)
    card_path.write_text(card + ("\n" + extra if extra else ""))
