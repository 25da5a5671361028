"""``Embedding`` and ``VocabParallelEmbedding`` (MAX's ``max.nn.embedding``): rows of
``weight [vocab_size, hidden_dim]`` by token id."""

from __future__ import annotations

import math
from typing import Any, Iterable

import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.ops._core import apply
from maxjax.graph.sharding import ShardingStrategy
from maxjax.graph.type import DeviceRef
from maxjax.graph.weight import Weight
from maxjax.nn.comm import Allreduce
from maxjax.nn.layer import Module

__all__ = ["Embedding", "VocabParallelEmbedding"]


def _laid_out_rows(indices: Any, *, remainder: int, base: int) -> Any:
    """Token ids -> rows of a table laid out on a mesh by a ``rowwise`` split of ``vocab =
    base * n + remainder`` rows (:class:`~maxjax.graph.sharding.DeviceLayout`): the first
    ``remainder`` shards hold ``base + 1`` rows, the others ``base`` rows and one zero row of
    padding each, so id ``v`` sits after ``max(v - remainder * (base + 1), 0) // base`` padding
    rows. Same shape and dtype as ``indices``."""
    v = indices
    return v + jnp.maximum(v - remainder * (base + 1), 0) // base


class Embedding(Module):
    """Looks up rows of ``weight`` (``[vocab_size, hidden_dim]``) for integer ``indices`` of any
    shape: ``[*indices.shape, hidden_dim]`` in the weight's dtype.

    With a GGUF ``quantization_encoding`` only the gathered rows are dequantized (float32).
    Weight key: ``name``, or ``weight`` when no ``name`` is given (MAX's ``Weight(name or "weight")``).
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_dim: int,
        dtype: DType,
        device: DeviceRef | None = None,
        quantization_encoding: Any = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.vocab_size, self.hidden_dim = vocab_size, hidden_dim
        self.device = device or DeviceRef.CPU()
        wname = name or "weight"
        if quantization_encoding is not None:
            shape = quantization_encoding.packed_shape((vocab_size, hidden_dim))
            self.weight = Weight(wname, DType.uint8, shape, self.device, quantization_encoding=quantization_encoding)
        else:
            self.weight = Weight(wname, dtype, (vocab_size, hidden_dim), self.device)

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """The table's strategy: ``rowwise`` (split over the vocabulary) or ``replicate``. MAX's
        ``Embedding`` has none (its ``VocabParallelEmbedding`` splits the vocabulary); maxjax uses
        it to place the table on a mesh (``Module.to(mesh)``), where XLA does the lookup across
        devices. There is no per-device ``shard``: a lookup in one slice of the vocabulary needs
        MAX's ``VocabParallelEmbedding``.

        Raises:
            ValueError: (setting) another strategy.
        """
        return self.weight.sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not (strategy.is_rowwise or strategy.is_replicate):
            raise ValueError(f"Embedding supports the rowwise (vocabulary) and replicate strategies, got {strategy}")
        self.weight.sharding_strategy = strategy

    def _rows(self, indices: Any) -> Any:
        """``indices`` as rows of the weight's runtime value: on a mesh, a vocabulary split that
        does not divide evenly pads the shorter shards (see :func:`_laid_out_rows`)."""
        strategy = self.weight.sharding_strategy
        if self.weight.mesh is None or strategy is None or not strategy.is_rowwise:
            return indices
        base, remainder = divmod(self.vocab_size, strategy.num_devices)
        if remainder == 0 or base == 0:  # no padding row before any id
            return indices
        return apply(_laid_out_rows, indices, _name="embedding_rows", remainder=remainder, base=base)

    def __call__(self, indices: Any) -> Any:
        indices = self._rows(indices)
        enc = self.weight.quantization_encoding
        if enc is None:
            return ops.gather(self.weight, indices, axis=0)
        rows = ops.gather(self.weight, ops.reshape(indices, [-1]), axis=0)
        return ops.reshape(ops.dequantize(enc, rows), [*indices.shape, self.hidden_dim])


class VocabParallelEmbedding(Embedding):
    """An embedding table split over ``devices`` along the vocabulary (MAX's
    ``max.nn.VocabParallelEmbedding``): ``__call__(indices, signal_buffers)`` returns the
    embeddings of ``indices`` once per device, ``[*indices.shape, hidden_dim]`` each, on
    ``devices[i]``; the numbers are those of a plain :class:`Embedding` of the same table.

    MAX looks up each device's slice of the vocabulary (ids outside it masked to zero) and sums the
    slices with an allreduce. maxjax does one lookup in a table that lives split on a
    ``jax.sharding.Mesh``: with more than one device the weight is placed at construction on a mesh
    of ``devices`` (axis ``"tp"``, ``ShardingStrategy.rowwise(len(devices))``: device ``i`` holds
    MAX's shard ``i``), and XLA's SPMD partitioner does the cross-device lookup. ``Module.to(mesh,
    axis=...)`` places it on another mesh (an axis of ``len(devices)`` devices).

    Weight key: ``name``, or ``weight`` (MAX's), declared on the CPU.

    Args: MAX's (``vocab_size, hidden_dim, dtype, devices, quantization_encoding, name``).

    Raises:
        ValueError: no devices; (call) not one signal buffer per device (MAX's allreduce check).
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_dim: int,
        dtype: DType,
        devices: list[DeviceRef],
        quantization_encoding: Any = None,
        name: str | None = None,
    ) -> None:
        if len(devices) == 0:
            raise ValueError("VocabParallelEmbedding: devices=[]; it needs at least one device")
        super().__init__(vocab_size, hidden_dim, dtype, DeviceRef.CPU(), quantization_encoding, name)
        self.devices = devices
        self.num_devices = len(devices)
        self.shard_size = math.ceil(vocab_size / self.num_devices)
        self.allreduce = Allreduce(num_accelerators=self.num_devices)
        if self.num_devices > 1:
            import numpy as np
            from jax.sharding import AxisType, Mesh

            self.sharding_strategy = ShardingStrategy.rowwise(self.num_devices)
            grid = np.asarray([DeviceRef.from_device(d).to_device().jax_device for d in devices], dtype=object)
            self.weight.place(Mesh(grid, ("tp",), axis_types=(AxisType.Auto,)), "tp")

    def __call__(self, indices: Any, signal_buffers: Iterable[Any]) -> list[Any]:  # type: ignore[override]
        """``indices`` (integer, any shape) -> one ``[*indices.shape, hidden_dim]`` per device."""
        n = len(list(signal_buffers))
        if n != self.num_devices:
            raise ValueError(f"expected number of inputs ({self.num_devices}) and number of signal buffers ({n}) to match")
        out = super().__call__(indices)
        return [ops.transfer_to(out, d) for d in self.devices]
