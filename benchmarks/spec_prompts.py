"""The speculative-decoding benchmarks' held-out prompts (none were used to tune anything), per kind:

- ``code_edit``: a function plus an instruction to rename a variable (copy-heavy);
- ``chat``: short open questions in the chat template (4 hand-written, then the drafters'
  held-out split);
- ``long_doc_qa``: a 4K-8K-token document of standard-library source (``LONG_DOC_TOKENS``) and a
  question about it.
"""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

CODE_SNIPPET = '''def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals and return them sorted."""
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
'''

CHAT_QUESTIONS = [
    "What are three good habits for learning a new language?",
    "Explain what a hash table is to a beginner.",
    "Give me a short plan for a rainy Sunday.",
    "Why do leaves change color in autumn?",
]

# standard-library modules a long document is cut from, in turn from the prompt's own first one
DOC_SOURCES = ("textwrap.py", "shlex.py", "bisect.py", "glob.py", "fnmatch.py", "heapq.py", "csv.py", "string.py")
# the document of long_doc_qa prompt i: MIN + (i x STEP) mod SPAN tokens, so 4 prompts span
# 4096 / 5632 / 7168 / 4608 and 8 reach 7680 (with the chat template, the question and 64 output
# tokens, within the default model's 8192-token context)
LONG_DOC_TOKENS = (4096, 1536, 4096)  # (MIN, STEP, SPAN)
LONG_DOC_QUESTION = "\n\nQuestion: list the names of the functions defined above."


@functools.cache
def _heldout_chats() -> tuple[str, ...]:
    """The drafters' held-out chat prompts (``spec/training/prompts.py``: topics no training
    prompt has), built once."""
    from services.decoder.spec.training.prompts import chat_prompts

    return tuple(p.text for p in chat_prompts() if p.split == "heldout")


def _heldout_chat(index: int) -> str:
    """Chat prompt ``index`` beyond the hand-written ones, spread over the held-out topics and
    templates (a stride coprime with their number: distinct for every index below it)."""
    held = _heldout_chats()
    return held[(index * 37) % len(held)]


def long_doc_tokens(index: int) -> int:
    """The document length (tokens) of long_doc_qa prompt ``index``."""
    low, step, span = LONG_DOC_TOKENS
    return low + (index * step) % span


def long_document(tokenizer, index: int) -> str:
    """Long_doc_qa prompt ``index``'s document: ``DOC_SOURCES`` from the ``index``-th on (each
    headed by its file name), cut at ``long_doc_tokens(index)`` tokens."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    want = long_doc_tokens(index)
    ids: list[int] = []
    for k in range(len(DOC_SOURCES)):
        name = DOC_SOURCES[(index + k) % len(DOC_SOURCES)]
        ids += tokenizer.encode(f"# file: {name}\n{(stdlib / name).read_text()}\n")
        if len(ids) >= want:
            return tokenizer.decode(ids[:want])
    raise ValueError(f"the documents in {DOC_SOURCES} hold {len(ids)} tokens, fewer than {want}")


def build_prompts(tokenizer, kind: str, count: int) -> list[list[int]]:
    """``count`` prompts of ``kind`` (token ids, in the chat template)."""
    def chat(content: str) -> list[int]:
        return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": content}]),
                                add_special_tokens=False)

    prompts = []
    for i in range(count):
        if kind == "code_edit":
            content = f"Rewrite this function, renaming `ordered` to `by_start{i}`. Output only code.\n\n{CODE_SNIPPET}"
        elif kind == "chat":
            content = CHAT_QUESTIONS[i] if i < len(CHAT_QUESTIONS) else _heldout_chat(i - len(CHAT_QUESTIONS))
        elif kind == "long_doc_qa":
            content = long_document(tokenizer, i) + LONG_DOC_QUESTION
        else:
            raise ValueError(kind)
        prompts.append(chat(content))
    return prompts
