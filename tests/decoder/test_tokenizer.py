"""Tokenizer: GGUF byte-level BPE vs transformers, SentencePiece-style GGUF vs sentencepiece,
chat templates, streaming detokenization."""

from __future__ import annotations

import io
import json

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers

from services.decoder.model.gguf_loader import GGUFTokenizerData
from services.decoder.model.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = [
    "Hello world",
    "",
    "  leading spaces",
    "trailing spaces   ",
    "multiple    spaces inside",
    "line1\nline2\n\n\nline3\r\n",
    "Numbers 1234567 and 3.14159, -42",
    "    return 1",
    "naïve café résumé Ωμέγα",
    "日本語のテキスト、中文字符",
    "emoji 😀🎉👍🏽 family 👨\u200d👩\u200d👧",
    "def f(x):\n    return x**2  # square\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "don't I'LL we've",
    "\t tabs\tand\u00a0nbsp",
    "<|endoftext|>text<file_sep>more",
]
# Whitespace runs before a numeric character: llama.cpp's "smollm" pre-tokenizer (and SmolLM2's own
# tokenizer.json) isolates every digit first, transformers' GGUF converter uses the GPT-2 regex only.
DIVERGENT = {
    "x  1": ["x", "ĠĠ", "1"],
    "a\n 12": ["a", "ĊĠ", "1", "2"],
    "½ ²": ["Â½", "Ġ", "Â²"],
}


@pytest.fixture(scope="module")
def tok(gguf_path):
    return Tokenizer.from_gguf(gguf_path)


@pytest.fixture(scope="module")
def compat_tok(gguf_path):
    return Tokenizer.from_gguf(gguf_path, transformers_compat=True)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tok, compat_tok, hf_tokenizer, text):
    expected = hf_tokenizer.encode(text)
    assert tok.encode(text) == expected
    assert compat_tok.encode(text) == expected


@pytest.mark.parametrize("text", sorted(DIVERGENT))
def test_digit_isolation_differs_from_transformers_by_design(tok, compat_tok, hf_tokenizer, text):
    ids = tok.encode(text)
    assert [tok.id_to_token(i) for i in ids] == DIVERGENT[text]
    assert ids != hf_tokenizer.encode(text)
    assert compat_tok.encode(text) == hf_tokenizer.encode(text)
    assert tok.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS + sorted(DIVERGENT))
def test_decode_round_trip(tok, hf_tokenizer, text):
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(
        ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    assert tok.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_special_ids_and_bos_policy(tok):
    assert tok.bos_token_id == 1 and tok.eos_token_ids == (2,)
    assert not tok.add_bos_token  # SmolLM2 declares add_bos_token False
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False)
    assert tok.vocab_size == 49152
    assert tok.decode([1, 4093, 2]) == "user"  # specials skipped


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "An apple 🍎."},
        {"role": "user", "content": "Another, in 日本語?"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok, hf_tokenizer, messages, add_generation_prompt):
    expected = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected


def test_chat_template_raise_exception_and_missing_template():
    backend = _byte_backend()
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}" \
               "{{ bos_token }}{% for m in messages %}{{ m['content'] | tojson }}{% endfor %}"
    t = Tokenizer(backend, bos_token_id=None, eos_token_ids=(), chat_template=template,
                  special_token_strings={"bos_token": "<s>"})
    assert t.apply_chat_template([{"role": "user", "content": "é"}]) == '<s>"é"'
    with pytest.raises(ValueError, match="first must be user"):
        t.apply_chat_template([{"role": "assistant", "content": "x"}])
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(backend, bos_token_id=None, eos_token_ids=()).apply_chat_template([])


# ---- streaming ---------------------------------------------------------------------------------

STREAM_TEXT = "Café ☕ costs 3€ — 日本語 😀👍🏽 done.\n  naïve 👨\u200d👩\u200d👧!"


