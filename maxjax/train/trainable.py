"""Trainable weights from any module: GGUF-quantized weights dequantized to float32 or bfloat16.

``jax.grad`` differentiates floating-point leaves only. A model loaded from a GGUF
(``load_model()``) keeps its quantized weights packed (uint8 blocks, see
:mod:`maxjax.graph.quantization`), which no gradient can flow into. Three ways to train it:

- :func:`dequantized`: a copy of the module whose every weight is a plain float array (the
  quantized ones dequantized, bit-identical to ``gguf``'s dequantizer, then cast to ``dtype``).
  Its weights, names and graphs are those of a model loaded from float safetensors: full
  fine-tuning, LoRA on plain ``Linear`` s, export with Hugging Face names.
- :func:`trainable_state`: just the arrays, ``{fqn: float array}``.
- keep the quantized weights frozen and train something else (LoRA adapters on the quantized
  ``Linear`` s, norms): only the trainable weights need gradients (:mod:`maxjax.train.params`).

:func:`grad` and :func:`value_and_grad` are ``jax.grad`` / ``jax.value_and_grad`` that first
check the differentiated argument and refuse a quantized weight with an error that says which
weight it is and what to do, where JAX would say only ``grad requires real- or complex-valued
inputs ... uint8``.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.quantization import QuantizedArray

__all__ = ["dequantized", "trainable_state", "check_differentiable", "grad", "value_and_grad", "FLOAT_DTYPES"]

#: the dtypes a trainable state can be made in
FLOAT_DTYPES = (DType.float32, DType.bfloat16)


def _check_dtype(dtype: Any) -> DType:
    d = dtype if isinstance(dtype, DType) else DType.of(dtype)
    if d not in FLOAT_DTYPES:
        raise ValueError(f"a trainable state is float32 or bfloat16, got {d!r}")
    return d


def _float_value(w: Any, value: Any, dtype: DType) -> jax.Array:
    """``value`` of weight ``w`` as a float array of ``dtype`` (quantized values dequantized)."""
    v = w.as_value(value)
    if isinstance(v, QuantizedArray):
        v = v.dequantize()
    v = jnp.asarray(v)
    if not jnp.issubdtype(v.dtype, jnp.floating):
        raise ValueError(f"weight {w.name!r} is {v.dtype}, not floating point: it cannot be made trainable")
    return v.astype(dtype.to_jax())


def trainable_state(module: Any, dtype: Any = DType.float32) -> dict[str, jax.Array]:
    """Every weight of ``module`` as a float array of ``dtype`` and logical shape, ``{fqn: array}``
    (GGUF-quantized weights dequantized: ``[rows, cols]`` float, not their uint8 blocks).

    Run it with a module whose weights are float (:func:`dequantized`); the original module's
    quantized Weights still expect packed values.

    Raises:
        ValueError: ``dtype`` is not float32/bfloat16; a weight with no value or an integer one.
    """
    d = _check_dtype(dtype)
    values = module.state_dict(auto_initialize=False)
    return {fqn: _float_value(w, values[fqn], d) for fqn, w in module._named_weights()}


def dequantized(module: Any, dtype: Any = DType.float32, activation_dtype: Any = None) -> Any:
    """A copy of ``module`` with every weight a plain float array of ``dtype`` (the module is not changed).

    Quantized weights become float weights of their logical shape (dequantized bit-identically,
    then cast), float weights are cast to ``dtype``; the copy's graphs then run plain float
    matmuls, and ``jax.grad`` differentiates every weight. Modules' ``dtype`` attributes (the
    activation dtype of ``LlamaForCausalLM``) become ``activation_dtype`` (default: ``dtype``, so
    that with ``bfloat16`` weights and activations agree; a bfloat16 ``Trainer`` under the
    policy's ``bfloat16_autocast`` passes float32); logits stay float32.

    The copy shares no Weight with ``module``; tied weights stay tied. About 4 (float32) or 2
    (bfloat16) bytes per parameter.

    Raises:
        ValueError: ``dtype`` is not float32/bfloat16; a weight with no value or an integer one.
    """
    d = _check_dtype(dtype)
    act = d if activation_dtype is None else _check_dtype(activation_dtype)
    values = module.state_dict(auto_initialize=False)
    named = module._named_weights()
    arrays = {fqn: _float_value(w, values[fqn], d) for fqn, w in named}
    memo: dict[int, Any] = {}
    for _, w in named:  # the copy gets fresh values below: do not copy the old ones
        memo[id(w._data)] = None
        memo[id(w._array_cache)] = None
    for _, m in module.named_modules():
        memo[id(m._cache)] = {}
    new = copy.deepcopy(module, memo)
    for fqn, w in new._named_weights():
        a = arrays[fqn]
        w.retype(None, d, a.shape)
    for _, m in new.named_modules():
        if isinstance(getattr(m, "dtype", None), DType) and m.dtype.is_float():
            m.dtype = act
    new.load_state_dict(arrays)
    return new


def check_differentiable(tree: Any, what: str = "the differentiated argument") -> None:
    """Raises unless every leaf of ``tree`` is floating point (what ``jax.grad`` can differentiate).

    Raises:
        TypeError: a quantized weight (one line naming it, its encoding and layout, and how to get
            a trainable one) or another integer leaf (naming its path and dtype).
    """

    def is_leaf(x: Any) -> bool:
        return isinstance(x, QuantizedArray)

    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]:
        where = jax.tree_util.keystr(path) or "<root>"
        if isinstance(leaf, QuantizedArray):
            if all(jnp.issubdtype(getattr(x, "dtype", np.float32), jnp.floating) for x in jax.tree.leaves(leaf)):
                continue  # e.g. DequantizedArray: float leaves differentiate
            raise TypeError(
                f"{what}{where} is a {leaf.encoding.value}-quantized weight ({leaf.layout} layout, integer blocks): "
                "jax.grad cannot differentiate it. Train a float copy (maxjax.train.dequantized(module) or "
                "Program(graph, quantized_layout='dequantized')), or freeze it (maxjax.train.Trainer(..., trainable=patterns))"
            )
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            shown = dtype if dtype is not None else type(leaf).__name__
            raise TypeError(f"{what}{where} is {shown}, not floating point: jax.grad cannot differentiate it")


def _checked(jax_fn: Callable[..., Any], fun: Callable[..., Any], argnums: int | Sequence[int], kwargs: Any) -> Callable[..., Any]:
    transformed = jax_fn(fun, argnums=argnums, **kwargs)
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    def wrapper(*args: Any, **kw: Any) -> Any:
        for i in nums:
            check_differentiable(args[i], f"argument {i}")
        return transformed(*args, **kw)

    return wrapper


def grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, **kwargs: Any) -> Callable[..., Any]:
    """``jax.grad(fun, argnums, **kwargs)`` that first checks the differentiated arguments with
    :func:`check_differentiable` (a quantized weight: a TypeError naming it and the fix)."""
    return _checked(jax.grad, fun, argnums, kwargs)


def value_and_grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, **kwargs: Any) -> Callable[..., Any]:
    """``jax.value_and_grad`` with the check of :func:`grad`."""
    return _checked(jax.value_and_grad, fun, argnums, kwargs)
