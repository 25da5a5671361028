"""``ops.group_norm`` (MAX's ``max.graph.ops.group_norm``; Wu & He, 2018, arXiv:1803.08494)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from maxjax.graph.ops._core import apply

__all__ = ["group_norm"]


def _group_norm(x: Any, gamma: Any, beta: Any, *, num_groups: int, epsilon: float) -> Any:
    n, c = x.shape[0], x.shape[1]
    xf = x.astype(jnp.float32).reshape(n, num_groups, -1)  # [N, G, C / G * spatial]
    mean = xf.mean(-1, keepdims=True)
    var = ((xf - mean) ** 2).mean(-1, keepdims=True)
    y = ((xf - mean) / jnp.sqrt(var + epsilon)).reshape(x.shape)
    affine = (c,) + (1,) * (x.ndim - 2)  # per channel, broadcast over the spatial axes
    return (y * gamma.astype(jnp.float32).reshape(affine) + beta.astype(jnp.float32).reshape(affine)).astype(x.dtype)


def group_norm(input: Any, gamma: Any, beta: Any, num_groups: int, epsilon: float) -> Any:  # noqa: A002 - MAX's name
    """Normalizes ``input [N, C, *]`` over each of ``num_groups`` groups of channels (mean and
    biased variance in float32), then ``* gamma[c] + beta[c]``; returns input's dtype.

    Raises:
        ValueError: rank below 2, ``C`` not divisible by ``num_groups``, or ``gamma``/``beta``
            not ``[C]`` (at build time, naming the values).
    """
    if len(input.shape) < 2:
        raise ValueError(f"group_norm: expected an input of rank >= 2 [N, C, *], got shape {list(input.shape)}")
    c = input.shape[1]
    if int(c) % num_groups:
        raise ValueError(f"group_norm: channels ({c}) must be divisible by num_groups ({num_groups})")
    for name, t in (("gamma", gamma), ("beta", beta)):
        if list(t.shape) != [c]:
            raise ValueError(f"group_norm: {name} must have shape [{c}] (the channels), got {list(t.shape)}")
    return apply(_group_norm, input, gamma, beta, _name="group_norm", num_groups=int(num_groups), epsilon=float(epsilon))
