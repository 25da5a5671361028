"""``maxjax.nn.sampling.min_p``: :class:`MinPSampler` (MAX 26.7's ``max/nn/sampling/min_p.py``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph.ops._core import apply
from maxjax.graph.type import Shape
from maxjax.nn.layer.layer import Module

__all__ = ["MinPSampler"]


def _min_p(logits: Any, min_p: Any, seed: Any, *, temperature: float, shape: tuple, dtype: Any) -> Any:
    scaled = logits.astype(jnp.float32) / temperature  # [batch, vocab]
    probs = jax.nn.softmax(scaled, axis=-1)
    keep = probs >= min_p.astype(jnp.float32)[:, None] * jnp.max(probs, axis=-1, keepdims=True)
    key = jax.random.key(jnp.reshape(seed, (-1,))[0].astype(jnp.uint32))
    gumbel = jax.random.gumbel(key, scaled.shape)
    tokens = jnp.argmax(jnp.where(keep, scaled + gumbel, -jnp.inf), axis=-1)  # [batch]
    return tokens.reshape(shape).astype(dtype)


class MinPSampler(Module):
    """Min-p sampling (MAX 26.7's ``MinPSampler``; Nguyen et al. 2024, "Min P Sampling").

    A token is kept when its probability (softmax of ``logits / temperature``) is at least
    ``min_p`` times the row's largest; one kept token is drawn per row.

    MAX's kernel draws from its own generator (no seed input). maxjax draws with ``jax.random``
    keyed by ``seed`` (keyword, default 0): ``min_p=1`` gives the most likely token, other values
    draw from the min-p distribution.

    Measured on MAX 26.7 (CPU): ``dtype`` is also the dtype of the temperature constant, so an
    integer ``dtype`` fails to compile ("cannot be converted from 'Int64' to 'Float32'"), and with
    ``DType.float32`` and ``min_p=1.0`` it returned token 0.0 for every row (reference
    ``minp_tokens``) where the most likely tokens were others. maxjax returns the min-p token
    ids in ``dtype`` (an integer dtype works).

    Args:
        dtype: dtype of the sampled tokens (MAX's output type, e.g. ``DType.int64``).
        shape: shape of the sampled tokens (e.g. ``["batch", 1]``).
        temperature: softmax temperature (> 0).
    """

    def __init__(self, dtype: DType, shape: Any, temperature: float = 1) -> None:
        super().__init__()
        self.dtype = dtype
        self.shape = Shape(shape)
        self.temperature = temperature

    def __call__(self, input: Any, min_p: Any = 0.0, *, seed: Any = 0) -> Any:  # noqa: A002 - MAX's name
        """Samples one token per row of ``input`` [batch, vocab] (float logits).

        Args:
            input: logits [batch, vocab].
            min_p: a float in [0, 1] or a [batch] float tensor.
            seed: integer (or integer tensor) keying the draw (maxjax only).

        Returns:
            tokens of ``self.dtype`` and ``self.shape``.

        Raises:
            ValueError: a float ``min_p`` outside [0, 1] (MAX's message).
        """
        if isinstance(min_p, (float, int)):
            if float(min_p) < 0.0 or float(min_p) > 1.0:
                raise ValueError(f"expected min_p to be in [0, 1], got {min_p}")
            min_p = jnp.full((1,), float(min_p), jnp.float32)  # [1]: broadcast over the rows
        elif min_p.shape[0] != input.shape[0]:
            raise ValueError(f"top_p tensor shape {min_p.shape} does not match batch_size {input.shape[0]}")
        if isinstance(seed, int):
            seed = jnp.asarray([seed], jnp.uint32)
        shape = tuple(-1 if not (isinstance(d, int) or hasattr(d, "__index__")) else int(d) for d in self.shape)
        return apply(_min_p, input, min_p, seed, _name="min_p_sampler", temperature=float(self.temperature), shape=shape,
                     dtype=self.dtype.to_jax())
