"""The Linear family and MLPs of MAX 26.7's ``max.nn.linear``: ``Linear``, ``linear``,
``ColumnParallelLinear``, ``GPTQLinear``, ``MLP`` and ``FusedMLP``, with MAX's constructor and call
parameters, weight names and numerics.

Quantized weights:

- GGUF blocks (``quantization_encoding``): uint8 ``[out_dim, bytes_per_row]`` run by
  ``ops.qmatmul`` (float32 arithmetic, the dequantization fused into the product).
- float8 with static scales (``quant_config``): MAX's static-scale FP8 matmul
  (``max/nn/quant_ops.py`` ``_matmul_float8`` -> ``quantize_static_scaled_float8`` and
  ``matmul_static_scaled_float8``): the input is quantized to the weight's float8 type with
  ``clip(x / input_scale, +-finfo.max)``, multiplied by the float8 weight in float32, and the
  product scaled by ``input_scale * weight_scale``; the result is bfloat16, as MAX's kernel's
  (the open-source Mojo registrations of ``mo.quantize_static_scaled_float8`` and
  ``mo.matmul_static_scaled_float8`` in modular/modular: ``fp8_quantize(x, 1 / scale)`` with
  clamping, float32 accumulation, epilogue ``acc * (input_scale * weight_scale)``). A ROWWISE ``weight_scale [out_dim, 1]`` scales each
  output column by its row's scale: MAX 26.7's ``Linear`` refuses that with a static input scale
  at graph build (``expected weight_scale to be a scalar, but got shape of [Dim(N), Dim(1)]``)
  though its fused-QKV path computes exactly this; maxjax computes it.
  Every other scale configuration is refused by name (:func:`maxjax.nn.quant_config.check_supported`).
- GPTQ int4 (``GPTQLinear``): :mod:`maxjax.graph.quantization.gptq`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.quantization import QuantizationConfig, QuantizationEncoding
from maxjax.graph.quantization.gptq import gptq_matmul
from maxjax.graph.ops.nn import matmul_transposed
from maxjax.graph.sharding import Segment, ShardingStrategy
from maxjax.graph.type import DeviceRef, Dim
from maxjax.graph.value import TensorValue
from maxjax.graph.weight import Weight
from maxjax.nn.activation import activation_function_from_name
from maxjax.nn.clamp import clamp
from maxjax.nn.layer import Module
from maxjax.nn.quant_config import QuantConfig, ScaleGranularity, check_supported, fp4_packed_k

__all__ = [
    "ColumnParallelLinear", "FusedMLP", "GPTQLinear", "Linear", "MLP", "QuantConfig", "QuantizationConfig",
    "QuantizationEncoding", "ScaleGranularity", "activation_function_from_name", "ceildiv", "clamp", "fp4_packed_k",
    "linear", "quantized_matmul", "Segment",
]  # fmt: skip


def ceildiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (MAX's ``max.support.math.ceildiv``, re-exported by ``nn.linear``)."""
    return -(-a // b)


def _static_fp8_matmul(x: Any, w: Any, input_scale: Any, weight_scale: Any) -> Any:
    """MAX's static-scale FP8 matmul: ``x [..., K]`` (float), ``w [N, K]`` float8, ``input_scale``
    scalar, ``weight_scale`` scalar or ``[N, 1]`` -> bfloat16 ``[..., N]``."""
    f32 = jnp.float32
    s_in = input_scale.astype(f32).reshape(())
    limit = float(jnp.finfo(w.dtype).max)
    xq = jnp.clip(x.astype(f32) * (1.0 / s_in), -limit, limit).astype(w.dtype)  # [..., K] float8
    acc = jnp.matmul(xq.astype(f32), w.astype(f32).T)  # [..., N] float32
    s_w = weight_scale.astype(f32)
    s_w = s_w.reshape(()) if s_w.size == 1 else s_w.reshape(-1)  # [] or [N]
    return (acc * (s_in * s_w)).astype(jnp.bfloat16)


def linear(
    x: Any,
    weight: Any,
    quantization_encoding: QuantizationEncoding | None = None,
    quant_config: QuantConfig | None = None,
    input_scale: Any = None,
    weight_scale: Any = None,
    weight_scale_2: Any = None,
    bias: Any = None,
) -> Any:
    """``x @ weight.T`` with quantization support (MAX's ``max.nn.linear.linear``): ``x [..., K]``,
    ``weight [N, K]`` -> ``[..., N]``. The bias is not added here (MAX's callers add it).

    - ``quantization_encoding``: GGUF blocks, ``ops.qmatmul`` in float32 (result in ``x``'s dtype).
    - ``quant_config``: static-scale float8 (module docstring), bfloat16 result.

    Raises:
        NotImplementedError: a ``quant_config`` maxjax does not compute (named), ``weight_scale_2``
            (NVFP4) or ``bias`` (only MAX's int8 W8A8 path consumes it here).
        ValueError: a static ``quant_config`` without ``input_scale`` or ``weight_scale``.
    """
    if bias is not None:
        raise NotImplementedError(
            "linear(bias=...): only MAX's int8 W8A8 kernel fuses the bias, and maxjax does not support that format; "
            "add the bias to the result"
        )
    if quantization_encoding is not None:
        xf = x if x.dtype == DType.float32 else x.cast(DType.float32)
        y = ops.qmatmul(quantization_encoding, None, xf, weight)
        return y if x.dtype == DType.float32 else y.cast(x.dtype)
    if quant_config is not None:
        return quantized_matmul(x, weight, weight_scale, input_scale, quant_config, weight_scale_2)
    return matmul_transposed(x, weight)


def quantized_matmul(
    x: Any,
    weight: Any,
    weight_scale: Any,
    input_scale: Any,
    quant_config: QuantConfig,
    weight_scale_2: Any = None,
    bias: Any = None,
    x_scales: Any = None,
) -> Any:
    """``x @ weight.T`` for a scaled-quantized weight (MAX's ``max.nn.quant_ops.quantized_matmul``,
    which ``max.nn.linear`` re-exports): ``x [..., K]``, float8 ``weight [N, K]``, ``input_scale``
    ``[]``, ``weight_scale`` ``[]`` or ``[N, 1]`` -> bfloat16 ``[..., N]`` (module docstring).

    Raises:
        NotImplementedError: a ``quant_config`` maxjax does not compute (named), ``weight_scale_2``
            (NVFP4), ``bias`` (MAX's int8 W8A8 epilogue) or ``x_scales`` (pre-quantized dynamic input).
        ValueError: ``input_scale`` or ``weight_scale`` is None.
    """
    check_supported(quant_config, weight.dtype, "quantized_matmul")
    for arg, value in (("weight_scale_2", weight_scale_2), ("bias", bias), ("x_scales", x_scales)):
        if value is not None:
            raise NotImplementedError(f"quantized_matmul({arg}=...): not supported by maxjax's static float8 matmul")
    if input_scale is None or weight_scale is None:
        missing = "input_scale" if input_scale is None else "weight_scale"
        raise ValueError(f"quantized_matmul: a static float8 quant_config needs {missing}, got None")
    return ops.apply(_static_fp8_matmul, x, weight, input_scale, weight_scale, _name="static_scaled_fp8_matmul")


class Linear(Module):
    """``y = x @ weight.T (+ bias)`` with ``weight [out_dim, in_dim]`` (MAX's ``nn.Linear``).

    Input ``[..., in_dim]``, output ``[..., out_dim]`` in the input's dtype (bfloat16 with a float8
    ``quant_config``, as MAX's kernel).

    Weight keys (``{name}.`` in front when ``name`` is given):

    - ``weight``: ``dtype [out_dim, in_dim]``; with a GGUF ``quantization_encoding``, uint8 blocks
      ``[out_dim, bytes_per_row]``.
    - ``bias`` ``[out_dim]`` with ``has_bias`` (dtype ``quant_config.bias_dtype`` or ``dtype``).
    - with a float8 ``quant_config``: ``input_scale`` ``[]`` and ``weight_scale`` ``[]`` (TENSOR) or
      ``[out_dim, 1]`` (ROWWISE), of the specs' dtypes.

    Args:
        in_dim, out_dim: features in and out.
        dtype: the weight's dtype (a float8 type with ``quant_config``) and the bias's.
        device: where the weights live (maxjax also takes None: the CPU).
        has_bias: add a ``bias``.
        quantization_encoding: a GGUF encoding of the weight, or None.
        quant_config: a static float8 :class:`~maxjax.nn.quant_config.QuantConfig`, or None.
        name: a prefix for the weight keys.
        clip_weight: clamp the (unquantized) weight to ``[-clip, clip]`` before use.
        is_sharding: MAX's flag for building a shard: no Weights are created (the caller assigns
            the shard's ``weight`` and ``bias``).

    Raises:
        NotImplementedError: a ``quant_config`` that is not a supported static float8 config
            (names the field and value); ``clip_weight`` with a ``quantization_encoding``.
        ValueError: ``in_dim`` is not a whole number of blocks of ``quantization_encoding``.
    """

    bias: Weight | None = None
    input_scale: Weight | None = None
    weight_scale: Weight | None = None
    weight_scale_2: Weight | None = None

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        dtype: DType,
        device: DeviceRef | None = None,
        has_bias: bool = False,
        quantization_encoding: QuantizationEncoding | None = None,
        quant_config: QuantConfig | None = None,
        name: str | None = None,
        clip_weight: float | None = None,
        is_sharding: bool = False,
    ) -> None:
        super().__init__()
        if quant_config is not None:
            if not isinstance(quant_config, QuantConfig):
                raise NotImplementedError(
                    f"Linear(quant_config={quant_config!r}): not supported, pass a maxjax.nn.QuantConfig"
                )
            check_supported(quant_config, dtype)
            if quantization_encoding is not None:
                raise NotImplementedError(
                    f"Linear(quantization_encoding={quantization_encoding}, quant_config=...): both at once are not "
                    "supported"
                )
        if clip_weight and quantization_encoding is not None:
            raise NotImplementedError(
                f"Linear(clip_weight={clip_weight}, quantization_encoding={quantization_encoding}): clipping packed "
                "blocks is not supported (MAX would clamp the raw bytes)"
            )
        self.in_dim, self.out_dim = in_dim, out_dim
        self.dtype = dtype
        self.device = device or DeviceRef.CPU()
        self.has_bias = has_bias
        self.clip_weight = clip_weight
        self.quant_config = quant_config
        self.quantization_encoding = quantization_encoding
        if is_sharding:
            return
        prefix = f"{name}." if name else ""
        if quantization_encoding is not None:
            shape = quantization_encoding.packed_shape((out_dim, in_dim))
            self.weight = Weight(f"{prefix}weight", DType.uint8, shape, self.device, quantization_encoding=quantization_encoding)
        else:
            self.weight = Weight(f"{prefix}weight", dtype, (out_dim, fp4_packed_k(in_dim, quant_config)), self.device)
        if has_bias:
            bias_dtype = quant_config.bias_dtype if quant_config and quant_config.bias_dtype else dtype
            self.bias = Weight(f"{prefix}bias", bias_dtype, (out_dim,), self.device)
        if quant_config is not None:
            cpu = DeviceRef.CPU()
            self.input_scale = Weight(f"{prefix}input_scale", quant_config.input_scale.dtype, (), cpu)
            scale_shape = (out_dim, 1) if quant_config.weight_scale.is_rowwise else ()
            self.weight_scale = Weight(f"{prefix}weight_scale", quant_config.weight_scale.dtype, scale_shape, cpu)

    # -- sharding (MAX's) -------------------------------------------------------------------------
    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """The weight's strategy. Setting it also sets the bias's (the same when the output
        dimension is split, axis 0, else replicated) and the weight scale's (a TENSOR scale is
        replicated; a ROWWISE one follows a row split and is replicated for a column split), as
        MAX does."""
        return self.weight.sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        self.weight.sharding_strategy = strategy
        if self.weight_scale is not None:
            assert self.quant_config is not None
            if self.quant_config.weight_scale.is_tensor or strategy.is_colwise or strategy.is_head_aware_colwise:
                self.weight_scale.sharding_strategy = ShardingStrategy.replicate(strategy.num_devices)
            else:
                self.weight_scale.sharding_strategy = strategy
        if self.bias is not None:
            split_out = strategy.sharded_axis == 0
            self.bias.sharding_strategy = strategy if split_out else ShardingStrategy.replicate(strategy.num_devices)

    def shard(self, devices: Iterable[DeviceRef]) -> list["Linear"]:
        """One Linear per device holding its shard of the weight (``weight[i]``), bias and weight
        scale (MAX's ``Linear.shard``): when the input dimension is split, only device 0 keeps the
        bias, so that the partial products add up to one bias after ``ops.allreduce.sum``; a
        scalar ``input_scale``/``weight_scale`` is shared by every shard.

        Raises:
            ValueError: no sharding strategy was set.
        """
        strategy = self.weight.sharding_strategy
        if not strategy:
            raise ValueError("Linear layer cannot be sharded because no sharding strategy was provided.")
        devices = list(devices)
        weights = self.weight.shard(devices)
        biases = self.bias.shard(devices) if self.bias is not None else []
        scales = (
            self.weight_scale.shard(devices)
            if self.weight_scale is not None and len(self.weight_scale.shape) > 0
            else []
        )
        k_split = strategy.is_colwise or strategy.is_head_aware_colwise or (strategy.is_segmented and strategy.sharded_axis == 1)
        shards = []
        for i, (device, w) in enumerate(zip(devices, weights)):
            sharded = Linear(
                int(w.shape[1]), int(w.shape[0]), self.dtype, device, self.bias is not None,
                quant_config=self.quant_config, clip_weight=self.clip_weight, is_sharding=True,
            )  # fmt: skip
            sharded.weight = w
            sharded.bias = None if self.bias is None or (k_split and i > 0) else biases[i]
            if self.quant_config is not None:
                sharded.input_scale = self.input_scale
                sharded.weight_scale = scales[i] if scales else self.weight_scale
            shards.append(sharded)
        return shards

    def __call__(self, x: Any) -> Any:
        """``x [..., in_dim]`` -> ``[..., out_dim]`` (see the class docstring for the dtype)."""
        w = self.weight
        if self.clip_weight:
            w = clamp(w, -self.clip_weight, self.clip_weight)
        input_scale, weight_scale = self.input_scale, self.weight_scale
        if self.quant_config is not None:  # the scales live on the CPU (MAX's convention): to x's device
            device = x.device
            input_scale = input_scale if input_scale.device == device else input_scale.to(device)
            weight_scale = weight_scale if weight_scale.device == device else weight_scale.to(device)
        y = linear(
            x, w, self.weight.quantization_encoding, self.quant_config, input_scale, weight_scale, self.weight_scale_2
        )  # fmt: skip
        if self.bias is not None:
            b = self.bias
            y = y + (b if b.dtype == y.dtype else b.cast(y.dtype))
        return y


