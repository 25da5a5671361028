"""Multi-head latent attention (MLA) of DeepSeek-V2/V3: MAX's ``LatentAttentionWithRope`` and
``TensorParallelLatentAttentionWithRope`` (``max/nn/attention/multi_latent_attention.py``).

Math (DeepSeek-V2, arXiv:2405.04434, section 2.1; MAX's Python structure):

- ``q = q_b_proj(RMSNorm(q_a_proj(x)))`` (or ``q_proj(x)`` when ``q_lora_rank`` is None),
  ``[total, h, nope + rope]``; its last ``qk_rope_head_dim`` channels are rotated.
- ``kv_a_proj_with_mqa(x) = [c_kv, k_rope]``: the latent ``c_kv [total, kv_lora_rank]`` is
  RMS-normed with ``kv_a_layernorm.weight`` (eps 1e-6) and ``k_rope [total, qk_rope_head_dim]``
  (one key head shared by all query heads) is rotated. The cache stores ``[c_kv, k_rope]``
  per token, one "head" of ``kv_lora_rank + qk_rope_head_dim`` channels (MAX's cache_head_dim).
- ``kv_b_proj.weight [h * (nope + v), kv_lora_rank]`` up-projects the latent: per head
  ``W_uk [nope, kv_lora_rank]`` (keys' nope part) and ``W_uv [v, kv_lora_rank]`` (values).
  Attention runs in the absorbed form of MAX's decode kernel: the query's nope part is projected
  into the latent space (``q_nope @ W_uk``), concatenated with the rotated ``q_rope``, and dotted
  with the cached ``[c_kv, k_rope]``, which equals ``q_nope . (W_uk c_kv) + q_rope . k_rope``;
  the softmax-weighted latents are up-projected by ``W_uv`` and ``o_proj`` gives
  ``[total, hidden]``. Scale: ``rope.compute_scale(scale or 1 / sqrt(nope + rope))`` (MAX's).
- The rotation pairs channels as ``rope.interleaved`` says (as :class:`AttentionWithRope`).
  MAX's MLA kernels take no layout flag (the Mojo kernel decides; DeepSeek's default
  ``rope_interleave=True`` is the interleaved pairing), so only ``interleaved=True`` is the layout
  MAX's DeepSeek models are known to use.
- ``dtype``: MAX accepts bfloat16 only (a limit of its GPU kernels); maxjax also computes float32.

The cache is maxjax's paged cache (:mod:`maxjax.nn.kernels`): ``kv_blocks [pages, 2, layers,
page_size, 1, kv_lora_rank + qk_rope_head_dim]``. MAX's MLA cache has one slab (``kv_dim`` 1);
maxjax's store/attention helpers read keys and values from two slabs, so the latent is written to
both (the value slab duplicates the key slab). Only the ragged batch over the paged cache
(``PagedCacheValues``) is supported, as in MAX.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph import Weight, ops
from maxjax.graph.type import DeviceRef
from maxjax.nn.comm import Allreduce
from maxjax.nn.kernels import attention_ragged_paged, rope_ragged, store_kv_ragged
from maxjax.nn.kv_cache import KVCacheInputsPerDevice, KVCacheParams, read_cache, write_cache
from maxjax.nn.layer import Module
from maxjax.nn.linear import Linear
from maxjax.nn.norm import RMSNorm
from maxjax.nn.rotary_embedding import RotaryEmbedding

__all__ = ["LatentAttentionWithRope", "TensorParallelLatentAttentionWithRope"]

_EPS = 1e-6  # MAX's epsilon of both RMS norms


def _mla_latent(kv: Any, gamma: Any, freqs_cis: Any, offsets: Any, cache_lengths: Any, *, rank: int, interleaved: bool) -> Any:
    """``kv [total, rank + rope]`` -> cache rows ``[total, 1, rank + rope]``: RMSNorm (float32,
    weight ``gamma [rank]``) of the latent, rotation of the rope part."""
    c = kv[:, :rank].astype(jnp.float32)
    c = c * jnp.reciprocal(jnp.sqrt(jnp.mean(c * c, axis=-1, keepdims=True) + _EPS)) * gamma.astype(jnp.float32)
    k_rope = rope_ragged(kv[:, None, rank:], freqs_cis, offsets, cache_lengths, interleaved=interleaved)  # [total, 1, rope]
    return jnp.concatenate([c.astype(kv.dtype)[:, None], k_rope.astype(kv.dtype)], axis=-1)


def _mla_attend(
    q: Any, kv_blocks: Any, kv_b: Any, freqs_cis: Any, layer_idx: Any, offsets: Any, cache_lengths: Any,
    lookup_table: Any, *, nope: int, v_dim: int, scale: float, interleaved: bool,
) -> Any:  # fmt: skip
    """Absorbed MLA of ``q [total, h, nope + rope]`` over the cached latents; ``kv_b [h * (nope +
    v), rank]`` (this device's heads). Returns ``[total, h * v]`` in q's dtype."""
    total, h, _ = q.shape
    rank = kv_b.shape[1]
    w = kv_b.astype(jnp.float32).reshape(h, nope + v_dim, rank)  # [h, nope + v, rank]
    q_rope = rope_ragged(q[..., nope:], freqs_cis, offsets, cache_lengths, interleaved=interleaved)  # [total, h, rope]
    q_lat = jnp.einsum("thn,hnr->thr", q[..., :nope].astype(jnp.float32), w[:, :nope])  # [total, h, rank]
    q_full = jnp.concatenate([q_lat, q_rope.astype(jnp.float32)], axis=-1)  # [total, h, rank + rope]
    out = attention_ragged_paged(q_full, kv_blocks, layer_idx, offsets, cache_lengths, lookup_table, scale=scale)
    ctx = jnp.einsum("thr,hvr->thv", out[..., :rank], w[:, nope:])  # [total, h, v]
    return ctx.reshape(total, h * v_dim).astype(q.dtype)


class LatentAttentionWithRope(Module):
    """DeepSeek's multi-head latent attention with rotary embedding (MAX's
    ``LatentAttentionWithRope``); see the module docstring for the math and the cache layout.

    Weight keys (MAX's): ``q_a_proj.weight [q_lora_rank, hidden]``, ``q_a_layernorm.weight
    [q_lora_rank]``, ``q_b_proj.weight [h * (nope + rope), q_lora_rank]`` (or ``q_proj.weight [h *
    (nope + rope), hidden]`` without ``q_lora_rank``), ``kv_a_layernorm.weight [kv_lora_rank]``,
    ``kv_a_proj_with_mqa.weight [kv_lora_rank + rope, hidden]``, ``kv_b_proj.weight [h * (nope + v),
    kv_lora_rank]``, ``o_proj.weight [hidden, h * v]``.

    ``__call__(layer_idx, x, kv_collection, freqs_cis, input_row_offsets,
    mla_prefill_metadata=None)``: ``x [total_seq_len, hidden]``; ``kv_collection`` a
    :class:`~maxjax.nn.kv_cache.PagedCacheValues` whose ``kv_blocks`` are ``[pages, 2, layers,
    page_size, 1, kv_lora_rank + qk_rope_head_dim]``; ``freqs_cis [max_positions,
    qk_rope_head_dim]``; ``input_row_offsets`` uint32 ``[batch + 1]``. Prefill and decode rows mix
    freely (every ``graph_mode`` computes the same numbers). Returns ``[total_seq_len, hidden]``.

    Raises:
        ValueError: ``graph_mode`` not ``prefill``/``decode``/``auto``/None (MAX's message); a
            ``dtype`` other than float32/bfloat16 (MAX: bfloat16 only, a GPU-kernel limit).
        NotImplementedError: ``o_proj_quant_config`` (quantized output projection); (called) a
            ``mla_prefill_metadata`` (maxjax plans nothing).
        TypeError: (called) a ``kv_collection`` that is not a ``PagedCacheValues``.
    """

    def __init__(
        self,
        *,
        rope: RotaryEmbedding,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        dtype: DType,
        devices: list[DeviceRef] | None = None,
        linear_cls: Callable[..., Linear] = Linear,
        o_proj_dtype: DType | None = None,
        o_proj_quant_config: Any = None,
        scale: float | None = None,
        q_lora_rank: int | None = None,
        kv_lora_rank: int = 512,
        qk_nope_head_dim: int = 128,
        qk_rope_head_dim: int = 64,
        v_head_dim: int = 128,
        buffer_size: int = 16384,
        graph_mode: str | None = None,
        norm_dtype: DType | None = None,
    ) -> None:
        super().__init__()
        role = graph_mode or "auto"
        if role not in ("prefill", "decode", "auto"):
            raise ValueError(f"Invalid graph_mode '{role}'. Use 'prefill', 'decode', or 'auto'.")
        if dtype not in (DType.float32, DType.bfloat16):
            raise ValueError(f"LatentAttentionWithRope(dtype={dtype}): maxjax supports float32 and bfloat16")
        if o_proj_quant_config is not None:
            raise NotImplementedError(
                f"LatentAttentionWithRope(o_proj_quant_config={o_proj_quant_config!r}): maxjax supports None only"
            )
        self.graph_mode = role
        self.rope = rope
        self.n_heads = num_attention_heads
        self.kv_params = kv_params
        self.num_key_value_heads = num_key_value_heads
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.norm_dtype = norm_dtype or dtype
        self.linear_cls = linear_cls
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.cache_head_dim = kv_lora_rank + qk_rope_head_dim
        self.BUFFER_TOK_SIZE = buffer_size
        self._scale = scale if scale is not None else math.sqrt(1.0 / self.qk_head_dim)
        self.scale = self.rope.compute_scale(self._scale)
        self.devices = list(devices) if devices else [DeviceRef.CPU()]
        device = self.devices[0]
        q_out = self.n_heads * self.qk_head_dim
        if q_lora_rank is not None:
            self.q_a_proj = Weight("q_a_proj.weight", dtype, (q_lora_rank, hidden_size), device)
            self.q_a_layernorm = RMSNorm(dim=q_lora_rank, dtype=self.norm_dtype, eps=_EPS, multiply_before_cast=False)
            self.q_b_proj = Weight("q_b_proj.weight", dtype, (q_out, q_lora_rank), device)
        else:
            self.q_proj = Weight("q_proj.weight", dtype, (q_out, hidden_size), device)
        self.kv_a_proj_layernorm = Weight("kv_a_layernorm.weight", self.norm_dtype, (kv_lora_rank,), device)
        self.kv_a_proj_with_mqa = Weight("kv_a_proj_with_mqa.weight", dtype, (self.cache_head_dim, hidden_size), device)
        self.kv_b_proj = Weight(
            "kv_b_proj.weight", dtype, (self.n_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank), device
        )
        self._o_proj_dtype = o_proj_dtype if o_proj_dtype is not None else dtype
        self._o_proj_quant_config = None
        self.o_proj = linear_cls(
            in_dim=self.n_heads * v_head_dim, out_dim=hidden_size, dtype=self._o_proj_dtype, device=device,
            quant_config=None,
        )  # fmt: skip

    def _heads_out(
        self, layer_idx: Any, x: Any, cache: Any, freqs_cis: Any, offsets: Any, heads: tuple[int, int],
        device: DeviceRef | None = None,
    ) -> Any:  # fmt: skip
        """Attention output ``[total, (hi - lo) * v]`` of query heads ``lo:hi`` (before ``o_proj``);
        stores this step's latents into ``cache``. With ``device``, the weights' slices move there
        (tensor parallel: each device's shard)."""
        lo, hi = heads
        on = (lambda w: w) if device is None else (lambda w: ops.transfer_to(w, device))
        if not isinstance(cache, KVCacheInputsPerDevice):
            raise TypeError(
                f"LatentAttentionWithRope: kv_collection must be a PagedCacheValues, got {type(cache).__name__}"
            )
        qk, nv = self.qk_head_dim, self.qk_nope_head_dim + self.v_head_dim
        if self.q_lora_rank is not None:
            q_a = ops.matmul(x, ops.transpose(on(self.q_a_proj), 0, 1))  # [total, q_lora_rank]
            if device is None:
                q_a = self.q_a_layernorm(q_a)
            else:  # the norm's weight on this device
                norm = self.q_a_layernorm
                q_a = ops.rms_norm(q_a, on(norm.weight), norm.eps, multiply_before_cast=False)
            xq = ops.matmul(q_a, ops.transpose(on(self.q_b_proj[lo * qk : hi * qk]), 0, 1))
        else:
            xq = ops.matmul(x, ops.transpose(on(self.q_proj[lo * qk : hi * qk]), 0, 1))  # [total, (hi - lo) * qk]
        xq = ops.reshape(xq, [-1, hi - lo, qk])  # [total, heads, nope + rope]
        kv = ops.matmul(x, ops.transpose(on(self.kv_a_proj_with_mqa), 0, 1))  # [total, rank + rope]
        freqs_cis = ops.cast(freqs_cis, xq.dtype)
        interleaved = bool(self.rope.interleaved)
        latent = ops.apply(
            _mla_latent, kv, on(self.kv_a_proj_layernorm), freqs_cis, offsets, cache.cache_lengths, _name="mla_latent",
            rank=self.kv_lora_rank, interleaved=interleaved,
        )  # fmt: skip  [total, 1, rank + rope]
        blocks = ops.apply(
            store_kv_ragged, read_cache(cache.kv_blocks), latent, latent, layer_idx, offsets, cache.cache_lengths,
            cache.lookup_table, _name="store_kv_ragged",
        )  # fmt: skip
        write_cache(cache, "kv_blocks", blocks)
        return ops.apply(
            _mla_attend, xq, blocks, on(self.kv_b_proj[lo * nv : hi * nv]), freqs_cis, layer_idx, offsets,
            cache.cache_lengths, cache.lookup_table, _name="mla_attend", nope=self.qk_nope_head_dim,
            v_dim=self.v_head_dim, scale=float(self.scale), interleaved=interleaved,
        )  # fmt: skip  [total, heads * v]

    def __call__(
        self,
        layer_idx: Any,
        x: Any,
        kv_collection: Any,
        freqs_cis: Any,
        input_row_offsets: Any,
        mla_prefill_metadata: Any = None,
    ) -> Any:
        if mla_prefill_metadata is not None:
            raise NotImplementedError("LatentAttentionWithRope(mla_prefill_metadata=...): maxjax supports None only")
        ctx = self._heads_out(layer_idx, x, kv_collection, freqs_cis, input_row_offsets, (0, self.n_heads))
        return self.o_proj(ctx)


class TensorParallelLatentAttentionWithRope(LatentAttentionWithRope):
    """:class:`LatentAttentionWithRope` with its query heads split evenly over ``devices`` (MAX's
    ``TensorParallelLatentAttentionWithRope``): device ``i`` computes heads ``i * h / n .. (i + 1)
    * h / n`` (rows of ``q_b_proj``/``q_proj`` and ``kv_b_proj``, columns of ``o_proj``) over its
    own copy of the latent cache (replicated, as in MAX), and the partial outputs are summed with
    :class:`~maxjax.nn.comm.Allreduce` unless ``skip_allreduce``. The state dict holds the whole
    weights (the parent's keys).

    ``__call__(layer_idx, xs, signal_buffers, kv_collections, freqs_cis, input_row_offsets,
    mla_prefill_metadata=None)``: one of each per device; returns one ``[total, hidden]`` per
    device (the summed output, or each device's partial sum with ``skip_allreduce``).

    Raises:
        ValueError: heads not divisible by the devices; (called) not one input per device.
    """

    def __init__(self, *, skip_allreduce: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        n = len(self.devices)
        if self.n_heads % n:
            raise ValueError(
                f"Number of attention heads ({self.n_heads}) must be divisible by the number of devices ({n})."
            )
        self.skip_allreduce = skip_allreduce
        self.allreduce = Allreduce(n)

    def __call__(  # type: ignore[override]
        self,
        layer_idx: Any,
        xs: Sequence[Any],
        signal_buffers: Sequence[Any],
        kv_collections: Sequence[Any],
        freqs_cis: Sequence[Any],
        input_row_offsets: Sequence[Any],
        mla_prefill_metadata: Any = None,
    ) -> list[Any]:
        n = len(self.devices)
        if mla_prefill_metadata is not None:
            raise NotImplementedError(
                "TensorParallelLatentAttentionWithRope(mla_prefill_metadata=...): maxjax supports None only"
            )
        if not (len(xs) == len(kv_collections) == len(freqs_cis) == len(input_row_offsets) == n):
            raise ValueError(f"Expected {n} xs, kv_collections, freqs_cis and input_row_offsets (one per device)")
        per = self.n_heads // n
        v = self.v_head_dim
        w_o = self.o_proj.weight  # [hidden, h * v]
        outs = []
        for i in range(n):
            ctx = self._heads_out(layer_idx, xs[i], kv_collections[i], freqs_cis[i], input_row_offsets[i],
                                  (i * per, (i + 1) * per), self.devices[i])  # fmt: skip  [total, per * v]
            w_i = ops.transfer_to(w_o[:, i * per * v : (i + 1) * per * v], self.devices[i])  # [hidden, per * v]
            outs.append(ops.matmul(ctx, ops.transpose(w_i, 0, 1)))
        if self.skip_allreduce:
            return outs
        return self.allreduce(outs, signal_buffers)
