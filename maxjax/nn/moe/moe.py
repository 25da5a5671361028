"""MAX 26.7's Mixture of Experts (``max/nn/moe/moe.py``): ``MoEGate``, ``MoE``, the gated
activations between an expert's gate-up and down projections, with MAX's constructor parameters,
weight names and routing.

MAX's routing (``MoE.__call__``): the gate's ``top_k`` of its raw scores gives each token
``num_experts_per_token`` expert ids and their weights (the scores themselves: MAX's base gate has
no softmax and no normalisation; model gates that want one subclass ``MoEGate``); each selected
expert computes ``down @ act(gate_up @ x)``; the outputs are summed weighted by the router weights
(``mo.moe.finalize``); shared experts (an ``MLP``) add their output.

maxjax computes the experts densely (MAX groups tokens by expert with ``moe_create_indices`` and
``grouped_matmul_ragged``, GPU kernels): every token goes through every expert in one
``einsum`` each for gate-up and down, and a one-hot combine (the router weights scattered into a
``[tokens, num_experts]`` matrix, zero for unselected experts) sums the selected ones. It is one
jnp path with static shapes, fast while ``num_experts / num_experts_per_token`` is small; it does
``num_experts / num_experts_per_token`` times the FLOPs of a ragged dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.ops._core import apply, op_traits
from maxjax.graph.sharding import ShardingStrategy
from maxjax.graph.type import DeviceRef
from maxjax.nn.activation import GatedActivation
from maxjax.nn.layer import LayerList, Module
from maxjax.nn.linear import MLP, Linear

__all__ = [
    "GatedActivation", "MoE", "MoEGate", "make_concatenated_gated_activation_fn", "make_interleaved_gated_activation_fn",
]  # fmt: skip


def make_concatenated_gated_activation_fn(activation_fn: Callable[[Any], Any], limit: float | None = None) -> Callable[[Any, int], Any]:
    """A ``gated_activation_fn`` for ``[gate | up]`` rows (MAX's): ``activation_fn(gate_up[:, :moe_dim])
    * gate_up[:, moe_dim:]``; with ``limit`` the activated gate is clamped above at ``limit`` and up
    to ``[-limit, limit]`` (after the activation, unlike the fused ``silu`` limit).

    Raises:
        AssertionError: ``limit`` is not None and not positive (MAX's assert).
    """
    assert limit is None or limit > 0, f"limit must be None or positive, got {limit}"

    def concatenated(gate_up: Any, moe_dim: int) -> Any:
        gate = activation_fn(gate_up[:, :moe_dim])  # [rows, moe_dim]
        up = gate_up[:, moe_dim:]  # [rows, moe_dim]
        if limit is not None:
            lim = float(limit)
            gate = ops.min(gate, lim)
            up = ops.min(ops.max(up, -lim), lim)
        return gate * up

    return concatenated


def make_interleaved_gated_activation_fn(activation_fn: Callable[[Any], Any]) -> Callable[[Any, int], Any]:
    """A ``gated_activation_fn`` for interleaved ``[g0, u0, g1, u1, ...]`` rows (MAX's):
    ``activation_fn(gate_up[:, 0::2]) * gate_up[:, 1::2]``."""

    def interleaved(gate_up: Any, moe_dim: int) -> Any:
        del moe_dim  # the halves are separated by a stride, not a split point
        return activation_fn(gate_up[:, 0::2]) * gate_up[:, 1::2]

    return interleaved


def _fused_gated_activation(h: Any, *, name: str, alpha: float, limit: float, interleaved: bool) -> Any:
    """MAX's ``fused_silu`` kernel (``max/nn/comm/ep/ep_kernels.py``) on ``h [..., 2 * moe_dim]``
    -> ``[..., moe_dim]``, computed in float32 and returned in ``h``'s dtype."""
    f32 = h.astype(jnp.float32)
    if interleaved:
        gate, up = f32[..., 0::2], f32[..., 1::2]  # [..., moe_dim] each
    else:
        gate, up = jnp.split(f32, 2, axis=-1)  # [..., moe_dim] each
    if limit > 0.0:
        gate = jnp.minimum(gate, limit)
        up = jnp.clip(up, -limit, limit)
    if name == "silu":
        out = jax.nn.silu(gate) * up
    elif name == "swigluoai":
        out = gate * jax.nn.sigmoid(alpha * gate) * (up + 1.0)
    else:  # gelu_tanh
        out = jax.nn.gelu(gate, approximate=True) * up
    return out.astype(h.dtype)


@op_traits(uses_policy=True)
def _all_experts_matmul(x: Any, w: Any, *, policy: Any) -> Any:
    """``x [T, K]`` through every expert's ``w [E, N, K]`` (Linear convention) -> ``[T, E, N]`` in
    ``x``'s dtype (float32 accumulation)."""
    acc = policy.einsum("tk,enk->ten", x, w) if x.dtype == jnp.float32 else jnp.einsum(
        "tk,enk->ten", x, w, preferred_element_type=jnp.float32
    )  # [T, E, N]
    return acc.astype(x.dtype)


@op_traits(uses_policy=True)
def _down_and_combine(act: Any, w: Any, router_idx: Any, router_weight: Any, *, policy: Any) -> Any:
    """The down projections of every expert, weighted by the router and summed (MAX's
    ``grouped_matmul_ragged`` + ``mo.moe.finalize``, densely).

    ``act [T, E, F]``, ``w [E, H, F]``, ``router_idx [T, k]`` (int), ``router_weight [T, k]``
    -> ``[T, H]`` in ``act``'s dtype. Each expert's output is rounded to ``act``'s dtype before the
    weighted sum (as MAX's down matmul writes it), which is accumulated in float32.
    """
    num_experts = w.shape[0]
    if act.dtype == jnp.float32:
        down = policy.einsum("tef,ehf->teh", act, w)  # [T, E, H]
    else:
        down = jnp.einsum("tef,ehf->teh", act, w, preferred_element_type=jnp.float32).astype(act.dtype)
    one_hot = jax.nn.one_hot(router_idx, num_experts, dtype=jnp.float32)  # [T, k, E]
    dense = jnp.einsum("tk,tke->te", router_weight.astype(jnp.float32), one_hot)  # [T, E], zero off the top-k
    out = policy.einsum("te,teh->th", dense, down.astype(jnp.float32))  # [T, H]
    return out.astype(act.dtype)


class MoEGate(Module):
    """The router of an MoE (MAX's ``max.nn.moe.MoEGate``): ``gate_score`` (a ``linear_cls``
    ``[num_experts, hidden_dim]``, key ``gate_score.weight``) scores each token, and
    ``ops.top_k`` keeps the ``num_experts_per_token`` largest scores.

    ``__call__(hidden_state [T, hidden_dim])`` -> ``(topk_indices [T, k] int64, topk_scores [T, k])``
    (the raw scores, largest first: no softmax, as MAX's base gate).

    Args:
        devices: the first one holds the weight.
        hidden_dim, num_experts, num_experts_per_token: sizes.
        dtype: the weight's dtype.
        is_sharding: MAX's flag for building a shard (no weight created).
        linear_cls: the Linear class of ``gate_score``.
    """

    _sharding_strategy: ShardingStrategy | None = None

    def __init__(
        self,
        devices: list[DeviceRef],
        hidden_dim: int,
        num_experts: int,
        num_experts_per_token: int,
        dtype: DType,
        is_sharding: bool = False,
        linear_cls: Callable[..., Linear] = Linear,
    ) -> None:
        super().__init__()
        self.devices = devices
        self.hidden_dim = hidden_dim
        self.num_experts = num_experts
        self.num_experts_per_token = num_experts_per_token
        self.dtype = dtype
        if not is_sharding:
            self.gate_score = linear_cls(in_dim=hidden_dim, out_dim=num_experts, dtype=dtype, device=devices[0])

    def __call__(self, hidden_state: Any) -> tuple[Any, Any]:
        scores = self.gate_score(hidden_state)  # [T, num_experts]
        topk_scores, topk_indices = ops.top_k(scores, k=self.num_experts_per_token, axis=-1)  # [T, k] each
        return topk_indices, topk_scores

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """``replicate`` only (MAX's rule): every device holds the whole gate."""
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        self._set_sharding_strategy(strategy)

    def _set_sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not strategy.is_replicate:
            raise ValueError("Only replicate sharding strategy is supported for MoEGate.")
        self._sharding_strategy = strategy
        self.gate_score.sharding_strategy = ShardingStrategy.replicate(strategy.num_devices)

    def shard(self, devices: Iterable[DeviceRef]) -> Sequence["MoEGate"]:
        """One gate per device, each with the (replicated) ``gate_score`` shard (MAX's).

        Raises:
            ValueError: no sharding strategy was set (MAX's message).
        """
        if not self._sharding_strategy:
            raise ValueError("MoEGate module cannot be sharded because no sharding strategy was provided.")
        devices = list(devices)
        scores = self.gate_score.shard(devices)
        shards = []
        for i, device in enumerate(devices):
            sharded = type(self)(
                devices=[device], hidden_dim=self.hidden_dim, num_experts=self.num_experts,
                num_experts_per_token=self.num_experts_per_token, dtype=self.dtype, is_sharding=True,
            )  # fmt: skip
            sharded.gate_score = scores[i]
            shards.append(sharded)
        return shards


class MoE(Module):
    """Mixture of Experts (MAX's ``max.nn.moe.MoE``): ``x [T, hidden_dim]`` -> ``[T, hidden_dim]``
    in ``x``'s dtype (module docstring: MAX's routing, maxjax's dense computation).

    Weight keys (MAX's): ``gate.gate_score.weight`` (bfloat16 ``[num_logical_experts, hidden_dim]``:
    MAX builds the gate in bfloat16 whatever ``dtype`` is), ``experts.{i}.gate_proj.weight`` /
    ``up_proj.weight`` ``[moe_dim, hidden_dim]`` and ``down_proj.weight`` ``[hidden_dim, moe_dim]``
    (``dtype``), ``shared_experts.{gate,up,down}_proj.weight`` with ``has_shared_experts``, and
    the ``pre_expert_norm.*`` weights of ``pre_expert_norm_cls()``.

    Only the experts' ``gate_proj``, ``up_proj`` and ``down_proj`` weights are read (stacked as
    :attr:`gate_up_proj` ``[E, 2 * moe_dim, hidden_dim]`` and :attr:`down_proj`
    ``[E, hidden_dim, moe_dim]``), as in MAX: ``mlp_cls``'s activation and biases do not take part;
    ``activation`` (a :class:`GatedActivation`) does. The shared experts run as their own MLP.

    Args: MAX's (``max/nn/moe/moe.py``), in MAX's order.

    Raises:
        NotImplementedError: ``ep_size > 1`` or an ``ep_batch_manager`` (MAX's expert parallelism
            dispatches tokens between GPUs with its EP kernels; maxjax has no such
            communication path), a ``quant_config`` or ``shared_experts_quant_config`` (MAX's
            quantized grouped matmuls are GPU kernels).
        AssertionError: ``has_shared_experts`` with ``shared_experts_dim <= 0`` (MAX's assert).
        ValueError: (call) ``x``'s dtype differs from the experts' (expected vs actual).
    """

    _ep_batch_manager: Any = None
    _sharding_strategy: ShardingStrategy | None = None
    shard_devices: list[DeviceRef] = []
    shard_index: int = 0
    layer_idx: int | None = None

    def __init__(
        self,
        devices: list[DeviceRef],
        hidden_dim: int,
        num_experts: int,
        num_experts_per_token: int,
        moe_dim: int,
        num_logical_experts: int | None = None,
        gate_cls: Callable[..., MoEGate] = MoEGate,
        mlp_cls: Callable[..., MLP] = MLP,
        shared_mlp_cls: Callable[..., MLP] | None = None,
        has_shared_experts: bool = False,
        shared_experts_dim: int = 0,
        ep_size: int = 1,
        dtype: DType = DType.bfloat16,
        activation: GatedActivation | None = None,
        interleaved_gate_up: bool = False,
        pre_expert_norm_cls: Callable[[], Module] | None = None,
        ep_batch_manager: Any = None,
        quant_config: Any = None,
        shared_experts_dtype: DType | None = None,
        shared_experts_quant_config: Any = None,
        is_sharding: bool = False,
    ):
        super().__init__()
        if ep_size != 1:
            raise NotImplementedError(
                f"MoE(ep_size={ep_size}): expert parallelism is not supported by maxjax (MAX's EP dispatch/combine are GPU "
                "kernels); use ep_size=1 (MAX's tensor-parallel sharding, or a mesh, splits the experts' weights)"
            )
        if ep_batch_manager is not None:
            raise NotImplementedError(
                "MoE(ep_batch_manager=...): expert parallelism is not supported by maxjax; pass ep_batch_manager=None"
            )
        for arg, value in (("quant_config", quant_config), ("shared_experts_quant_config", shared_experts_quant_config)):
            if value is not None:
                raise NotImplementedError(
                    f"MoE({arg}={value!r}): quantized experts are not supported by maxjax (MAX's are GPU grouped-matmul "
                    "kernels); pass None"
                )
        self.devices = devices
        self.hidden_dim = hidden_dim
        self.num_experts = num_experts
        self.num_experts_per_token = num_experts_per_token
        self.num_logical_experts = num_logical_experts or num_experts
        self.moe_dim = moe_dim
        self.gate_cls = gate_cls
        self.mlp_cls = mlp_cls
        self.shared_mlp_cls = shared_mlp_cls
        self.has_shared_experts = has_shared_experts
        self.shared_experts_dim = shared_experts_dim
        self.ep_size = ep_size
        self.dtype = dtype
        self.activation = activation or GatedActivation()
        self.interleaved_gate_up = interleaved_gate_up
        self.pre_expert_norm_cls = pre_expert_norm_cls
        self.pre_expert_norm = pre_expert_norm_cls() if pre_expert_norm_cls else None
        self.gate = gate_cls(
            devices=devices, hidden_dim=hidden_dim, num_experts=self.num_logical_experts,
            num_experts_per_token=num_experts_per_token, dtype=DType.bfloat16,
        )  # fmt: skip
        self.num_local_experts = num_experts // ep_size
        self.quant_config = quant_config
        self.shared_experts_dtype = shared_experts_dtype if shared_experts_dtype is not None else dtype
        self.shared_experts_quant_config = shared_experts_quant_config
        if has_shared_experts:
            assert shared_experts_dim > 0, "shared_experts_dim must be greater than 0"
            self.shared_experts = (shared_mlp_cls if shared_mlp_cls is not None else mlp_cls)(
                dtype=self.shared_experts_dtype, quantization_encoding=None, hidden_dim=hidden_dim,
                feed_forward_length=shared_experts_dim, devices=devices, quant_config=None,
            )  # fmt: skip
        if not is_sharding:
            self._init_experts()

    def _init_experts(self) -> None:
        self._all_experts = [
            self.mlp_cls(
                dtype=self.dtype, quantization_encoding=None, hidden_dim=self.hidden_dim,
                feed_forward_length=self.moe_dim, devices=self.devices, quant_config=self.quant_config,
            )  # fmt: skip
            for _ in range(self.num_experts)
        ]
        self.experts = LayerList(self._all_experts)

    def eplb_weight_sources(self, phy2log: Sequence[int]) -> dict[str, str]:
        """For an EPLB placement ``phy2log`` (the logical expert of each physical slot): each
        slot's weight key -> the logical expert's weight key it loads, relative to this module
        (MAX's).

        Raises:
            ValueError: not one module per expert, ``phy2log`` of another length, or a logical id
                out of range (MAX's messages).
        """
        if len(self.experts) != self.num_experts:
            raise ValueError(
                f"{type(self).__name__} keeps {len(self.experts)} expert modules for {self.num_experts} experts; EPLB "
                "placement needs one module per physical slot"
            )
        if len(phy2log) != self.num_experts:
            raise ValueError(f"EPLB placement row has {len(phy2log)} slots, expected {self.num_experts}")
        sources: dict[str, str] = {}
        for phy, log in enumerate(phy2log):
            if not 0 <= log < self.num_logical_experts:
                raise ValueError(f"EPLB placement maps slot {phy} to logical expert {log}, outside [0, {self.num_logical_experts})")
            for name in self.experts[phy].raw_state_dict():
                sources[f"experts.{phy}.{name}"] = f"experts.{log}.{name}"
        return sources

    @property
    def ep_batch_manager(self) -> Any:
        """MAX's expert-parallel batch manager; maxjax has none.

        Raises:
            NotImplementedError: always (expert parallelism is not supported).
        """
        raise NotImplementedError("MoE.ep_batch_manager: expert parallelism is not supported by maxjax")

    # -- sharding (MAX's tensor parallelism) --------------------------------------------------
    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """``tensor_parallel`` (MAX's): the gate replicated, each expert's ``moe_dim`` (and the
        shared experts') split over the devices; the per-device outputs add up (``ops.allreduce.sum``).

        Raises:
            NotImplementedError: (setting) ``expert_parallel`` (see the class docstring).
            ValueError: (setting) any other strategy (MAX's message).
        """
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        self._set_sharding_strategy(strategy)

    def _set_sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if strategy.is_expert_parallel:
            raise NotImplementedError(
                "MoE.sharding_strategy = expert_parallel: expert parallelism is not supported by maxjax; use tensor_parallel"
            )
        if not strategy.is_tensor_parallel:
            raise ValueError("Only tensor parallel or expert parallel sharding strategies are supported for MoE")
        self._sharding_strategy = strategy
        self.gate.sharding_strategy = ShardingStrategy.replicate(strategy.num_devices)
        if self.has_shared_experts:
            self.shared_experts.sharding_strategy = strategy
        for expert in self.experts:
            expert.sharding_strategy = strategy

    def shard(self, devices: Iterable[DeviceRef]) -> list["MoE"]:
        """One MoE per device (MAX's tensor-parallel ``shard``): device ``i`` holds the gate, the
        pre-expert norm (replicated), its shard of the shared experts, and reads shard ``i`` of
        every expert's weights (:attr:`gate_up_proj`, :attr:`down_proj`); its output is a partial
        sum to be joined with ``ops.allreduce.sum``.

        Raises:
            ValueError: no sharding strategy was set (MAX's message).
        """
        if not self._sharding_strategy:
            raise ValueError("MoE module cannot be sharded because no sharding strategy was provided.")
        devices = list(devices)
        gate_shards = self.gate.shard(devices)
        shared_shards = self.shared_experts.shard(devices) if self.has_shared_experts else None
        norm_shards = None
        if self.pre_expert_norm is not None:
            self.pre_expert_norm.sharding_strategy = ShardingStrategy.replicate(self._sharding_strategy.num_devices)
            norm_shards = self.pre_expert_norm.shard(devices)
        n = self._sharding_strategy.num_devices
        shards = []
        for i, device in enumerate(devices):
            sharded = type(self)(
                devices=[device], hidden_dim=self.hidden_dim, num_experts=self.num_experts,
                num_experts_per_token=self.num_experts_per_token, moe_dim=self.moe_dim // n,
                num_logical_experts=self.num_logical_experts, gate_cls=self.gate_cls, mlp_cls=self.mlp_cls,
                shared_mlp_cls=self.shared_mlp_cls, has_shared_experts=self.has_shared_experts,
                shared_experts_dim=self.shared_experts_dim // n, ep_size=self.ep_size, dtype=self.dtype,
                activation=self.activation, interleaved_gate_up=self.interleaved_gate_up,
                pre_expert_norm_cls=self.pre_expert_norm_cls, shared_experts_dtype=self.shared_experts_dtype,
                is_sharding=True,
            )  # fmt: skip
            sharded._all_experts = self._all_experts
            sharded.gate = gate_shards[i]
            if shared_shards is not None:
                sharded.shared_experts = shared_shards[i]
            if norm_shards is not None:
                sharded.pre_expert_norm = norm_shards[i]
            sharded.shard_index = i
            sharded.shard_devices = devices
            sharded.experts = LayerList(list(self.experts))
            sharded.layer_idx = self.layer_idx
            shards.append(sharded)
        return shards

    def _expert_weights(self, proj: str) -> list[Any]:
        """Each expert's ``proj`` weight, or on a shard its shard ``shard_index`` (the expert's
        tensor-parallel strategy: gate/up by rows, down by columns)."""
        weights = [getattr(expert, proj).weight for expert in self.experts]
        if not self.shard_devices:
            return weights
        return [w.shard(self.shard_devices)[self.shard_index] for w in weights]

    @property
    def gate_up_proj(self) -> Any:
        """Every expert's gate and up weights stacked (MAX's layout): ``[E, 2 * moe_dim,
        hidden_dim]``, rows ``[gate | up]`` per expert."""
        pairs: list[Any] = []
        for gate, up in zip(self._expert_weights("gate_proj"), self._expert_weights("up_proj"), strict=True):
            pairs.extend((gate, up))
        k_dim = pairs[0].shape[1]
        stacked = ops.stack(pairs, axis=0)  # [2E, moe_dim, K]
        return ops.reshape(stacked, [len(pairs) // 2, -1, k_dim])  # [E, 2 * moe_dim, K]

    @property
    def down_proj(self) -> Any:
        """Every expert's down weight stacked: ``[E, hidden_dim, moe_dim]``."""
        return ops.stack(self._expert_weights("down_proj"), axis=0)

    def __call__(self, x: Any) -> Any:
        """``x [T, hidden_dim]`` -> ``[T, hidden_dim]`` (class docstring)."""
        x_dtype = x.dtype if isinstance(x.dtype, DType) else DType.from_jax(x.dtype)
        if x_dtype != self.dtype:
            raise ValueError(f"MoE: the input's dtype is {x_dtype.name}, expected the experts' dtype {self.dtype.name}")
        router_idx, router_weight = self.gate(x)  # [T, k] each
        if self.pre_expert_norm is not None:
            x = self.pre_expert_norm(x)
        gate_up = self.gate_up_proj  # [E, 2F, H]
        h = apply(_all_experts_matmul, x, gate_up, _name="moe_gate_up")  # [T, E, 2F]
        tokens, num_experts, two_f = h.shape
        fn = self.activation.gated_activation_fn
        if fn is not None:  # MAX's graph-op activation, on rows of [gate | up]
            act = ops.reshape(fn(ops.reshape(h, [-1, two_f]), self.moe_dim), [tokens, num_experts, -1])  # [T, E, F]
        else:
            a = self.activation
            act = apply(
                _fused_gated_activation, h, _name="moe_fused_activation", name=a.fused_activation, alpha=float(a.alpha),
                limit=float(a.limit), interleaved=self.interleaved_gate_up,
            )  # fmt: skip  # [T, E, F]
        out = apply(_down_and_combine, act, self.down_proj, router_idx, router_weight, _name="moe_down_combine")  # [T, H]
        if self.has_shared_experts:
            out = out + self.shared_experts(x)
        return out