def test_incremental_detokenizer_concatenates_to_decode(tok):
    ids = tok.encode(STREAM_TEXT)
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in ids]
    assert "".join(deltas) + detok.flush() == tok.decode(ids) == STREAM_TEXT
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas  # some tokens end inside a multi-byte character and were held back
    assert detok.text == STREAM_TEXT


def test_incremental_detokenizer_with_prompt_and_specials(tok):
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"}]))
    generated = tok.encode("日本 😀 ok") + [2]  # ends with <|im_end|>
    detok = IncrementalDetokenizer(tok, prompt_ids=prompt)
    text = "".join(detok.push(i) for i in generated) + detok.flush()
    assert text == tok.decode(generated) == "日本 😀 ok"


def test_incremental_detokenizer_flush_emits_incomplete_tail(tok):
    ids = tok.encode("a😀")
    detok = IncrementalDetokenizer(tok)
    streamed = "".join(detok.push(i) for i in ids[:-1])  # stop mid-emoji
    assert "\ufffd" not in streamed
    assert streamed + detok.flush() == tok.decode(ids[:-1])


# ---- tokenizer.json directories ----------------------------------------------------------------


def _byte_backend():
    vocab = {p: i for i, p in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab |= {"<s>": len(vocab), "</s>": len(vocab) + 1}
    backend = BackendTokenizer(models.BPE(vocab, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def test_from_pretrained_dir_reads_config_and_template(tmp_path):
    _byte_backend().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": True,
        "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"}],
    }))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, 65]}))
    t = Tokenizer.from_pretrained_dir(tmp_path)
    assert t.bos_token_id == 256 and t.eos_token_ids == (257, 65)
    assert t.encode("A")[0] == 256 and t.encode("A", add_special_tokens=False) == [t.token_to_id("A")]
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == "<s>x"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert Tokenizer.from_pretrained_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "J1"


# ---- SentencePiece-style GGUF vocabulary -------------------------------------------------------

SPM_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello there, world of tokens.",
    "Sparse attention reads only the pages it needs.",
    "Speculative decoding verifies drafts without changing the output.",
    "Numbers like 12, 345 and 6789 appear in text.",
    "  Indented lines and double  spaces stay as they are.",
] * 20


@pytest.fixture(scope="module")
def spm_pair():
    """(sentencepiece processor, our Tokenizer built from its pieces as GGUF metadata)."""
    import sentencepiece as spm
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SPM_CORPUS), model_writer=proto, vocab_size=400, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        character_coverage=1.0, minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    n = sp.get_piece_size()

    def piece_type(i):
        return 2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 5 if sp.is_unused(i) else 1

    data = GGUFTokenizerData(
        model="llama", pre="default", tokens=[sp.id_to_piece(i) for i in range(n)],
        token_types=[piece_type(i) for i in range(n)], scores=[sp.get_score(i) for i in range(n)], merges=None,
        bos_token_id=sp.bos_id(), eos_token_id=sp.eos_id(), eot_token_id=None, eom_token_id=None,
        unk_token_id=sp.unk_id(), pad_token_id=None, add_bos_token=None, add_eos_token=None,
        add_space_prefix=True, chat_template=None,
    )
    return sp, Tokenizer.from_gguf_data(data)


SPM_TEXTS = ["Hello world", "the lazy fox", "  two leading", "double  space", "tokens.\nNew line",
             "naïve ☕ 日本", "unseen: Zyx 42!", "Speculative sparse decoding reads drafts"]


@pytest.mark.parametrize("text", SPM_TEXTS)
def test_sentencepiece_gguf_vocab_matches_sentencepiece(spm_pair, text):
    sp, ours = spm_pair
    assert ours.encode(text, add_special_tokens=False) == sp.encode(text)
    assert ours.encode(text) == [sp.bos_id(), *sp.encode(text)]  # llama default: add BOS
    assert ours.decode(sp.encode(text)) == sp.decode(sp.encode(text))
