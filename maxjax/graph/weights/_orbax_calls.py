"""Orbax reads that fail in one clean line: for :mod:`maxjax.graph.weights.orbax`.

:func:`quiet_reads` wraps a call that reads a checkpoint:

- absl logging is silenced: where orbax logs a warning or an error and carries on (a damaged
  metadata file read as "no metadata"), maxjax raises a ``WeightsFileError`` that says what is
  damaged, so the log lines would only repeat it, or contradict it.
- every asyncio event loop created during the call lets its unfinished tasks finish before it
  closes. Orbax runs a batch of tensorstore reads with ``asyncio.gather`` on a fresh loop that it
  closes as soon as one read fails, while the other reads are still running; when those finish,
  tensorstore hands their results to the closed loop (``loop.call_soon_threadsafe``), and Python
  prints ``RuntimeError: Event loop is closed`` as an unraisable exception, at some later moment.
  Letting the loop drain before it closes leaves no read to finish on a closed loop. (Cancelling
  the tasks, as ``asyncio.run`` does, is not enough: it does not stop the tensorstore reads they
  await, and those still call back.) The wait is for reads already started, on an error path.
  For the duration of the block ``asyncio.new_event_loop`` (what orbax's ``run_sync`` calls) makes
  such draining loops.

:func:`one_line` gives the innermost cause of an orbax/tensorstore error on one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any, Iterator

__all__ = ["quiet_reads", "one_line"]

_LOCK = threading.Lock()
_DEPTH = [0]
_SAVED: dict[str, Any] = {}


class _DrainingLoop(asyncio.SelectorEventLoop):
    """An event loop that runs its unfinished tasks to their end when it is closed."""

    def close(self) -> None:
        if not self.is_closed() and not self.is_running():
            idle = 0
            while idle < 3:  # until no task is left and the callbacks the last ones scheduled have run
                pending = [t for t in asyncio.all_tasks(self) if not t.done()]
                if pending:
                    idle = 0
                    self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                else:
                    idle += 1
                    self.run_until_complete(asyncio.sleep(0))
        super().close()


@contextlib.contextmanager
def quiet_reads() -> Iterator[None]:
    """Silences absl logging and makes new event loops drain before closing, for the ``with`` block.

    Both are process-wide while any thread is inside such a block (a count keeps nested and
    concurrent blocks right); both are put back when the last one ends.
    """
    with _LOCK:
        if _DEPTH[0] == 0:
            absl = logging.getLogger("absl")
            _SAVED.update(absl_disabled=absl.disabled, new_event_loop=asyncio.new_event_loop)
            absl.disabled = True
            asyncio.new_event_loop = _DrainingLoop  # type: ignore[assignment]
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                logging.getLogger("absl").disabled = _SAVED.pop("absl_disabled")
                asyncio.new_event_loop = _SAVED.pop("new_event_loop")


def one_line(e: BaseException) -> str:
    """``"Type: message"`` of the innermost cause of ``e`` (tensorstore's reason, not orbax's
    wrapper), without tensorstore's spec dump, on one line."""
    seen = [e]
    while len(seen) < 16:
        nxt = seen[-1].__cause__ or seen[-1].__context__
        if nxt is None or nxt in seen:
            break
        seen.append(nxt)
    inner = seen[-1]
    text = str(inner.args[0]) if isinstance(inner, KeyError) and inner.args else str(inner)
    for cut in (" [tensorstore_spec=", " See full TensorStore details"):
        text = text.split(cut)[0]
    text = " ".join(text.split())
    return f"{type(inner).__name__}: {text}" if text else type(inner).__name__
