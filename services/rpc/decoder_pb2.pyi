from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos", "include_stop_str_in_output")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    include_stop_str_in_output: bool
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., include_stop_str_in_output: _Optional[bool] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "text", "messages", "sampling", "max_prompt_tokens", "resume")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: TokenIds
    text: str
    messages: ChatMessages
    sampling: SamplingParams
    max_prompt_tokens: int
    resume: ResumeFrom
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., text: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., max_prompt_tokens: _Optional[int] = ..., resume: _Optional[_Union[ResumeFrom, _Mapping]] = ...) -> None: ...

class ResumeFrom(_message.Message):
    __slots__ = ("output_token_ids", "num_streamed_chars")
    OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_STREAMED_CHARS_FIELD_NUMBER: _ClassVar[int]
    output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_streamed_chars: int
    def __init__(self, output_token_ids: _Optional[_Iterable[int]] = ..., num_streamed_chars: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class SpeculationStats(_message.Message):
    __slots__ = ("num_draft_tokens", "num_accepted_tokens", "num_verify_steps")
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_VERIFY_STEPS_FIELD_NUMBER: _ClassVar[int]
    num_draft_tokens: int
    num_accepted_tokens: int
    num_verify_steps: int
    def __init__(self, num_draft_tokens: _Optional[int] = ..., num_accepted_tokens: _Optional[int] = ..., num_verify_steps: _Optional[int] = ...) -> None: ...

class ResidencyStats(_message.Message):
    __slots__ = ("mode", "num_hot_pages", "num_hot_hits", "num_hot_misses", "num_bytes_fetched", "num_bytes_written")
    MODE_FIELD_NUMBER: _ClassVar[int]
    NUM_HOT_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_HOT_HITS_FIELD_NUMBER: _ClassVar[int]
    NUM_HOT_MISSES_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FETCHED_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    mode: str
    num_hot_pages: int
    num_hot_hits: int
    num_hot_misses: int
    num_bytes_fetched: int
    num_bytes_written: int
    def __init__(self, mode: _Optional[str] = ..., num_hot_pages: _Optional[int] = ..., num_hot_hits: _Optional[int] = ..., num_hot_misses: _Optional[int] = ..., num_bytes_fetched: _Optional[int] = ..., num_bytes_written: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_s", "prefill_s", "decode_s", "num_preemptions", "num_prefill_tokens")
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    queue_s: float
    prefill_s: float
    decode_s: float
    num_preemptions: int
    num_prefill_tokens: int
    def __init__(self, queue_s: _Optional[float] = ..., prefill_s: _Optional[float] = ..., decode_s: _Optional[float] = ..., num_preemptions: _Optional[int] = ..., num_prefill_tokens: _Optional[int] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("request_id", "token_ids", "text_delta", "finish_reason", "usage", "speculation", "residency", "timing", "resumable")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    RESUMABLE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text_delta: str
    finish_reason: str
    usage: Usage
    speculation: SpeculationStats
    residency: ResidencyStats
    timing: Timing
    resumable: bool
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text_delta: _Optional[str] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., speculation: _Optional[_Union[SpeculationStats, _Mapping]] = ..., residency: _Optional[_Union[ResidencyStats, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., resumable: _Optional[bool] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("status", "decoder_id", "model")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[HealthResponse.Status]
        SERVING: _ClassVar[HealthResponse.Status]
        DRAINING: _ClassVar[HealthResponse.Status]
    UNKNOWN: HealthResponse.Status
    SERVING: HealthResponse.Status
    DRAINING: HealthResponse.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    status: HealthResponse.Status
    decoder_id: str
    model: str
    def __init__(self, status: _Optional[_Union[HealthResponse.Status, str]] = ..., decoder_id: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("decoder_id", "model", "num_running", "num_waiting", "max_num_seqs", "max_num_waiting", "num_free_slots", "num_total_slots", "page_size", "num_requests_finished", "num_generated_tokens", "num_prompt_tokens", "num_steps", "draining", "residency_mode_counts", "uptime_s", "num_prefill_tokens", "num_resumed_requests", "num_handed_off_requests")
    class ResidencyModeCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOTAL_SLOTS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_MODE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_RESUMED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_HANDED_OFF_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    decoder_id: str
    model: str
    num_running: int
    num_waiting: int
    max_num_seqs: int
    max_num_waiting: int
    num_free_slots: int
    num_total_slots: int
    page_size: int
    num_requests_finished: int
    num_generated_tokens: int
    num_prompt_tokens: int
    num_steps: int
    draining: bool
    residency_mode_counts: _containers.ScalarMap[str, int]
    uptime_s: float
    num_prefill_tokens: int
    num_resumed_requests: int
    num_handed_off_requests: int
    def __init__(self, decoder_id: _Optional[str] = ..., model: _Optional[str] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., max_num_waiting: _Optional[int] = ..., num_free_slots: _Optional[int] = ..., num_total_slots: _Optional[int] = ..., page_size: _Optional[int] = ..., num_requests_finished: _Optional[int] = ..., num_generated_tokens: _Optional[int] = ..., num_prompt_tokens: _Optional[int] = ..., num_steps: _Optional[int] = ..., draining: _Optional[bool] = ..., residency_mode_counts: _Optional[_Mapping[str, int]] = ..., uptime_s: _Optional[float] = ..., num_prefill_tokens: _Optional[int] = ..., num_resumed_requests: _Optional[int] = ..., num_handed_off_requests: _Optional[int] = ...) -> None: ...
