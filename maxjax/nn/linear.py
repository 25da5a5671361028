"""``Linear`` and ``MLP`` with MAX's constructor arguments and weight names."""

from __future__ import annotations

from typing import Any, Sequence

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.sharding import ShardingStrategy
from maxjax.graph.type import DeviceRef
from maxjax.graph.weight import Weight
from maxjax.nn.layer import Module

__all__ = ["Linear", "MLP"]


class Linear(Module):
    """``y = x @ weight.T (+ bias)`` with ``weight`` of shape ``[out_dim, in_dim]`` (MAX's ``nn.Linear``).

    With a GGUF ``quantization_encoding`` the weight is declared as MAX declares it, uint8 blocks
    ``[out_dim, bytes_per_row]``; it runs as a quantized tensor (``ops.qmatmul``: float32
    arithmetic, the dequantization fused into the product).

    Weight keys: ``weight`` and ``bias`` (``{name}.weight`` when ``name`` is given).

    Args:
        in_dim, out_dim: features in and out.
        dtype: the weight's (and bias's) dtype when not quantized.
        device: where the weights live.
        has_bias: add a ``bias [out_dim]``.
        quantization_encoding: a GGUF encoding of the weight, or None.
        quant_config: MAX's config of FP8/FP4/int8 weight scales; not supported (must be None).
        name: a prefix for the weight keys.
        clip_weight: clamp the (unquantized) weight to ``[-clip, clip]`` before use.
        is_sharding: MAX's flag for building a shard: no Weights are created (the caller assigns
            the shard's ``weight`` and ``bias``).

    Raises:
        NotImplementedError: a ``quant_config``.
        ValueError: ``in_dim`` is not a whole number of blocks of ``quantization_encoding``.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        dtype: DType,
        device: DeviceRef | None = None,
        has_bias: bool = False,
        quantization_encoding: Any = None,
        quant_config: Any = None,
        name: str | None = None,
        clip_weight: float | None = None,
        is_sharding: bool = False,
    ) -> None:
        super().__init__()
        if quant_config is not None:
            raise NotImplementedError(
                f"Linear(quant_config={quant_config!r}): MAX's FP8/FP4/int8 scale configs are not supported by maxjax; "
                "GGUF weights use quantization_encoding"
            )
        self.in_dim, self.out_dim = in_dim, out_dim
        self.dtype = dtype
        self.device = device or DeviceRef.CPU()
        self.has_bias = has_bias
        self.clip_weight = clip_weight
        self.quantization_encoding = quantization_encoding
        self.bias: Weight | None = None
        if is_sharding:
            return
        prefix = f"{name}." if name else ""
        if quantization_encoding is not None:
            shape = quantization_encoding.packed_shape((out_dim, in_dim))
            self.weight = Weight(f"{prefix}weight", DType.uint8, shape, self.device, quantization_encoding=quantization_encoding)
        else:
            self.weight = Weight(f"{prefix}weight", dtype, (out_dim, in_dim), self.device)
        if has_bias:
            self.bias = Weight(f"{prefix}bias", dtype, (out_dim,), self.device)

    # -- sharding (MAX's) -------------------------------------------------------------------------
    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """The weight's strategy. Setting it also sets the bias's: the same when the output
        dimension is split (axis 0), else replicated (MAX's rule)."""
        return self.weight.sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        self.weight.sharding_strategy = strategy
        if self.bias is not None:
            split_out = strategy.sharded_axis == 0
            self.bias.sharding_strategy = strategy if split_out else ShardingStrategy.replicate(strategy.num_devices)

    def shard(self, devices: Sequence[DeviceRef]) -> list["Linear"]:
        """One Linear per device holding its shard of the weight (``weight[i]``) and bias (MAX's
        ``Linear.shard``): when the input dimension is split, only device 0 keeps the bias, so
        that the partial products add up to one bias after ``ops.allreduce.sum``.

        Raises:
            ValueError: no sharding strategy was set.
        """
        strategy = self.weight.sharding_strategy
        if not strategy:
            raise ValueError("Linear layer cannot be sharded because no sharding strategy was provided.")
        devices = list(devices)
        weights = self.weight.shard(devices)
        biases = self.bias.shard(devices) if self.bias is not None else []
        input_split = strategy.is_colwise or strategy.is_head_aware_colwise or (strategy.is_segmented and strategy.sharded_axis == 1)
        shards = []
        for i, (device, w) in enumerate(zip(devices, weights)):
            sharded = Linear(
                int(w.shape[1]), int(w.shape[0]), self.dtype, device, self.bias is not None, clip_weight=self.clip_weight,
                is_sharding=True,
            )  # fmt: skip
            sharded.weight = w
            sharded.bias = None if self.bias is None or (input_split and i > 0) else biases[i]
            shards.append(sharded)
        return shards

    def __call__(self, x: Any) -> Any:
        enc = self.weight.quantization_encoding
        if enc is not None:
            y = ops.qmatmul(enc, None, x.cast(DType.float32) if x.dtype != DType.float32 else x, self.weight)
            y = y.cast(x.dtype) if x.dtype != DType.float32 else y
        else:
            w = self.weight
            if self.clip_weight:
                w = ops.max(ops.min(w, self.clip_weight), -self.clip_weight)
            y = x @ w.T
        if self.bias is not None:
            y = y + self.bias
        return y


_ACTIVATIONS = {
    "silu": ops.silu,
    "gelu": ops.gelu,
    "gelu_tanh": lambda x: ops.gelu(x, approximate="tanh"),
    "relu": ops.relu,
    "tanh": ops.tanh,
    "sigmoid": ops.sigmoid,
}


class MLP(Module):
    """Gated feed-forward block (SwiGLU with ``silu``): ``down(act(gate(x)) * up(x))``.

    MAX's ``nn.MLP`` arguments; weight keys ``gate_proj.weight``, ``up_proj.weight``,
    ``down_proj.weight`` (and ``.bias`` with ``has_bias``).

    Raises:
        ValueError: an unknown ``activation_function`` (lists the supported ones).
    """

    def __init__(
        self,
        dtype: DType,
        quantization_encoding: Any,
        hidden_dim: int,
        feed_forward_length: int,
        devices: Sequence[DeviceRef] = (),
        linear_cls: type = Linear,
        has_bias: bool = False,
        activation_function: str = "silu",
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if activation_function not in _ACTIVATIONS:
            raise ValueError(
                f"MLP: unsupported activation_function {activation_function!r} (supported: {sorted(_ACTIVATIONS)})"
            )
        device = list(devices)[0] if devices else DeviceRef.CPU()
        self.devices = list(devices)
        self.activation_function = activation_function
        self.gate_proj = linear_cls(hidden_dim, feed_forward_length, dtype, device, has_bias, quantization_encoding)
        self.down_proj = linear_cls(feed_forward_length, hidden_dim, dtype, device, has_bias, quantization_encoding)
        self.up_proj = linear_cls(hidden_dim, feed_forward_length, dtype, device, has_bias, quantization_encoding)
        self._sharding_strategy: ShardingStrategy | None = None

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
            self.up_proj.sharding_strategy = ShardingStrategy.rowwise(n)
            self.down_proj.sharding_strategy = ShardingStrategy.columnwise(n)
        else:
            raise ValueError(f"Unsupported sharding strategy: {strategy}")
        self._sharding_strategy = strategy

    def shard(self, devices: Sequence[DeviceRef]) -> list["MLP"]:
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
            sharded = object.__new__(type(self))
            Module.__init__(sharded)
            sharded.devices, sharded.activation_function = [device], self.activation_function
            sharded.gate_proj, sharded.down_proj, sharded.up_proj = gate[i], down[i], up[i]
            sharded._sharding_strategy = self._sharding_strategy
            shards.append(sharded)
        return shards

    def __call__(self, x: Any) -> Any:
        act = _ACTIVATIONS[self.activation_function]
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))
