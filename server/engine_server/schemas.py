"""Wire types of the OpenAI-compatible API (the subset served). Requests are strict: an
unknown field or a value of the wrong type is a 400 naming it, not a silent coercion (a
``max_tokens`` of ``"16"`` or ``1.5`` is refused). Responses are built as plain dicts in
:mod:`.openai_format` (their shape is OpenAI's, checked by the tests)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_In):
    include_usage: StrictBool = False


class _Sampling(_In):
    """Fields common to completions and chat completions."""

    model: StrictStr | None = Field(None, description="must name the served model when given")
    max_tokens: StrictInt = Field(16, ge=1, description="tokens to generate at most")
    temperature: StrictFloat | StrictInt = Field(1.0, ge=0, description="0: greedy")
    top_p: StrictFloat | StrictInt = Field(1.0, gt=0, le=1)
    seed: StrictInt | None = Field(None, ge=0)
    stop_token_ids: list[StrictInt] = Field(
        default_factory=list, description="stop after emitting one of these (vLLM's extension)")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = Field(1, description="one choice per request (only 1 is served)")
    cache_salt: StrictStr | None = Field(
        None, description="a per-request cache namespace: NOT supported by this engine (400)")
    return_token_ids: StrictBool = Field(
        False, description="also return the generated token ids (vLLM's extension)")
    user: StrictStr | None = None


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictInt] = Field(
        description="text (tokenized by the served tokenizer) or a list of token ids")


class ChatMessage(_In):
    role: Literal["system", "user", "assistant"]
    content: StrictStr


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
