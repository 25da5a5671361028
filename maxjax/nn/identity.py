"""``maxjax.nn.identity``: :class:`Identity` (MAX 26.7's ``max/nn/identity.py``)."""

from __future__ import annotations

from typing import Any

from maxjax.nn.layer.layer import Module

__all__ = ["Identity"]


class Identity(Module):
    """A layer that returns its input unchanged (MAX's ``max.nn.Identity``).

    Used where an architecture skips an operation (e.g. a norm in EAGLE draft models). Works in
    every mode: graph values come back as the same value, arrays in eager mode as JAX arrays of
    the same shape and dtype. Layer hooks see the call as for any layer.
    """

    def __call__(self, x: Any) -> Any:
        """Returns ``x`` (any shape, any dtype)."""
        return x
