"""Rotary position embeddings (RoPE; Su et al., 2021, arXiv:2104.09864) with MAX 26.7's classes
(``max/nn/rotary_embedding.py``): ``RotaryEmbedding``, ``Llama3RotaryEmbedding`` (+
``Llama3RopeScalingParams``) and the ``LinearScalingParams`` type.

Each class defines its inverse frequencies ``[head_dim // 2]`` once (:meth:`inv_freqs`, float32,
computed as MAX does: in float64, then cast). Two ways to apply them, the same numbers:

- MAX's: ``freqs_cis`` ``[max_seq_len * 2, head_dim]``, rows of ``cos_i, sin_i`` pairs at
  positions ``0 .. 2 * max_seq_len - 1`` (``outer(t, inv_freqs)`` in float32), and
  ``__call__(x, start_pos=None, seq_len=None)`` on ``x [batch, seq, n_heads, head_dim]``.
- maxjax's :meth:`RotaryEmbedding.rotate` ``(x, positions)`` at any integer positions (padded
  batches, ragged batches), with the angles computed on the fly from the same float32 products.

``interleaved=True`` (MAX's default, llama.cpp/GGUF's layout) rotates channel pairs ``(2i, 2i+1)``;
``interleaved=False`` (Hugging Face's ``rotate_half``) pairs ``(i, i + head_dim / 2)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.ops.shape import literal_constant
from maxjax.nn.layer import Module

__all__ = [
    "DeepseekYarnRopeScalingParams", "DeepseekYarnRotaryEmbedding",
    "DynamicRotaryEmbedding", "LinearScalingParams", "Llama3RopeScalingParams", "Llama3RotaryEmbedding", "LongRoPERotaryEmbedding",
    "LongRoPEScalingParams", "RotaryEmbedding", "YarnRotaryEmbedding", "YarnScalingParams",
]  # fmt: skip


class RotaryEmbedding(Module):
    """MAX's ``RotaryEmbedding(dim, n_heads, theta, max_seq_len, head_dim=None, _freqs_cis=None,
    interleaved=True)``: no weights.

    Args:
        dim: model hidden size (``head_dim`` defaults to ``dim // n_heads``).
        n_heads: query heads.
        theta: the rope base (Llama's ``rope_theta``).
        max_seq_len: the table ``freqs_cis`` covers positions ``< 2 * max_seq_len``.
        head_dim: channels per head (even).
        _freqs_cis: a precomputed ``[2 * max_seq_len, head_dim // 2, 2]`` or ``[.., head_dim]``
            table to use instead (MAX's private argument).
        interleaved: the pair layout (see the module docstring).

    Raises:
        ValueError: an odd ``head_dim``.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        theta: float,
        max_seq_len: int,
        head_dim: int | None = None,
        _freqs_cis: Any = None,
        interleaved: bool = True,
    ) -> None:
        super().__init__()
        self.dim, self.n_heads, self.theta, self.max_seq_len = dim, n_heads, theta, max_seq_len
        self.head_dim = head_dim if head_dim is not None else dim // n_heads
        if self.head_dim % 2:
            raise ValueError(f"RotaryEmbedding: head_dim must be even (pairs of channels rotate), got {self.head_dim}")
        self.interleaved = interleaved
        self._freqs_cis = _freqs_cis
        self._table: np.ndarray | None = None

    def _compute_inv_freqs(self) -> np.ndarray:
        """``1 / theta ** (2i / head_dim)`` float32 ``[head_dim // 2]`` (computed in float64, as MAX)."""
        n = self.head_dim
        iota = np.arange(0, n, 2, dtype=np.float64)
        return (1.0 / (float(self.theta) ** (iota / n))).astype(np.float32)

    def inv_freqs(self) -> np.ndarray:
        """The inverse frequencies the class applies, float32 ``[head_dim // 2]`` (cached)."""
        cached = self.__dict__.get("_inv")
        if cached is None:
            cached = self.__dict__["_inv"] = self._compute_inv_freqs()
        return cached

    def attention_factor(self) -> float:
        """A factor on cos and sin (1.0 here; YaRN-style scalings have another)."""
        return 1.0

    def _table_length(self) -> int:
        """Positions in ``freqs_cis`` (MAX: ``2 * max_seq_len``)."""
        return self.max_seq_len * 2

    def _angles(self, t: Any, xp: Any) -> Any:
        """float32 angles ``[*t.shape, head_dim // 2]`` at float32 positions ``t`` (``xp`` is
        ``numpy`` for the table or the graph ``ops`` for :meth:`rotate`: the same products)."""
        if xp is np:
            return t[..., None] * self.inv_freqs()
        return ops.unsqueeze(t, -1) * literal_constant(self.inv_freqs(), DType.float32)

    def _freqs_table(self) -> np.ndarray:
        """float32 ``[positions, head_dim // 2, 2]``: (cos, sin) of the angles at ``0, 1, ...``."""
        if self._table is None:
            if self._freqs_cis is not None:
                table = np.asarray(self._freqs_cis, np.float32)
                self._table = table.reshape(table.shape[0], -1, 2)
            else:
                t = np.arange(self._table_length(), dtype=np.float32)
                freqs = self._angles(t, np).astype(np.float32)  # [positions, head_dim // 2] float32
                f = np.float32(self.attention_factor())
                self._table = np.stack([np.cos(freqs) * f, np.sin(freqs) * f], axis=-1).astype(np.float32)
        return self._table

    def freqs_cis_base(self) -> Any:
        """MAX's table ``[max_seq_len * 2, head_dim // 2, 2]`` (float32 constant)."""
        return literal_constant(self._freqs_table(), DType.float32)

    @property
    def freqs_cis(self) -> Any:
        """MAX's flattened table ``[max_seq_len * 2, head_dim]`` (``cos_i, sin_i`` pairs)."""
        table = self._freqs_table()
        return literal_constant(table.reshape(table.shape[0], -1), DType.float32)

    def compute_scale(self, user_scale: float | None = None) -> float:
        """The attention scale: ``user_scale``, or ``1 / sqrt(head_dim)``."""
        return user_scale if user_scale is not None else math.sqrt(1.0 / self.head_dim)

    def rotate(self, x: Any, positions: Any, freqs_cis: Any = None) -> Any:
        """``x [..., n_heads, head_dim]`` rotated at integer ``positions`` (broadcastable to
        ``x.shape[:-2]``), in float32; returns x's dtype. Equal to applying ``freqs_cis`` rows.

        Without ``freqs_cis`` the angles are computed here (any position, no table); with it (MAX's
        table ``[positions, head_dim]`` of ``cos_i, sin_i`` pairs, or ``[positions, head_dim // 2,
        2]``, holding every position asked for) its rows at ``positions`` are read: no sine or
        cosine in the program, what a caller that rotates many tensors at the same positions
        wants (positions past the table are clamped to its last row). ``positions=None`` (with
        ``freqs_cis``) means ``0 .. seq - 1`` along ``x``'s axis -3, read as the table's first rows."""
        if freqs_cis is None:
            cos, sin = self._cos_sin(positions)
        else:
            table = ops.reshape(freqs_cis, [freqs_cis.shape[0], self.head_dim // 2, 2])
            if positions is None:
                rows = table[: x.shape[-3]]  # [seq, head_dim // 2, 2]
            else:
                rows = ops.gather(table, ops.cast(positions, DType.int32), axis=0)  # [*positions, head_dim // 2, 2]
            cos, sin = rows[..., 0], rows[..., 1]
        return self._apply(x, ops.unsqueeze(cos, -2), ops.unsqueeze(sin, -2))  # broadcast over heads

    def _cos_sin(self, positions: Any) -> tuple[Any, Any]:
        """float32 ``(cos, sin)``, each ``[*positions.shape, head_dim // 2]``, at integer positions."""
        angles = self._angles(ops.cast(positions, DType.float32), ops)
        cos, sin = ops.cos(angles), ops.sin(angles)
        if self.attention_factor() != 1.0:
            f = literal_constant(self.attention_factor(), DType.float32)
            cos, sin = cos * f, sin * f
        return cos, sin

    def table_rows(self, n: Any) -> Any:
        """MAX's ``freqs_cis`` rows at positions ``0 .. n - 1``, float32 ``[n, head_dim]``
        (``cos_i, sin_i`` pairs), computed in the program with :meth:`rotate`'s arithmetic: no
        table constant, any ``n`` (symbolic too)."""
        cos, sin = self._cos_sin(ops.range(0, n, 1, dtype=DType.int32))  # [n, head_dim // 2]
        return ops.reshape(ops.stack([cos, sin], axis=-1), [n, self.head_dim])

    def _apply(self, x: Any, cos: Any, sin: Any) -> Any:
        half = self.head_dim // 2
        xf = ops.cast(x, DType.float32)
        if self.interleaved:
            pairs = ops.reshape(xf, [*x.shape[:-1], half, 2])
            a, b = pairs[..., 0], pairs[..., 1]
            out = ops.reshape(ops.stack([a * cos - b * sin, a * sin + b * cos], axis=-1), x.shape)
        else:
            a, b = xf[..., :half], xf[..., half:]
            out = ops.concat([a * cos - b * sin, b * cos + a * sin], axis=-1)
        return ops.cast(out, x.dtype)

    def __call__(self, x: Any, start_pos: Any = None, seq_len: Any = None) -> Any:
        """MAX's call: ``x [batch, seq_len, n_heads, head_dim]`` at positions ``start_pos ..
        start_pos + seq_len - 1`` (``start_pos`` default 0, ``seq_len`` default ``x.shape[-3]``)."""
        start = 0 if start_pos is None else start_pos
        n = x.shape[-3] if seq_len is None else seq_len
        table = self.freqs_cis_base()[start : start + n]  # [seq, head_dim // 2, 2]
        cos = ops.unsqueeze(ops.unsqueeze(table[..., 0], 1), 0)  # [1, seq, 1, head_dim // 2]
        sin = ops.unsqueeze(ops.unsqueeze(table[..., 1], 1), 0)
        return self._apply(x, cos, sin)


@dataclass
class Llama3RopeScalingParams:
    """Llama 3's frequency scaling (MAX's fields)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    orig_max_position: int


@dataclass
class LinearScalingParams:
    """Linear rope scaling (MAX's type): positions divided by ``factor``."""

    factor: float


class Llama3RotaryEmbedding(RotaryEmbedding):
    """RoPE with Llama 3's frequency scaling (MAX's ``Llama3RotaryEmbedding``; Meta's
    ``apply_scaling`` in llama3's ``model.py``): wavelengths shorter than ``orig_max_position /
    high_freq_factor`` keep their frequency, longer than ``orig_max_position / low_freq_factor``
    are divided by ``factor``, and those between are interpolated smoothly.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        theta: float,
        max_seq_len: int,
        head_dim: int | None = None,
        _freqs_cis: Any = None,
        interleaved: bool = True,
        scaling_params: Llama3RopeScalingParams | None = None,
    ) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, head_dim, _freqs_cis, interleaved)
        self.scaling_params = scaling_params

    def _compute_inv_freqs(self) -> np.ndarray:
        inv = super()._compute_inv_freqs()
        p = self.scaling_params
        if p is None:
            return inv
        low_wavelen = np.float32(p.orig_max_position / p.low_freq_factor)
        high_wavelen = np.float32(p.orig_max_position / p.high_freq_factor)
        wave_len = (np.float32(2 * math.pi) / inv).astype(np.float32)
        if p.low_freq_factor != p.high_freq_factor:
            smooth = ((np.float32(p.orig_max_position) / wave_len - np.float32(p.low_freq_factor))
                      / np.float32(p.high_freq_factor - p.low_freq_factor)).astype(np.float32)  # fmt: skip
        else:
            smooth = np.float32(0)
        f = np.float32(p.factor)
        mid = (1 - smooth) * inv / f + smooth * inv
        return np.where(wave_len < high_wavelen, inv, np.where(wave_len > low_wavelen, inv / f, mid)).astype(np.float32)


@dataclass
class YarnScalingParams:
    """YaRN's scaling (MAX's fields; Peng et al., 2023, arXiv:2309.00071)."""

    factor: float
    beta_fast: float
    beta_slow: float
    original_max_position_embeddings: int
    truncate: bool


@dataclass
class LongRoPEScalingParams:
    """LongRoPE's per-frequency factors (MAX's fields; Phi-3.5)."""

    short_factor: list[float]
    long_factor: list[float]
    original_max_position: int
    max_position_embeddings: int


def _yarn_correction_dim(num_rotations: float, dim: int, base: float, max_position: int) -> np.float32:
    f = np.float32
    return (f(dim) * np.log(f(max_position) / (f(num_rotations) * f(2 * math.pi)))) / (f(2) * np.log(f(base)))


class YarnRotaryEmbedding(RotaryEmbedding):
    """RoPE with YaRN frequency interpolation (MAX's ``YarnRotaryEmbedding``): frequencies blend
    between extrapolated and interpolated (``/ factor``) by a linear ramp over the dimensions
    between the ``beta_fast``/``beta_slow`` correction dims; cos and sin are multiplied by
    ``0.1 * ln(factor) + 1``. As in MAX, ``freqs_cis`` covers ``max_seq_len`` positions (not twice).
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        theta: float,
        max_seq_len: int,
        head_dim: int | None = None,
        _freqs_cis: Any = None,
        interleaved: bool = True,
        scaling_params: YarnScalingParams | None = None,
    ) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, head_dim, _freqs_cis, interleaved)
        self.scaling_params = scaling_params

    def _table_length(self) -> int:
        return self.max_seq_len if self.scaling_params is not None else super()._table_length()

    def attention_factor(self) -> float:
        p = self.scaling_params
        return 1.0 if p is None or p.factor <= 1 else 0.1 * math.log(p.factor) + 1.0

    def _compute_inv_freqs(self) -> np.ndarray:
        p = self.scaling_params
        if p is None:
            return super()._compute_inv_freqs()
        n, half = self.head_dim, self.head_dim // 2
        base = float(self.theta) ** (np.arange(0, n, 2, dtype=np.float64) / float(n))
        extra = (1.0 / base).astype(np.float32)
        inter = (1.0 / (p.factor * base)).astype(np.float32)
        low = max(np.floor(_yarn_correction_dim(p.beta_fast, n, self.theta, p.original_max_position_embeddings)), np.float32(0))
        high = min(np.trunc(_yarn_correction_dim(p.beta_slow, n, self.theta, p.original_max_position_embeddings)) + 1, np.float32(n - 1))
        diff = np.float32(high - low) if high != low else np.float32(0.001)
        ramp = np.clip((np.arange(half, dtype=np.float32) - np.float32(low)) / diff, 0, 1).astype(np.float32)
        mask = (np.float32(1) - ramp).astype(np.float32)
        return (inter * (1 - mask) + extra * mask).astype(np.float32)


class LongRoPERotaryEmbedding(RotaryEmbedding):
    """RoPE with LongRoPE's factors (MAX's ``LongRoPERotaryEmbedding``): positions below
    ``original_max_position`` use ``inv_freqs / short_factor``, later ones ``inv_freqs /
    long_factor`` (the table is stitched at that position); :meth:`compute_scale` adds the
    attention factor ``sqrt(1 + ln(s) / ln(original_max_position))`` for ``s =
    max_position_embeddings / original_max_position > 1``.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        theta: float,
        max_seq_len: int,
        head_dim: int | None = None,
        _freqs_cis: Any = None,
        interleaved: bool = True,
        scaling_params: LongRoPEScalingParams | None = None,
    ) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, head_dim, _freqs_cis, interleaved)
        self.scaling_params = scaling_params

    def _scaled(self, factors: list[float]) -> np.ndarray:
        inv = self.inv_freqs()
        return (inv / np.asarray(factors[: inv.shape[0]], np.float32)).astype(np.float32)

    def _angles(self, t: Any, xp: Any) -> Any:
        p = self.scaling_params
        if p is None:
            return super()._angles(t, xp)
        short, long = self._scaled(p.short_factor), self._scaled(p.long_factor)
        if xp is np:
            return np.where(t[..., None] < p.original_max_position, t[..., None] * short, t[..., None] * long)
        tt = ops.unsqueeze(t, -1)
        is_short = tt < literal_constant(float(p.original_max_position), DType.float32)
        return ops.where(is_short, tt * literal_constant(short, DType.float32), tt * literal_constant(long, DType.float32))

    def compute_scale(self, user_scale: float | None = None) -> float:
        if user_scale is not None:
            return user_scale
        scale = super().compute_scale(None)
        p = self.scaling_params
        if p:
            factor = p.max_position_embeddings / p.original_max_position
            if factor > 1.0:
                scale *= math.sqrt(1 + math.log(factor) / math.log(p.original_max_position))
        return scale


class DynamicRotaryEmbedding(RotaryEmbedding):
    """MAX's ``DynamicRotaryEmbedding``: a table that grows with the sequences it is asked for.

    :meth:`maybe_update_freqs` ``(position_ids)`` (MAX's, called while a graph is built) sets the
    table's length from ``position_ids``'s static first dimension: longer than the cached length
    grows it (a symbolic one grows it to ``max(cached, 2 * original)``), shorter than the
    original length resets it and the original frequencies. The frequencies themselves are
    unscaled, as in MAX 26.7. This mutates the module as MAX's does: call it while building,
    not inside a traced function that shares the module.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        theta: float,
        max_seq_len: int,
        head_dim: int | None = None,
        _freqs_cis: Any = None,
        interleaved: bool = True,
    ) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, head_dim, _freqs_cis, interleaved)
        self.original_max_seq_len = max_seq_len
        self.max_seq_len_cached = max_seq_len
        self._inv_freq: np.ndarray | None = None
        self._freqs_cis = None

    @property
    def original_inv_freq(self) -> np.ndarray:
        """The frequencies at the original length, float32 ``[head_dim // 2]``."""
        return self._compute_inv_freqs()

    @property
    def inv_freq(self) -> np.ndarray:
        """The frequencies the table is computed from."""
        return self.original_inv_freq if self._inv_freq is None else self._inv_freq

    @inv_freq.setter
    def inv_freq(self, value: Any) -> None:
        self._inv_freq = np.asarray(value, np.float32)
        self.__dict__.pop("_inv", None)
        self._table = None

    def inv_freqs(self) -> np.ndarray:
        return self.inv_freq

    def _table_length(self) -> int:
        return self.max_seq_len_cached * 2

    def maybe_update_freqs(self, position_ids: Any) -> None:
        """Grows (or resets) the table for ``position_ids`` (see the class docstring)."""
        shape = getattr(position_ids, "shape", np.shape(position_ids))
        if len(shape) > 0:
            try:
                seq_len = int(shape[0])
            except TypeError:
                seq_len = max(self.max_seq_len_cached, self.original_max_seq_len * 2)
        else:
            seq_len = 1
        if seq_len > self.max_seq_len_cached:
            self.max_seq_len_cached = seq_len
            self._table = None
        elif seq_len < self.original_max_seq_len and self.max_seq_len_cached > self.original_max_seq_len:
            self.inv_freq = self.original_inv_freq
            self.max_seq_len_cached = self.original_max_seq_len
            self._table = None


@dataclass
class DeepseekYarnRopeScalingParams:
    """DeepSeek's YaRN scaling (MAX's fields, ``max/nn/rotary_embedding.py``)."""

    scaling_factor: float
    original_max_position_embeddings: int
    beta_fast: int
    beta_slow: int
    mscale: float
    mscale_all_dim: float


def _yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """YaRN's magnitude factor (MAX's): ``0.1 * mscale * ln(scale) + 1`` for ``scale > 1``, else 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class DeepseekYarnRotaryEmbedding(RotaryEmbedding):
    """RoPE with DeepSeek's YaRN (MAX's ``DeepseekYarnRotaryEmbedding``; DeepSeek-V2/V3's
    ``yarn`` rope, Peng et al., 2023, arXiv:2309.00071). ``dim`` is the rope dimension (not the
    hidden size): the frequencies are over ``dim`` channels, and ``freqs_cis`` is
    ``[max_seq_len, dim]`` (``max_seq_len`` positions, not twice).

    As MAX computes it in float32 graph ops: ``base = theta ** (2i / dim)``, frequencies blended
    between ``1 / base`` and ``1 / (scaling_factor * base)`` by a linear ramp between the
    ``beta_fast``/``beta_slow`` correction dims (of ``int(theta)``, clamped to ``[0, dim - 1]``);
    cos and sin multiplied by ``mscale(scaling_factor, mscale) / mscale(scaling_factor,
    mscale_all_dim)``; :meth:`compute_scale` multiplies the attention scale by
    ``mscale(scaling_factor, mscale) ** 2``.

    Raises:
        ValueError: the table or frequencies are asked for without ``scaling_params`` (MAX's
            message, "scaling_params must be provided").
        AssertionError: :meth:`compute_scale` without ``scaling_params`` (MAX's assert).
    """

    scaling_params: DeepseekYarnRopeScalingParams | None = None

    def __init__(
        self,
        dim: int,
        n_heads: int,
        theta: float,
        max_seq_len: int,
        head_dim: int | None = None,
        _freqs_cis: Any = None,
        interleaved: bool = True,
        scaling_params: DeepseekYarnRopeScalingParams | None = None,
    ) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, head_dim, _freqs_cis, interleaved)
        self.scaling_params = scaling_params

    def _params(self) -> DeepseekYarnRopeScalingParams:
        if self.scaling_params is None:
            raise ValueError("scaling_params must be provided")
        return self.scaling_params

    def _table_length(self) -> int:
        return self.max_seq_len

    def attention_factor(self) -> float:
        p = self._params()
        return float(_yarn_get_mscale(p.scaling_factor, p.mscale) / _yarn_get_mscale(p.scaling_factor, p.mscale_all_dim))

    def _compute_inv_freqs(self) -> np.ndarray:
        """float32 ``[dim // 2]``, in float32 steps as MAX's graph (``_compute_yarn_freqs``)."""
        p = self._params()
        f, n = np.float32, self.dim
        base = f(self.theta) ** (np.arange(0, n, 2, dtype=f) / f(n))  # [dim // 2]
        extra = f(1) / base
        inter = f(1) / (f(p.scaling_factor) * base)

        def correction_dim(rotations: float) -> np.float32:
            num = f(n) * np.log(f(p.original_max_position_embeddings) / (f(rotations) * f(2) * f(math.pi)))
            return num / (f(2) * np.log(f(int(self.theta))))

        low = max(np.floor(correction_dim(p.beta_fast)), f(0))
        high = min(np.trunc(correction_dim(p.beta_slow)) + f(1), f(n - 1))
        diff = f(high - low) if high != low else f(0.001)
        ramp = np.clip((np.arange(n // 2, dtype=f) - f(low)) / diff, 0, 1).astype(f)
        mask = f(1) - ramp
        return (inter * (f(1) - mask) + extra * mask).astype(f)

    def compute_scale(self, user_scale: float | None = None) -> float:
        assert self.scaling_params
        mscale = _yarn_get_mscale(self.scaling_params.scaling_factor, self.scaling_params.mscale)
        return super().compute_scale(user_scale) * mscale * mscale
