"""Prompts shared by the speculative-decoding engine tests."""

import pytest

from tests.decoder.prompts import SHORT_PROMPTS, long_document


@pytest.fixture(scope="module")
def prompts(loaded_model):
    tok = loaded_model.tokenizer
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Repeat exactly: red, green, blue, red, green, blue, red, green."}]
    )
    return [
        tok.encode(long_document(30)),  # copy-heavy: many acceptances
        tok.encode(SHORT_PROMPTS[1]),
        tok.encode(chat, add_special_tokens=False),
        tok.encode(long_document(8)),
    ]
