"""Documents, passkey prompts and the quality metrics (pure, unit-tested)."""

from __future__ import annotations

import math
import re
import sysconfig
from pathlib import Path

import torch

# Fixed document list (large, stable stdlib modules). Missing files are skipped and the used list recorded.
STDLIB_DOCUMENTS = (
    "argparse.py",
    "difflib.py",
    "doctest.py",
    "inspect.py",
    "pydoc.py",
    "subprocess.py",
    "tarfile.py",
    "typing.py",
)

FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
PASSKEY_SENTENCE = "The pass key is {key}. Remember it. {key} is the pass key. "
PASSKEY_QUESTION = "What is the pass key?"
PASSKEY_INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there.\n\n"
)

PPL_TARGET_BUDGET = 2048
PPL_TARGET_CONTEXT = 8192
PPL_TARGET_MAX_INCREASE = 0.02
PASSKEY_TARGET_BUDGETS = (1024, 2048)


# ---------------------------------------------------------------------------------------------
# pure helpers (unit-tested)
# ---------------------------------------------------------------------------------------------
def nll_sum(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Sum of ``-log softmax(logits)[target]`` over rows. ``logits: [n, vocab]``, ``targets: [n]``."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return float(-logp.gather(1, targets.view(-1, 1).long()).sum())


def perplexity(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """``exp(mean NLL)`` of ``targets`` under ``logits``."""
    return math.exp(nll_sum(logits, targets) / max(int(targets.numel()), 1))


def agreement(reference: list[int], other: list[int]) -> dict:
    """Common-prefix length and position-wise agreement of two token sequences (over the
    reference's length)."""
    n = len(reference)
    prefix = 0
    while prefix < min(n, len(other)) and reference[prefix] == other[prefix]:
        prefix += 1
    same = sum(1 for a, b in zip(reference, other) if a == b)
    return {"tokens": n, "prefix_match": prefix, "positionwise": same / n if n else 1.0}


def passkey_text(num_filler: int, depth: float, key: str) -> str:
    """The user message: intro, ``num_filler`` filler blocks with the key sentence inserted after
    ``round(depth * num_filler)`` of them, then the question."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError("depth must be in [0, 1]")
    at = round(depth * num_filler)
    body = FILLER * at + PASSKEY_SENTENCE.format(key=key) + FILLER * (num_filler - at)
    return PASSKEY_INTRO + body + "\n" + PASSKEY_QUESTION


def passkey_depth(text: str, key: str) -> float:
    """Where the key sentence sits in the filler, as a fraction of filler blocks before it."""
    body = text[len(PASSKEY_INTRO):]
    before, _, after = body.partition(PASSKEY_SENTENCE.format(key=key))
    n_before, n_after = before.count(FILLER), after.count(FILLER)
    return n_before / max(n_before + n_after, 1)


def passkey_correct(answer: str, key: str) -> bool:
    """True when the key's digits appear in ``answer`` (spaces/commas between digits tolerated)."""
    return key in re.sub(r"[\s,]", "", answer)


def make_key(index: int) -> str:
    """Deterministic 5-digit keys."""
    return str(10000 + (index * 7919 + 4271) % 90000)


def budget_label(budget: int | None) -> str:
    return "dense" if budget is None else f"sparse{budget}"


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
def stdlib_documents(tokenizer, window: int, count: int) -> list[tuple[str, list[int]]]:
    """The first ``window`` tokens of up to ``count`` files of ``STDLIB_DOCUMENTS`` that are long enough."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for name in sorted(STDLIB_DOCUMENTS):
        path = root / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        # a prefix of the file is enough (code is >2 chars/token); fall back to the whole file
        ids = tokenizer.encode(text[: window * 8], add_special_tokens=False)
        if len(ids) < window:
            ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= window:
            docs.append((name, ids[:window]))
        if len(docs) == count:
            break
    return docs


def passkey_prompt(tokenizer, context: int, depth: float, key: str, reserve: int = 16) -> list[int]:
    """Chat-templated passkey prompt of at most ``context - reserve`` tokens (as many filler blocks as fit)."""
    limit = context - reserve

    def encode(n: int) -> list[int]:
        text = tokenizer.apply_chat_template([{"role": "user", "content": passkey_text(n, depth, key)}])
        return tokenizer.encode(text, add_special_tokens=False)

    base = len(encode(0))
    per_block = max((len(encode(8)) - base) / 8, 1.0)
    n = max(int((limit - base) / per_block), 0)
    ids = encode(n)
    while len(ids) > limit and n > 0:
        n -= max(1, int((len(ids) - limit) / per_block))
        n = max(n, 0)
        ids = encode(n)
    while True:  # grow back to the tightest fit
        bigger = encode(n + 1)
        if len(bigger) > limit:
            break
        n, ids = n + 1, bigger
    return ids


# ---------------------------------------------------------------------------------------------
# engine drivers
