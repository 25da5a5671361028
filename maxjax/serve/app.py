"""The OpenAI-compatible HTTP front end of an :class:`~maxjax.serve.Engine` (FastAPI, SSE by sse-starlette).

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (``stream: true`` answers with
server-sent events in OpenAI's chunk format, ending with a usage chunk and ``data: [DONE]``) for a
language model's :class:`~maxjax.serve.Engine`; ``POST /v1/embeddings`` (OpenAI's embeddings
format) for a sentence encoder's :class:`~maxjax.serve.encoder_engine.EncoderEngine`;
``GET /v1/models``, ``GET /health`` (200 while the engine runs, else 503) and ``GET /metrics``
(Prometheus text format, see :mod:`maxjax.serve.metrics`).

Errors use OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``: 400 for malformed
JSON, wrong types, values out of range and prompts longer than the context (code
``context_length_exceeded``); 404 for another model or route; 429 with ``Retry-After`` when the
engine's queue is full; 503 while the engine is not running; 504 when a request passes the
engine's timeout. A client that disconnects cancels its request (its row is freed at the next
step).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import uuid
from typing import Any, AsyncIterator

import anyio
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from maxjax.serve.encoder_engine import EmbeddingJob, EncoderEngine
from maxjax.serve.engine import ContextLengthExceeded, Engine, EngineStopped, QueueFull
from maxjax.serve.metrics import CONTENT_TYPE
from maxjax.serve.request import Event, Request, SamplingParams
from maxjax.serve.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, OpenAIRequest, error_body

__all__ = ["create_app"]

#: how often a non-streaming request checks whether its client is still there (seconds)
DISCONNECT_POLL = 0.25


class APIError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code, self.headers = status, message, type, param, code, headers

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.type, self.param, self.code), self.status, headers=self.headers)


_ENDED = {
    "timeout": (504, "the request did not finish within the server's request timeout", "timeout_error", "timeout"),
    "shutdown": (503, "the server is shutting down", "server_error", "shutdown"),
    "error": (500, "the server failed while generating", "server_error", None),
    "cancelled": (499, "the request was cancelled", "invalid_request_error", "cancelled"),
}


def create_app(engine: Engine | EncoderEngine, *, model_name: str | None = None, manage_engine: bool = True, shutdown_grace: float = 25.0) -> FastAPI:
    """The FastAPI app serving ``engine``.

    Args:
        engine: a :class:`~maxjax.serve.Engine` or an
            :class:`~maxjax.serve.encoder_engine.EncoderEngine` (started by the app's lifespan if it is not running yet
            and ``manage_engine``; stopped when the app shuts down).
        model_name: the model's id in ``/v1/models`` and the only ``model`` requests may name
            (default: the model file's name without its extension).
        manage_engine: start and stop the engine with the app.
        shutdown_grace: seconds a stream may go on once the server is told to exit (less than the
            ASGI server's own graceful-shutdown timeout); past that it is cut.
    """
    lm = engine.lm
    name = model_name or _default_name(lm)
    is_encoder = isinstance(engine, EncoderEngine)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_engine and not engine.running:
            await asyncio.to_thread(engine.start)
        try:
            yield
        finally:
            if manage_engine:
                await asyncio.to_thread(engine.stop)

    app = FastAPI(title="maxjax serve", lifespan=lifespan)
    app.state.engine = engine
    app.state.model_name = name

    # -- errors ---------------------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def _api_error(_: HTTPRequest, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: HTTPRequest, e: RequestValidationError) -> JSONResponse:
        return _validation_error(e.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: HTTPRequest, e: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if e.status_code == 404 else None
        return APIError(e.status_code, str(e.detail), param=None, code=code, headers=getattr(e, "headers", None)).response()

    # -- routes ---------------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> JSONResponse:
        if engine.running:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE)

    def model_card() -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "maxjax", "max_model_len": engine.context}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != name:
            raise _no_such_model(model_id)
        return model_card()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HTTPRequest) -> Any:
        _check(body, name)
        _generative(is_encoder, name)
        ids = _completion_prompt(lm, body)
        params = _params(body, body.max_tokens if body.max_tokens is not None else 16)
        req, events = _submit(engine, ids, params, "prompt")
        rid, t = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        usage = lambda: _usage(req)  # noqa: E731

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            return {"id": rid, "object": "text_completion", "created": t, "model": name, "choices": [choice]}

        if body.stream:
            return _sse(req, events, lambda text: chunk(text, None), lambda fin: chunk("", fin),
                        lambda: {"id": rid, "object": "text_completion", "created": t, "model": name, "choices": [], "usage": usage()},
                        grace=shutdown_grace)  # fmt: skip
        await _wait(req, events, http)
        out = chunk(req.text, req.finish_reason)
        out["usage"] = usage()
        return out

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: HTTPRequest) -> Any:
        _check(body, name)
        _generative(is_encoder, name)
        ids = _chat_prompt(lm, body)
        params = _params(body, body.limit())
        req, events = _submit(engine, ids, params, "messages")
        rid, t = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        usage = lambda: _usage(req)  # noqa: E731

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"id": rid, "object": "chat.completion.chunk", "created": t, "model": name, "choices": [choice]}

        if body.stream:
            return _sse(req, events, lambda text: chunk({"content": text}, None), lambda fin: chunk({}, fin),
                        lambda: {"id": rid, "object": "chat.completion.chunk", "created": t, "model": name, "choices": [],
                                 "usage": usage()},
                        first=chunk({"role": "assistant", "content": ""}, None), grace=shutdown_grace)  # fmt: skip
        await _wait(req, events, http)
        message = {"role": "assistant", "content": req.text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": req.finish_reason}
        return {"id": rid, "object": "chat.completion", "created": t, "model": name, "choices": [choice], "usage": usage()}

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, http: HTTPRequest) -> Any:
        if body.model != name:
            raise _no_such_model(body.model)
        if not is_encoder:
            raise APIError(400, f"The model `{name}` is a language model: it does not produce embeddings", param="model",
                           code="model_not_supported")  # fmt: skip
        if body.dimensions is not None and body.dimensions != engine.dimension:
            raise APIError(400, f"dimensions={body.dimensions} is not supported: this model's embeddings have "
                           f"{engine.dimension} dimensions and cannot be shortened", param="dimensions")  # fmt: skip
        rows = _embedding_rows(engine, body.input)
        job = await _embed(engine, rows, http)
        if body.encoding_format == "base64":
            values = [base64.b64encode(e.astype("<f4").tobytes()).decode("ascii") for e in job.embeddings]
        else:
            values = job.embeddings.tolist()
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(values)]
        tokens = job.prompt_tokens
        return {"object": "list", "data": data, "model": name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    return app


# -- helpers ------------------------------------------------------------------------------------
def _default_name(lm: Any) -> str:
    from pathlib import Path

    src = Path(lm.source) if lm.source else None
    if src is None:
        return "maxjax-model"
    return src.stem if src.is_file() else src.name


def _no_such_model(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def _field_path(loc: Any) -> list[str]:
    """A pydantic error location as the request's field path: ``("body", "stop", "list[str]", 0)``
    -> ``["stop", "0"]`` (union member tags such as ``str``, ``list[int]``, ``TextPart`` dropped)."""
    out = []
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, str) and (part[:1].isupper() or "[" in part or "-" in part or part in _TYPE_TAGS):
            continue
        out.append(str(part))
    return out


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def _validation_error(errors: Any) -> APIError:
    first = dict(errors[0]) if errors else {}
    loc = _field_path(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        return APIError(400, f"We could not parse the JSON body of your request: {first.get('msg', '')}", code="invalid_json")
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "missing":
        msg = "Field required"
    return APIError(400, f"{param}: {msg}" if param else msg, param=param, code=first.get("type"))


def _check(body: OpenAIRequest, name: str) -> None:
    if body.model != name:
        raise _no_such_model(body.model)
    bad = body.unsupported()
    if bad is not None:
        raise APIError(400, bad[1], param=bad[0])


def _generative(is_encoder: bool, name: str) -> None:
    if is_encoder:
        raise APIError(400, f"The model `{name}` is a sentence encoder: it serves /v1/embeddings only", param="model",
                       code="model_not_supported")  # fmt: skip


def _embedding_rows(engine: EncoderEngine, given: Any) -> list[list[int]]:
    """The token-id rows (``[CLS] ... [SEP]``) of an embeddings ``input``: texts are tokenized and
    truncated at the model's max length, as sentence-transformers does; token ids (the text's,
    without special tokens) get the special tokens and must fit."""
    texts = [given] if isinstance(given, str) else given
    if not texts:
        raise APIError(400, "input is empty", param="input")
    if isinstance(texts[0], int):
        texts = [texts]
    enc = engine.encoder
    if isinstance(texts[0], str):
        for i, t in enumerate(texts):
            if t == "":
                raise APIError(400, f"input[{i}] is an empty string" if len(texts) > 1 else "input is an empty string", param="input")
        return enc.tokenize(texts)
    cls_id, sep_id = enc.tokenizer.cls_id, enc.tokenizer.sep_id
    rows = []
    for i, ids in enumerate(texts):
        if not ids:
            raise APIError(400, f"input[{i}] has no tokens", param="input")
        if len(ids) + 2 > engine.context:
            raise APIError(400, f"input[{i}] has {len(ids)} tokens; this model's maximum is {engine.context - 2} tokens "
                           "(plus [CLS] and [SEP])", param="input", code="context_length_exceeded")  # fmt: skip
        rows.append([cls_id, *ids, sep_id])
    return rows


async def _embed(engine: EncoderEngine, rows: list[list[int]], http: HTTPRequest) -> EmbeddingJob:
    """Submits ``rows`` and waits for the job; cancels it when the client disconnects (checked
    every ``DISCONNECT_POLL`` s) or when the engine's ``request_timeout`` passes (504)."""
    loop = asyncio.get_running_loop()
    finished = asyncio.Event()
    try:
        job = engine.submit(rows, on_done=lambda _: loop.call_soon_threadsafe(finished.set))
    except QueueFull as e:
        raise APIError(429, str(e), type="rate_limit_error", code="queue_full",
                       headers={"Retry-After": str(max(1, round(e.retry_after)))}) from None  # fmt: skip
    except ContextLengthExceeded as e:
        raise APIError(400, str(e), param="input", code="context_length_exceeded") from None
    except EngineStopped as e:
        raise APIError(503, str(e), type="server_error", code="engine_stopped") from None
    except ValueError as e:
        raise APIError(400, str(e), param="input") from None
    deadline = loop.time() + engine.request_timeout
    try:
        while not finished.is_set():
            try:
                await asyncio.wait_for(finished.wait(), min(DISCONNECT_POLL, max(0.0, deadline - loop.time())))
            except asyncio.TimeoutError:
                if loop.time() >= deadline:
                    engine.cancel(job, "timeout")
                elif await http.is_disconnected():
                    engine.cancel(job, "cancelled")
    finally:
        engine.cancel(job, "cancelled")  # no-op once ended; frees the queue if this coroutine is cancelled
    if job.finish_reason in ("timeout", "cancelled"):
        status, message, type_, code = _ENDED[job.finish_reason]
        raise APIError(status, message, type=type_, code=code)
    if job.error is not None:
        raise APIError(500, job.error, type="server_error")
    return job


def _completion_prompt(lm: Any, body: CompletionRequest) -> list[int]:
    p = body.prompt
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        if not p:
            raise APIError(400, "prompt is empty", param="prompt")
        return lm.encode_prompt(p)
    if not p:
        raise APIError(400, "prompt is empty", param="prompt")
    return list(p)


def _chat_prompt(lm: Any, body: ChatCompletionRequest) -> list[int]:
    messages = [{"role": m.role, "content": m.text(), "name": m.name} for m in body.messages]
    try:
        text = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as e:  # the template refused the conversation (raise_exception) or failed
        raise APIError(400, f"the model's chat template cannot render these messages: {e}", param="messages") from None
    return lm.tokenizer.encode(text, add_special_tokens=False)


def _params(body: OpenAIRequest, max_tokens: int | None) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_k=body.top_k or 0,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=tuple(body.stop_list()),
    )