class ColumnParallelLinear(Linear):
    """A Linear whose weight (and bias) rows are split over ``devices`` (MAX's
    ``ColumnParallelLinear``): device ``i`` computes ``y_i = x_i @ W_i.T + b_i`` and
    ``ops.allgather`` concatenates the ``y_i`` on the last axis, giving every device the whole
    ``y = x @ W.T + b``.

    Weight keys: the unsplit ``weight [out_dim, in_dim]`` (and ``bias``), as a ``Linear``'s; the
    per-device layers (``distributed_linear_layers``) are views of it, not registered.

    Args:
        in_dim, out_dim, dtype: as ``Linear``.
        devices: the devices (one shard each, lower indices taking the extra rows).
        tied_weight: a Weight owned elsewhere to use as ``weight`` (a tied output head).
        **kwargs: more ``Linear`` arguments (``has_bias``, ``quant_config``, ...).

    Raises:
        ValueError: no devices; ``tied_weight`` with ``quant_config`` or ``has_bias`` (MAX's checks).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        dtype: DType,
        devices: Sequence[DeviceRef],
        tied_weight: Weight | None = None,
        **kwargs: Any,
    ) -> None:
        if len(devices) == 0:
            raise ValueError("ColumnParallelLinear requires a non-empty devices argument")
        if tied_weight is not None and (kwargs.get("quant_config") is not None or kwargs.get("has_bias", False)):
            raise ValueError("float8 and bias are both unsupported by ColumnParallelLinear currently")
        super().__init__(in_dim, out_dim, dtype, devices[0], **kwargs)
        if tied_weight is not None:
            self.weight = tied_weight
            self.set_shared_weight("weight", tied_weight)
        self.devices = devices
        self.num_devices = len(devices)
        self.sharding_strategy = ShardingStrategy.rowwise(self.num_devices)
        self.distributed_linear_layers = Linear.shard(self, self.devices)

    def __call__(self, x: Sequence[Any], signal_buffers: Iterable[Any]) -> list[Any]:  # type: ignore[override]
        """``x``: one ``[..., in_dim]`` input per device -> one ``[..., out_dim]`` output per device.

        Raises:
            ValueError: not one input and one signal buffer per device (``ops.allgather``'s checks).
        """
        if len(x) != self.num_devices:
            raise ValueError(f"ColumnParallelLinear: expected {self.num_devices} inputs (one per device), got {len(x)}")
        outs = [layer(xi) for layer, xi in zip(self.distributed_linear_layers, x)]
        return ops.allgather(outs, signal_buffers, axis=-1)


class GPTQLinear(Linear):
    """A Linear with symmetric 4-bit GPTQ weights (MAX's ``GPTQLinear``), dequantized inside the
    compiled function (:func:`maxjax.graph.quantization.gptq.gptq_matmul`).

    Weight keys, MAX's: ``qweight`` int32 ``[in_dim // 8, out_dim]``, ``scales`` float16
    ``[in_dim // group_size, out_dim]`` and, with ``desc_act``, ``perm_idx`` int32 ``[in_dim]``
    (``argsort`` of the checkpoint's ``g_idx``: :func:`~maxjax.graph.quantization.gptq.perm_idx_from_g_idx`).
    No ``qzeros`` (symmetric: zero point 8) and no bias, as in MAX. MAX declares ``qweight`` and
    ``scales`` as uint8 ``[1, 1]`` and re-types them to byte views of the loaded checkpoint arrays;
    maxjax declares the checkpoint's own dtypes and shapes, so ``load_state_dict`` checks them.

    Input ``[..., in_dim]`` -> ``[..., out_dim]`` in the input's dtype (MAX's GPU kernel takes and
    gives bfloat16; maxjax also takes float32).

    Raises:
        ValueError: ``has_bias``, a ``quant_config``, no ``quantization_config``, ``sym=False``,
            another ``quant_method`` than ``gptq``, or ``in_dim`` not a multiple of 8 and of
            ``group_size`` (MAX's messages where it has them).
        NotImplementedError: ``bits`` other than 4.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        dtype: DType,
        device: DeviceRef,
        has_bias: bool = False,
        quantization_encoding: QuantizationEncoding | None = None,
        quantization_config: QuantizationConfig | None = None,
        quant_config: QuantConfig | None = None,
    ) -> None:
        if has_bias:
            raise ValueError("has_bias=True is not supported in GPTQLinear.")
        if quant_config:
            raise ValueError("Scaled quantization is not supported in GPTQLinear.")
        if quantization_config is None:
            raise ValueError("GPTQLinear: quantization_config=None; a QuantizationConfig must be provided for GPTQLinear")
        qc = quantization_config
        if qc.quant_method != "gptq":
            raise ValueError(f"GPTQLinear: quantization_config.quant_method={qc.quant_method!r} is not supported (only 'gptq')")
        if qc.bits != 4:
            raise NotImplementedError(f"GPTQLinear: quantization_config.bits={qc.bits} is not supported (only 4-bit GPTQ)")
        if not qc.sym:
            raise ValueError("GPTQLinear: quantization_config.sym=False: GPTQ with sym=False is not supported.")
        if in_dim % 8 or in_dim % qc.group_size:
            raise ValueError(
                f"GPTQLinear: in_dim={in_dim} must be a multiple of 8 and of quantization_config.group_size={qc.group_size}"
            )
        Module.__init__(self)
        self.in_dim, self.out_dim, self.dtype = in_dim, out_dim, dtype
        self.device = device or DeviceRef.CPU()
        self.has_bias, self.clip_weight, self.quant_config = False, None, None
        self.quantization_encoding = quantization_encoding
        self.quantization_config = qc
        self.qweight = Weight("qweight", DType.int32, (in_dim // 8, out_dim), self.device)
        self.scales = Weight("scales", DType.float16, (in_dim // qc.group_size, out_dim), self.device)
        self.perm_idx: Weight | None = None
        if qc.desc_act:
            self.perm_idx = Weight("perm_idx", DType.int32, (in_dim,), self.device)

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        return None

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        raise NotImplementedError("GPTQLinear: per-device sharding is not supported by maxjax (nor by MAX)")

    def shard(self, devices: Iterable[DeviceRef]) -> list["Linear"]:
        raise NotImplementedError("GPTQLinear: per-device sharding is not supported by maxjax (nor by MAX)")

    def __call__(self, x: Any) -> Any:
        """``x [..., in_dim]`` -> ``[..., out_dim]`` in ``x``'s dtype."""
        tensors = (x, self.qweight, self.scales) + ((self.perm_idx,) if self.perm_idx is not None else ())
        return ops.apply(gptq_matmul, *tensors, _name="gptq_matmul", group_size=self.quantization_config.group_size)


def _concat_or_max(a: Any, b: Any) -> Any:
    """MAX's gate/up fusion of two tensors: scalars -> their max, others -> concatenated rows."""
    if a is None or b is None:
        return None
    if len(a.shape) == 0:
        return ops.max(ops.concat((a.reshape((1,)), b.reshape((1,))))).reshape(())
    return ops.concat((a, b))


class MLP(Module):
    """Gated feed-forward block: ``down(act(gate(x)) * up(x))`` (SwiGLU with ``silu``; MAX's
    ``nn.MLP``).

    Input and output ``[..., hidden_dim]``; the hidden layer is ``[..., feed_forward_length]``.
    Weight keys ``gate_proj.weight [ffl, hidden]``, ``up_proj.weight [ffl, hidden]``,
    ``down_proj.weight [hidden, ffl]`` (and ``.bias``, scales, as ``linear_cls`` makes them).

    ``devices``: the first one holds the weights (maxjax also takes none: the CPU; MAX requires
    it). As in MAX, without a ``quantization_encoding`` (and with no ``quant_config``, or one with
    ``can_use_fused_mlp``) gate and up run as one matmul of the concatenated weights, then split;
    with ``swiglu_limit > 0`` the gate is clamped above at the limit and up to ``+-limit``.

    Raises:
        ValueError: an unknown ``activation_function`` (MAX's message).
    """

    def __init__(
        self,
        dtype: DType,
        quantization_encoding: QuantizationEncoding | None,
        hidden_dim: int,
        feed_forward_length: int,
        devices: Sequence[DeviceRef] = (),
        linear_cls: Callable[..., Linear] = Linear,
        has_bias: bool = False,
        activation_function: str = "silu",
        quant_config: QuantConfig | None = None,
        swiglu_limit: float = 0.0,
        is_sharding: bool = False,
    ) -> None:
        super().__init__()
        self.devices = devices
        self.num_devices = len(devices)
        self.hidden_dim = hidden_dim
        self.feed_forward_length = feed_forward_length
        self.activation_function = activation_function_from_name(activation_function)
        if not is_sharding:
            common = dict(
                dtype=dtype, device=devices[0] if devices else DeviceRef.CPU(), quantization_encoding=quantization_encoding, has_bias=has_bias,
                quant_config=quant_config,
            )  # fmt: skip
            self.gate_proj = linear_cls(in_dim=hidden_dim, out_dim=feed_forward_length, **common)
            self.down_proj = linear_cls(in_dim=feed_forward_length, out_dim=hidden_dim, **common)
            self.up_proj = linear_cls(in_dim=hidden_dim, out_dim=feed_forward_length, **common)
        self.quantization_encoding = quantization_encoding
        self.quant_config = quant_config
        self.swiglu_limit = swiglu_limit
        self._activation_function_name = activation_function
        self._sharding_strategy: ShardingStrategy | None = None

    def _can_use_fused_mlp(self) -> bool:
        """MAX fuses gate and up into one matmul of their concatenated weights whenever the
        weights are not GGUF-quantized and any ``quant_config`` allows it. Without a
        ``quant_config`` the fused product equals the two separate ones (the same dot products),
        so maxjax runs them separately and does not copy the weights into a concatenation on
        every call; with a ``can_use_fused_mlp`` float8 config it fuses as MAX does, because MAX
        then scales both halves by the larger of the two per-tensor scales."""
        if self.quantization_encoding or self.quant_config is None:
            return False
        return self.quant_config.can_use_fused_mlp and _plain_linear(self)

    def __call__(self, x: Any) -> Any:
        """``x [..., hidden_dim]`` -> ``[..., hidden_dim]``."""
        if not self._can_use_fused_mlp():
            gate_out = self.activation_function(self.gate_proj(x))
            up_out = self.up_proj(x)
        else:
            g, u = self.gate_proj, self.up_proj
            out = linear(
                x, ops.concat((g.weight, u.weight)), None, self.quant_config,
                input_scale=_concat_or_max(g.input_scale, u.input_scale),
                weight_scale=_concat_or_max(g.weight_scale, u.weight_scale),
            )  # fmt: skip  # [..., 2 * ffl]
            bias = _concat_or_max(g.bias, u.bias)
            if bias is not None:
                out = out + (bias if bias.dtype == out.dtype else bias.cast(out.dtype))
            ffl = g.weight.shape[0]
            gate_out, up_out = ops.split(out, [ffl, ffl], axis=-1)  # 2 x [..., ffl]
            gate_out = self.activation_function(gate_out)
        if self.swiglu_limit > 0:
            lim = float(self.swiglu_limit)
            gate_out = ops.min(gate_out, lim)
            up_out = ops.min(ops.max(up_out, -lim), lim)
        return self.down_proj(gate_out * up_out)

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """MAX's MLP strategies: ``replicate`` (every projection replicated) or
        ``tensor_parallel`` (gate and up split by rows, down by columns: each device computes its
        slice of the hidden layer, the partial outputs add up)."""
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        n = strategy.num_devices
        if strategy.is_replicate:
            for proj in (self.gate_proj, self.down_proj, self.up_proj):
                proj.sharding_strategy = strategy
        elif strategy.is_tensor_parallel:
            self.gate_proj.sharding_strategy = ShardingStrategy.rowwise(n)
            self.down_proj.sharding_strategy = ShardingStrategy.columnwise(n)
            self.up_proj.sharding_strategy = ShardingStrategy.rowwise(n)
        else:
            raise ValueError(f"Unsupported sharding strategy: {strategy}")
        self._sharding_strategy = strategy

    def shard(self, devices: Iterable[DeviceRef]) -> list["MLP"]:
        """One MLP per device with its shards of the three projections (MAX's ``MLP.shard``).

        Raises:
            ValueError: no sharding strategy was set.
        """
        if self._sharding_strategy is None:
            raise ValueError("Sharding strategy is not set")
        devices = list(devices)
        gate, down, up = (p.shard(devices) for p in (self.gate_proj, self.down_proj, self.up_proj))
        shards = []
        for i, device in enumerate(devices):
            sharded = MLP(
                dtype=self.gate_proj.weight.dtype, quantization_encoding=self.quantization_encoding,
                hidden_dim=self.hidden_dim, feed_forward_length=self.feed_forward_length, devices=[device],
                has_bias=self.gate_proj.bias is not None, activation_function=self._activation_function_name,
                quant_config=self.quant_config, swiglu_limit=self.swiglu_limit, is_sharding=True,
            )  # fmt: skip
            sharded.gate_proj, sharded.down_proj, sharded.up_proj = gate[i], down[i], up[i]
            sharded._sharding_strategy = self._sharding_strategy
            shards.append(sharded)
        return shards


def _plain_linear(mlp: MLP) -> bool:
    """True when gate and up are Linears whose call is ``linear`` + bias (no subclass override,
    e.g. LoRA adapters), so that MAX's fused gate/up matmul computes the same thing."""
    return all(type(p).__call__ is Linear.__call__ for p in (mlp.gate_proj, mlp.up_proj))


class FusedMLP(Module):
    """An MLP whose gate and up projections are one stored weight (MAX's ``FusedMLP``):
    ``gate_up_proj_fused [2 * feed_forward_length, hidden_dim]`` (gate rows, then up rows) and
    ``down_proj.weight [hidden_dim, feed_forward_length]``; no bias, not quantized.

    Input and output ``[..., hidden_dim]``; ``swiglu_limit`` as in :class:`MLP`.

    Raises:
        ValueError: not exactly one device; an unknown ``activation_function`` (MAX's messages).
    """

    def __init__(
        self,
        dtype: DType,
        hidden_dim: int,
        feed_forward_length: int,
        devices: Sequence[DeviceRef],
        activation_function: str = "silu",
        swiglu_limit: float = 0.0,
        is_sharding: bool = False,
    ) -> None:
        super().__init__()
        if len(devices) != 1:
            raise ValueError(f"FusedMLP requires exactly one device, got {len(devices)}")
        self.devices = devices
        self.num_devices = len(devices)
        self.hidden_dim = hidden_dim
        self.feed_forward_length = feed_forward_length
        self.swiglu_limit = swiglu_limit
        self._activation_function_name = activation_function
        self.activation_function = activation_function_from_name(activation_function)
        self._sharding_strategy: ShardingStrategy | None = None
        if not is_sharding:
            self.gate_up_proj_fused = Weight("gate_up_proj_fused", dtype, [2 * feed_forward_length, hidden_dim], devices[0])
            self.down_proj = Linear(in_dim=feed_forward_length, out_dim=hidden_dim, dtype=dtype, device=devices[0])

    def __call__(self, x: Any) -> Any:
        """``x [..., hidden_dim]`` -> ``[..., hidden_dim]``."""
        out = linear(x, self.gate_up_proj_fused)  # [..., 2 * ffl]
        gate_out, up_out = ops.split(out, [self.feed_forward_length, self.feed_forward_length], axis=-1)
        gate_out = self.activation_function(gate_out)
        if self.swiglu_limit > 0:
            lim = float(self.swiglu_limit)
            gate_out = ops.min(gate_out, lim)
            up_out = ops.min(ops.max(up_out, -lim), lim)
        return self.down_proj(gate_out * up_out)

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        """``replicate``, or ``tensor_parallel`` on one device (MAX's rule).

        Raises:
            ValueError: tensor parallelism over several devices, or another strategy.
        """
        if strategy.is_tensor_parallel and strategy.num_devices != 1:
            raise ValueError(f"FusedMLP does not support tensor parallelism across {strategy.num_devices} devices")
        if strategy.is_replicate:
            self.gate_up_proj_fused.sharding_strategy = strategy
            self.down_proj.sharding_strategy = strategy
        elif strategy.is_tensor_parallel:
            self.gate_up_proj_fused.sharding_strategy = ShardingStrategy.rowwise(strategy.num_devices)
            self.down_proj.sharding_strategy = ShardingStrategy.columnwise(strategy.num_devices)
        else:
            raise ValueError(f"Unsupported sharding strategy: {strategy}")
        self._sharding_strategy = strategy

    def shard(self, devices: Iterable[DeviceRef]) -> list["FusedMLP"]:
        """One FusedMLP per device (MAX's ``FusedMLP.shard``).

        Raises:
            ValueError: no sharding strategy was set.
        """
        if self._sharding_strategy is None:
            raise ValueError("Sharding strategy is not set")
        devices = list(devices)
        gate_up = self.gate_up_proj_fused.shard(devices)
        downs = self.down_proj.shard(devices)
        shards = []
        for device, gu, down in zip(devices, gate_up, downs):
            sharded = FusedMLP(
                dtype=self.gate_up_proj_fused.dtype, hidden_dim=self.hidden_dim,
                feed_forward_length=self.feed_forward_length, devices=[device],
                activation_function=self._activation_function_name, swiglu_limit=self.swiglu_limit, is_sharding=True,
            )  # fmt: skip
            sharded.gate_up_proj_fused = gu
            sharded.down_proj = down
            shards.append(sharded)
        return shards
