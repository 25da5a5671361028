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

from typing import Any, Literal

import jax
import jax.numpy as jnp

from maxjax.graph.ops._core import apply
from maxjax.graph.type import DeviceRef
from maxjax.nn.layer.layer import Module
from maxjax.nn.sampling.penalties import LogitPenalties, unpack_bitmask

__all__ = [
    "AcceptanceSampler",
    "RejectionSampler",
    "RejectionSamplerWithResiduals",
    "compute_synthetic_acceptance_base_rate",
    "greedy_acceptance_sampler",
    "synthetic_acceptance_sampler",
]


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


def _uniform(seed: Any, shape: tuple, domain: int) -> Any:
    """Uniform [0, 1) float32 draws of ``shape`` keyed by ``seed``'s first value and ``domain``."""
    key = jax.random.fold_in(jax.random.key(jnp.reshape(seed, (-1,))[0].astype(jnp.uint32)), domain)
    return jax.random.uniform(key, shape, jnp.float32)


def _residuals(draft: Any, target: Any, offsets: Any, all_draft: Any, seed: Any, rejection_rand: Any, residual_rand: Any, *,
               eps: float, top_k: int, temperature: float) -> tuple[Any, Any, Any]:
    batch, steps = draft.shape
    target_probs = jax.nn.softmax(target.reshape(batch, steps + 1, target.shape[-1])[:, :steps], axis=-1)  # [b, s, V]
    draft_probs = jax.nn.softmax(jnp.transpose(all_draft, (1, 0, 2)), axis=-1)  # [b, s, V]
    tok = draft.astype(jnp.int32)[..., None]
    ratio = jnp.take_along_axis(target_probs, tok, -1)[..., 0] / (jnp.take_along_axis(draft_probs, tok, -1)[..., 0] + eps)
    if rejection_rand is None:
        rejection_rand = _uniform(seed, ratio.shape, 1)
    first = _first_true(rejection_rand >= jnp.minimum(ratio, 1.0))[:, 0]  # [batch]
    diff = jnp.maximum(target_probs - draft_probs, jnp.finfo(jnp.float32).tiny)
    recovered_probs = diff / jnp.sum(diff, axis=-1, keepdims=True)  # [b, s, V]: max(p - q, 0) renormalized
    if residual_rand is None:
        residual_rand = _uniform(seed, recovered_probs.shape, 2) * (1 - 2 * jnp.finfo(jnp.float32).eps) + jnp.finfo(jnp.float32).eps
    q = -jnp.log(jnp.maximum(residual_rand, jnp.finfo(jnp.float32).eps))  # exponential noise: argmax(p / q) ~ p
    recovered = jnp.argmax(recovered_probs / q, axis=-1)  # [b, s]
    bonus_rows = offsets[1:].astype(jnp.int32) - 1
    bonus = _topk_sample(target[bonus_rows], seed, top_k=top_k, top_p=1.0, temperature=temperature)
    return first, recovered, bonus


def _residuals_op(d: Any, t: Any, off: Any, ad: Any, sd: Any, *rand: Any, has_rej: bool, has_res: bool, **kw: Any) -> Any:
    """:func:`_residuals` with the optional uniforms passed positionally (those given)."""
    it = iter(rand)
    return _residuals(d, t, off, ad, sd, next(it) if has_rej else None, next(it) if has_res else None, **kw)


