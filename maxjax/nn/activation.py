"""``activation_function_from_name`` (MAX's ``max.nn.activation``)."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from maxjax.graph import ops

__all__ = ["activation_function_from_name"]

_ACTIVATIONS: dict[str, Callable[[Any], Any]] = {
    "silu": ops.silu,
    "gelu": ops.gelu,
    "gelu_tanh": partial(ops.gelu, approximate="tanh"),
    "relu": ops.relu,
    "tanh": ops.tanh,
    "sigmoid": ops.sigmoid,
}


def activation_function_from_name(name: str) -> Callable[[Any], Any]:
    """The op named ``name``: ``silu``, ``gelu`` (exact, erf), ``gelu_tanh`` (tanh approximation),
    ``relu``, ``tanh`` or ``sigmoid`` (MAX's table).

    Raises:
        ValueError: any other name (MAX's message: ``Unrecognized activation function name (x)``).
    """
    fn = _ACTIVATIONS.get(name)
    if fn is None:
        raise ValueError(f"Unrecognized activation function name ({name})")
    return fn
