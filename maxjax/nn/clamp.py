"""``clamp`` (MAX's ``max.nn.clamp``)."""

from __future__ import annotations

from typing import Any

from maxjax.graph import ops

__all__ = ["clamp"]


def clamp(x: Any, min: float | None = None, max: float | None = None) -> Any:
    """Clamps ``x`` to ``[min, max]`` elementwise (MAX's ``max.nn.clamp.clamp``): ``ops.max`` with
    ``min``, then ``ops.min`` with ``max`` (Python scalars, taking ``x``'s dtype); a bound of
    ``None`` is not applied. Shape and dtype of ``x`` are kept.
    """
    if min is not None:
        x = ops.max(x, min)
    if max is not None:
        x = ops.min(x, max)
    return x
