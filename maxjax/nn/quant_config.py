"""Scaled-quantization configuration types (MAX's ``max.nn.quant_config``).

The same enums, dataclasses, fields, defaults, constructors and properties as MAX 26.7, so a MAX
program builds its configs unchanged. What maxjax computes with them is decided by the layers:
``Linear`` runs float8 weights with a static per-tensor input scale and a per-tensor or per-row
weight scale and refuses every other combination by name (see :func:`check_supported`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from maxjax.dtype import DType

__all__ = [
    "InputScaleSpec", "MXFP4_BLOCK_SIZE", "NVFP4_BLOCK_SIZE", "QuantConfig", "QuantFormat", "ScaleGranularity",
    "ScaleOrigin", "WeightScaleSpec", "check_supported", "fp4_packed_k",
]  # fmt: skip

NVFP4_BLOCK_SIZE = 16
"""Inputs covered by one NVFP4 weight block scale."""

MXFP4_BLOCK_SIZE = 32
"""Inputs covered by one MXFP4 weight block scale."""


class ScaleGranularity(Enum):
    """What one scale factor covers: the whole tensor, one row, one column or one block."""

    TENSOR = "tensor"
    ROWWISE = "rowwise"
    COLWISE = "colwise"
    BLOCK = "block"

    def __str__(self) -> str:
        return self.value


class ScaleOrigin(Enum):
    """Whether a scale is stored with the weights (static) or computed from the input (dynamic)."""

    STATIC = "static"
    DYNAMIC = "dynamic"

    @property
    def is_dynamic(self) -> bool:
        return self == ScaleOrigin.DYNAMIC

    @property
    def is_static(self) -> bool:
        return self == ScaleOrigin.STATIC


class QuantFormat(Enum):
    """The quantization format of a checkpoint (MAX's members and values)."""

    COMPRESSED_TENSORS_FP8 = "compressed-tensors-fp8"
    FBGEMM_FP8 = "fbgemm-fp8"
    BLOCKSCALED_FP8 = "blockscaled-fp8"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"
    MXFP6 = "mxfp6"
    INT8_W8A8 = "int8-w8a8"


def _check_block(granularity: ScaleGranularity, block_size: tuple[int, int] | None) -> None:
    if granularity == ScaleGranularity.BLOCK:
        if block_size is None:
            raise ValueError("block_size must be specified for block-wise scaling")
        if len(block_size) != 2:
            raise ValueError("block_size must be a tuple of two integers")


class _Granular:
    granularity: ScaleGranularity

    @property
    def is_tensor(self) -> bool:
        return self.granularity == ScaleGranularity.TENSOR

    @property
    def is_rowwise(self) -> bool:
        return self.granularity == ScaleGranularity.ROWWISE

    @property
    def is_colwise(self) -> bool:
        return self.granularity == ScaleGranularity.COLWISE

    @property
    def is_block(self) -> bool:
        return self.granularity == ScaleGranularity.BLOCK


@dataclass
class WeightScaleSpec(_Granular):
    """How weights are scaled: ``granularity``, the scale ``dtype`` and, for BLOCK, ``block_size``
    ``(rows, cols)``.

    Raises:
        ValueError: BLOCK granularity without a two-int ``block_size`` (MAX's messages).
    """

    granularity: ScaleGranularity
    dtype: DType
    block_size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        _check_block(self.granularity, self.block_size)


@dataclass
class InputScaleSpec(_Granular):
    """How input activations are scaled: ``granularity``, ``origin`` (static/dynamic), scale
    ``dtype``, an optional ``activation_scale_ub`` (dynamic scaling) and, for BLOCK, ``block_size``.

    Raises:
        ValueError: BLOCK granularity without a two-int ``block_size`` (MAX's messages).
    """

    granularity: ScaleGranularity
    origin: ScaleOrigin
    dtype: DType
    activation_scale_ub: float | None = None
    block_size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        _check_block(self.granularity, self.block_size)


@dataclass
class QuantConfig:
    """Scaled-quantization settings of a model section (MAX's ``QuantConfig``: same fields,
    defaults, class constructors and properties)."""

    input_scale: InputScaleSpec
    weight_scale: WeightScaleSpec
    mlp_quantized_layers: set[int]
    attn_quantized_layers: set[int]
    format: QuantFormat
    embedding_output_dtype: DType | None = None
    shared_experts_weight_dtype: DType | None = None
    bias_dtype: DType | None = None
    can_use_fused_mlp: bool = False
    can_use_fused_swiglu: bool = False
    scales_pre_interleaved: bool = False
    _mxfp6_element_format: str = "e2m3"

    @classmethod
    def blockscaled_fp8(
        cls,
        *,
        mlp_quantized_layers: Iterable[int],
        attn_quantized_layers: Iterable[int],
        block_size: int = 128,
        scale_dtype: DType = DType.float32,
        embedding_output_dtype: DType | None = None,
        bias_dtype: DType | None = None,
    ) -> "QuantConfig":
        """DeepSeek-V3-style FP8: one weight scale per ``block_size`` square, dynamic activation
        scales per token per ``block_size`` inputs."""
        return cls(
            input_scale=InputScaleSpec(ScaleGranularity.BLOCK, ScaleOrigin.DYNAMIC, scale_dtype, block_size=(1, block_size)),
            weight_scale=WeightScaleSpec(ScaleGranularity.BLOCK, scale_dtype, block_size=(block_size, block_size)),
            mlp_quantized_layers=set(mlp_quantized_layers),
            attn_quantized_layers=set(attn_quantized_layers),
            embedding_output_dtype=embedding_output_dtype,
            bias_dtype=bias_dtype,
            format=QuantFormat.BLOCKSCALED_FP8,
        )

    @classmethod
    def mxfp4(
        cls,
        *,
        mlp_quantized_layers: Iterable[int],
        attn_quantized_layers: Iterable[int] = (),
        embedding_output_dtype: DType | None = None,
        bias_dtype: DType | None = None,
        can_use_fused_mlp: bool = False,
    ) -> "QuantConfig":
        """OCP MXFP4 weights (E8M0 scale per 32 inputs) with dynamic MXFP8 activations."""
        return cls(
            input_scale=InputScaleSpec(ScaleGranularity.BLOCK, ScaleOrigin.DYNAMIC, DType.float32, block_size=(1, MXFP4_BLOCK_SIZE)),
            weight_scale=WeightScaleSpec(ScaleGranularity.BLOCK, DType.float8_e8m0fnu, block_size=(1, MXFP4_BLOCK_SIZE)),
            mlp_quantized_layers=set(mlp_quantized_layers),
            attn_quantized_layers=set(attn_quantized_layers),
            embedding_output_dtype=embedding_output_dtype,
            bias_dtype=bias_dtype,
            format=QuantFormat.MXFP4,
            can_use_fused_mlp=can_use_fused_mlp,
        )

    @classmethod
    def nvfp4(
        cls,
        *,
        mlp_quantized_layers: Iterable[int],
        attn_quantized_layers: Iterable[int],
        embedding_output_dtype: DType | None = None,
        bias_dtype: DType | None = None,
        shared_experts_weight_dtype: DType | None = None,
        can_use_fused_mlp: bool = False,
    ) -> "QuantConfig":
        """ModelOpt NVFP4: E4M3 weight scale per 16 inputs, static per-tensor input scale."""
        return cls(
            input_scale=InputScaleSpec(ScaleGranularity.BLOCK, ScaleOrigin.STATIC, DType.float32, block_size=(1, NVFP4_BLOCK_SIZE)),
            weight_scale=WeightScaleSpec(ScaleGranularity.BLOCK, DType.float8_e4m3fn, block_size=(1, NVFP4_BLOCK_SIZE)),
            mlp_quantized_layers=set(mlp_quantized_layers),
            attn_quantized_layers=set(attn_quantized_layers),
            embedding_output_dtype=embedding_output_dtype,
            bias_dtype=bias_dtype,
            shared_experts_weight_dtype=shared_experts_weight_dtype,
            format=QuantFormat.NVFP4,
            can_use_fused_mlp=can_use_fused_mlp,
        )

    @property
    def scales_granularity_mnk(self) -> tuple[int, int, int]:
        """``(m, n, k)`` scale granularities of input rows, weight rows and inputs (-1: whole axis)."""
        if self.input_scale.is_block:
            assert self.input_scale.block_size is not None
            m_in, k_in = self.input_scale.block_size
        elif self.input_scale.is_colwise:
            m_in, k_in = 1, -1
        elif self.input_scale.is_tensor:
            m_in, k_in = -1, -1
        else:
            raise ValueError("unsupported input scale granularity")
        if self.weight_scale.is_block:
            assert self.weight_scale.block_size is not None
            n_w, k_w = self.weight_scale.block_size
        elif self.weight_scale.is_rowwise:
            n_w, k_w = 1, -1
        elif self.weight_scale.is_tensor:
            n_w, k_w = -1, -1
        else:
            raise ValueError("unsupported weight scale granularity")
        assert k_in == k_w, "k_input_granularity and k_weight_granularity must be the same"
        return (m_in, n_w, k_in)

    @property
    def is_static(self) -> bool:
        return self.input_scale.origin == ScaleOrigin.STATIC

    @property
    def is_dynamic(self) -> bool:
        return self.input_scale.origin == ScaleOrigin.DYNAMIC

    @property
    def is_nvfp4(self) -> bool:
        return self.format == QuantFormat.NVFP4

    @property
    def is_mxfp4(self) -> bool:
        return self.format == QuantFormat.MXFP4

    @property
    def is_mxfp6(self) -> bool:
        return self.format == QuantFormat.MXFP6

    @property
    def is_mxfp8(self) -> bool:
        return self.format == QuantFormat.MXFP8

    @property
    def is_fp4(self) -> bool:
        return self.is_nvfp4 or self.is_mxfp4

    @property
    def mxfp6_format(self) -> str:
        if not self.is_mxfp6:
            raise ValueError(f"not an MXFP6 config: {self.format}")
        return self._mxfp6_element_format

    @property
    def is_mx(self) -> bool:
        return self.is_mxfp4 or self.is_mxfp6 or self.is_mxfp8

    @property
    def mx_element_dtype(self) -> DType:
        if self.is_mxfp6:
            return DType.float6_e3m2fn if self._mxfp6_element_format == "e3m2" else DType.float6_e2m3fn
        if self.is_mxfp4:
            return DType.float4_e2m1fn
        if self.is_mxfp8:
            return DType.float8_e4m3fn
        raise ValueError(f"not an MX config: {self.format}")

    @property
    def is_int8_w8a8(self) -> bool:
        return self.format == QuantFormat.INT8_W8A8

    def shared_experts_dtype(self, routed_weight_dtype: DType) -> DType:
        return self.shared_experts_weight_dtype if self.shared_experts_weight_dtype is not None else routed_weight_dtype

    def shared_experts_use_quant(self, routed_weight_dtype: DType) -> bool:
        return self.shared_experts_dtype(routed_weight_dtype) == routed_weight_dtype


def fp4_packed_k(in_dim: int, quant_config: QuantConfig | None) -> int:
    """The stored K (bytes per weight row) of sub-byte MX weights, else ``in_dim`` (MAX's rule:
    FP4 two codes a byte, FP6 four codes per three bytes)."""
    if quant_config is None:
        return in_dim
    if quant_config.is_fp4:
        return in_dim // 2
    if quant_config.is_mxfp6:
        return in_dim * 3 // 4
    return in_dim


_FP8_FORMATS = (QuantFormat.COMPRESSED_TENSORS_FP8, QuantFormat.FBGEMM_FP8)


def check_supported(quant_config: QuantConfig, weight_dtype: DType, layer: str = "Linear") -> None:
    """Refuses, with a one-line error naming the field and value, every ``quant_config`` that
    maxjax's ``Linear`` does not compute.

    Supported: ``format`` COMPRESSED_TENSORS_FP8 or FBGEMM_FP8, a float8 weight dtype, a STATIC
    TENSOR input scale and a TENSOR or ROWWISE weight scale (MAX's static-scale FP8 path).

    Raises:
        NotImplementedError: any other format, origin, granularity or weight dtype.
    """
    ok = "maxjax supports static float8 (COMPRESSED_TENSORS_FP8/FBGEMM_FP8, TENSOR input scale, TENSOR or ROWWISE weight scale)"
    if quant_config.format not in _FP8_FORMATS:
        raise NotImplementedError(f"{layer}: quant_config.format={quant_config.format} is not supported; {ok}")
    if quant_config.input_scale.origin != ScaleOrigin.STATIC:
        raise NotImplementedError(
            f"{layer}: quant_config.input_scale.origin={quant_config.input_scale.origin} (dynamic input scales) is not "
            f"supported; {ok}"
        )
    if not quant_config.input_scale.is_tensor:
        raise NotImplementedError(
            f"{layer}: quant_config.input_scale.granularity={quant_config.input_scale.granularity} is not supported; {ok}"
        )
    if not (quant_config.weight_scale.is_tensor or quant_config.weight_scale.is_rowwise):
        raise NotImplementedError(
            f"{layer}: quant_config.weight_scale.granularity={quant_config.weight_scale.granularity} is not supported; {ok}"
        )
    if not weight_dtype.is_float8() or weight_dtype == DType.float8_e8m0fnu:
        raise NotImplementedError(f"{layer}: dtype={weight_dtype} with a float8 quant_config is not supported; {ok}")
