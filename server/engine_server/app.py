"""The OpenAI-compatible app over an :class:`~.engine_loop.EngineLoop`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (:mod:`.metrics`). Errors follow the admin API's convention (one mapping of kvstore's errors to
their ``http_status``, with message and hint) in OpenAI's ``{"error": {...}}`` shape; a
request the engine refuses (``InvalidArgument``: an id outside the vocabulary, a prompt plus
``max_tokens`` past the context, ...) is a 400 before any byte of a stream is sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvstore.errors import InvalidArgument, KVStoreError
from runtime.sampling import SamplingParams
from runtime.tokenizer import Tokenizer
from server.engine_server import openai_format as fmt
from server.engine_server.engine_loop import (Accepted, EngineLoop, Failed, Finished,
                                              RequestStream, Tokens)
from server.engine_server.metrics import add_metrics
from server.engine_server.schemas import ChatCompletionRequest, CompletionRequest, _Sampling

#: how often a non-streamed request checks that its client is still there
_DISCONNECT_POLL_S = 0.25


class _NotServed(Exception):
    """A 404: the request names another model."""


def _error(message: str, status: int, hint: str = "", param: str | None = None) -> JSONResponse:
    return JSONResponse(fmt.error_body(message, status, hint, param), status_code=status)


def build_app(loop: EngineLoop, model_name: str, tokenizer: Tokenizer, *,
              own_loop: bool = True) -> FastAPI:
    """The app; with ``own_loop`` its lifespan starts the loop and stops it (closing the
    engine) on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if own_loop:
            loop.start()
        try:
            yield
        finally:
            if own_loop:
                await asyncio.to_thread(loop.stop)

    app = FastAPI(title="kvstore engine (OpenAI-compatible)", version="1", lifespan=lifespan)
    app.state.loop = loop
    app.state.metrics = add_metrics(app, loop)
    vocab = loop.engine.model.config.vocab_size
    created = int(time.time())

    @app.exception_handler(KVStoreError)
    async def kvstore_error(request: Request, exc: KVStoreError) -> JSONResponse:
        return _error(exc.message, exc.http_status, exc.hint)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        # 400 (OpenAI's status for a malformed request) naming the first offending field
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg"))
        return _error(msg, 400, param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(str(exc.detail), exc.status_code)

    @app.exception_handler(_NotServed)
    async def not_served(request: Request, exc: _NotServed) -> JSONResponse:
        return _error(str(exc), 404, f"this server serves {model_name!r}", "model")

    @app.get("/health")
    def health() -> JSONResponse:
        if not loop.alive:
            why = f"engine failed: {loop.error}" if loop.error else "engine loop not running"
            return _error(why, 503)
        return JSONResponse({"status": "ok", "finished": loop.num_finished})

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "kvstore",
            "max_model_len": loop.engine.model.config.max_position_embeddings}]}

    def params_of(body: _Sampling) -> SamplingParams:
        if body.model is not None and body.model != model_name:
            raise _NotServed(f"model {body.model!r} is not served here")
        if body.cache_salt is not None:
            # the engine hashes every block key under one namespace; a salt it cannot honour
            # must not be silently dropped (tenants would share cached prefixes)
            raise InvalidArgument("cache_salt is not supported: the engine has one cache "
                                  "namespace for all requests",
                                  hint="leave cache_salt out, or run one server per tenant")
        bad = [t for t in body.stop_token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidArgument(f"stop_token_ids {bad} are outside [0, {vocab})")
        return SamplingParams(max_tokens=body.max_tokens, temperature=float(body.temperature),
                              top_p=float(body.top_p), seed=body.seed,
                              stop_token_ids=tuple(body.stop_token_ids))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        params = params_of(body)
        if isinstance(body.prompt, str):
            if not body.prompt:
                raise InvalidArgument("prompt is empty", hint="send at least one character")
            prompt = tokenizer.encode(body.prompt)
        else:
            prompt = list(body.prompt)
        return await _serve(loop, request, prompt, params, body, model_name, tokenizer,
                            chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        params = params_of(body)
        text = fmt.chat_prompt([(m.role, m.content) for m in body.messages])
        return await _serve(loop, request, tokenizer.encode(text), params, body, model_name,
                            tokenizer, chat=True)

    return app


async def _accepted(stream: RequestStream) -> None:
    """Wait for the engine to take the request; its refusal raises here (a 400 for an
    InvalidArgument) before any response starts."""
    ev = await stream.events.get()
    if isinstance(ev, Failed):
        if isinstance(ev.error, KVStoreError):
            raise ev.error  # InvalidArgument: a 400 naming the problem
        raise StarletteHTTPException(503, str(ev.error))  # the engine stopped or failed
    assert isinstance(ev, Accepted), ev


async def _serve(loop: EngineLoop, request: Request, prompt: list[int], params: SamplingParams,
                 body: _Sampling, model: str, tokenizer: Tokenizer, *, chat: bool) -> Any:
    if not prompt:
        raise InvalidArgument("prompt is empty", hint="send at least one token")
    try:
        stream = loop.submit(prompt, params)
    except RuntimeError as exc:  # the engine loop stopped or failed: /health says why
        return _error(str(exc), 503)
    try:
        await _accepted(stream)
    except asyncio.CancelledError:
        loop.cancel(stream.request_id)
        raise
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(
            _sse(loop, stream, model, tokenizer, chat=chat, include_usage=include_usage,
                 token_ids=body.return_token_ids),
            media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _collect(loop, request, stream, model, tokenizer, chat=chat,
                          token_ids=body.return_token_ids)


async def _collect(loop: EngineLoop, request: Request, stream: RequestStream, model: str,
                   tokenizer: Tokenizer, *, chat: bool, token_ids: bool) -> Any:
    """The whole output as one body; a client that goes away meanwhile cancels it."""
    done = False
    try:
        while True:
            try:
                ev = await asyncio.wait_for(stream.events.get(), _DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return None
                continue
            if isinstance(ev, Failed):
                done = True
                return _error(str(ev.error), 503)
            if isinstance(ev, Finished):
                done = True
                text = tokenizer.decode(ev.output.output_token_ids)
                return fmt.completion_body(stream.request_id, model, ev.output, text, chat=chat,
                                           token_ids=token_ids)
    finally:
        if not done:
            loop.cancel(stream.request_id)


async def _sse(loop: EngineLoop, stream: RequestStream, model: str, tokenizer: Tokenizer, *,
               chat: bool, include_usage: bool, token_ids: bool) -> AsyncIterator[str]:
    """SSE chunks as tokens arrive, a last chunk with the finish reason, then ``[DONE]``. A
    disconnect cancels this generator (Starlette cancels the response when the client's
    ``http.disconnect`` arrives): the ``finally`` cancels the request."""
    text = fmt.IncrementalText(tokenizer)
    rid = stream.request_id
    done = False
    first = True
    try:
        while True:
            ev = await stream.events.get()
            if isinstance(ev, Tokens):
                delta = text.add(ev.token_ids)
                if not delta and not token_ids:
                    continue  # a split character or a special token: nothing to show yet
                yield fmt.chunk(rid, model, chat=chat, text=delta, first=first,
                                token_ids=ev.token_ids if token_ids else None)
                first = False
            elif isinstance(ev, Finished):
                done = True
                tail = text.add([], final=True)
                yield fmt.chunk(rid, model, chat=chat, text=tail,
                                finish=fmt.finish_reason(ev.output), first=first,
                                token_ids=[] if token_ids else None)
                if include_usage:
                    yield fmt.chunk(rid, model, chat=chat, usage_=fmt.usage(ev.output))
                yield fmt.DONE
                return
            elif isinstance(ev, Failed):
                done = True
                # the status line is sent: the error goes in the stream (as OpenAI's does)
                yield fmt.sse(fmt.error_body(str(ev.error), 503))
                yield fmt.DONE
                return
    finally:
        if not done:
            loop.cancel(rid)
