"""maxjax's counterpart of MAX 26.7's ``max.experimental``: the eager :class:`~maxjax.experimental.tensor.Tensor`
(single device).

MAX's other experimental modules (``functional``, ``nn``, ``sharding``, ``random``, ``custom``,
``validation``) have no maxjax counterpart yet: ``maxjax.graph.ops`` and ``maxjax.nn`` cover the
same ground, and sharding is ``jax.sharding.NamedSharding`` through maxjax's sharding strategies.
"""

from maxjax.experimental import tensor
from maxjax.experimental.tensor import Tensor

__all__ = ["Tensor", "tensor"]
