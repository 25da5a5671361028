"""``maxjax.graph``: MAX's graph API (``Graph``, ``TensorValue``, ``Weight``, types, ``ops``) on JAX."""

from maxjax.dtype import DType
from maxjax.graph.graph import DevicePlacementPolicy, Graph, KernelLibrary, Module
from maxjax.graph.graph import register_kernel  # maxjax: a JAX implementation of a custom kernel (ops.custom)
from maxjax.graph.graph import default_custom_extensions, default_custom_extensions_scope
from maxjax.graph.type import (
    AlgebraicDim, BufferType, DeviceKind, DeviceRef, Dim, DimLike, Shape, ShapeLike, StaticDim, SymbolicDim, TensorType, Type,
)
from maxjax.graph.value import TensorValue, TensorValueLike, Value
from maxjax.graph.buffer import BufferValue
from maxjax.graph.weight import ShardingStrategy, Weight
from maxjax.graph.quantization import QuantizationConfig, QuantizationEncoding
from maxjax.graph import ops
from maxjax.graph import dtype_promotion  # noqa: E402 - MAX's max.graph.dtype_promotion

__all__ = [
    "AlgebraicDim", "BufferType", "BufferValue", "DType", "DeviceKind", "DeviceRef", "Dim", "DimLike", "Graph", "KernelLibrary", "QuantizationConfig",
    "QuantizationEncoding", "Shape", "ShapeLike", "ShardingStrategy", "StaticDim", "SymbolicDim",
    "TensorType", "TensorValue", "TensorValueLike", "Type", "Value", "Weight", "ops",
]  # fmt: skip
__all__ += ["DevicePlacementPolicy", "Module", "default_custom_extensions", "default_custom_extensions_scope", "register_kernel"]
