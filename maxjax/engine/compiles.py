"""Counting XLA compiles per thread (a ``jax.monitoring`` listener).

``jit`` compiles on the thread that first calls a shape (or that calls ``.lower(...).compile()``),
so a count kept per thread tells a caller whether its own call compiled, whatever else runs:
generation releases the compiler's freed heap after a call that compiled, the serving engine
reports compiles after its warmup.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax

__all__ = ["compile_counter"]


class _CompileCounter(threading.local):
    count = 0


_compiles = _CompileCounter()
_listening = False
_listen_lock = threading.Lock()


def _on_event(event: str, seconds: float, **kwargs: Any) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles.count += 1


def compile_counter() -> Callable[[], int]:
    """A function giving the number of XLA compiles so far on the calling thread (a
    ``jax.monitoring`` listener, registered once per process)."""
    global _listening
    with _listen_lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _listening = True
    return lambda: _compiles.count
