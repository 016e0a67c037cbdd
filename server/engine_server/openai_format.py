"""OpenAI's response shapes (completions, chat completions, SSE chunks, errors), and the
incremental detokenizer that streams text from token ids."""

from __future__ import annotations

import json
import time
from typing import Any

from runtime.request import RequestOutput
from runtime.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalText:
    """Text deltas from a growing list of token ids. Decodes the whole output each time
    (outputs are short here) and holds back a trailing U+FFFD: a multi-byte character split
    over tokens decodes to it until its last byte arrives."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self.token_ids: list[int] = []
        self._emitted = 0

    def add(self, token_ids: list[int], *, final: bool = False) -> str:
        self.token_ids.extend(token_ids)
        text = self._tok.decode(self.token_ids)
        stop = len(text)
        if not final:
            while stop > self._emitted and text[stop - 1] == _REPLACEMENT:
                stop -= 1
        delta = text[self._emitted:stop]
        self._emitted = stop
        return delta

    @property
    def text(self) -> str:
        return self._tok.decode(self.token_ids)


def usage(out: RequestOutput) -> dict[str, Any]:
    """OpenAI's usage, with the prefix-cache hits as ``prompt_tokens_details.cached_tokens``
    (OpenAI's field) and per tier under ``kvstore`` (this server's extension)."""
    reused = dict(out.metrics.num_tokens_reused)
    n_prompt, n_out = len(out.prompt_token_ids), len(out.output_token_ids)
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_out,
        "total_tokens": n_prompt + n_out,
        "prompt_tokens_details": {"cached_tokens": sum(reused.values())},
        "kvstore": {"tokens_reused": reused, "tokens_computed": out.metrics.num_tokens_computed,
                    "ttft_s": out.metrics.ttft_s},
    }


def finish_reason(out: RequestOutput) -> str:
    # "error" is the engine's (a failed request among healthy ones); OpenAI has no such
    # reason, and clients treat an unknown one as the end, which it is
    return out.finish_reason


def completion_body(rid: str, model: str, out: RequestOutput, text: str, *, chat: bool,
                    token_ids: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(out), "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    if token_ids:
        choice["token_ids"] = list(out.output_token_ids)
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(out)}


def chunk(rid: str, model: str, *, chat: bool, text: str | None = None,
          token_ids: list[int] | None = None, finish: str | None = None,
          usage_: dict[str, Any] | None = None, first: bool = False) -> str:
    """One SSE event. ``usage_`` alone: the final usage chunk (empty ``choices``)."""
    choices: list[dict[str, Any]] = []
    if usage_ is None or text is not None or finish is not None:
        c: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            c["delta"] = delta
        else:
            c["text"] = text or ""
        if token_ids is not None:
            c["token_ids"] = token_ids
        choices.append(c)
    body: dict[str, Any] = {"id": rid,
                            "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": int(time.time()), "model": model, "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    return sse(body)


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


DONE = "data: [DONE]\n\n"


def error_body(message: str, status: int, hint: str = "", param: str | None = None,
               ) -> dict[str, Any]:
    """OpenAI's error shape, plus the admin API's ``detail`` and ``hint`` (kvstore's
    convention: the same fields as ``server.admin.main.error_response``)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message + (f" (hint: {hint})" if hint else ""), "type": kind,
                      "param": param, "code": status},
            "detail": message, "hint": hint}


def chat_prompt(messages: list[tuple[str, str]]) -> str:
    """A plain-text chat template (the random-weight models have none of their own): one
    ``Role: content`` line per message, then the assistant's cue."""
    lines = [f"{role.capitalize()}: {content}" for role, content in messages]
    return "\n".join(lines) + "\nAssistant:"
