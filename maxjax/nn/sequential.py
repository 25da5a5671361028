"""``maxjax.nn.sequential``: :class:`Sequential` (MAX 26.7's ``max/nn/sequential.py``)."""

from maxjax.nn.layer.layer_list import LayerList

__all__ = ["Sequential"]


class Sequential(LayerList):
    """A sequential stack of layers (MAX's ``max.nn.Sequential``).

    Called with the first layer's inputs, it passes the data through each layer in order and
    returns the last layer's output. Layers are registered as ``"0"``, ``"1"``, ... (weights
    ``0.weight``, ...), as in :class:`~maxjax.nn.layer.LayerList`, whose ``__call__`` it shares.

    Args:
        layers: The layers, in calling order.
    """
