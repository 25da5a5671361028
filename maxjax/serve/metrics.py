"""The serving engine's Prometheus metrics (``prometheus_client``), in a registry of their own.

======================================================  ==========  ==============================================
name                                                    type        what
======================================================  ==========  ==============================================
``maxjax_queue_depth``                                  gauge       requests waiting for a batch row
``maxjax_running_batch_size``                           gauge       requests in the running batch
``maxjax_batch_slots``                                  gauge       rows the batch can hold (``max_batch``)
``maxjax_generation_tokens_per_second``                 gauge       tokens generated per second over the last
                                                                    :data:`Metrics.window` seconds
``maxjax_generation_tokens_total``                      counter     tokens generated
``maxjax_prompt_tokens_total``                          counter     prompt tokens prefilled
``maxjax_prefill_calls_total``                          counter     prefill programs run (each prefills one or
                                                                    more prompts admitted together)
``maxjax_requests_finished_total{finish_reason}``       counter     ended requests, by ``finish_reason``
``maxjax_requests_rejected_total{reason}``              counter     refused requests (``queue_full``, ...)
``maxjax_engine_compiles_total``                        counter     XLA compiles while serving (0 after a warmup)
``maxjax_time_to_first_token_seconds``                  histogram   submission to first token
``maxjax_inter_token_latency_seconds``                  histogram   between two tokens of a request
``maxjax_request_latency_seconds``                      histogram   submission to the end of a request
======================================================  ==========  ==============================================

``Metrics().exposition()`` is the text format a Prometheus server scrapes (``GET /metrics``).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics", "CONTENT_TYPE"]

#: the ``Content-Type`` of :meth:`Metrics.exposition`
CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0, 300.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.0)


class Metrics:
    """The engine's metrics (see the module docstring) in ``registry`` (default: a new one).

    Args:
        registry: a ``prometheus_client.CollectorRegistry``.
        window: seconds over which ``maxjax_generation_tokens_per_second`` is measured.
    """

    window = 10.0

    def __init__(self, registry: CollectorRegistry | None = None, window: float | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        if window is not None:
            self.window = float(window)
        r = self.registry
        self.queue_depth = Gauge("maxjax_queue_depth", "Requests waiting for a batch row", registry=r)
        self.batch_size = Gauge("maxjax_running_batch_size", "Requests in the running batch", registry=r)
        self.batch_slots = Gauge("maxjax_batch_slots", "Rows the running batch can hold (max_batch)", registry=r)
        self.tokens_per_second = Gauge(
            "maxjax_generation_tokens_per_second", "Tokens generated per second over the last window seconds", registry=r
        )
        self.tokens_per_second.set_function(self._rate)
        self.generated_tokens = Counter("maxjax_generation_tokens", "Tokens generated", registry=r)
        self.prompt_tokens = Counter("maxjax_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.prefill_calls = Counter(
            "maxjax_prefill_calls", "Prefill programs run (each prefills one or more prompts admitted together)", registry=r
        )
        self.finished = Counter("maxjax_requests_finished", "Requests ended, by finish reason", ["finish_reason"], registry=r)
        self.rejected = Counter("maxjax_requests_rejected", "Requests refused, by reason", ["reason"], registry=r)
        self.compiles = Counter("maxjax_engine_compiles", "XLA compiles on the engine's thread while serving", registry=r)
        self.time_to_first_token = Histogram(
            "maxjax_time_to_first_token_seconds", "Seconds from submission to the first token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.inter_token_latency = Histogram(
            "maxjax_inter_token_latency_seconds", "Seconds between two tokens of a request", buckets=_TOKEN_BUCKETS, registry=r
        )
        self.request_latency = Histogram(
            "maxjax_request_latency_seconds", "Seconds from submission to the end of a request", buckets=_LATENCY_BUCKETS, registry=r
        )
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def count_tokens(self, n: int) -> None:
        """Counts ``n`` generated tokens (now)."""
        self.generated_tokens.inc(n)
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, n))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - self.window:
            self._recent.popleft()

    def _rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            return sum(n for _, n in self._recent) / self.window

    def request_finished(self, req: Any) -> None:
        """Counts an ended :class:`~maxjax.serve.request.Request` and observes its latency."""
        self.finished.labels(finish_reason=req.finish_reason).inc()
        if req.latency is not None:
            self.request_latency.observe(req.latency)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
