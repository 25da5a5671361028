"""``Engine``: continuous batching of one model, as a library object (the HTTP server drives one).

    from maxjax.models import load_model
    from maxjax.serve import Engine, SamplingParams

    lm = load_model()
    with Engine(lm, max_batch=8) as engine:               # compiles its shapes, starts its thread
        req = engine.submit(lm.tokenizer.encode("The quick brown fox"), SamplingParams(max_tokens=16))
        for event in req.events():                         # or req.result().text
            print(event.text, end="")

One thread owns the model. Requests wait in a bounded queue; between decode steps the engine
admits waiting requests into free rows of its KV cache (the prompts admitted together prefilled
together, a few rows per call, grouped by prompt bucket, each row's caches then written into its
free row by one program), then runs one decode step for all rows, each with its own sampling
parameters, random stream and stop conditions. A request leaves its row when it finishes, is
cancelled or times out, and the row is reused. The cache's shape (rows, positions) follows the
load through a small fixed set of buckets (:class:`~maxjax.serve.steps.Buckets`), each compiled
at start-up (:meth:`Engine.warmup`), so no request waits for a compile.
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
import time
import traceback
from typing import Any, Callable, Sequence

import numpy as np

from maxjax.engine.compiles import compile_counter
from maxjax.serve.metrics import Metrics
from maxjax.serve.request import Event, Request, SamplingParams
from maxjax.serve.steps import Buckets, Steps, key_data
from maxjax.serve.text import StopStrings

__all__ = ["Engine", "QueueFull", "EngineStopped", "ContextLengthExceeded"]

log = logging.getLogger("maxjax.serve")


class QueueFull(RuntimeError):
    """The engine's queue holds ``max_queue`` waiting requests: try again later."""

    def __init__(self, max_queue: int, retry_after: float):
        super().__init__(f"the server's queue is full ({max_queue} requests waiting); retry after {retry_after:.0f} s")
        self.max_queue, self.retry_after = max_queue, retry_after


class EngineStopped(RuntimeError):
    """The engine is not running (not started yet, stopping or stopped)."""


class ContextLengthExceeded(ValueError):
    """A prompt (with its ``max_tokens``) does not fit the engine's context."""

    def __init__(self, prompt_tokens: int, max_tokens: int | None, context: int):
        asked = prompt_tokens + (max_tokens or 1)
        super().__init__(
            f"This model's maximum context length is {context} tokens. However, you requested {asked} tokens "
            f"({prompt_tokens} in the prompt, {max_tokens or 1} for the completion). Please reduce the length of "
            "the prompt or of max_tokens."
        )
        self.prompt_tokens, self.max_tokens, self.context = prompt_tokens, max_tokens, context


class _Row:
    """A running request's place in the batch and its decoding state."""

    __slots__ = ("req", "position", "last_token", "keys", "detok", "stops")

    def __init__(self, req: Request, detok: Any, keys: np.ndarray):
        self.req = req
        self.position = len(req.prompt_ids)  # where the next decode step writes
        self.last_token = 0
        self.keys = keys
        self.detok = detok
        self.stops = StopStrings(req.params.stop)


class _Step:
    """A dispatched decode step: its tokens (on the device) and the rows it decoded."""

    __slots__ = ("tokens", "rows")

    def __init__(self, tokens: Any, rows: list[_Row | None]):
        self.tokens, self.rows = tokens, rows


