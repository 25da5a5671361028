"""Serving: a continuous-batching engine (a library object) and an OpenAI-compatible HTTP server.

- :class:`Engine` (:mod:`maxjax.serve.engine`): one thread owns the model; requests join and leave
  the running batch between decode steps; shapes come from a fixed set compiled at start-up.
- :func:`create_app` (:mod:`maxjax.serve.app`): the FastAPI app of ``maxjax serve``
  (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``, ``/metrics``).
- The pure functions these are built on, for a JAX user's own serving code, are
  :attr:`maxjax.models.CausalLM.functions` and :mod:`maxjax.models.sampling`.
"""

from maxjax.serve.encoder_engine import EncoderEngine
from maxjax.serve.engine import ContextLengthExceeded, Engine, EngineStopped, QueueFull
from maxjax.serve.metrics import Metrics
from maxjax.serve.request import Event, Request, SamplingParams
from maxjax.serve.steps import Buckets

__all__ = [
    "Buckets", "ContextLengthExceeded", "EncoderEngine", "Engine", "EngineStopped", "Event", "Metrics", "QueueFull", "Request",
    "SamplingParams", "create_app",
]  # fmt: skip


def create_app(*args, **kwargs):
    """See :func:`maxjax.serve.app.create_app` (imported on first use: it needs FastAPI)."""
    from maxjax.serve.app import create_app as _create_app

    return _create_app(*args, **kwargs)
