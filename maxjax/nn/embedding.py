"""``Embedding`` (MAX's ``nn.Embedding``): rows of ``weight [vocab_size, hidden_dim]`` by token id."""

from __future__ import annotations

from typing import Any

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.sharding import ShardingStrategy
from maxjax.graph.type import DeviceRef
from maxjax.graph.weight import Weight
from maxjax.nn.layer import Module

__all__ = ["Embedding"]


class Embedding(Module):
    """Looks up rows of ``weight`` (``[vocab_size, hidden_dim]``) for integer ``indices`` of any shape.

    With a GGUF ``quantization_encoding`` only the gathered rows are dequantized (float32).
    Weight key: ``weight`` (``{name}.weight`` when ``name`` is given).
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
        wname = f"{name}.weight" if name else "weight"
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

    def __call__(self, indices: Any) -> Any:
        enc = self.weight.quantization_encoding
        if enc is None:
            return ops.gather(self.weight, indices, axis=0)
        rows = ops.gather(self.weight, ops.reshape(indices, [-1]), axis=0)
        return ops.reshape(ops.dequantize(enc, rows), [*indices.shape, self.hidden_dim])
