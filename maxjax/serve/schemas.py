"""Request bodies of the OpenAI API that ``maxjax serve`` accepts (pydantic models), and its error body.

Types are strict (a string is not a number; an integer is a number); fields the server does not
use are ignored, fields it cannot honour (``n > 1``, ``logprobs``, penalties, tools, ...) are refused
with a 400 naming them (:meth:`OpenAIRequest.unsupported`). ``top_k`` is an extension (0: off).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CompletionRequest", "ChatCompletionRequest", "ChatMessage", "EmbeddingRequest", "StreamOptions", "error_body"]


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = True


class OpenAIRequest(_Strict):
    """The sampling fields both endpoints share."""

    model: str
    temperature: float | None = Field(1.0, ge=0)
    top_p: float | None = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(0, ge=0)
    n: int | None = Field(1, ge=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) for the first field set to something the server cannot do, else None."""
        if self.n not in (None, 1):
            return "n", "n must be 1: this server returns one choice per request"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                return name, f"{name} is not supported by this server (only 0)"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported by this server"
        stops = self.stop_list()
        if any(not s for s in stops):
            return "stop", "stop strings must not be empty"
        return None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``: one prompt (a string, or token ids)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool | None = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], (str, list)) and len(self.prompt) != 1:
            return "prompt", "this server takes one prompt per request (a string or a list of token ids)"
        if self.echo:
            return "echo", "echo is not supported by this server"
        if self.logprobs is not None:
            return "logprobs", "logprobs is not supported by this server"
        if self.best_of not in (None, 1):
            return "best_of", "best_of must be 1"
        if self.suffix:
            return "suffix", "suffix is not supported by this server"
        return super().unsupported()


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str | None:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content


class ChatCompletionRequest(OpenAIRequest):
    """``POST /v1/chat/completions``: a conversation rendered with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs or self.top_logprobs:
            return "logprobs", "logprobs is not supported by this server"
        if self.tools:
            return "tools", "tools are not supported by this server"
        if self.response_format and self.response_format.get("type", "text") != "text":
            return "response_format", "only response_format {'type': 'text'} is supported by this server"
        return super().unsupported()

    def limit(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens`` (None: up to the context)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class EmbeddingRequest(_Strict):
    """``POST /v1/embeddings``: ``input`` is a string, a list of strings, a list of token ids
    (one input) or a list of lists of token ids; token ids are the tokenizer's ids of the text
    without special tokens (the server adds ``[CLS]``/``[SEP]``). ``encoding_format`` ``"float"``
    (lists of numbers) or ``"base64"`` (little-endian float32 bytes). ``dimensions`` is refused
    unless it is the model's own size (the model has no shortened embeddings)."""

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = None
    user: str | None = None
