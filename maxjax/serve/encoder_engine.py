"""``EncoderEngine``: embedding requests batched together on one thread that owns the encoder.

Requests (each a list of token-id rows, ``[CLS] ... [SEP]`` included) wait in a queue of at most
``max_queue``; each iteration takes rows from the oldest requests, at most ``max_batch`` rows, and
runs them in one forward pass (:meth:`SentenceEncoder.embed_ids`: padded to a length bucket and a
power-of-two row count, so shapes come from a small fixed set). A request larger than
``max_batch`` rows is spread over several passes; rows of several requests share a pass. A
request ends when all its rows have their embeddings, or with an error.

It has the attributes :func:`maxjax.serve.create_app` reads from an engine (``lm``, ``context``,
``running``, ``metrics``, ``start``, ``stop``), so the same app serves it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from maxjax.serve.engine import ContextLengthExceeded, EngineStopped, QueueFull
from maxjax.serve.metrics import Metrics

__all__ = ["EncoderEngine", "EmbeddingJob"]

log = logging.getLogger("maxjax.serve")


class EmbeddingJob:
    """One embedding request: ``rows`` of token ids -> ``embeddings`` float32 ``[n, dim]``.

    ``done`` is set when it ends; then ``error`` is None (``embeddings`` complete) or a message.
    ``on_done(job)`` (optional) is called on the engine's thread when it ends.
    """

    def __init__(self, rows: Sequence[Sequence[int]], dim: int, on_done: Callable[["EmbeddingJob"], None] | None = None):
        self.rows = [list(r) for r in rows]
        self.embeddings = np.empty((len(self.rows), dim), np.float32)
        self.next_row = 0  # rows before it are taken
        self.rows_done = 0
        self.error: str | None = None
        self.finish_reason: str | None = None  # "stop" or "error" (for the metrics)
        self.done = threading.Event()
        self.on_done = on_done
        self.submitted = time.monotonic()
        self.latency: float | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r) for r in self.rows)

    def _finish(self, error: str | None = None) -> None:
        self.error = error
        if self.finish_reason is None:  # cancel() sets "cancelled" / "timeout" first
            self.finish_reason = "stop" if error is None else "error"
        self.latency = time.monotonic() - self.submitted
        self.done.set()
        if self.on_done is not None:
            self.on_done(self)


class EncoderEngine:
    """Batches embedding requests for a sentence encoder (see the module docstring).

    Args:
        encoder: a :class:`~maxjax.models.bert.SentenceEncoder` (``embed_ids``, ``tokenize``,
            ``dimension``, ``head.max_seq_length``, ``source``).
        max_batch: most rows in one forward pass.
        max_queue: most requests waiting; more are refused with :class:`QueueFull`.
        metrics: a :class:`~maxjax.serve.Metrics` (default: a new one).
        request_timeout: seconds a request may take from submission to its last row (the HTTP
            app cancels it past that and answers 504).

    Raises:
        ValueError: ``max_batch`` < 1, ``max_queue`` < 0 or ``request_timeout`` <= 0.
    """

    def __init__(self, encoder: Any, max_batch: int = 32, max_queue: int = 64, metrics: Metrics | None = None,
                 request_timeout: float = 600.0):  # fmt: skip
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be at least 0, got {max_queue}")
        if not request_timeout > 0:
            raise ValueError(f"request_timeout must be positive (seconds), got {request_timeout}")
        self.request_timeout = float(request_timeout)
        self.lm = self.encoder = encoder
        self.max_batch, self.max_queue = max_batch, max_queue
        self.context = encoder.head.max_seq_length
        self.dimension = encoder.dimension
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.batch_slots.set(max_batch)
        self._waiting: collections.deque[EmbeddingJob] = collections.deque()
        self._lock = threading.Condition()
        self._state = "new"  # new -> running -> stopping -> stopped
        self._thread: threading.Thread | None = None
        self.passes = 0  # forward passes run

    def warmup(self) -> float:
        """Compiles every (row count, length) shape a pass can have; returns the seconds taken."""
        t0 = time.perf_counter()
        from maxjax.models.bert.encoder import length_buckets

        for rows in length_buckets(self.max_batch, 1, between=False):
            for seq in self.encoder.buckets:
                self.encoder.embed_ids([[0] * seq] * rows, batch_size=self.max_batch)
        return time.perf_counter() - t0

    def start(self) -> "EncoderEngine":
        """Starts the engine's thread (idempotent while running)."""
        with self._lock:
            if self._state == "running":
                return self
            self._state = "running"
        self._thread = threading.Thread(target=self._loop, name="maxjax-encoder-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stops taking requests, finishes the queued ones, and joins the thread."""
        with self._lock:
            if self._state != "running":
                self._state = "stopped"
                return
            self._state = "stopping"
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._state == "running"

    def submit(self, rows: Sequence[Sequence[int]], on_done: Callable[[EmbeddingJob], None] | None = None) -> EmbeddingJob:
        """Queues the token-id ``rows`` (each with its special tokens).

        Raises:
            EngineStopped: the engine is not running.
            QueueFull: ``max_queue`` requests are waiting.
            ContextLengthExceeded: a row longer than the model's ``max_seq_length``.
            ValueError: no rows, an empty row, or an id outside the vocabulary (naming the row).
        """
        if not rows:
            raise ValueError("input is empty")
        vocab = self.encoder.config.vocab_size
        for i, r in enumerate(rows):
            if len(r) == 0:
                raise ValueError(f"input row {i} has no tokens")
            if len(r) > self.context:
                raise ContextLengthExceeded(len(r), 0, self.context)
            if min(r) < 0 or max(r) >= vocab:
                raise ValueError(f"input row {i} has a token id outside [0, {vocab})")
        job = EmbeddingJob(rows, self.dimension, on_done)
        with self._lock:
            if self._state != "running":
                raise EngineStopped("the engine is not running")
            if len(self._waiting) >= self.max_queue > 0 or self.max_queue == 0 and self._waiting:
                self.metrics.rejected.labels(reason="queue_full").inc()
                raise QueueFull(self.max_queue, 1.0)
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self._lock.notify_all()
        return job

    def cancel(self, job: EmbeddingJob, reason: str = "cancelled") -> None:
        """Ends ``job`` now with ``finish_reason`` ``reason`` (``"cancelled"``: its client went away;
        ``"timeout"``): its rows not yet taken are never run, and the embeddings of rows in a pass
        already running are dropped. Does nothing to a job that has ended."""
        with self._lock:
            if job.done.is_set():
                return
            job.next_row = len(job.rows)  # nothing more is taken
            try:
                self._waiting.remove(job)
            except ValueError:
                pass  # its last rows are in the running pass
            self.metrics.queue_depth.set(len(self._waiting))
            job.finish_reason = reason
        self._end(job, f"the request was {'cancelled' if reason == 'cancelled' else 'timed out'}")

    def embed(self, rows: Sequence[Sequence[int]], timeout: float | None = None) -> np.ndarray:
        """:meth:`submit` and wait: float32 ``[len(rows), dim]``.

        Raises:
            TimeoutError: not done within ``timeout`` seconds; RuntimeError: the pass failed.
        """
        job = self.submit(rows)
        if not job.done.wait(timeout):
            raise TimeoutError(f"embedding request not done within {timeout} s")
        if job.error is not None:
            raise RuntimeError(job.error)
        return job.embeddings

    def _take(self) -> list[tuple[EmbeddingJob, int, int]] | None:
        """Up to ``max_batch`` rows from the oldest jobs: ``(job, start, stop)`` slices; None when
        stopping with nothing left."""
        with self._lock:
            while not self._waiting:
                if self._state != "running":
                    return None
                self._lock.wait()
            taken, room = [], self.max_batch
            for job in self._waiting:
                n = min(room, len(job.rows) - job.next_row)
                taken.append((job, job.next_row, job.next_row + n))
                job.next_row += n
                room -= n
                if room == 0:
                    break
            while self._waiting and self._waiting[0].next_row == len(self._waiting[0].rows):
                self._waiting.popleft()
            self.metrics.queue_depth.set(len(self._waiting))
            return taken

    def _loop(self) -> None:
        try:
            while True:
                taken = self._take()
                if taken is None:
                    break
                rows = [r for job, a, b in taken for r in job.rows[a:b]]
                self.metrics.batch_size.set(len(taken))
                try:
                    emb = self.encoder.embed_ids(rows, batch_size=self.max_batch)
                except Exception as e:  # a failed pass fails its requests, not the server
                    log.exception("embedding pass failed")
                    for job, _, _ in taken:
                        if not job.done.is_set():
                            self._end(job, f"the server failed while embedding: {type(e).__name__}")
                    continue
                self.passes += 1
                self.metrics.prompt_tokens.inc(sum(len(r) for r in rows))
                k = 0
                for job, a, b in taken:
                    k += b - a
                    if job.done.is_set():  # cancelled while its rows ran
                        continue
                    job.embeddings[a:b] = emb[k - (b - a) : k]
                    job.rows_done += b - a
                    if job.rows_done == len(job.rows):
                        self._end(job)
                self.metrics.batch_size.set(0)
        finally:
            with self._lock:
                self._state = "stopped"
                left, self._waiting = list(self._waiting), collections.deque()
            for job in left:
                if not job.done.is_set():
                    self._end(job, "the server is shutting down")

    def _end(self, job: EmbeddingJob, error: str | None = None) -> None:
        job._finish(error)
        self.metrics.request_finished(job)
