"""LoRA adapters (Hu et al., 2021, arXiv:2106.09685) on chosen ``Linear`` layers, merged back for export.

    paths = apply_lora(model, ["q_proj", "v_proj"], rank=8, alpha=16, key=jax.random.key(0))
    ... train the weights matching "*lora_*" (maxjax.train.Trainer(model, opt, trainable="*lora_*")) ...
    plain = merge_lora(model, weights)        # {fqn: array}: no lora_* keys, W + (alpha/rank) B @ A

A :class:`LoRALinear` keeps its base layer's weights under their own names (``q_proj.weight``,
``q_proj.bias``) and adds ``q_proj.lora_A.weight [rank, in_dim]`` and ``q_proj.lora_B.weight
[out_dim, rank]``, the names and initialization of Hugging Face PEFT (A as PyTorch's ``Linear``,
``U(-1/sqrt(in_dim), 1/sqrt(in_dim))``; B zeros, so an adapted model starts equal to its base).
``y = base(x) + (x @ A.T @ B.T) * alpha / rank``. The base may be GGUF-quantized (QLoRA): it
stays packed and frozen, the adapters are float32. No dropout on the adapters' input.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.quantization import QuantizedArray
from maxjax.nn.layer import LayerList, Module
from maxjax.nn.linear import Linear
from maxjax.train.params import as_patterns, matches

__all__ = ["LoRALinear", "LoRAUp", "apply_lora", "merge_lora", "lora_layers", "lora_rank"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _lora_delta(x: Any, a: Any, b: Any, scaling: float) -> Any:
    """``(x @ a.T) @ b.T * scaling``: x ``[..., in]``, a ``[rank, in]``, b ``[out, rank]``."""
    return ((x @ a.T) @ b.T) * jnp.asarray(scaling, x.dtype)


def _lora_delta_fwd(x: Any, a: Any, b: Any, scaling: float) -> tuple[Any, Any]:
    z = x @ a.T
    return (z @ b.T) * jnp.asarray(scaling, x.dtype), (x, a, b, z)


def _lora_delta_bwd(scaling: float, res: Any, g: Any) -> tuple[Any, Any, Any]:
    # the weight gradients contract over every token: written with the small operand transposed
    # (rank x tokens), so XLA:CPU never re-lays the large [tokens, features] activations
    x, a, b, z = res
    g = g * jnp.asarray(scaling, g.dtype)
    rows = math.prod(x.shape[:-1])
    x2, g2, z2 = x.reshape(rows, x.shape[-1]), g.reshape(rows, g.shape[-1]), z.reshape(rows, z.shape[-1])
    dz2 = g2 @ b  # [tokens, rank]
    db = (z2.T @ g2).T  # [out, rank]
    da = dz2.T @ x2  # [rank, in]
    dx = (dz2 @ a).reshape(x.shape)
    return dx, da, db


_lora_delta.defvjp(_lora_delta_fwd, _lora_delta_bwd)


class LoRALinear(Module):
    """A ``Linear`` plus a trainable low-rank update (see the module docstring).

    Args:
        base: the ``Linear`` to adapt (its Weights are kept, under the same names).
        rank: the adapters' rank ``r`` (>= 1).
        alpha: the scale numerator: the update is multiplied by ``alpha / rank``.
        dtype: the adapters' dtype (default: the base weight's when it is float, else float32).

    Weight keys: the base's (``weight``, ``bias``), ``lora_A.weight [rank, in_dim]``,
    ``lora_B.weight [out_dim, rank]``. Input and output ``[..., in_dim] -> [..., out_dim]``.

    Raises:
        TypeError: ``base`` is not a ``Linear`` (or is already a LoRALinear).
        ValueError: ``rank < 1`` or ``alpha <= 0``.
    """

    def __init__(self, base: Linear, rank: int, alpha: float, dtype: DType | None = None):
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"LoRA adapts a Linear, got {type(base).__name__}")
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {rank!r}")
        if not alpha > 0:
            raise ValueError(f"LoRA alpha must be positive, got {alpha!r}")
        self.rank, self.alpha = rank, float(alpha)
        self.scaling = self.alpha / rank
        self.in_dim, self.out_dim = base.in_dim, base.out_dim
        # the base's Weights become this layer's own, under their local keys ("weight", "bias")
        for attr, key in base._weight_attrs.items():
            w = getattr(base, attr)
            if w is None:
                continue
            w.name = key
            setattr(self, attr, w)
            if key in base._shared_keys:
                self._shared_keys.add(key)
        object.__setattr__(self, "base", base)  # called, not registered: its weights are ours
        if dtype is None:
            wd = base.weight.dtype
            dtype = wd if base.weight.quantization_encoding is None and wd.is_float() else DType.float32
        self.lora_A = Linear(self.in_dim, rank, dtype, base.device)
        self.lora_B = LoRAUp(rank, self.out_dim, dtype, base.device)

    #: compute the update as one op whose backward contracts the small operands' transposes (the
    #: default; about 10% less CPU time per LoRA step of SmolLM2 on XLA:CPU than the two Linears)
    fused: bool = True

    def __call__(self, x: Any) -> Any:
        y = self.base(x)
        a = x if x.dtype == self.lora_A.weight.dtype else x.cast(self.lora_A.weight.dtype)
        if self.fused:
            update = ops.apply(_lora_delta, a, self.lora_A.weight, self.lora_B.weight, _name="lora", scaling=self.scaling)
        else:
            update = self.lora_B(self.lora_A(a)) * self.scaling
        return y + (update if update.dtype == y.dtype else update.cast(y.dtype))

    def __repr__(self) -> str:
        return f"LoRALinear({self.in_dim} -> {self.out_dim}, rank={self.rank}, alpha={self.alpha:g})"


class LoRAUp(Linear):
    """The B factor of a LoRA adapter: a ``Linear`` that :mod:`maxjax.nn.init` initializes to zeros."""


def _init_lora(m: LoRALinear, key: jax.Array, style: str) -> dict[Any, jax.Array]:
    from maxjax.nn.init import _linear

    return _linear(m.base, key, style)  # the base's weights (this layer's own) as a Linear's


def _init_up(m: LoRAUp, key: jax.Array, style: str) -> dict[Any, jax.Array]:
    return {m.weight: jnp.zeros(tuple(int(d) for d in m.weight.shape), m.weight.dtype.to_jax())}


def _register_initializers() -> None:
    from maxjax.nn.init import register_initializer

    register_initializer(LoRALinear, _init_lora)
    register_initializer(LoRAUp, _init_up)


_register_initializers()


def lora_layers(module: Module) -> dict[str, LoRALinear]:
    """The LoRA layers of ``module`` by path (``"layers.0.self_attn.q_proj"``)."""
    return {prefix[:-1]: m for prefix, m in module.named_modules() if isinstance(m, LoRALinear)}


def lora_rank(module: Module) -> int | None:
    """The rank of ``module``'s LoRA layers (None without any).

    Raises:
        ValueError: layers of different ranks.
    """
    ranks = {m.rank for m in lora_layers(module).values()}
    if len(ranks) > 1:
        raise ValueError(f"LoRA layers of several ranks: {sorted(ranks)}")
    return ranks.pop() if ranks else None


def _matches_path(path: str, patterns: list[Any]) -> bool:
    last = path.rsplit(".", 1)[-1]
    plain = [p for p in patterns if isinstance(p, str) and not any(c in p for c in ".*?[")]
    return last in plain or matches(path, patterns)


def _check_stacks(module: Module, chosen: set[str]) -> None:
    """Layers of a LayerList run as one subgraph built from its first layer: the same relative
    paths must be adapted in every one of them."""
    for prefix, m in module.named_modules():
        if not isinstance(m, LayerList) or len(m) < 2:
            continue
        base = prefix
        per_layer = []
        for i in range(len(m)):
            head = f"{base}{i}."
            per_layer.append({p[len(head) :] for p in chosen if p.startswith(head)})
        for i, rel in enumerate(per_layer[1:], start=1):
            if rel != per_layer[0]:
                diff = sorted(rel ^ per_layer[0])[0]
                where, other = (f"{base}0.{diff}", f"{base}{i}.{diff}") if diff in per_layer[0] else (f"{base}{i}.{diff}", f"{base}0.{diff}")
                raise ValueError(
                    f"LoRA targets differ between the layers of {base[:-1] or '<root>'!r}: {where!r} is adapted, {other!r} is not "
                    "(its layers run as one scanned subgraph; adapt the same layers in each, and choose what trains with "
                    "trainable= patterns)"
                )


def apply_lora(
    module: Module,
    targets: Any,
    *,
    rank: int,
    alpha: float,
    key: jax.Array,
    dtype: DType | None = None,
) -> list[str]:
    """Replaces the chosen ``Linear`` layers of ``module`` by :class:`LoRALinear` s, in place.

    Args:
        targets: which layers: glob patterns over module paths (``"layers.*.self_attn.q_proj"``),
            compiled regexes, or plain layer names that match the last path component (PEFT's
            ``target_modules=["q_proj", "v_proj"]``).
        rank, alpha: see :class:`LoRALinear`.
        key: ``jax.random`` key for the A matrices (each from ``fold_in(key, crc32(path))``).
        dtype: the adapters' dtype (default: the module's activation dtype, its ``dtype``
            attribute where it has a float one, as ``LlamaForCausalLM``: a float32 model that
            kept a bfloat16 checkpoint's weights gets float32 adapters; else see
            :class:`LoRALinear`).

    Returns:
        The adapted paths, in module order.

    Raises:
        ValueError: a target that matches no layer; a matched layer that is not a ``Linear``
            (naming it and its class); different targets in the layers of a ``LayerList``; a bad
            rank or alpha. Nothing is changed when this raises.
    """
    from maxjax.nn.init import weight_key

    patterns = as_patterns(targets)
    if not patterns:
        raise ValueError("apply_lora: no targets given")
    modules = [(prefix[:-1], m) for prefix, m in module.named_modules() if prefix]
    chosen: list[tuple[str, Module]] = []
    for p in patterns:
        hit = [(path, m) for path, m in modules if _matches_path(path, [p])]
        if not hit:
            shown = p.pattern if hasattr(p, "pattern") else p
            raise ValueError(f"LoRA target {shown!r} matches no layer of {type(module).__name__}")
    for path, m in modules:
        if _matches_path(path, patterns):
            if isinstance(m, LoRALinear):
                raise ValueError(f"LoRA target {path!r} already has LoRA adapters (rank {m.rank})")
            if not isinstance(m, Linear):
                raise ValueError(f"LoRA target {path!r} is a {type(m).__name__}, not a Linear")
            chosen.append((path, m))
    _check_stacks(module, {p for p, _ in chosen})
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA rank must be a positive integer, got {rank!r}")
    if not alpha > 0:
        raise ValueError(f"LoRA alpha must be positive, got {alpha!r}")
    paths = dict(module.named_modules())
    if dtype is None and isinstance(getattr(module, "dtype", None), DType) and module.dtype.is_float():
        dtype = module.dtype
    for path, lin in chosen:
        parent_path, _, attr = path.rpartition(".")
        parent = paths[parent_path + "." if parent_path else ""]
        lora = LoRALinear(lin, rank, alpha, dtype)
        k = weight_key(key, path)
        bound = 1.0 / (lin.in_dim**0.5)
        a_dtype = lora.lora_A.weight.dtype.to_jax()
        lora.lora_A.load_state_dict({"weight": jax.random.uniform(k, (rank, lin.in_dim), a_dtype, -bound, bound)})
        lora.lora_B.load_state_dict({"weight": jnp.zeros((lin.out_dim, rank), a_dtype)})
        parent.replace_module(attr, lora)
        if isinstance(parent, LayerList) and attr.isdigit():
            parent.layers[int(attr)] = lora
    module.raw_state_dict()  # gives every weight (the adapters' too) its fully-qualified name
    return [p for p, _ in chosen]


def merge_lora(module: Module, weights: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The weights with every adapter merged into its base: ``W + (alpha / rank) * B @ A``.

    Args:
        weights: ``{fqn: array}`` of ``module`` (e.g. a trained state, by registry name);
            default: the values loaded on the module.

    Returns:
        ``{fqn: array}`` without ``lora_A``/``lora_B`` keys, the merged weights float32 (or the
        adapters' float dtype); other entries unchanged. A quantized base is dequantized first.
    """
    layers = lora_layers(module)
    if weights is None:
        weights = module.state_dict(auto_initialize=False)
    out = dict(weights)
    for path, lora in layers.items():
        a = jnp.asarray(out.pop(f"{path}.lora_A.weight"))
        b = jnp.asarray(out.pop(f"{path}.lora_B.weight"))
        key = f"{path}.weight"
        w = lora.weight.as_value(out[key])
        if isinstance(w, QuantizedArray):
            w = w.dequantize()
        w = jnp.asarray(w)
        dtype = w.dtype if jnp.issubdtype(w.dtype, jnp.floating) else a.dtype
        delta = (b.astype(jnp.float32) @ a.astype(jnp.float32)) * lora.scaling
        out[key] = (w.astype(jnp.float32) + delta).astype(dtype)
    return out
