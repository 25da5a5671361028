"""``maxjax.nn.layer.missing_layer``: :class:`MissingLayer` (MAX 26.7's ``max/nn/layer/missing_layer.py``)."""

from __future__ import annotations

from typing import Any, NoReturn

from maxjax.nn.layer.layer import Module

__all__ = ["MissingLayer"]


class MissingLayer(Module):
    """Holds the place of a decoder layer another pipeline stage builds (as in MAX 26.7).

    A ``LayerList`` keeps one entry per decoder layer, with a ``MissingLayer`` where a stage does
    not build one, so the layers it does build keep their checkpoint names. It has no weights.

    Args:
        layer_id: The decoder layer this entry stands for.

    Raises:
        RuntimeError: when called (MAX's message: the layer belongs to another pipeline stage).
    """

    def __init__(self, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(f"Decoder layer {self.layer_id} belongs to another pipeline stage.")
