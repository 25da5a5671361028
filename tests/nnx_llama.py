"""A Llama decoder written in Flax NNX, the same arithmetic as ``maxjax.models.llama`` (the oracle of
the training tests and the Flax side of ``benchmarks/train.py``).

Attribute names mirror maxjax's (``embed_tokens``, ``layers``, ``self_attn.q_proj``, ``mlp.up_proj``,
``input_layernorm``, ...), so :mod:`maxjax.train.interop` maps the weights by name. With
``scan=True`` the layers are one stacked module built with ``nnx.vmap`` and run with ``nnx.scan``
(``stacked=("layers",)`` in the interop calls), the way Flax users keep compile time flat.

Hugging Face's Llama: pre-norm blocks, RMSNorm (``nnx.RMSNorm``, statistics in float32), rotary
embedding in the ``rotate_half`` layout, grouped-query causal attention, SwiGLU MLP; float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def _linear(i: int, o: int, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(i, o, use_bias=False, rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, c, rngs: nnx.Rngs):
        self.h, self.kv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = _linear(c.hidden_size, self.h * self.d, rngs)
        self.k_proj = _linear(c.hidden_size, self.kv * self.d, rngs)
        self.v_proj = _linear(c.hidden_size, self.kv * self.d, rngs)
        self.o_proj = _linear(self.h * self.d, c.hidden_size, rngs)

    def __call__(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).reshape(b, s, self.h, self.d)
        k = self.k_proj(x).reshape(b, s, self.kv, self.d)
        v = self.v_proj(x).reshape(b, s, self.kv, self.d)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        g = self.h // self.kv
        k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.d)
        causal = jnp.tril(jnp.ones((s, s), bool))
        scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, self.h * self.d)
        return self.o_proj(ctx)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


class MLP(nnx.Module):
    def __init__(self, c, rngs: nnx.Rngs):
        self.gate_proj = _linear(c.hidden_size, c.intermediate_size, rngs)
        self.up_proj = _linear(c.hidden_size, c.intermediate_size, rngs)
        self.down_proj = _linear(c.intermediate_size, c.hidden_size, rngs)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):
    def __init__(self, c, rngs: nnx.Rngs):
        self.self_attn = Attention(c, rngs)
        self.mlp = MLP(c, rngs)
        self.input_layernorm = nnx.RMSNorm(c.hidden_size, epsilon=c.rms_norm_eps, rngs=rngs)
        self.post_attention_layernorm = nnx.RMSNorm(c.hidden_size, epsilon=c.rms_norm_eps, rngs=rngs)

    def __call__(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Llama(nnx.Module):
    """``Llama(config, rngs, scan=False)(tokens [batch, seq]) -> logits [batch, seq, vocab]``."""

    def __init__(self, c, rngs: nnx.Rngs, scan: bool = False):
        self.config = c
        self.scan = scan
        self.embed_tokens = nnx.Embed(c.vocab_size, c.hidden_size, rngs=rngs)
        if scan:

            @nnx.split_rngs(splits=c.num_hidden_layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make(rngs):
                return Block(c, rngs)

            self.layers = make(rngs)
        else:
            self.layers = nnx.List([Block(c, rngs) for _ in range(c.num_hidden_layers)])
        self.norm = nnx.RMSNorm(c.hidden_size, epsilon=c.rms_norm_eps, rngs=rngs)
        self.lm_head = _linear(c.hidden_size, c.vocab_size, rngs)
        d = c.head_dim
        self.inv_freq = nnx.Variable(jnp.asarray(1.0 / (np.float32(c.rope_theta) ** (np.arange(0, d, 2).astype(np.float32) / np.float32(d)))))

    def __call__(self, tokens):
        s = tokens.shape[1]
        angles = jnp.arange(s, dtype=jnp.float32)[:, None] * self.inv_freq[...]
        cos, sin = jnp.cos(angles), jnp.sin(angles)
        h = self.embed_tokens(tokens)
        if self.scan:

            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def body(h, layer):
                return layer(h, cos, sin)

            h = body(h, self.layers)
        else:
            for layer in self.layers:
                h = layer(h, cos, sin)
        return self.lm_head(self.norm(h))
