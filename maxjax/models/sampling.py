"""Next-token sampling: greedy, temperature, top-k and top-p (nucleus), with explicit ``jax.random`` keys.

Top-p follows Holtzman et al., 2019 (arXiv:1904.09751): keep the smallest set of most likely
tokens whose probabilities add up to at least ``top_p``. All functions are pure and jittable;
``temperature``, ``top_k`` and ``top_p`` are traced values, either one for the batch or one per
row (continuous batching: each request its own), so changing them does not recompile.
:func:`check_sampling` validates them on the host, once, before anything runs.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

import jax
import jax.numpy as jnp

__all__ = ["greedy", "sample", "check_sampling"]

_INT32_MAX = 2**31 - 1


def greedy(logits: jax.Array) -> jax.Array:
    """The most likely token of each row: int32 ``[batch]`` from float ``[batch, vocab]``.

    The first index of the maximum, as ``jnp.argmax`` (a NaN counts as the maximum), written as a
    max and a min-index pass (one reduction each).
    """
    top = jnp.max(logits, axis=-1, keepdims=True)
    hit = (logits == top) | jnp.isnan(logits)
    vocab = logits.shape[-1]
    return jnp.min(jnp.where(hit, jnp.arange(vocab, dtype=jnp.int32), vocab), axis=-1)


def _per_row(x: Any, dtype: Any) -> jax.Array:
    """A scalar or ``[batch]`` parameter as ``[batch or 1, 1]`` (broadcasts over the vocabulary)."""
    return jnp.reshape(jnp.asarray(x, dtype), (-1, 1))


def sample(logits: jax.Array, key: jax.Array, temperature: Any, top_k: Any, top_p: Any) -> jax.Array:
    """A token per row drawn from ``softmax(logits / temperature)`` restricted to the ``top_k`` most
    likely tokens (``top_k <= 0``: all) and to the top-``top_p`` nucleus (``top_p >= 1``: all).

    Args:
        logits: float ``[batch, vocab]``.
        key: a ``jax.random`` key, or one key per row ``[batch]`` (each request its own stream).
        temperature: > 0; a scalar or ``[batch]``.
        top_k: int; a scalar or ``[batch]``.
        top_p: in (0, 1]; a scalar or ``[batch]``.

    Returns:
        int32 ``[batch]``.
    """
    logits = logits.astype(jnp.float32) / _per_row(temperature, jnp.float32)
    vocab = logits.shape[-1]
    order = jnp.argsort(-logits, axis=-1)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    rank = jnp.arange(vocab)
    k = _per_row(top_k, jnp.int32)
    keep = jnp.where(k > 0, rank < k, True)
    probs = jax.nn.softmax(jnp.where(keep, sorted_logits, -jnp.inf), axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # probability mass of the more likely tokens
    keep = keep & (before < _per_row(top_p, jnp.float32))
    keep = keep.at[..., 0].set(True)
    masked = jnp.where(keep, sorted_logits, -jnp.inf)
    if key.ndim == 0:
        choice = jax.random.categorical(key, masked, axis=-1)
    else:
        choice = jax.vmap(lambda k, row: jax.random.categorical(k, row))(key, masked)
    return jnp.take_along_axis(order, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)


def check_sampling(
    temperature: Any = 0.0, top_k: Any = 0, top_p: Any = 1.0, seed: Any = 0, *, names: Mapping[str, str] | None = None
) -> None:
    """Checks sampling parameters before anything runs.

    Args:
        temperature: a finite real >= 0 (0: greedy).
        top_k: an int in ``[0, 2**31 - 1]`` (0: off).
        top_p: a finite real in (0, 1].
        seed: an int in ``[-2**63, 2**63 - 1]`` (what ``jax.random.key`` takes).
        names: how the caller spells each parameter in messages (the CLI: ``{"top_k": "--top-k"}``).

    Raises:
        ValueError: the first parameter out of range, named, with its value.
    """
    n = dict(names or {})

    def bad(param: str, rule: str, value: Any) -> ValueError:
        return ValueError(f"{n.get(param, param)} must be {rule}, got {value!r}")

    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) or temperature < 0:
        raise bad("temperature", "a finite number >= 0", temperature)
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or not 0 <= top_k <= _INT32_MAX:
        raise bad("top_k", f"an integer in [0, {_INT32_MAX}]", top_k)
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not math.isfinite(top_p) or not 0 < top_p <= 1:
        raise bad("top_p", "a finite number in (0, 1]", top_p)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not -(2**63) <= seed < 2**63:
        raise bad("seed", "an integer in [-2**63, 2**63 - 1]", seed)
