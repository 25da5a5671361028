"""Per-layer weights of a scanned chain: one device buffer per layer, indexed by the scan.

A chain of ``ops.call`` layers runs as one ``lax.scan`` (:mod:`maxjax.graph.scan`). Its weights
are normally stacked along a layer axis and sliced by the scan's step; XLA:CPU copies each slice
(``dynamic-slice``) before a matmul reads it, so a float weight is read three times per step
instead of once (a scan of 8 float32 ``[2048, 8192]`` matmuls over one row: 193-213 ms stacked,
37.6 ms per layer, 31.3 ms for one batched dot over the stack; 2-core AVX2 EPYC).

:class:`LayerWeights` keeps one array per layer instead (no stacking copy when loading either).
Inside the scan body the weight is a :class:`LayerIndexed` (the arrays and the traced layer
index): an op with the ``accepts_layer_indexed`` trait (the matmul of a ``Linear``) runs as a
``lax.switch`` over the layers, each branch reading its own buffer in place; any other op gets
the layer's array (a switch that returns it: one copy, as the stacked slice was). Which weights
are kept this way is the backend policy's ``layer_weights`` (see :mod:`maxjax.backend.policy`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["LayerWeights", "LayerIndexed", "StackIndexed", "StackBits", "materialize"]


@jax.tree_util.register_pytree_node_class
class LayerWeights:
    """One weight of a scanned chain as a tuple of per-layer arrays (a pytree whose leaves are the
    layers): ``shape`` and ``dtype`` are those of the stack it stands for, ``[layers, *shape]``."""

    def __init__(self, layers: Sequence[Any]):
        if not layers:
            raise ValueError("LayerWeights needs at least one layer")
        self.layers = tuple(layers)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.layers), *self.layers[0].shape)

    @property
    def dtype(self) -> Any:
        return self.layers[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in self.layers)

    def __getitem__(self, i: int) -> Any:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        return f"LayerWeights({len(self.layers)} x {self.dtype}{list(self.layers[0].shape)})"

    def tree_flatten(self) -> tuple[tuple[Any, ...], None]:
        return self.layers, None

    @classmethod
    def tree_unflatten(cls, aux: None, children: Sequence[Any]) -> "LayerWeights":
        obj = object.__new__(cls)
        obj.layers = tuple(children)
        return obj


class LayerIndexed:
    """Layer ``index`` (a traced int32 scalar) of per-layer ``layers``, as a scan step sees it.

    ``shape``/``dtype`` are one layer's. :meth:`apply` runs ``fn(layer)`` on the indexed layer
    without copying it; :meth:`value` gives the layer's array (copied by the switch).
    """

    materializes = True

    def __init__(self, layers: Sequence[Any], index: Any):
        self.layers = tuple(layers)
        self.index = index

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.layers[0].shape)

    @property
    def dtype(self) -> Any:
        return self.layers[0].dtype

    @property
    def ndim(self) -> int:
        return len(self.layers[0].shape)

    def apply(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(layer)`` for the indexed layer: one ``lax.switch`` branch per layer."""
        return lax.switch(self.index, [lambda a=a: fn(a) for a in self.layers])

    def value(self) -> Any:
        """The indexed layer's array."""
        return self.apply(lambda a: a)


class StackIndexed:
    """Layer ``index`` (a traced int32 scalar) of a stacked quantized weight ``stack`` (a
    :class:`~maxjax.graph.quantization.QuantizedArray` with leaves ``[layers, ...]``), as a scan
    step sees it when the backend policy multiplies it in a kernel that reads the layer in place
    (:meth:`~maxjax.backend.BackendPolicy.native_matmul`): ``qmatmul`` passes the stack and the
    index to :meth:`~maxjax.graph.quantization.QuantizedArray.layer_matmul`; any other op gets the
    layer (:meth:`value`: sliced, as the scan would have sliced it)."""

    materializes = True

    def __init__(self, stack: Any, index: Any):
        self.stack = stack
        self.index = index

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.stack.shape[1:])

    @property
    def dtype(self) -> Any:
        return self.stack.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def value(self) -> Any:
        """The indexed layer (a slice of every leaf)."""
        return self.stack.layer(self.index)


def materialize(x: Any) -> Any:
    """``x``'s array when it stands for one (a :class:`LayerIndexed`, a :class:`StackIndexed`, or
    another value whose class sets ``materializes = True`` and gives the array by ``value()``, such
    as an :class:`~maxjax.backend.kernels.amx.AmxWeight` that keeps its array for the ops that do
    not multiply it as stored), else ``x``. Ops without ``accepts_layer_indexed`` get this."""
    return x.value() if getattr(x, "materializes", False) else x


@jax.tree_util.register_pytree_node_class
class StackBits:
    """A stacked bfloat16 weight ``[layers, ...]`` carried through a scan as its uint16 bit
    patterns, and sliced so: XLA:CPU widens a bfloat16 ``dynamic-slice`` to float32 (and then
    converts the whole stack at every step), an integer slice it reads in place. Only for values
    that are not differentiated (a bitcast carries no gradient): a Trainer's frozen weights."""

    def __init__(self, bits: Any):
        self.bits = bits

    @classmethod
    def of(cls, stack: Any) -> "StackBits":
        """The bits of a bfloat16 ``stack``."""
        return cls(lax.bitcast_convert_type(stack, np.uint16))

    def value(self) -> Any:
        """The bfloat16 array (of a slice, inside the scan)."""
        return lax.bitcast_convert_type(self.bits, jnp.bfloat16)

    def tree_flatten(self) -> tuple[tuple[Any], None]:
        return (self.bits,), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: Sequence[Any]) -> "StackBits":
        return cls(children[0])
