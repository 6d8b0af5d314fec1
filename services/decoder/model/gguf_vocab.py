"""Build a ``tokenizers.Tokenizer`` from a GGUF file's ``tokenizer.ggml.*`` metadata.

Two GGUF tokenizer models are supported:

``gpt2`` — byte-level BPE (SmolLM2, Llama 3, Qwen2/3). The merges are in the file; what is not in
the file is the pre-tokenizer, only its name (``tokenizer.ggml.pre``). We rebuild the one llama.cpp
uses for that name, which is the one the model was trained with (its original ``tokenizer.json``):

- ``smollm`` (and starcoder, refact, codeshell, command-r, exaone, minerva): every digit is its own
  pre-token, then the GPT-2 regex.
- ``llama-bpe`` / ``llama3``: the Llama 3 regex (digits in groups of up to 3, case-insensitive
  contractions), and whole pre-tokens found in the vocabulary skip the merges (``ignore_merges``).
- ``qwen2``: the Llama 3 regex with single digits.
- ``gpt2``, or no ``tokenizer.ggml.pre`` at all (old files): the GPT-2 regex.

transformers' GGUF converter (5.x) does not read ``tokenizer.ggml.pre``: for GGUF architecture
``llama`` it always uses the plain GPT-2 regex. That differs from the model's own tokenizer
wherever whitespace runs precede a digit (``"x  1"``: we give ``x ĠĠ 1``, transformers gives
``x Ġ Ġ 1``) and, for Llama 3, on digit groups. ``transformers_compat=True`` reproduces
transformers' choice, for token-exact comparisons with a transformers oracle.

``llama`` — SentencePiece-style BPE with scores (Llama 2, Mistral v0.1). Merges are derived from
the scores (a pair merges into a piece with the rank of that piece's score, highest first, as
SentencePiece does), spaces become ``▁`` with a ``▁`` prepended (``add_space_prefix``), and bytes
missing from the vocabulary fall back to ``<0xNN>`` pieces.

Token types (SentencePiece numbering): 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused,
6 byte. Control and unknown tokens are special (skipped by ``decode(skip_special_tokens=True)``);
user-defined tokens are matched verbatim in text but are not special.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE

from services.decoder.model.errors import ModelLoadError, UnsupportedArchitectureError
from services.decoder.model.gguf_loader import GGUFTokenizerData

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = _LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")

_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "codeshell", "command-r", "exaone", "minerva"}
_LLAMA3 = {"llama-bpe", "llama3", "llama-v3"}
_QWEN2 = {"qwen2"}
_GPT2 = {"gpt2"}
SUPPORTED_BPE_PRE = tuple(sorted(_DIGITS_THEN_GPT2 | _LLAMA3 | _QWEN2 | _GPT2))


def _byte_level_pre_tokenizer(pre: str | None, transformers_compat: bool):
    """Pre-tokenizer for a byte-level BPE GGUF vocabulary; returns (pre_tokenizer, ignore_merges)."""
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    if pre is None or pre in _GPT2:
        return gpt2, False
    if pre in _QWEN2:  # transformers agrees here (its Qwen2 converter)
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]), False
    if transformers_compat and (pre in _DIGITS_THEN_GPT2 or pre in _LLAMA3):
        return gpt2, False
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2]), False
    if pre in _LLAMA3:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]), True
    raise UnsupportedArchitectureError(
        f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(SUPPORTED_BPE_PRE)})"
    )


def _split_merges(merges: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ModelLoadError(f"malformed GGUF merge {merge!r} (expected 'left right')")
        pairs.append((parts[0], parts[1]))
    return pairs


def _merges_from_scores(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """SentencePiece BPE as ranked merges: every split ``l + r`` of a normal piece, where both
    halves are normal pieces, ranked by the merged piece's score (highest first; ties by id)."""
    normal = {t: i for i, t in enumerate(tokens) if types[i] == TOKEN_NORMAL}
    ranked = []
    for piece, piece_id in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-scores[piece_id], piece_id, normal[left], normal[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _add_typed_tokens(backend: BackendTokenizer, data: GGUFTokenizerData, types: list[int], spm: bool) -> None:
    special_types = (TOKEN_CONTROL, TOKEN_UNKNOWN) if spm else (TOKEN_CONTROL,)
    specials = [AddedToken(data.tokens[i], normalized=False, special=True)
                for i, t in enumerate(types) if t in special_types]
    user = [AddedToken(data.tokens[i], normalized=False, special=False)
            for i, t in enumerate(types) if t == TOKEN_USER_DEFINED]
    if specials:
        backend.add_special_tokens(specials)
    if user:
        backend.add_tokens(user)


def build_gguf_backend(data: GGUFTokenizerData, *, transformers_compat: bool = False) -> BackendTokenizer:
    """A ``tokenizers.Tokenizer`` equivalent to llama.cpp's for this GGUF vocabulary (no
    post-processor: BOS/EOS insertion is ``Tokenizer.encode``'s job)."""
    tokens = data.tokens
    types = data.token_types or [TOKEN_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ModelLoadError(f"GGUF tokenizer has {len(tokens)} tokens but {len(types)} token types")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelLoadError("GGUF tokenizer has duplicate tokens")

    if data.model == "gpt2":
        if data.merges is None:
            raise ModelLoadError("GGUF gpt2 tokenizer has no tokenizer.ggml.merges")
        pre, ignore_merges = _byte_level_pre_tokenizer(data.pre, transformers_compat)
        backend = BackendTokenizer(BPE(vocab, _split_merges(data.merges), ignore_merges=ignore_merges))
        backend.pre_tokenizer = pre
        backend.decoder = decoders.ByteLevel()
        _add_typed_tokens(backend, data, types, spm=False)
        return backend

    if data.model == "llama":
        if data.scores is None or len(data.scores) != len(tokens):
            raise ModelLoadError("GGUF llama (SentencePiece) tokenizer needs one score per token")
        unk = tokens[data.unk_token_id] if data.unk_token_id is not None else None
        merges = _merges_from_scores(tokens, data.scores, types)
        backend = BackendTokenizer(BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
        add_prefix = True if data.add_space_prefix is None else data.add_space_prefix
        steps = [normalizers.Prepend("▁")] if add_prefix else []
        backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
        dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        if add_prefix:
            dec.append(decoders.Strip(" ", 1, 0))
        backend.decoder = decoders.Sequence(dec)
        _add_typed_tokens(backend, data, types, spm=True)
        return backend

    raise UnsupportedArchitectureError(
        f"GGUF tokenizer model {data.model!r} is not supported (supported: gpt2, llama)"
    )
