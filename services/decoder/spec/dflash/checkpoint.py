"""Draft checkpoints on disk: a directory with ``config.json`` (``config.py``'s format) and
``model.safetensors`` holding the draft layers only (the target's embeddings and LM head are
shared, never stored). Loading checks every tensor name and shape and refuses with a
``DraftCheckpointError`` that names the problem."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from services.decoder.spec.dflash.config import DraftCheckpointError, DraftConfig
from services.decoder.spec.dflash.model import DraftNet

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
VOCAB_FILE = "draft_vocab.json"  # optional: the token ids drafts are drawn from (our addition)


def save_checkpoint(net: DraftNet, directory: str | Path, dtype: torch.dtype | None = None, extra: dict | None = None) -> Path:
    """Writes ``config.json`` (plus ``extra`` keys, e.g. training facts) and the weights
    (cast to ``dtype`` when given). Returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    raw = net.cfg.to_json()
    if extra:
        raw["dhisparse"] = extra
    tensors = {name: (t.detach().to(dtype) if dtype else t.detach()).contiguous() for name, t in net.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    _write_raw_config(directory, raw)
    return directory


def _write_raw_config(directory: str | Path, raw: dict) -> None:
    (Path(directory) / CONFIG_FILE).write_text(json.dumps(raw, indent=2) + "\n")


def _read_raw_config(directory: str | Path) -> dict:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise DraftCheckpointError(f"{Path(directory)} is not a draft checkpoint: no {CONFIG_FILE}")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DraftCheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise DraftCheckpointError(f"{path}: want a JSON object")
    return raw


def read_config(directory: str | Path) -> DraftConfig:
    return DraftConfig.from_json(_read_raw_config(directory))


def read_facts(directory: str | Path) -> dict:
    """The ``dhisparse`` block of ``config.json`` (training facts), ``{}`` when there is none."""
    facts = _read_raw_config(directory).get("dhisparse", {})
    if not isinstance(facts, dict):
        raise DraftCheckpointError(f"{Path(directory) / CONFIG_FILE}: \"dhisparse\" must be a JSON object")
    return facts


def write_facts(directory: str | Path, facts: dict) -> None:
    """Replaces the ``dhisparse`` block of ``config.json``; the draft config stays as it is."""
    raw = _read_raw_config(directory)
    raw["dhisparse"] = facts
    _write_raw_config(directory, raw)


def read_heldout_acceptance_length(directory: str | Path) -> float | None:
    """The drafter's held-out mean acceptance length that training recorded
    (``dhisparse.heldout_acceptance.draft.mean_acceptance_length``), or None when the checkpoint
    has none (e.g. one trained elsewhere)."""
    raw = _read_raw_config(directory)
    try:
        value = raw["dhisparse"]["heldout_acceptance"]["draft"]["mean_acceptance_length"]
    except (KeyError, TypeError):
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise DraftCheckpointError(f"{Path(directory) / CONFIG_FILE}: held-out mean_acceptance_length {value!r} is not a number")
    return float(value)


def load_checkpoint(directory: str | Path, dtype: torch.dtype = torch.float32) -> DraftNet:
    cfg = read_config(directory)
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise DraftCheckpointError(f"{Path(directory)}: no {WEIGHTS_FILE}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise DraftCheckpointError(f"{path}: unreadable safetensors file ({exc})") from None
    net = DraftNet(cfg)
    expected = net.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise DraftCheckpointError(
            f"{path}: weights do not match the config ({cfg.kind}): missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
        )
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise DraftCheckpointError(f"{path}: {name} has shape {tuple(tensor.shape)}, the config needs {tuple(expected[name].shape)}")
        if not torch.isfinite(tensor).all():
            raise DraftCheckpointError(f"{path}: {name} holds non-finite values")
    net.load_state_dict({name: t.to(dtype) for name, t in tensors.items()})
    return net.to(dtype).eval()


def write_draft_vocab(directory: str | Path, token_ids: list[int]) -> Path:
    """Stores the draft vocabulary: drafts are then drawn from these ids only (a head of
    ``len(token_ids)`` rows instead of the whole vocabulary; verification is unaffected)."""
    path = Path(directory) / VOCAB_FILE
    path.write_text(json.dumps({"token_ids": [int(t) for t in token_ids]}) + "\n")
    return path


def read_draft_vocab(directory: str | Path, vocab_size: int) -> torch.Tensor | None:
    """``[N]`` int64 token ids, or None when the checkpoint drafts over the whole vocabulary."""
    path = Path(directory) / VOCAB_FILE
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())["token_ids"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise DraftCheckpointError(f"{path}: want {{\"token_ids\": [...]}} ({exc!r})") from None
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and 0 <= t < vocab_size for t in ids):
        raise DraftCheckpointError(f"{path}: token_ids must be a non-empty list of ids in [0, {vocab_size})")
    if len(set(ids)) != len(ids):
        raise DraftCheckpointError(f"{path}: token_ids repeat an id")
    return torch.tensor(ids, dtype=torch.int64)
