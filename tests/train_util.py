"""Shared pieces of the training tests: a tiny Llama config and a model initialized from a key."""

from __future__ import annotations

import jax
import numpy as np

from maxjax import nn
from maxjax.models.llama import LlamaConfig, build_llama

TINY = LlamaConfig(
    vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=256,
    tie_word_embeddings=False,
)  # fmt: skip


def tiny_model(seed: int = 0, config: LlamaConfig = TINY):
    """A Llama of ``config`` with weights from ``nn.init`` (PyTorch style), loaded."""
    model = build_llama(config)
    nn.init.initialize(model, jax.random.key(seed))
    return model


def tokens(batch: int, seq: int, seed: int = 0, vocab: int = TINY.vocab_size) -> np.ndarray:
    """Random token ids int32 ``[batch, seq]``."""
    return np.random.default_rng(seed).integers(0, vocab, (batch, seq)).astype(np.int32)
