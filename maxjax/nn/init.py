"""Initializers: a module's weights from a ``jax.random`` key, per layer as PyTorch or Flax does.

    model = build_llama(config)                       # unloaded weights
    state = nn.init.initialize(model, jax.random.key(0))           # PyTorch's defaults, loaded
    state = nn.init.initialize(model, jax.random.key(0), style="flax")

Each layer class has one initializer (:func:`register_initializer` adds or replaces one); a layer's
key is ``jax.random.fold_in(key, crc32(fqn of its first weight))`` (:func:`weight_key`), so its
values depend only on the key and its names, never on the order modules are visited. The rules (``fan_in`` = a Linear's ``in_dim``):

=================  ==============================================  ==================================================
layer              ``style="pytorch"`` (``torch.nn`` defaults)     ``style="flax"`` (``flax.nnx`` defaults)
=================  ==============================================  ==================================================
``Linear``         weight and bias ``U(-1/sqrt(fan_in), +..)``     weight ``lecun_normal`` (truncated normal, variance
                   (``kaiming_uniform_(a=sqrt(5))``)               ``1/fan_in``), bias zeros
``Embedding``      ``N(0, 1)``                                     ``variance_scaling(1, "fan_in", "normal",
                                                                   out_axis=0)`` (``nnx.Embed``'s)
``RMSNorm``        weight ones                                     weight ones
``LayerNorm``      weight ones, bias zeros                         weight ones, bias zeros
=================  ==============================================  ==================================================

Values have each weight's dtype. Layers without weights need no initializer; a weight of a class
with none is an error (naming it), as is a quantized weight (initialize float weights, then
quantize).
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from maxjax.nn.embedding import Embedding
from maxjax.nn.layer import Module
from maxjax.nn.linear import Linear
from maxjax.nn.norm import LayerNorm, RMSNorm

__all__ = ["initialize", "init_state", "register_initializer", "STYLES", "weight_key"]

#: the initialization styles every built-in initializer knows
STYLES = ("pytorch", "flax")

#: ``fn(module, key, style) -> {Weight: array}`` for the module's own weights
Initializer = Callable[[Any, jax.Array, str], Mapping[Any, jax.Array]]

_INITIALIZERS: dict[type, Initializer] = {}


def register_initializer(cls: type, fn: Initializer) -> None:
    """Sets the initializer of layer class ``cls`` (and of its subclasses without one of their own).

    ``fn(module, key, style)`` returns ``{Weight: array}`` for the module's own weights (not its
    children's), each array of the weight's shape and dtype; ``key`` is the module's key (split
    it as needed).
    """
    _INITIALIZERS[cls] = fn


def _initializer_for(cls: type) -> Initializer | None:
    for base in cls.__mro__:
        fn = _INITIALIZERS.get(base)
        if fn is not None:
            return fn
    return None


def weight_key(key: jax.Array, fqn: str) -> jax.Array:
    """The key of weight ``fqn``: ``fold_in(key, crc32(fqn))`` (independent of visiting order)."""
    return jax.random.fold_in(key, zlib.crc32(fqn.encode()) & 0x7FFFFFFF)


def _shape(w: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in w.shape)


def _uniform(key: jax.Array, w: Any, bound: float) -> jax.Array:
    return jax.random.uniform(key, _shape(w), w.dtype.to_jax(), -bound, bound)


def _linear(m: Linear, key: jax.Array, style: str) -> dict[Any, jax.Array]:
    fan_in = int(m.weight.shape[1])
    kw, kb = jax.random.split(key)
    out: dict[Any, jax.Array] = {}
    if style == "pytorch":
        bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
        out[m.weight] = _uniform(kw, m.weight, bound)
        if m.bias is not None:
            out[m.bias] = _uniform(kb, m.bias, bound)
    else:  # flax: lecun_normal on the [in, out] kernel, which is weight.T
        out_dim, in_dim = _shape(m.weight)
        out[m.weight] = jax.nn.initializers.lecun_normal()(kw, (in_dim, out_dim), m.weight.dtype.to_jax()).T
        if m.bias is not None:
            out[m.bias] = jnp.zeros(_shape(m.bias), m.bias.dtype.to_jax())
    return out


def _embedding(m: Embedding, key: jax.Array, style: str) -> dict[Any, jax.Array]:
    dtype = m.weight.dtype.to_jax()
    if style == "pytorch":
        return {m.weight: jax.random.normal(key, _shape(m.weight), dtype)}
    init = jax.nn.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)
    return {m.weight: init(key, _shape(m.weight), dtype)}


def _norm(m: Any, key: jax.Array, style: str) -> dict[Any, jax.Array]:
    out = {m.weight: jnp.ones(_shape(m.weight), m.weight.dtype.to_jax())}
    if getattr(m, "bias", None) is not None:
        out[m.bias] = jnp.zeros(_shape(m.bias), m.bias.dtype.to_jax())
    return out


register_initializer(Linear, _linear)
register_initializer(Embedding, _embedding)
register_initializer(RMSNorm, _norm)
register_initializer(LayerNorm, _norm)


def init_state(module: Module, key: jax.Array, *, style: str = "pytorch") -> dict[str, jax.Array]:
    """Initial values of every weight of ``module``, ``{fqn: jax.Array}``; the module is not changed.

    Pure in ``key`` (usable under ``jax.jit`` and ``jax.eval_shape``).

    Args:
        key: a ``jax.random`` key.
        style: ``"pytorch"`` or ``"flax"`` (see the module docstring).

    Raises:
        ValueError: an unknown ``style``; a weight that is quantized, not floating point, or owned
            by a layer class with no initializer (naming the weight and the class).
    """
    if style not in STYLES:
        raise ValueError(f"init style must be one of {', '.join(map(repr, STYLES))}, got {style!r}")
    fqn_of = {id(w): fqn for fqn, w in module._named_weights()}
    out: dict[str, jax.Array] = {}
    for prefix, m in module.named_modules():
        own = [w for k, w in m.layer_weights.items() if k not in m._shared_keys]
        if not own:
            continue
        for w in own:
            if w.quantization_encoding is not None or not w.dtype.is_float():
                raise ValueError(
                    f"cannot initialize weight {fqn_of[id(w)]!r} ({w.dtype.name}"
                    f"{'' if w.quantization_encoding is None else ', ' + str(w.quantization_encoding.value)}): "
                    "initializers make floating-point weights"
                )
        fn = _initializer_for(type(m))
        if fn is None:
            names = ", ".join(repr(fqn_of[id(w)]) for w in own)
            raise ValueError(
                f"no initializer for {type(m).__name__} (weights {names}): add one with "
                f"maxjax.nn.init.register_initializer({type(m).__name__}, fn)"
            )
        first = fqn_of[id(own[0])]
        values = fn(m, weight_key(key, first), style)
        for w in own:
            if w not in values:
                raise ValueError(f"the initializer of {type(m).__name__} gave no value for weight {fqn_of[id(w)]!r}")
            out[fqn_of[id(w)]] = values[w]
    return out


def initialize(module: Module, key: jax.Array, *, style: str = "pytorch") -> dict[str, jax.Array]:
    """Initializes every weight of ``module`` from ``key`` and loads the values into it.

    Returns the state ``{fqn: jax.Array}`` (the values loaded; also ``maxjax.nn.state(module)``).
    See :func:`init_state` for ``style`` and errors; on an error nothing is loaded.
    """
    state = init_state(module, key, style=style)
    module.load_state_dict(state)
    return state
