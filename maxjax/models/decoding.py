"""Pure functions of ``(state, inputs)`` for a decoder LM: the forward pass, prefill and one decode step.

These are what a JAX user composes: every function is pure (no Python state changes, nothing
captured but the program's structure), so it works inside the user's own ``jax.jit`` (with the KV
cache donated), ``jax.vmap`` over requests and ``shard_map``, and a jitted function of them
compiles once per input shape. Nothing platform-specific is attached to them: compiler options
are applied only where maxjax itself jits (``CausalLM``), while the choices made at trace time
(GEMM operand order, attention layout) follow the program's :class:`~maxjax.backend.BackendPolicy`.

    lm = load_model()
    fns = lm.functions                       # a DecoderFunctions bound to lm's program
    k, v = fns.new_cache(batch=2, cache_len=256)
    decode = jax.jit(fns.decode, donate_argnums=(3, 4))
    logits, k, v = jax.jit(fns.prefill, donate_argnums=(3, 4))(lm.state, tokens, lengths, k, v)
    nxt = greedy(logits)                     # or maxjax.models.sampling.sample(...)
    logits, k, v = decode(lm.state, nxt, lengths, k, v)

Shapes: ``tokens`` int32 ``[batch, seq]`` right-padded, ``lengths`` int32 ``[batch]``; the caches
``k_cache [n_layers, batch, n_kv_heads, head_dim, cache_len]`` and ``v_cache [n_layers, batch,
n_kv_heads, cache_len, head_dim]`` (see :mod:`maxjax.nn.attention`); logits float32 ``[batch,
vocab]``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["DecoderFunctions", "cache_shapes"]


def cache_shapes(config: Any, batch: Any, cache_len: Any, kv_heads: int | None = None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Shapes of a model's caches: keys ``[n_layers, batch, n_kv_heads, head_dim, cache_len]``
    (transposed, see :mod:`maxjax.nn.attention`) and values ``[n_layers, batch, n_kv_heads,
    cache_len, head_dim]``; ``batch`` and ``cache_len`` are ints or symbolic dimension names;
    ``kv_heads`` overrides the config's KV head count (a model on a mesh may pad it)."""
    c = config
    kv = c.num_key_value_heads if kv_heads is None else kv_heads
    keys = (c.num_hidden_layers, batch, kv, c.head_dim, cache_len)
    values = (c.num_hidden_layers, batch, kv, cache_len, c.head_dim)
    return keys, values


class DecoderFunctions:
    """The pure functions of one decoder program (see the module docstring).

    Args:
        program: the model's :class:`~maxjax.engine.Program` (its graph takes ``tokens,
            positions, k_cache, v_cache, last_index``).
        config: the model's config (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``).
        dtype: the cache's ``jnp`` dtype.
        kv_heads: the cache's KV heads when not the config's (a model on a mesh may pad them).
        cache_shardings: ``(keys, values)`` ``jax.sharding.Sharding`` objects :meth:`new_cache` places
            the caches with (None: the default device).
    """

    def __init__(
        self, program: Any, config: Any, dtype: Any = jnp.float32, kv_heads: int | None = None, cache_shardings: Any = None
    ):
        self.program = program
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.kv_heads = kv_heads
        self.cache_shardings = cache_shardings

    def cache_shapes(self, batch: Any, cache_len: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """See :func:`cache_shapes`."""
        return cache_shapes(self.config, batch, cache_len, self.kv_heads)

    def new_cache(self, batch: int, cache_len: int) -> tuple[jax.Array, jax.Array]:
        """Zero key and value caches of :meth:`cache_shapes` (placed with ``cache_shardings``)."""
        keys, values = self.cache_shapes(batch, cache_len)
        ks, vs = self.cache_shardings or (None, None)
        return jnp.zeros(keys, self.dtype, device=ks), jnp.zeros(values, self.dtype, device=vs)

    def forward(
        self, state: Any, tokens: Any, positions: Any, k_cache: Any, v_cache: Any, last_index: Any
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``tokens``/``positions`` int32 ``[batch, seq]`` -> (logits ``[batch, vocab]`` of the
        position ``last_index [batch]`` of each row, updated caches)."""
        logits, k_cache, v_cache = self.program.apply(state, tokens, positions, k_cache, v_cache, last_index)
        return logits, k_cache, v_cache

    def prefill(self, state: Any, tokens: Any, lengths: Any, k_cache: Any, v_cache: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Right-padded prompts ``tokens [batch, seq]`` of ``lengths [batch]`` written into the
        caches from position 0; returns the logits of each prompt's last token and the caches."""
        b, s = tokens.shape
        positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
        last = jnp.asarray(lengths, jnp.int32) - 1
        return self.forward(state, tokens, positions, k_cache, v_cache, last)

    def decode(self, state: Any, tokens: Any, positions: Any, k_cache: Any, v_cache: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One new token per row: ``tokens [batch]`` at ``positions [batch]``; returns its logits
        and the caches."""
        b = tokens.shape[0]
        tokens = jnp.reshape(jnp.asarray(tokens, jnp.int32), (b, 1))
        positions = jnp.reshape(jnp.asarray(positions, jnp.int32), (b, 1))
        return self.forward(state, tokens, positions, k_cache, v_cache, jnp.zeros(b, jnp.int32))