class RejectionSamplerWithResiduals(Module):
    """Speculative-decoding rejection sampling with residual recovery (MAX 26.7's
    ``RejectionSamplerWithResiduals``; Leviathan et al. 2023, Chen et al. 2023).

    Draft token ``x`` at a position is accepted when ``u < min(1, p(x) / (q(x) + eps))``
    (``p``: target softmax, ``q``: draft softmax, ``u`` uniform); at a rejection the token is
    drawn from ``max(p - q, 0)`` renormalized (``argmax(probs / -log(v))``, ``v`` uniform). The
    bonus token comes from the target's last row of each request (argmax at ``top_k=1``).

    ``rejection_rand`` / ``residual_rand`` fix the uniforms (MAX's debug inputs): the result is
    then MAX's exactly. Without them maxjax draws them with ``jax.random`` keyed by ``seed``
    (MAX draws from its graph-level generator: same distribution, other numbers).

    Args:
        device: Where the sampler runs (kept for MAX's signature).
        top_k: Tokens considered for the bonus token (1: greedy).
        temperature: Softmax temperature of the bonus token.
        eps: Added to the draft probability in the acceptance ratio.
        debug: Kept for MAX's signature (MAX 26.7 does not read it).
    """

    def __init__(self, device: DeviceRef, top_k: int = 1, temperature: float = 1.0, eps: float = 1e-10, debug: bool = False) -> None:
        super().__init__()
        self.device = device
        self.top_k = top_k
        self.temperature = temperature
        self.eps = eps
        self.debug = debug

    def __call__(self, draft_tokens: Any, draft_logits_for_sampled_tokens: Any, target_logits: Any, target_logit_offsets: Any,
                 all_draft_logits: Any, seed: Any, rejection_rand: Any = None, residual_rand: Any = None) -> tuple[Any, Any, Any]:
        """Returns ``(first_rejected_idx [batch], recovered_tokens [batch, num_steps], bonus_tokens [batch, 1])``.

        Args:
            draft_tokens: [batch, num_steps] integer ids.
            draft_logits_for_sampled_tokens: [batch, num_steps] (not read, as in MAX 26.7).
            target_logits: [batch * (num_steps + 1), vocab] float.
            target_logit_offsets: [batch + 1] integer row offsets (bonus row: ``offsets[i+1] - 1``).
            all_draft_logits: [num_steps, batch, vocab] float.
            seed: integer seed tensor keying the draws maxjax makes.
            rejection_rand: optional [batch, num_steps] uniforms of the acceptance test.
            residual_rand: optional [batch, num_steps, vocab] uniforms of the residual draw.
        """
        tensors = [draft_tokens, target_logits, target_logit_offsets, all_draft_logits, seed]
        extra = [r for r in (rejection_rand, residual_rand) if r is not None]
        return apply(_residuals_op, *tensors, *extra, _name="rejection_sampler_with_residuals", has_rej=rejection_rand is not None,
                     has_res=residual_rand is not None, eps=float(self.eps), top_k=int(self.top_k),
                     temperature=float(self.temperature))


def _synthetic(draft: Any, target: Any, seed: Any, *, rate: float) -> tuple[Any, Any, Any]:
    _, recovered, bonus = _greedy(draft, target)
    rejected = _uniform(seed, draft.shape, 3) >= rate  # [batch, steps]
    first = _first_true(rejected)[:, 0]
    return first, jnp.where(rejected, recovered, draft.astype(recovered.dtype)), bonus


def synthetic_acceptance_sampler(draft_tokens: Any, target_logits: Any, base_acceptance_rate: float, num_draft_steps: int, seed: Any,
                                 *, temperature: Any = None, top_k: Any = None, max_k: Any = None, top_p: Any = None,
                                 min_top_p: Any = None) -> tuple[Any, Any, Any]:
    """Benchmarking acceptance (MAX 26.7's ``synthetic_acceptance_sampler``): each draft position
    is accepted with probability ``base_acceptance_rate`` (independent uniforms keyed by
    ``seed``), all positions after the first rejection are rejected; accepted positions keep the
    draft token, the others and the bonus get the target argmax.

    Rates 0 and 1 are deterministic and give MAX's outputs; other rates draw from the same
    distribution as MAX with other numbers (``jax.random`` keyed by ``seed``).

    Returns:
        ``(first_rejected_idx [batch], recovered_tokens [batch, num_steps], bonus_tokens [batch, 1])``.

    Raises:
        NotImplementedError: sampling parameters given (MAX then recovers with its stochastic
            sampler, which maxjax does not have).
    """
    given = [n for n, v in (("temperature", temperature), ("top_k", top_k), ("max_k", max_k), ("top_p", top_p),
                            ("min_top_p", min_top_p)) if v is not None]
    if given:
        raise NotImplementedError(
            f"synthetic_acceptance_sampler: {', '.join(given)} given; maxjax recovers with the target argmax only "
            "(MAX's stochastic recovery is not built): pass no sampling parameters"
        )
    return apply(_synthetic, draft_tokens, target_logits, seed, _name="synthetic_acceptance_sampler",
                 rate=float(base_acceptance_rate))


