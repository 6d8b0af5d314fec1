"""OpenAI request models for /v1/completions and /v1/chat/completions.

Validation failures become 400s with OpenAI's error body (``errors.invalid_request``); limits
that depend on configuration (max_tokens ceiling, prompt tokens) are checked in ``generation``.
Unknown fields are ignored, as vLLM and SGLang do. Besides OpenAI's fields the requests accept
the usual extras: ``top_k``, ``ignore_eos``, ``stop_token_ids``, ``include_stop_str_in_output``.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from services.gateway.errors import APIError, invalid_request

UINT32_MAX = 2**32 - 1  # counts and token ids travel to the decoder as uint32
TokenId = Annotated[int, Field(ge=0, le=UINT32_MAX)]


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingFields(BaseModel):
    # unknown top-level fields are refused (400 naming the field), as OpenAI's API does: a
    # misspelt parameter must not be silently ignored
    model_config = ConfigDict(extra="forbid")

    model: str
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # extras (vLLM-style)
    top_k: int = Field(0, ge=-1, le=UINT32_MAX)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False

    @field_validator("stop")
    @classmethod
    def _stop_non_empty(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        if len(stops) > 16:
            raise ValueError("at most 16 stop sequences are supported")
        return value

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("only n=1 is supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported (must be 0)")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1, le=UINT32_MAX)
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _token_ids_in_range(cls, value):
        ids = [t for item in value for t in (item if isinstance(item, list) else [item])] \
            if isinstance(value, list) else []
        if any(isinstance(t, int) and not 0 <= t <= UINT32_MAX for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {UINT32_MAX}]")
        return value

    @model_validator(mode="after")
    def _one_prompt(self):
        if isinstance(self.prompt, list):
            if not self.prompt:
                raise ValueError("prompt must not be empty")
            if isinstance(self.prompt[0], (str, list)) and len(self.prompt) != 1:
                raise ValueError("only one prompt per request is supported")
        if self.prompt == "" or self.prompt == [""] or self.prompt == [[]]:
            raise ValueError("prompt must not be empty")
        if self.echo:
            raise ValueError("echo is not supported")
        if self.logprobs is not None:
            raise ValueError("logprobs is not supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        return self

    @property
    def single_prompt(self) -> str | list[int]:
        """The one prompt: text, or token ids."""
        prompt = self.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        return prompt


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list | None = None
    response_format: dict | None = None

    @model_validator(mode="after")
    def _supported_chat(self):
        if self.logprobs or self.top_logprobs:
            raise ValueError("logprobs is not supported")
        if self.tools:
            raise ValueError("tools are not supported")
        if self.response_format and self.response_format.get("type") != "text":
            raise ValueError("only response_format type 'text' is supported")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict]:
        """Messages for the chat template (``developer`` is read as ``system``)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text} for m in self.messages]


def parse_request(model: type[BaseModel], body: bytes):
    """Parses a JSON body into ``model``; raises ``APIError`` 400 with the first problem."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise _as_api_error(exc) from None


# parts of an error location that name a union member or a validator, not a field
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|function-.*|constrained-.*|.*\[.*\])$")


def _as_api_error(exc: ValidationError) -> APIError:
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return invalid_request(f"We could not parse the JSON body of your request: {first['msg']}")
    loc = [str(p) for p in first["loc"] if not _UNION_TAG.match(str(p))]
    param = ".".join(loc) or None
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        message = f"Missing required parameter: '{param}'."
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return invalid_request(message, param)
