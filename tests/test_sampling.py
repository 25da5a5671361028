"""``maxjax.models.sampling``: greedy agrees with ``jnp.argmax`` (first maximum, NaN as maximum)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.models.sampling import greedy, sample


def test_greedy_matches_argmax_with_ties_and_nan():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 1000)).astype(np.float32)
    logits[1, [17, 400, 999]] = 9.0  # a three-way tie: the first index wins
    logits[2, [5, 6]] = np.nan  # NaN counts as the maximum, first NaN wins
    logits[3, :] = -np.inf
    logits[4, 999] = np.inf
    logits[5, 0] = 50.0
    expect = np.asarray(jnp.argmax(jnp.asarray(logits), axis=-1))
    got = np.asarray(jax.jit(greedy)(jnp.asarray(logits)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expect)
    assert got.tolist()[:3] == [int(expect[0]), 17, 5]


def test_sample_with_top_k_1_is_greedy():
    logits = jnp.asarray(np.random.default_rng(1).standard_normal((4, 300)).astype(np.float32))
    got = sample(logits, jax.random.key(0), jnp.float32(2.0), jnp.int32(1), jnp.float32(1.0))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(greedy(logits)))
