"""Flax NNX states to maxjax names and back.

A Flax NNX model whose attributes mirror a maxjax module's (``self.layers``, ``self.mlp.up_proj``,
...) holds the same weights under other leaf names and layouts. The correspondence is by layer
class of the maxjax module:

=================  ==========================  ===================================================
maxjax layer       maxjax weight               NNX leaf
=================  ==========================  ===================================================
``Linear``         ``weight [out, in]``        ``nnx.Linear`` ``kernel [in, out]`` (transposed)
                   ``bias [out]``              ``bias``
``Embedding``      ``weight [vocab, dim]``     ``nnx.Embed`` ``embedding``
``RMSNorm``        ``weight [dim]``            ``nnx.RMSNorm`` ``scale``
``LayerNorm``      ``weight``, ``bias``        ``nnx.LayerNorm`` ``scale``, ``bias``
=================  ==========================  ===================================================

The NNX side is the nested "pure dict" of ``nnx.state(model, nnx.Param).to_pure_dict()`` (list
items keyed by int); write one back with ``nnx.replace_by_pure_dict(state, d)`` then
``nnx.update(model, state)``. A layer list the NNX model keeps *stacked* (built with
``nnx.vmap`` and run with ``nnx.scan``: one module whose leaves have a leading layer axis) is named
in ``stacked``: maxjax's ``layers.3.mlp.up_proj.weight`` is then slice 3 of NNX's
``layers/mlp/up_proj/kernel``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import jax.numpy as jnp

from maxjax.nn.embedding import Embedding
from maxjax.nn.layer import LayerList, Module
from maxjax.nn.linear import Linear
from maxjax.nn.norm import LayerNorm, RMSNorm

__all__ = ["to_maxjax", "from_maxjax", "nnx_leaf_map"]


def _leaf_names(m: Module) -> dict[str, tuple[str, bool]]:
    """maxjax local weight key -> (NNX leaf name, transposed) for layer ``m``."""
    key_of = dict(m._weight_attrs)  # attribute -> the key the weight is registered under
    if isinstance(m, Linear):
        leaves = {"weight": ("kernel", True), "bias": ("bias", False)}
    elif isinstance(m, Embedding):
        leaves = {"weight": ("embedding", False)}
    elif isinstance(m, (RMSNorm, LayerNorm)):
        leaves = {"weight": ("scale", False), "bias": ("bias", False)}
    else:
        raise ValueError(f"no NNX counterpart for the weights of {type(m).__name__}")
    return {key_of[attr]: leaf for attr, leaf in leaves.items() if attr in key_of}


def nnx_leaf_map(module: Module, stacked: Iterable[str] = ()) -> dict[str, tuple[tuple[Any, ...], int | None, bool]]:
    """``{maxjax fqn: (NNX path, layer index in a stacked list or None, transposed)}`` for every
    weight of ``module``.

    Raises:
        ValueError: a weight of a layer class with no NNX counterpart; a name in ``stacked`` that is
            not a ``LayerList`` of ``module``.
    """
    stacked = set(stacked)
    lists = {prefix[:-1] for prefix, m in module.named_modules() if isinstance(m, LayerList)}
    for s in stacked:
        if s not in lists:
            raise ValueError(f"stacked list {s!r} is not a LayerList of {type(module).__name__} (those: {sorted(lists)})")
    out = {}
    for prefix, m in module.named_modules():
        own = [k for k in m.layer_weights if k not in m._shared_keys]
        if not own:
            continue
        names = _leaf_names(m)
        parts = prefix[:-1].split(".") if prefix else []
        index = None
        for s in stacked:
            head = s.split(".")
            if parts[: len(head)] == head and len(parts) > len(head) and parts[len(head)].isdigit():
                index = int(parts[len(head)])
                parts = head + parts[len(head) + 1 :]
                break
        path = tuple(int(p) if p.isdigit() else p for p in parts)
        for k in own:
            leaf, transposed = names[k]
            out[prefix + k] = (path + (leaf,), index, transposed)
    return out


def _get(tree: Mapping[Any, Any], path: tuple[Any, ...], fqn: str) -> Any:
    node: Any = tree
    for i, p in enumerate(path):
        if not isinstance(node, Mapping) or p not in node:
            where = "/".join(str(x) for x in path[: i + 1])
            raise KeyError(f"the NNX state has no {where!r} (for maxjax weight {fqn!r})")
        node = node[p]
    return node


def to_maxjax(nnx_state: Mapping[Any, Any], module: Module, *, stacked: Iterable[str] = ()) -> dict[str, Any]:
    """An NNX model's parameters (a pure dict, see the module docstring) as ``{fqn: array}`` of
    ``module`` (``module.load_state_dict`` or ``nn.functional_call`` take it).

    Raises:
        KeyError: the NNX state lacks a leaf a weight needs (naming both).
        ValueError: see :func:`nnx_leaf_map`.
    """
    out = {}
    for fqn, (path, index, transposed) in nnx_leaf_map(module, stacked).items():
        v = jnp.asarray(_get(nnx_state, path, fqn))
        if index is not None:
            v = v[index]
        out[fqn] = jnp.swapaxes(v, -1, -2) if transposed else v
    return out


def from_maxjax(state: Mapping[str, Any], module: Module, *, stacked: Iterable[str] = ()) -> dict[Any, Any]:
    """``{fqn: array}`` of ``module`` as an NNX pure dict (the inverse of :func:`to_maxjax`).

    Raises:
        KeyError: ``state`` lacks a weight of ``module``.
        ValueError: see :func:`nnx_leaf_map`.
    """
    out: dict[Any, Any] = {}
    layers: dict[tuple[Any, ...], dict[int, Any]] = {}
    for fqn, (path, index, transposed) in nnx_leaf_map(module, stacked).items():
        if fqn not in state:
            raise KeyError(f"the state has no weight {fqn!r}")
        v = jnp.asarray(state[fqn])
        v = jnp.swapaxes(v, -1, -2) if transposed else v
        if index is not None:
            layers.setdefault(path, {})[index] = v
            continue
        _put(out, path, v)
    for path, by_index in layers.items():
        _put(out, path, jnp.stack([by_index[i] for i in sorted(by_index)]))
    return out


def _put(tree: dict[Any, Any], path: tuple[Any, ...], value: Any) -> None:
    node = tree
    for p in path[:-1]:
        node = node.setdefault(p, {})
    node[path[-1]] = value