class AcceptanceSampler:
    """Chooses the acceptance rule of speculative decoding (MAX 26.7's ``AcceptanceSampler``):
    synthetic when ``synthetic_acceptance_rate`` is set (the per-position rate from
    :func:`compute_synthetic_acceptance_base_rate`), otherwise greedy.

    Raises:
        NotImplementedError: ``use_stochastic=True``, ``draft_proposal="sampled"`` or relaxed
            acceptance (MAX's fused stochastic sampling kernels are not built).
        ValueError: MAX's argument checks (``vocab_size`` with ``"sampled"``; relaxed with it).
    """

    def __init__(self, synthetic_acceptance_rate: float | None = None, num_draft_steps: int = 1, use_stochastic: bool = False,
                 draft_proposal: Literal["argmax", "sampled"] = "argmax", vocab_size: int | None = None,
                 relaxed_topk: int | None = None, relaxed_delta: float | None = None) -> None:
        if draft_proposal == "sampled" and vocab_size is None:
            raise ValueError("vocab_size is required when draft_proposal='sampled'")
        if draft_proposal == "sampled" and (relaxed_topk is not None or relaxed_delta is not None):
            raise ValueError(
                "relaxed acceptance requires draft_proposal='argmax': it accepts a draft token whenever the target ranks "
                "it near the top, which is only a sound approximation when that token is the draft's own argmax"
            )
        for name, value, ok in (("use_stochastic", use_stochastic, False), ("draft_proposal", draft_proposal, "argmax"),
                                ("relaxed_topk", relaxed_topk, None), ("relaxed_delta", relaxed_delta, None)):
            if value != ok:
                raise NotImplementedError(
                    f"AcceptanceSampler: {name}={value!r} is not supported (maxjax has the greedy and synthetic rules; "
                    f"supported: {name}={ok!r})"
                )
        self._num_draft_steps = num_draft_steps
        self._use_stochastic = use_stochastic
        self._draft_proposal = draft_proposal
        self._vocab_size = vocab_size
        self._relaxed_topk = relaxed_topk
        self._relaxed_delta = relaxed_delta
        self._base_rate: float | None = None
        if synthetic_acceptance_rate is not None and num_draft_steps > 0:
            self._base_rate = compute_synthetic_acceptance_base_rate(synthetic_acceptance_rate, num_draft_steps)

    @property
    def acceptance_rule(self) -> Literal["synthetic", "stochastic", "greedy"]:
        """The rule :meth:`__call__` uses."""
        if self._base_rate is not None:
            return "synthetic"
        if self._use_stochastic:
            return "stochastic"
        return "greedy"

    def __call__(self, draft_tokens: Any, target_logits: Any, *, seed: Any = None, temperature: Any = None, top_k: Any = None,
                 max_k: Any = None, top_p: Any = None, min_top_p: Any = None, in_thinking_phase: Any = None,
                 token_bitmasks: Any = None, draft_probs_full: Any = None,
                 penalties: LogitPenalties | None = None) -> tuple[Any, Any, Any]:
        """Returns ``(first_rejected_idx, recovered_tokens, bonus_tokens)``; penalties (if any)
        are subtracted from ``target_logits`` first. Arguments as MAX's; ``seed`` is required by
        the synthetic rule, the sampling parameters are refused (see
        :func:`synthetic_acceptance_sampler`), ``draft_probs_full`` is refused (argmax proposals).

        Raises:
            ValueError: synthetic rule without ``seed``; ``draft_probs_full`` given.
        """
        if draft_probs_full is not None:
            raise ValueError("draft_probs_full is only for draft_proposal='sampled', which this sampler was not built with")
        if penalties is not None:
            target_logits = penalties.apply(target_logits)
        if self._base_rate is not None:
            if seed is None:
                raise ValueError("synthetic acceptance requires a seed")
            return synthetic_acceptance_sampler(draft_tokens, target_logits, base_acceptance_rate=self._base_rate,
                                                num_draft_steps=self._num_draft_steps, seed=seed, temperature=temperature,
                                                top_k=top_k, max_k=max_k, top_p=top_p, min_top_p=min_top_p)
        return greedy_acceptance_sampler(draft_tokens, target_logits, token_bitmasks)
