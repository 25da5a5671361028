"""One request to the serving engine: its sampling parameters, its output events and its handle.

:class:`SamplingParams` are checked once, on the caller's thread, before the request is queued.
The engine thread reports progress through :class:`Event`\\ s: to a callback given at submission
(the HTTP front end hands them to its event loop), or else to a queue that :meth:`Request.events`
and :meth:`Request.result` read.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from maxjax.models.sampling import check_sampling

__all__ = ["SamplingParams", "Event", "Request", "FINISH_REASONS"]

#: why a request ended: ``"stop"`` (an end-of-generation token or a stop string), ``"length"``
#: (``max_tokens``, or the context is full), ``"cancelled"`` (:meth:`Request.cancel`, e.g. the
#: client went away), ``"timeout"`` (the engine's per-request timeout), ``"shutdown"`` (the engine
#: stopped), ``"error"`` (the engine failed while running it; ``Request.error`` says how)
FINISH_REASONS = ("stop", "length", "cancelled", "timeout", "shutdown", "error")

_ids = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded.

    Args:
        max_tokens: most new tokens (>= 1); None: until the end of the engine's context.
        temperature: 0 for greedy decoding, else sampling (a finite number >= 0).
        top_k: sample among the ``top_k`` most likely tokens (0: all).
        top_p: nucleus sampling mass in (0, 1] (1: all).
        seed: the request's random stream: the same seed, prompt and parameters give the same text
            whatever else the engine is running; None: a fresh random seed.
        stop: strings that end the text when they appear (not included in it), as OpenAI's ``stop``.
        stop_at_eos: end at the model's end-of-generation tokens (not included in the text).
    """

    max_tokens: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))

    def check(self) -> None:
        """Raises ``ValueError`` naming the first parameter out of range."""
        m = self.max_tokens
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {m!r}")
        check_sampling(self.temperature, self.top_k, self.top_p, 0 if self.seed is None else self.seed)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must be non-empty strings, got {s!r}")


@dataclasses.dataclass
class Event:
    """What happened to a request since its last event.

    ``text`` is the new text (``""`` while a character or a possible stop string is incomplete),
    ``token_ids`` the new token ids; ``finish_reason`` is set on the last event only (one of
    :data:`FINISH_REASONS`).
    """

    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None


class Request:
    """A submitted request: what the engine reports about it, and ``cancel()``.

    Made by :meth:`maxjax.serve.Engine.submit`. Attributes, filled in as the request runs:
    ``prompt_ids``, ``params``, ``token_ids`` (every generated token, the end-of-generation token
    included), ``text`` (the output text, stop string excluded), ``finish_reason``, ``error`` (a
    message when ``finish_reason == "error"``), ``submitted_at``/``first_token_at``/``finished_at``
    (``time.perf_counter()`` seconds).
    """

    def __init__(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        max_tokens: int,
        deadline: float,
        on_event: Callable[[Event], Any] | None = None,
    ):
        self.id = next(_ids)
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.max_tokens = max_tokens
        self.deadline = deadline
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.finished_at: float | None = None
        self._on_event = on_event
        self._queue: queue.SimpleQueue[Event] | None = queue.SimpleQueue() if on_event is None else None
        self._done = threading.Event()
        self._cancelled = False
        self._wake: Callable[[], None] = lambda: None  # set by the engine: wakes its loop

    # -- caller side ------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True once the last event has been sent."""
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Asks the engine to drop this request: its slot is freed at the engine's next step and it
        ends with ``finish_reason == "cancelled"`` (unless it has already ended). Thread-safe."""
        if not self.done:
            self._cancelled = True
            self._wake()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Yields the request's events until the last one (only without an ``on_event`` callback).

        Raises:
            RuntimeError: the request was submitted with an ``on_event`` callback.
            TimeoutError: no event came for ``timeout`` seconds.
        """
        if self._queue is None:
            raise RuntimeError("this request reports to its on_event callback")
        while True:
            try:
                ev = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no event from request {self.id} in {timeout} s") from None
            yield ev
            if ev.finish_reason is not None:
                return

    def result(self, timeout: float | None = None) -> "Request":
        """Waits until the request has ended; returns it (``text``, ``token_ids``, ``finish_reason``).

        Raises:
            TimeoutError: it has not ended within ``timeout`` seconds.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} has not finished in {timeout} s")
        return self

    @property
    def time_to_first_token(self) -> float | None:
        """Seconds from submission to the first generated token (None before it)."""
        return None if self.first_token_at is None else self.first_token_at - self.submitted_at

    @property
    def latency(self) -> float | None:
        """Seconds from submission to the end (None before it)."""
        return None if self.finished_at is None else self.finished_at - self.submitted_at

    # -- engine side ------------------------------------------------------------------------
    def _emit(self, event: Event) -> None:
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            self.finished_at = time.perf_counter()
        try:
            if self._on_event is not None:
                self._on_event(event)
            else:
                self._queue.put(event)
        except Exception:  # the consumer is gone (e.g. its event loop closed): nobody to tell
            self._cancelled = True
        if event.finish_reason is not None:
            self._done.set()

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id}, prompt={len(self.prompt_ids)} tokens, generated={len(self.token_ids)}, "
            f"finish_reason={self.finish_reason!r})"
        )
