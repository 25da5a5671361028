"""``StackedLinear`` (MAX's ``max.nn.stacked_linear``): several projections of one input (q/k/v)
run as one matmul of their stacked weights."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.sharding import ShardingStrategy
from maxjax.graph.type import DeviceRef
from maxjax.graph.weight import Weight
from maxjax.nn.clamp import clamp
from maxjax.nn.layer import Module
from maxjax.nn.linear import Linear, linear
from maxjax.nn.quant_config import QuantConfig

__all__ = ["StackedLinear"]


class StackedLinear(Module):
    """Projections of one input stacked into one ``x @ W.T (+ b)`` (MAX's ``StackedLinear``).

    Input ``[..., in_dim]`` -> ``[..., sum(out_dims)]`` (the projections' outputs side by side, in
    ``names`` order).

    - ``stacked=True``: one stored weight ``weight [sum(out_dims), in_dim]`` (and ``bias``), for
      checkpoints that store the fused projection (``qkv_proj.weight``).
    - ``stacked=False``: one child ``linear_cls`` per name (``q_proj``, ``k_proj``, ``v_proj``),
      their weights concatenated when called. As in MAX, this module's own attribute name is left
      out of its children's weight names (``_omit_module_attr_name``): ``self.qkv_proj =
      StackedLinear(..., names=["q_proj", "k_proj", "v_proj"])`` in ``self_attn`` exposes
      ``self_attn.q_proj.weight``. (maxjax's Module core must honour the property for a nested
      StackedLinear; as the root module the keys are ``q_proj.weight`` etc. either way.)

    Raises:
        ValueError: ``clip_weight`` with ``stacked=True`` (MAX's message).
        NotImplementedError: a ``quant_config`` (MAX's float8 re-quantization of the stacked
            weight under the largest scale is not implemented in maxjax).
    """

    def __init__(
        self,
        in_dim: int,
        out_dims: Sequence[int],
        names: Sequence[str],
        dtype: DType,
        device: DeviceRef,
        stacked: bool = False,
        has_bias: bool = False,
        linear_cls: Callable[..., Linear] = Linear,
        quant_config: QuantConfig | None = None,
        clip_weight: float | None = None,
        _is_sharding: bool = False,
    ) -> None:
        super().__init__()
        if quant_config is not None:
            raise NotImplementedError(
                f"StackedLinear(quant_config={quant_config.format}): float8 stacked projections are not supported by "
                "maxjax; use separate Linear layers"
            )
        if len(names) != len(out_dims):
            raise ValueError(f"StackedLinear: {len(names)} names for {len(out_dims)} out_dims")
        self._names = list(names)
        self._stacked = stacked
        self._out_dims = list(out_dims)
        self._in_dim = in_dim
        self._has_bias = has_bias
        self._clip_weight = clip_weight
        self._quant_config = quant_config
        if _is_sharding:
            return
        if stacked:
            if clip_weight:
                raise ValueError("clip_weight is not yet supported with stacked=True.")
            total = sum(out_dims)
            self.weight = Weight("weight", dtype, [total, in_dim], device)
            if has_bias:
                self.bias = Weight("bias", dtype, [total], device)
        else:
            for name, out_dim in zip(names, out_dims):
                setattr(
                    self, name,
                    linear_cls(
                        in_dim=in_dim, out_dim=out_dim, dtype=dtype, device=device, has_bias=has_bias,
                        quant_config=quant_config, clip_weight=clip_weight,
                    ),
                )  # fmt: skip

    @property
    def _omit_module_attr_name(self) -> bool:
        """True in unfused mode: this module's attribute name is left out of descendant FQNs."""
        return not self._stacked

    def _child(self, name: str) -> Linear:
        return getattr(self, name)

    @property
    def stacked_weight(self) -> Any:
        """``[sum(out_dims), in_dim]``: the stored weight, or the children's (clipped) weights
        concatenated."""
        if self._stacked:
            return self.weight
        weights = [self._child(n).weight for n in self._names]
        if self._clip_weight:
            weights = [clamp(w, min=-self._clip_weight, max=self._clip_weight) for w in weights]
        return ops.concat(weights)

    @property
    def stacked_bias(self) -> Any:
        """``[sum(out_dims)]`` or None."""
        if not self._has_bias:
            return None
        if self._stacked:
            return self.bias
        return ops.concat([self._child(n).bias for n in self._names])

    @property
    def stacked_input_scale(self) -> None:
        return None

    @property
    def stacked_weight_scale(self) -> None:
        return None

    @property
    def stacked_weight_scale_2(self) -> None:
        return None

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        if self._stacked:
            return self.weight.sharding_strategy
        return self._child(self._names[0]).sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        """Sets the stored weight's (and bias's) strategy, or every child's (MAX's rule)."""
        if self._stacked:
            self.weight.sharding_strategy = strategy
            if self._has_bias:
                self.bias.sharding_strategy = strategy
        else:
            for n in self._names:
                self._child(n).sharding_strategy = strategy

    def shard(self, devices: Iterable[DeviceRef]) -> list["StackedLinear"]:
        """One StackedLinear per device (MAX's ``StackedLinear.shard``): the stored weight's
        shards, or each child's shards reassembled; ``out_dims`` divided by the device count."""
        devices = list(devices)
        shard_out_dims = [d // len(devices) for d in self._out_dims]
        shards = []
        if self._stacked:
            weights = self.weight.shard(devices)
            biases = self.bias.shard(devices) if self._has_bias else None
            for i, device in enumerate(devices):
                sl = StackedLinear(
                    self._in_dim, shard_out_dims, self._names, self.weight.dtype, device, stacked=True,
                    has_bias=self._has_bias, clip_weight=self._clip_weight, _is_sharding=True,
                )  # fmt: skip
                sl.weight = weights[i]
                if biases is not None:
                    sl.bias = biases[i]
                shards.append(sl)
            return shards
        children = {n: self._child(n).shard(devices) for n in self._names}
        linear_cls = type(self._child(self._names[0]))
        for i, device in enumerate(devices):
            sl = StackedLinear(
                self._in_dim, shard_out_dims, self._names, self._child(self._names[0]).weight.dtype, device,
                stacked=False, has_bias=self._has_bias, linear_cls=linear_cls, clip_weight=self._clip_weight,
                _is_sharding=True,
            )  # fmt: skip
            for n in self._names:
                setattr(sl, n, children[n][i])
            shards.append(sl)
        return shards

    def __call__(self, x: Any) -> Any:
        """``x [..., in_dim]`` -> ``[..., sum(out_dims)]``."""
        y = linear(x, self.stacked_weight)
        bias = self.stacked_bias
        if bias is not None:
            y = y + bias
        return y