class Engine:
    """Continuous batching of one :class:`~maxjax.models.CausalLM` (see the module docstring).

    Args:
        lm: the model.
        max_batch: most requests decoded together (the KV cache's rows; on a mesh with a data-parallel
            axis, rounded up to a multiple of its size: the rows are split over it).
        max_queue: most requests waiting for a row; :meth:`submit` raises :class:`QueueFull` beyond.
        max_context: most positions of a request (prompt plus new tokens); None: the model's context
            or 2048, whichever is smaller. The KV cache never holds more than ``max_batch`` rows of
            this many positions.
        request_timeout: seconds a request may take from submission to its last token; past that
            it ends with ``finish_reason == "timeout"``.
        buckets: the shapes to compile (default :meth:`Buckets.default`).
        prefill_budget: prompt tokens prefilled between two decode steps, padding included (each
            prefill call costs its rows, rounded up to a prefill row bucket, times its prompt
            bucket; at least one prompt is admitted): bounds how long running requests wait for
            newcomers. It also bounds the batched prefill shapes compiled (rows x bucket within it).
        shrink_after: decode steps the load must fit a smaller cache shape before it shrinks.
        metrics: where to report (default: a new :class:`~maxjax.serve.metrics.Metrics`).
        warmup: compile every shape in :meth:`start` (else each compiles when first needed).

    Raises:
        ValueError: ``max_batch``, ``max_queue``, ``max_context`` or ``request_timeout`` out of range.
    """

    def __init__(
        self,
        lm: Any,
        *,
        max_batch: int = 16,
        max_queue: int = 64,
        max_context: int | None = None,
        request_timeout: float = 600.0,
        buckets: Buckets | None = None,
        prefill_budget: int = 512,
        shrink_after: int = 16,
        metrics: Metrics | None = None,
        warmup: bool = True,
    ):
        model_context = int(lm.config.max_position_embeddings)
        if max_context is None:
            max_context = min(model_context, 2048)
        for name, value, low in (("max_batch", max_batch, 1), ("max_queue", max_queue, 0), ("max_context", max_context, 2)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if max_context > model_context:
            raise ValueError(f"max_context ({max_context}) exceeds the model's context of {model_context} tokens")
        if not request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {request_timeout!r}")
        self.lm = lm
        self.buckets = buckets or Buckets.default(max_batch, max_context, lm.batch_multiple)
        self.max_batch, self.context = self.buckets.max_batch, self.buckets.context
        self.max_queue = max_queue
        self.request_timeout = float(request_timeout)
        self.prefill_budget = prefill_budget
        self.shrink_after = shrink_after
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.batch_slots.set(self.max_batch)
        self.steps = Steps(lm, self.buckets, prefill_budget)
        # the most rows one prefill call takes, per prompt bucket
        self._prefill_top = {p: max(r for r, q in self.steps.prefill_shapes if q == p) for p in self.buckets.prompt}
        self._do_warmup = warmup
        self._eos = frozenset(lm.tokenizer.eos_token_ids)
        self._lock = threading.Condition()
        self._waiting: collections.deque[Request] = collections.deque()
        self._rows: list[_Row | None] = []  # index = cache row; None = free
        self._k: Any = None
        self._v: Any = None
        self._small_for = 0  # decode steps in a row that a smaller cache shape would have done
        self._inflight: _Step | None = None  # a decode step dispatched, its tokens not yet handled
        self._thread: threading.Thread | None = None
        self._state = "new"  # new -> running -> stopping -> stopped
        self.warmup_seconds: float | None = None
        #: XLA compiles on the engine's thread since :meth:`start` (0 after a full warmup)
        self.compiles_while_serving = 0

    # -- life cycle -----------------------------------------------------------------------------
    def warmup(self, progress: Callable[[str, int, int], None] | None = None) -> float:
        """Compiles every shape the engine uses (see :meth:`Steps.warmup`); returns the seconds taken."""
        self.warmup_seconds = self.steps.warmup(progress)
        self.steps.lm.release_freed_heap()  # what the compiles freed
        return self.warmup_seconds

    def start(self, progress: Callable[[str, int, int], None] | None = None) -> "Engine":
        """Warms up (unless ``warmup=False``) and starts the engine's thread. Returns ``self``."""
        with self._lock:
            if self._state != "new":
                raise EngineStopped(f"the engine was already started (it is {self._state})")
        if self._do_warmup and self.warmup_seconds is None:
            self.warmup(progress)
        with self._lock:
            self._state = "running"
        self._thread = threading.Thread(target=self._loop, name="maxjax-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stops the engine: waiting and running requests end with ``finish_reason == "shutdown"``
        (after the step in progress), and the thread exits."""
        with self._lock:
            if self._state in ("new", "stopped"):
                self._state = "stopped"
                return
            self._state = "stopping"
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> "Engine":
        return self.start() if self._state == "new" else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True while the engine's thread serves requests."""
        return self._state == "running" and self._thread is not None and self._thread.is_alive()

    # -- requests -------------------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        on_event: Callable[[Event], Any] | None = None,
        timeout: float | None = None,
    ) -> Request:
        """Queues a request; returns its handle at once.

        Args:
            prompt_ids: the prompt's token ids (at least one, each in the vocabulary).
            params: how to decode it (default: greedy, up to the end of the context).
            on_event: called on the engine's thread with each :class:`Event` (it must not block);
                without it, read :meth:`Request.events` or :meth:`Request.result`.
            timeout: seconds for this request (default: the engine's ``request_timeout``).

        Raises:
            ValueError: an empty prompt, a token id outside the vocabulary, a parameter out of range.
            ContextLengthExceeded: the prompt plus ``max_tokens`` exceeds the context.
            QueueFull: ``max_queue`` requests are already waiting.
            EngineStopped: the engine is not running.
        """
        params = params or SamplingParams()
        params.check()
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.lm.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
        if len(ids) + (params.max_tokens or 1) > self.context:
            raise ContextLengthExceeded(len(ids), params.max_tokens, self.context)
        max_tokens = params.max_tokens or self.context - len(ids)
        limit = self.request_timeout if timeout is None else float(timeout)
        if params.seed is None:
            params = _with_seed(params, secrets.randbits(63))
        req = Request(ids, params, max_tokens, time.perf_counter() + limit, on_event)
        req._wake = self._notify
        with self._lock:
            if self._state != "running":
                raise EngineStopped("the engine is not running")
            if len(self._waiting) >= self.max_queue:
                self.metrics.rejected.labels(reason="queue_full").inc()
                raise QueueFull(self.max_queue, self._retry_after())
            self._waiting.append(req)
            self.metrics.queue_depth.set(len(self._waiting))
            self._lock.notify_all()
        return req

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, timeout: float | None = None) -> Request:
        """:meth:`submit`, then wait for the result (blocking; not on the engine's own thread)."""
        return self.submit(prompt_ids, params, timeout=timeout).result()

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a row."""
        return len(self._waiting)

    @property
    def batch_size(self) -> int:
        """Requests in the running batch."""
        return sum(r is not None for r in self._rows)

    @property
    def cache_shape(self) -> tuple[int, int] | None:
        """The KV cache's (rows, positions) now, None when idle."""
        return None if self._k is None else (int(self._k.shape[1]), int(self._k.shape[-1]))

    def _notify(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def _retry_after(self) -> float:
        return 1.0

    # -- the loop ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        self._compiles = compile_counter()  # this thread's
        self._compiles_at_start = self._compiles()
        try:
            while True:
                with self._lock:
                    while self._state == "running" and not self._waiting and not self._rows:
                        self._lock.wait()
                    if self._state != "running":
                        break
                    newcomers = self._take_newcomers()
                try:
                    self._iteration(newcomers)
                except Exception as e:  # a failed step: fail what it was running, keep serving
                    log.error("engine step failed: %s", traceback.format_exc())
                    self._fail_all(newcomers, f"{type(e).__name__}: {e}")
        finally:
            with self._lock:
                waiting, self._waiting = list(self._waiting), collections.deque()
            for req in waiting + [r.req for r in self._rows if r is not None]:
                self._finish_request(req, "shutdown")
            self._rows, self._k, self._v = [], None, None
            self._publish()
            with self._lock:
                self._state = "stopped"

    def _take_newcomers(self) -> list[Request]:
        """Pops waiting requests (in order) that fit in free rows and the prefill budget, counted as
        :meth:`_prefill_cost` (lock held)."""
        free = self.max_batch - sum(r is not None for r in self._rows)
        out, joining, per_bucket, cost = [], 0, collections.Counter(), 0
        while self._waiting and joining < free:
            req = self._waiting[0]
            if req.cancelled or time.perf_counter() > req.deadline:
                out.append(self._waiting.popleft())  # ended in _admit, outside the lock
                continue
            b = self.buckets.prompt_for(len(req.prompt_ids))
            more = cost - self._prefill_cost(b, per_bucket[b]) + self._prefill_cost(b, per_bucket[b] + 1)
            if joining and more > self.prefill_budget:
                break
            cost, per_bucket[b] = more, per_bucket[b] + 1
            joining += 1
            out.append(self._waiting.popleft())
        self.metrics.queue_depth.set(len(self._waiting))
        return out

    def _prefill_calls(self, bucket: int, n: int) -> list[int]:
        """The rows of each prefill call for ``n`` prompts of ``bucket``: calls of the most rows a
        call of that bucket takes, then the rest."""
        top = self._prefill_top[bucket]
        return [top] * (n // top) + ([n % top] if n % top else [])

    def _prefill_cost(self, bucket: int, n: int) -> int:
        """Prompt tokens, padding included, of prefilling ``n`` prompts of ``bucket``."""
        return sum(_fit_rows(self.steps.prefill_rows, k) * bucket for k in self._prefill_calls(bucket, n))

    def _iteration(self, newcomers: list[Request]) -> None:
        self._expire_waiting()
        if newcomers:
            self._drain()
            self._admit(newcomers)
        self._reap()
        if any(r is not None for r in self._rows):
            self._decode()
            self._reap()
        self._maybe_shrink()
        self._publish()
        n = self._compiles() - self._compiles_at_start
        if n != self.compiles_while_serving:
            self.steps.lm.release_freed_heap()
            self.metrics.compiles.inc(n - self.compiles_while_serving)
            if self._do_warmup:
                log.warning("the engine compiled %d program(s) after its warmup", n - self.compiles_while_serving)
            self.compiles_while_serving = n

    def _expire_waiting(self) -> None:
        now = time.perf_counter()
        with self._lock:
            gone = [r for r in self._waiting if r.cancelled or now > r.deadline]
            for r in gone:
                self._waiting.remove(r)
            self.metrics.queue_depth.set(len(self._waiting))
        for r in gone:
            self._finish_request(r, "cancelled" if r.cancelled else "timeout")

    # -- admitting --------------------------------------------------------------------------------
    def _admit(self, newcomers: list[Request]) -> None:
        """Prefills the newcomers, grouped by prompt bucket (in order of arrival within a bucket), a
        prefill call per group of up to the rows a call of that bucket takes; writes each call's
        rows into free cache rows (one program), then hands each its first token."""
        groups: dict[int, list[Request]] = {}
        for req in newcomers:
            if req.cancelled or time.perf_counter() > req.deadline:
                self._finish_request(req, "cancelled" if req.cancelled else "timeout")
                continue
            groups.setdefault(self.buckets.prompt_for(len(req.prompt_ids)), []).append(req)
        firsts = []  # (tokens on the device, rows), read once every call is dispatched
        for bucket, reqs in groups.items():
            at = 0
            for n in self._prefill_calls(bucket, len(reqs)):
                firsts.append(self._prefill(bucket, reqs[at : at + n]))
                at += n
        for tok, rows in firsts:
            host = np.asarray(tok)
            for j, row in enumerate(rows):
                self._on_token(row, int(host[j]))

    def _prefill(self, bucket: int, reqs: list[Request]) -> tuple[Any, list[int]]:
        """One prefill call for ``reqs`` (all of ``bucket``; their rows padded to a prefill row
        bucket), their caches written into free rows; returns the first tokens (on the device,
        ``[rows]``) and the cache rows taken."""
        n = _fit_rows(self.steps.prefill_rows, len(reqs))
        tokens = np.zeros((n, bucket), np.int32)
        lengths = np.ones(n, np.int32)
        keys = np.zeros((n, 2), np.uint32)
        temperature = np.zeros(n, np.float32)
        top_k = np.zeros(n, np.int32)
        top_p = np.ones(n, np.float32)
        for j, req in enumerate(reqs):
            p = req.params
            tokens[j, : len(req.prompt_ids)] = req.prompt_ids
            lengths[j], keys[j] = len(req.prompt_ids), key_data(p.seed)
            temperature[j], top_k[j], top_p[j] = p.temperature, p.top_k, p.top_p
        tok, k1, v1 = self.steps.prefill(tokens, lengths, keys, temperature, top_k, top_p)
        self.metrics.prefill_calls.inc()
        rows = []
        for j, req in enumerate(reqs):
            row = self._free_row()
            slot = _Row(req, self.lm.tokenizer.incremental_detokenizer(), keys[j])
            if row == len(self._rows):
                self._rows.append(slot)
            else:
                self._rows[row] = slot
            rows.append(row)
            self.metrics.prompt_tokens.inc(len(req.prompt_ids))
        self._ensure_shape(len(self._rows), max(bucket, self._positions_needed()))
        # a padding row's target: one past the cache's rows (dropped by the insert)
        targets = np.array(rows + [self._k.shape[1]] * (n - len(rows)), np.int32)
        self._k, self._v = self.steps.insert(self._k, self._v, k1, v1, targets)
        return tok, rows

    def _free_row(self) -> int:
        for i, r in enumerate(self._rows):
            if r is None:
                return i
        return len(self._rows)

    def _positions_needed(self) -> int:
        """Cache positions the running rows need for their next token."""
        return max((r.position + 1 for r in self._rows if r is not None), default=1)

    def _ensure_shape(self, rows: int, positions: int) -> None:
        """Makes the cache at least the buckets of ``rows`` and ``positions`` (never smaller)."""
        want_r, want_c = self.buckets.batch_for(rows), self.buckets.cache_for(positions)
        if self._k is None:
            self._k, self._v = self.steps.fresh(want_r, want_c)
            return
        r, c = self._k.shape[1], self._k.shape[-1]
        if want_r > r or want_c > c:
            self._k, self._v = self.steps.resize(self._k, self._v, max(want_r, r), max(want_c, c))

    # -- decoding ---------------------------------------------------------------------------------
    def _decode(self) -> None:
        """Processes one decode step's tokens; the next step is dispatched first when no request is
        waiting to join, so the device computes it while the host handles these tokens."""
        if self._inflight is None:
            self._inflight = self._dispatch(ahead=None)
        step, self._inflight = self._inflight, None
        if not self._waiting:
            self._inflight = self._dispatch(ahead=step)
        self._process(step)

    def _dispatch(self, ahead: "_Step | None") -> "_Step":
        """Dispatches a decode step for the live rows: from their host state, or (``ahead``) from
        the tokens a dispatched step is computing, one position further."""
        k = 0 if ahead is None else 1
        self._ensure_shape(len(self._rows), self._positions_needed() + k)
        n = self._k.shape[1]
        tokens = np.zeros(n, np.int32)
        positions = np.zeros(n, np.int32)
        keys = np.zeros((n, 2), np.uint32)
        counters = np.zeros(n, np.int32)
        temperature = np.zeros(n, np.float32)
        top_k = np.zeros(n, np.int32)
        top_p = np.ones(n, np.float32)
        rows = list(self._rows) + [None] * (n - len(self._rows))
        for i, r in enumerate(rows):
            if r is None:
                continue
            p = r.req.params
            tokens[i], positions[i], keys[i], counters[i] = r.last_token, r.position + k, r.keys, len(r.req.token_ids) + k
            temperature[i], top_k[i], top_p[i] = p.temperature, p.top_k, p.top_p
        if ahead is not None:
            if ahead.tokens.shape[0] == n:
                tokens = ahead.tokens  # on the device: no round trip through the host
            else:  # the cache grew a bucket of rows: never while a step is ahead (nothing joined)
                raise AssertionError("the batch changed shape under a dispatched step")
        nxt, self._k, self._v = self.steps.decode(tokens, positions, self._k, self._v, keys, counters, temperature, top_k, top_p)
        return _Step(nxt, rows)

    def _process(self, step: "_Step") -> None:
        """Hands each row its token from ``step`` (rows that ended or changed since are skipped:
        their token was computed ahead and is dropped)."""
        host = np.asarray(step.tokens)
        for i, r in enumerate(step.rows):
            if r is not None and i < len(self._rows) and self._rows[i] is r:
                r.position += 1
                self._on_token(i, int(host[i]))

    def _drain(self) -> None:
        """Processes the step dispatched ahead, if any (before rows join or move)."""
        if self._inflight is not None:
            step, self._inflight = self._inflight, None
            self._process(step)
            self._reap()

    def _on_token(self, i: int, token: int) -> None:
        """Records row ``i``'s new token; ends the request on EOS, a stop string or its length."""
        r = self._rows[i]
        req = r.req
        now = time.perf_counter()
        if req.first_token_at is None:
            req.first_token_at = now
            self.metrics.time_to_first_token.observe(now - req.submitted_at)
        else:
            self.metrics.inter_token_latency.observe(now - req.last_token_at)
        req.last_token_at = now
        req.token_ids.append(token)
        r.last_token = token
        self.metrics.count_tokens(1)
        params = req.params
        finish = None
        if params.stop_at_eos and token in self._eos:
            finish = "stop"
            text = r.detok.flush()
            text, hit = r.stops.add(text) if text else ("", False)
            text += "" if hit else r.stops.flush()
        else:
            text, hit = r.stops.add(r.detok.add(token))
            if hit:
                finish = "stop"
            elif len(req.token_ids) >= req.max_tokens or r.position >= self.context:
                finish = "length"
                tail, hit = r.stops.add(r.detok.flush())
                text += tail
                if hit:
                    finish = "stop"
                else:
                    text += r.stops.flush()
                    if r.stops.stopped:  # a stop string completed before held-back text was decided
                        finish = "stop"
        req.text += text
        if finish is None:
            req._emit(Event(text, [token]))
        else:
            self._rows[i] = None
            self._finish_request(req, finish, Event(text, [token], finish))

    def _reap(self) -> None:
        """Ends cancelled and timed-out running requests, freeing their rows."""
        now = time.perf_counter()
        for i, r in enumerate(self._rows):
            if r is not None and (r.req.cancelled or now > r.req.deadline):
                self._rows[i] = None
                self._finish_request(r.req, "cancelled" if r.req.cancelled else "timeout")
        while self._rows and self._rows[-1] is None:
            self._rows.pop()

    def _maybe_shrink(self) -> None:
        """Moves rows down and shrinks the cache once a smaller shape has sufficed for a while."""
        if self._k is None:
            return
        live = [i for i, r in enumerate(self._rows) if r is not None]
        if not live:
            self._inflight = None  # a step computed ahead for rows that have all ended
            self._rows, self._k, self._v, self._small_for = [], None, None, 0
            return
        rows, c = self._k.shape[1], self._k.shape[-1]
        want_r = self.buckets.batch_for(len(live))
        want_c = self.buckets.cache_for(self._positions_needed())
        if want_r >= rows and want_c >= c:
            self._small_for = 0
            return
        self._small_for += 1
        if self._small_for < self.shrink_after:
            return
        self._small_for = 0
        self._drain()  # rows may have ended: look again
        live = [i for i, r in enumerate(self._rows) if r is not None]
        if not live:
            self._rows, self._k, self._v = [], None, None
            return
        want_r = self.buckets.batch_for(len(live))
        want_c = self.buckets.cache_for(self._positions_needed())
        free = [i for i in range(want_r) if i >= len(self._rows) or self._rows[i] is None]
        for src in [i for i in live if i >= want_r]:
            dst = free.pop(0)
            self._k, self._v = self.steps.move(self._k, self._v, src, dst)
            while len(self._rows) <= dst:
                self._rows.append(None)
            self._rows[dst], self._rows[src] = self._rows[src], None
        while self._rows and self._rows[-1] is None:
            self._rows.pop()
        self._k, self._v = self.steps.resize(self._k, self._v, min(want_r, rows), min(want_c, c))

    # -- ending -----------------------------------------------------------------------------------
    def _finish_request(self, req: Request, reason: str, event: Event | None = None, error: str | None = None) -> None:
        if req.done:
            return
        req.error = error
        req._emit(event or Event(finish_reason=reason))
        self.metrics.request_finished(req)

    def _fail_all(self, newcomers: list[Request], message: str) -> None:
        for req in newcomers + [r.req for r in self._rows if r is not None]:
            self._finish_request(req, "error", error=message)
        self._rows, self._k, self._v, self._inflight = [], None, None, None

    def _publish(self) -> None:
        self.metrics.queue_depth.set(len(self._waiting))
        self.metrics.batch_size.set(sum(r is not None for r in self._rows))


def _fit_rows(buckets: tuple[int, ...], n: int) -> int:
    """The smallest of ``buckets`` (ascending) holding ``n`` rows."""
    return next(b for b in buckets if b >= n)


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    import dataclasses

    return dataclasses.replace(params, seed=seed)
