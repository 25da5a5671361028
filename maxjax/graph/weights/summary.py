"""What is in a checkpoint, without reading tensor data: for ``maxjax inspect`` and for tools.

:func:`summarize` works on every Weights source of this package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TensorInfo", "WeightsSummary", "summarize"]


@dataclass(frozen=True)
class TensorInfo:
    """One stored tensor as its file describes it.

    Attributes:
        name: the tensor's name in the file.
        shape: the logical (row-major) shape; for quantized tensors the float shape.
        dtype: the dtype's name (``"float32"``, ``"bfloat16"``) or, for a dtype maxjax cannot load,
            the file's code for it.
        encoding: the block encoding of a quantized tensor (``"Q4_1"``), or None.
        nbytes: bytes the tensor occupies in the file.
        file: the file holding it.
        offset: byte offset of its data in that file (None where the format does not say).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    encoding: str | None
    nbytes: int
    file: str
    offset: int | None = None


@dataclass
class WeightsSummary:
    """The format, files, metadata and tensors of a checkpoint."""

    format: str
    files: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def summarize(weights: Any) -> WeightsSummary:
    """The :class:`WeightsSummary` of a ``SafetensorWeights``, ``GGUFWeights`` or ``OrbaxWeights``.

    Only headers are read (no tensor data).

    Raises:
        TypeError: ``weights`` is not one of this package's Weights sources.
    """
    store = getattr(weights, "_store", None)
    if store is None or not hasattr(store, "infos"):
        raise TypeError(f"cannot summarize {type(weights).__name__}: not a maxjax weights source")
    return WeightsSummary(store.format_name, store.file_list(), store.file_metadata(), store.infos())