def _submit(engine: Engine, ids: list[int], params: SamplingParams, prompt_field: str) -> tuple[Request, asyncio.Queue]:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()

    def on_event(ev: Event) -> None:  # on the engine's thread
        loop.call_soon_threadsafe(events.put_nowait, ev)

    try:
        req = engine.submit(ids, params, on_event=on_event)
    except QueueFull as e:
        raise APIError(429, str(e), type="rate_limit_error", code="queue_full",
                       headers={"Retry-After": str(max(1, round(e.retry_after)))}) from None  # fmt: skip
    except ContextLengthExceeded as e:
        raise APIError(400, str(e), param=prompt_field, code="context_length_exceeded") from None
    except EngineStopped as e:
        raise APIError(503, str(e), type="server_error", code="engine_stopped") from None
    except ValueError as e:
        msg = str(e)
        param = msg.split(" ", 1)[0] if msg.split(" ", 1)[0] in SamplingParams.__dataclass_fields__ else prompt_field
        raise APIError(400, msg, param=param) from None
    return req, events


def _usage(req: Request) -> dict[str, int]:
    p, c = len(req.prompt_ids), len(req.token_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


async def _wait(req: Request, events: asyncio.Queue, http: HTTPRequest) -> None:
    """Waits for the request's last event; cancels it if the client goes away first."""
    try:
        while True:
            try:
                ev = await asyncio.wait_for(events.get(), DISCONNECT_POLL)
            except asyncio.TimeoutError:
                if await http.is_disconnected():
                    req.cancel()
                continue
            if ev.finish_reason is not None:
                break
    finally:
        if not req.done:
            req.cancel()
    if req.finish_reason not in ("stop", "length"):
        status, message, type_, code = _ENDED[req.finish_reason]
        raise APIError(status, req.error or message, type=type_, code=code)


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _sse(req: Request, events: asyncio.Queue, delta: Any, final: Any, usage: Any, first: dict | None = None,
         grace: float = 0.0) -> EventSourceResponse:  # fmt: skip
    async def stream() -> AsyncIterator[dict[str, str]]:
        try:
            if first is not None:
                yield {"data": _json(first)}
            while True:
                ev = await events.get()
                if ev.text:
                    yield {"data": _json(delta(ev.text))}
                if ev.finish_reason is None:
                    continue
                if ev.finish_reason in ("stop", "length"):
                    yield {"data": _json(final(ev.finish_reason))}
                    yield {"data": _json(usage())}
                else:
                    status, message, type_, code = _ENDED[ev.finish_reason]
                    yield {"data": _json(error_body(req.error or message, type_, None, code))}
                yield {"data": "[DONE]"}
                return
        finally:  # the client went away (the task is cancelled) or the stream ended
            if not req.done:
                req.cancel()

    # on shutdown the stream goes on for up to `grace` seconds (then sse-starlette cuts it)
    return EventSourceResponse(stream(), ping=15, sep="\n", shutdown_event=anyio.Event(), shutdown_grace_period=grace)
