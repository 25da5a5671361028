"""``maxjax.nn.sampling.penalties``: :class:`LogitPenalties` (MAX 26.7's
``max/nn/sampling/penalties.py``): OpenAI presence/frequency penalties over a CSR of counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph.ops._core import apply
from maxjax.graph.type import DeviceRef, TensorType
__all__ = ["LogitPenalties", "unpack_bitmask"]


def unpack_bitmask(packed: Any, vocab: int) -> Any:
    """Token-kept mask [..., vocab] (bool) of a packed int32 grammar bitmask [..., ceil(vocab/32)]:
    token ``t`` is kept when bit ``t % 32`` (least significant first) of word ``t // 32`` is set,
    as MAX's ``apply_packed_bitmask`` reads it."""
    t = jnp.arange(vocab)
    words = jnp.take(packed.astype(jnp.int32), t // 32, axis=-1)  # [..., vocab]
    return ((words >> (t % 32).astype(jnp.int32)) & 1) != 0


def _penalty(logits: Any, data: Any, offsets: Any, frequency: Any, presence: Any) -> Any:
    """[rows, vocab] float32 amounts to subtract: for each ``[token, count]`` entry of row ``i``
    (``data[offsets[i]:offsets[i + 1]]``, negative tokens are padding),
    ``frequency[i] * count + presence[i] * (count > 0)`` at ``token``."""
    entries = jnp.arange(data.shape[0])
    row = jnp.searchsorted(offsets.astype(jnp.int32), entries.astype(jnp.int32), side="right") - 1  # [entries]
    token, count = data[:, 0].astype(jnp.int32), data[:, 1].astype(jnp.float32)
    owned = (token >= 0) & (row >= 0) & (row < offsets.shape[0] - 1)  # padding and entries past the last row: none
    row = jnp.clip(row, 0, logits.shape[0] - 1)
    amount = frequency.astype(jnp.float32)[row] * count + presence.astype(jnp.float32)[row] * (count > 0).astype(jnp.float32)
    amount = jnp.where(owned, amount, 0.0)
    return jnp.zeros(logits.shape, jnp.float32).at[row, jnp.maximum(token, 0)].add(amount)


def _apply(logits: Any, data: Any, offsets: Any, frequency: Any, presence: Any) -> Any:
    return (logits.astype(jnp.float32) - _penalty(logits, data, offsets, frequency, presence)).astype(logits.dtype)


def _apply_masked(logits: Any, packed: Any, data: Any, offsets: Any, frequency: Any, presence: Any, *, fill_val: float) -> Any:
    keep = unpack_bitmask(packed, logits.shape[-1])
    penalized = _apply(logits, data, offsets, frequency, presence)
    return jnp.where(keep, penalized, jnp.asarray(fill_val, logits.dtype))


@dataclass(frozen=True)
class LogitPenalties:
    """Presence/frequency penalties, one CSR row per logit row (MAX 26.7's ``LogitPenalties``).

    Logit row ``i`` owns ``data[offsets[i]:offsets[i+1]]``: ``[token, count]`` pairs (int32)
    counted over the tokens generated before that row's position; a negative token is padding.
    ``frequency`` and ``presence`` are float32 [rows]. The penalty of a token is
    ``frequency[i] * count + presence[i]`` (OpenAI's API definition).
    """

    data: Any
    offsets: Any
    frequency: Any
    presence: Any

    @staticmethod
    def input_types(device: DeviceRef) -> list[TensorType]:
        """The four graph inputs, in the order :meth:`from_inputs` reads them."""
        return [
            TensorType(DType.int32, ["penalty_entries", 2], device=device),
            TensorType(DType.uint32, ["penalty_offsets"], device=device),
            TensorType(DType.float32, ["penalty_rows"], device=device),
            TensorType(DType.float32, ["penalty_rows"], device=device),
        ]

    @classmethod
    def from_inputs(cls, values: Sequence[Any]) -> "LogitPenalties":
        """Binds the four values :meth:`input_types` declared."""
        data, offsets, frequency, presence = values
        return cls(data, offsets, frequency, presence)

    def apply(self, logits: Any) -> Any:
        """``logits`` [rows, vocab] with the penalties subtracted (same shape and dtype)."""
        return apply(_apply, logits, self.data, self.offsets, self.frequency, self.presence, _name="logit_penalties")

    def apply_with_bitmask(self, logits: Any, packed: Any, fill_val: float) -> Any:
        """Masks ``logits`` with the packed int32 grammar bitmask [rows, ceil(vocab/32)] (masked
        tokens become ``fill_val``) and subtracts the penalties from the tokens kept."""
        return apply(_apply_masked, logits, packed, self.data, self.offsets, self.frequency, self.presence,
                     _name="logit_penalties_bitmask", fill_val=float(fill_val))
