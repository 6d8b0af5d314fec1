"""Text <-> token ids, chat templates and streaming detokenization.

``Tokenizer`` wraps a ``tokenizers.Tokenizer`` built either from a GGUF file's ``tokenizer.ggml.*``
metadata (see ``gguf_vocab``) or from a Hugging Face ``tokenizer.json`` (+ ``tokenizer_config.json``,
``chat_template.jinja``, ``generation_config.json``, ``config.json`` when present).

``IncrementalDetokenizer`` turns a stream of generated ids into text deltas that never split a
UTF-8 character.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as BackendTokenizer

from services.decoder.model.errors import ModelLoadError
from services.decoder.model.gguf_loader import GGUFTokenizerData, read_gguf_tokenizer
from services.decoder.model.gguf_vocab import build_gguf_backend

_REPLACEMENT_CHAR = "\ufffd"


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile_template(source: str) -> jinja2.Template:
    """Compile a chat template the way Hugging Face does (sandboxed, trim/lstrip blocks)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ModelLoadError(f"the model's chat template does not compile: {exc}") from exc


class Tokenizer:
    """A model's tokenizer.

    ``encode`` adds BOS/EOS only as the model declares (``add_bos_token``/``add_eos_token``); when
    the declaration comes from ``tokenizer.json``'s post-processor (``manual_specials=False``) the
    backend's post-processor does it.
    """

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: tuple[int, ...],
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        manual_specials: bool = True,
        chat_template: str | None = None,
        special_token_strings: dict[str, str] | None = None,
    ):
        self._backend = backend
        self._bos_token_id = bos_token_id
        self._eos_token_ids = tuple(dict.fromkeys(eos_token_ids))
        self._add_bos = add_bos_token
        self._add_eos = add_eos_token
        self._manual_specials = manual_specials
        self._chat_template = chat_template
        self._compiled_template: jinja2.Template | None = None
        self._special_strings = dict(special_token_strings or {})

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, *, transformers_compat: bool = False) -> Tokenizer:
        """Tokenizer from a GGUF file's metadata (no tensor is read)."""
        return cls.from_gguf_data(read_gguf_tokenizer(path), transformers_compat=transformers_compat)

    @classmethod
    def from_gguf_data(cls, data: GGUFTokenizerData, *, transformers_compat: bool = False) -> Tokenizer:
        """Tokenizer from already-read GGUF tokenizer metadata. See ``gguf_vocab`` for
        ``transformers_compat`` (reproduce transformers' GGUF converter instead of llama.cpp)."""
        backend = build_gguf_backend(data, transformers_compat=transformers_compat)
        is_spm = data.model == "llama"
        add_bos = data.add_bos_token if data.add_bos_token is not None else is_spm  # llama.cpp defaults
        eos_ids = tuple(i for i in (data.eos_token_id, data.eot_token_id, data.eom_token_id) if i is not None)

        def piece(token_id):
            return None if token_id is None else data.tokens[token_id]

        strings = {"bos_token": piece(data.bos_token_id), "eos_token": piece(data.eos_token_id),
                   "unk_token": piece(data.unk_token_id), "pad_token": piece(data.pad_token_id)}
        return cls(
            backend,
            bos_token_id=data.bos_token_id,
            eos_token_ids=eos_ids,
            add_bos_token=bool(add_bos),
            add_eos_token=bool(data.add_eos_token),
            chat_template=data.chat_template,
            special_token_strings={k: v for k, v in strings.items() if v is not None},
        )

    @classmethod
    def from_pretrained_dir(cls, directory: str | os.PathLike) -> Tokenizer:
        """Tokenizer from a Hugging Face directory: ``tokenizer.json`` (required) plus optional
        ``tokenizer_config.json`` (bos/eos strings, add_bos/eos_token, chat_template),
        ``chat_template.jinja``, ``generation_config.json`` and ``config.json`` (extra eos ids)."""
        directory = Path(directory)
        tok_file = directory / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelLoadError(f"{directory} has no tokenizer.json")
        try:
            backend = BackendTokenizer.from_file(str(tok_file))
        except Exception as exc:
            raise ModelLoadError(f"{tok_file} is not a valid tokenizers file: {exc}") from exc
        cfg = _read_json(directory / "tokenizer_config.json")

        def token_str(value):
            if isinstance(value, dict):
                value = value.get("content")
            return value if isinstance(value, str) else None

        strings = {k: token_str(cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        strings = {k: v for k, v in strings.items() if v is not None}
        bos_id = backend.token_to_id(strings["bos_token"]) if "bos_token" in strings else None

        eos_ids: list[int] = []
        if "eos_token" in strings and backend.token_to_id(strings["eos_token"]) is not None:
            eos_ids.append(backend.token_to_id(strings["eos_token"]))
        for extra in ("generation_config.json", "config.json"):
            value = _read_json(directory / extra).get("eos_token_id")
            eos_ids.extend(value if isinstance(value, list) else [] if value is None else [value])
            if bos_id is None and extra == "config.json":
                bos_id = _read_json(directory / extra).get("bos_token_id")

        manual = "add_bos_token" in cfg or "add_eos_token" in cfg
        return cls(
            backend,
            bos_token_id=bos_id,
            eos_token_ids=tuple(int(i) for i in eos_ids),
            add_bos_token=bool(cfg.get("add_bos_token", False)),
            add_eos_token=bool(cfg.get("add_eos_token", False)),
            manual_specials=manual,
            chat_template=_chat_template_from_dir(directory, cfg),
            special_token_strings=strings,
        )

    # ---- properties ---------------------------------------------------------------------------

    @property
    def backend(self) -> BackendTokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._backend

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation (eos, and end-of-turn ids where the model declares them)."""
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def add_bos_token(self) -> bool:
        return self._add_bos

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    # ---- encode / decode ----------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids for ``text``. Special-token strings inside ``text`` (e.g. ``<|im_start|>``)
        become their ids. BOS/EOS are added only when ``add_special_tokens`` and the model says so."""
        if not self._manual_specials:
            return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self._add_bos and self._bos_token_id is not None:
                ids = [self._bos_token_id, *ids]
            if self._add_eos and self._eos_token_ids:
                ids = [*ids, self._eos_token_ids[0]]
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (no clean-up of spaces before punctuation: the exact text)."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ---- chat ---------------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """Render ``messages`` ([{"role": ..., "content": ...}, ...]) with the model's template.

        Variables: ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token`` (and
        ``unk_token``/``pad_token`` when defined), plus any ``kwargs`` (e.g. ``tools``). A template
        error (including the template's own ``raise_exception``) raises ``ValueError``.
        """
        if self._chat_template is None:
            raise ValueError("this model has no chat template; send a raw prompt instead")
        if self._compiled_template is None:
            self._compiled_template = _compile_template(self._chat_template)
        variables = {**self._special_strings, **kwargs}
        try:
            return self._compiled_template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **variables
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ValueError(f"chat template error: {exc}") from exc


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    return value if isinstance(value, dict) else {}


def _chat_template_from_dir(directory: Path, cfg: dict) -> str | None:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = cfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        by_name = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = by_name.get("default")
    return template if isinstance(template, str) else None


class IncrementalDetokenizer:
    """Streaming text for generated ids.

    ``push(id)`` returns the text that ``id`` completes, or ``""`` while the decoded tail still ends
    in an incomplete UTF-8 character (U+FFFD). ``flush()`` returns what is held back at the end of
    the stream. The concatenation of all deltas (plus ``flush()``) equals
    ``decode(prompt_ids + generated)[len(decode(prompt_ids)):]``, which is ``decode(generated)``
    when ``prompt_ids`` is None (and for byte-level tokenizers in any case).

    Cost per push: one decode of the ids since the last emitted boundary (a few ids), not of
    the whole sequence.
    """

    _PROMPT_CONTEXT_IDS = 5  # prompt ids kept as left context (SentencePiece leading-space rule)

    def __init__(self, tokenizer: Tokenizer, prompt_ids=None, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        context = list(prompt_ids or [])[-self._PROMPT_CONTEXT_IDS:]
        self._ids: list[int] = context
        self._prefix_offset = 0  # start of the window decoded for context
        self._read_offset = len(context)  # ids before this are already emitted
        self._text_parts: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._text_parts)

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        prefix_text = self._tok.decode(self._ids[self._prefix_offset:self._read_offset], self._skip)
        full_text = self._tok.decode(self._ids[self._prefix_offset:], self._skip)
        if full_text.endswith(_REPLACEMENT_CHAR) or len(full_text) <= len(prefix_text):
            return ""  # incomplete character (or nothing new yet): hold back
        delta = full_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._text_parts.append(delta)
        return delta

    def flush(self) -> str:
        """Emit whatever is held back (e.g. a genuinely incomplete byte sequence at the end)."""
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._tok.decode(self._ids[self._prefix_offset:self._read_offset], self._skip)
        full_text = self._tok.decode(self._ids[self._prefix_offset:], self._skip)
        delta = full_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        if delta:
            self._text_parts.append(delta)
        return delta
