"""``maxjax.nn.sampling.rejection_sampler`` (MAX 26.7's ``max/nn/sampling/rejection_sampler.py``):
speculative-decoding verification: :func:`greedy_acceptance_sampler`, :class:`RejectionSampler`,
:func:`compute_synthetic_acceptance_base_rate`.

Shapes (MAX's): ``draft_tokens`` [batch, num_steps] (int); flat ``target_logits``
[batch * (num_steps + 1), vocab] for the acceptance samplers (one row per draft position plus
the bonus position), or ragged rows with ``target_logit_offsets`` [batch + 1] for
:class:`RejectionSampler`. Token ids come back as JAX's default integer (int32 unless
``jax_enable_x64``; MAX gives int64).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from maxjax.graph.ops._core import apply
from maxjax.graph.type import DeviceRef
from maxjax.nn.layer.layer import Module

__all__ = ["RejectionSampler", "compute_synthetic_acceptance_base_rate", "greedy_acceptance_sampler"]


def unpack_bitmask(packed: Any, vocab: int) -> Any:
    """Token-kept mask [..., vocab] (bool) of a packed int32 grammar bitmask [..., ceil(vocab/32)]:
    token ``t`` is kept when bit ``t % 32`` (least significant first) of word ``t // 32`` is set,
    as MAX's ``apply_packed_bitmask`` reads it."""
    t = jnp.arange(vocab)
    words = jnp.take(packed.astype(jnp.int32), t // 32, axis=-1)  # [..., vocab]
    return ((words >> (t % 32).astype(jnp.int32)) & 1) != 0


def _first_true(mask: Any) -> Any:
    """Index of the first True in each row of ``mask`` [rows, n]; ``n`` when none: [rows, 1]
    (MAX's ``_find_first_rejected``: a True sentinel appended, then argmax)."""
    with_sentinel = jnp.concatenate([mask, jnp.ones(mask.shape[:-1] + (1,), bool)], axis=-1)
    return jnp.argmax(with_sentinel, axis=-1, keepdims=True)


def _greedy(draft: Any, target: Any, packed: Any = None) -> tuple[Any, Any, Any]:
    batch, steps = draft.shape
    logits = target.reshape(batch, steps + 1, target.shape[-1])  # [batch, steps + 1, vocab]
    if packed is not None:
        logits = jnp.where(unpack_bitmask(packed, logits.shape[-1]), logits, -jnp.inf)
    tokens = jnp.argmax(logits, axis=-1)  # [batch, steps + 1]
    recovered = tokens[:, :steps]
    first = _first_true(draft != recovered.astype(draft.dtype))[:, 0]  # [batch]
    return first, recovered, tokens[:, steps:]


def greedy_acceptance_sampler(draft_tokens: Any, target_logits: Any, token_bitmasks: Any = None) -> tuple[Any, Any, Any]:
    """Target-only acceptance (MAX 26.7's ``greedy_acceptance_sampler``): a draft token is
    accepted when it is the target's argmax at its position.

    Args:
        draft_tokens: [batch, num_steps] integer token ids.
        target_logits: [batch * (num_steps + 1), vocab] float logits.
        token_bitmasks: optional [batch, num_steps + 1, ceil(vocab / 32)] int32 packed grammar
            mask; masked tokens get ``-inf`` before the argmax.

    Returns:
        ``(first_rejected_idx [batch], recovered_tokens [batch, num_steps],
        bonus_tokens [batch, 1])``; ``first_rejected_idx`` is ``num_steps`` when all are accepted.
    """
    if token_bitmasks is None:
        return apply(_greedy, draft_tokens, target_logits, _name="greedy_acceptance_sampler")
    return apply(_greedy, draft_tokens, target_logits, token_bitmasks, _name="greedy_acceptance_sampler")


def _topk_sample(logits: Any, seed: Any, *, top_k: int, top_p: float, temperature: float) -> Any:
    """One token per row of ``logits`` [rows, vocab]: argmax when ``top_k == 1``; otherwise a draw
    from the top-k / top-p (nucleus) filtered softmax at ``temperature`` by the Gumbel-max trick,
    keyed by ``seed`` and the row index. Returns [rows, 1]."""
    if top_k == 1:
        return jnp.argmax(logits, axis=-1, keepdims=True)
    scaled = logits.astype(jnp.float32) / temperature
    k = min(top_k, logits.shape[-1]) if top_k > 0 else logits.shape[-1]
    vals, idx = jax.lax.top_k(scaled, k)  # [rows, k], descending
    probs = jax.nn.softmax(vals, axis=-1)
    keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p  # the smallest prefix reaching top_p
    key = jax.random.key(jnp.reshape(seed, (-1,))[0].astype(jnp.uint32))
    gumbel = jax.vmap(lambda r: jax.random.gumbel(jax.random.fold_in(key, r), (k,)))(jnp.arange(logits.shape[0]))
    choice = jnp.argmax(jnp.where(keep, vals + gumbel, -jnp.inf), axis=-1, keepdims=True)
    return jnp.take_along_axis(idx, choice, axis=-1)


def _rejection(draft: Any, draft_logits: Any, target: Any, offsets: Any, seed: Any, *, eps: float, top_k: int, top_p: float,
               temperature: float) -> tuple[Any, Any]:
    steps = draft.shape[1]
    rows = offsets[:-1, None].astype(jnp.int32) + jnp.arange(steps, dtype=jnp.int32)  # [batch, steps]
    target_at_draft = target[rows, draft.astype(jnp.int32)]  # [batch, steps]
    first = _first_true(draft_logits > target_at_draft + eps)  # [batch, 1]
    rejected_rows = offsets[:-1].astype(jnp.int32) + first[:, 0].astype(jnp.int32)  # [batch]
    token = _topk_sample(target[rejected_rows], seed, top_k=top_k, top_p=top_p, temperature=temperature)
    return first, token


class RejectionSampler(Module):
    """Speculative-decoding verification (MAX 26.7's ``RejectionSampler``): a draft token is
    accepted unless its draft logit exceeds the target logit of that token by more than ``eps``;
    one token is recovered from the target logits at the first rejected position.

    With ``top_k=1`` (the default) the recovered token is the target's argmax, as in MAX. With
    ``top_k > 1`` it is drawn from the top-k / top-p filtered softmax at ``temperature`` with
    ``jax.random`` keyed by ``seed`` (MAX draws with its fused sampling kernel: same
    distribution, other numbers).

    Args:
        device: Where the sampler runs (kept for MAX's signature).
        top_k: Tokens considered when recovering (1: greedy; 0 or less: all).
        top_p: Nucleus probability mass when recovering.
        temperature: Softmax temperature when recovering.
        eps: Tolerance of the acceptance test.
    """

    def __init__(self, device: DeviceRef, top_k: int = 1, top_p: float = 1, temperature: float = 1.0, eps: float = 1e-5) -> None:
        super().__init__()
        self.device = device
        self.top_k = top_k
        self.top_p = top_p
        self.temperature = temperature
        self.eps = eps

    def __call__(self, draft_tokens: Any, draft_logits_for_sampled_tokens: Any, target_logits: Any, target_logit_offsets: Any,
                 seed: Any) -> tuple[Any, Any]:
        """Verifies the drafts.

        Args:
            draft_tokens: [batch, num_steps] integer token ids.
            draft_logits_for_sampled_tokens: [batch, num_steps] float: the draft's logit of each
                drafted token.
            target_logits: [rows, vocab] float; request ``i``'s rows start at
                ``target_logit_offsets[i]`` (one per draft position, then more).
            target_logit_offsets: [batch + 1] integer row offsets.
            seed: integer seed tensor ([1] or scalar); used only when ``top_k != 1``.

        Returns:
            ``(first_rejected_idx [batch, 1], recovered_token [batch, 1])``.
        """
        return apply(_rejection, draft_tokens, draft_logits_for_sampled_tokens, target_logits, target_logit_offsets, seed,
                     _name="rejection_sampler", eps=float(self.eps), top_k=int(self.top_k), top_p=float(self.top_p),
                     temperature=float(self.temperature))


def compute_synthetic_acceptance_base_rate(p_avg: float, n: int, tol: float = 1e-9) -> float:
    """The per-position acceptance rate ``base`` whose mean joint acceptance over ``n`` draft
    positions, ``sum_{i=1..n} base**i / n``, is ``p_avg`` (MAX 26.7's bisection, to ``tol``).

    Returns 0.0 for ``p_avg <= 0`` and 1.0 for ``p_avg >= 1``.
    """
    if p_avg <= 0.0:
        return 0.0
    if p_avg >= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if sum(mid ** (i + 1) for i in range(n)) / n >= p_avg:
            hi = mid
        else:
            lo = mid
    return hi
