"""Quantization encodings: :class:`QuantizationEncoding`, :class:`BlockParameters`, :class:`QuantizationConfig`.

The counterpart of ``max.graph.quantization``'s enum and dataclasses. MAX 26.7 has Q4_0, Q4_K, Q5_K,
Q6_K and GPTQ; maxjax adds the other GGUF block formats it reads (Q4_1, Q5_0, Q5_1, Q8_0). The
block sizes are llama.cpp's (``ggml/src/ggml-common.h``, ``block_q4_0`` ...).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # pragma: no cover
    import gguf

__all__ = ["BlockParameters", "QuantizationConfig", "QuantizationEncoding", "as_encoding", "GGUF_ENCODINGS"]



class BlockParameters(NamedTuple):
    """Shape of one quantization block: how many elements it holds, and its size in bytes."""

    elements_per_block: int
    block_size: int


class QuantizationEncoding(enum.Enum):
    """How a weight is quantized (``max.graph.quantization.QuantizationEncoding``).

    MAX 26.7 has Q4_0, Q4_K, Q5_K, Q6_K and GPTQ; maxjax adds the other GGUF block formats that
    :func:`dequantize` supports (Q4_1, Q5_0, Q5_1, Q8_0). As in MAX, ``.name`` is lower case
    (``QuantizationEncoding.Q4_K.name == "q4_k"``) while the value is upper case.
    """

    Q4_0 = "Q4_0"
    Q4_1 = "Q4_1"
    Q5_0 = "Q5_0"
    Q5_1 = "Q5_1"
    Q8_0 = "Q8_0"
    Q4_K = "Q4_K"
    Q5_K = "Q5_K"
    Q6_K = "Q6_K"
    GPTQ = "GPTQ"

    @property
    def name(self) -> str:  # type: ignore[override]
        """The lower-case name, as MAX returns it (``"q4_k"``)."""
        return self._name_.lower()

    @property
    def block_parameters(self) -> BlockParameters:
        """``BlockParameters(elements_per_block, block_size)``; a ValueError for GPTQ."""
        try:
            return _BLOCK_PARAMETERS[self]
        except KeyError:
            raise ValueError(
                f"{self} has no fixed block parameters: it is not a GGUF block format "
                f"(GGUF encodings: {', '.join(e.value for e in _BLOCK_PARAMETERS)})"
            ) from None

    @property
    def elements_per_block(self) -> int:
        """Number of weight elements in one block (32, or 256 for the k-quants)."""
        return self.block_parameters.elements_per_block

    @property
    def block_size(self) -> int:
        """Size of one block in bytes."""
        return self.block_parameters.block_size

    def packed_shape(self, shape: Any) -> tuple[Any, ...]:
        """The uint8 shape ``[..., bytes_per_row]`` of a logical ``[..., cols]`` tensor in this
        GGUF encoding's blocks.

        Raises:
            ValueError: not a GGUF encoding, or ``cols`` is not a whole number of blocks.
        """
        bpe, bsize = self.block_parameters
        *lead, cols = shape
        if cols % bpe:
            raise ValueError(f"{self}: a row of {cols} elements is not a whole number of {bpe}-element blocks")
        return (*lead, cols // bpe * bsize)

    def logical_shape(self, packed_shape: Any) -> tuple[Any, ...]:
        """The logical ``[..., cols]`` shape of uint8 blocks ``[..., bytes_per_row]`` (the inverse
        of :meth:`packed_shape`; a partial block counts for nothing)."""
        bpe, bsize = self.block_parameters
        *lead, row_bytes = packed_shape
        return (*lead, row_bytes // bsize * bpe)

    @property
    def is_gguf(self) -> bool:
        """True for the GGUF block formats, i.e. for every member but GPTQ."""
        return self in _BLOCK_PARAMETERS

    @classmethod
    def from_gguf(cls, qtype: "gguf.GGMLQuantizationType | int") -> "QuantizationEncoding":
        """The encoding of a ``gguf.GGMLQuantizationType`` (ValueError for unsupported types)."""
        import gguf

        try:
            qtype = gguf.GGMLQuantizationType(qtype)
        except ValueError:
            raise ValueError(
                f"{qtype!r} is not a gguf.GGMLQuantizationType; supported quantization types: "
                f"{', '.join(e.value for e in _BLOCK_PARAMETERS)}"
            ) from None
        try:
            return cls(qtype.name)
        except ValueError:
            pass
        raise ValueError(
            f"GGUF quantization type {qtype.name} is not supported by maxjax; supported "
            f"quantization types: {', '.join(e.value for e in _BLOCK_PARAMETERS)}"
        )

    def to_gguf(self) -> "gguf.GGMLQuantizationType":
        """The matching ``gguf.GGMLQuantizationType`` (ValueError for GPTQ)."""
        import gguf

        if not self.is_gguf:
            raise ValueError(f"{self} is not a GGUF quantization type")
        return gguf.GGMLQuantizationType[self.value]


_E = QuantizationEncoding
_BLOCK_PARAMETERS: dict[QuantizationEncoding, BlockParameters] = {
    _E.Q4_0: BlockParameters(32, 18),  # d:f16, qs:u8[16]
    _E.Q4_1: BlockParameters(32, 20),  # d:f16, m:f16, qs:u8[16]
    _E.Q5_0: BlockParameters(32, 22),  # d:f16, qh:u8[4], qs:u8[16]
    _E.Q5_1: BlockParameters(32, 24),  # d:f16, m:f16, qh:u8[4], qs:u8[16]
    _E.Q8_0: BlockParameters(32, 34),  # d:f16, qs:i8[32]
    _E.Q4_K: BlockParameters(256, 144),  # d:f16, dmin:f16, scales:u8[12], qs:u8[128]
    _E.Q5_K: BlockParameters(256, 176),  # d:f16, dmin:f16, scales:u8[12], qh:u8[32], qs:u8[128]
    _E.Q6_K: BlockParameters(256, 210),  # ql:u8[128], qh:u8[64], scales:i8[16], d:f16
}


@dataclass
class QuantizationConfig:
    """Configuration of a non-GGUF quantization such as GPTQ (``max.graph.quantization``)."""

    quant_method: str
    bits: int
    group_size: int
    desc_act: bool = False
    sym: bool = False


#: the GGUF block encodings, in the enum's order
GGUF_ENCODINGS: tuple[QuantizationEncoding, ...] = tuple(_BLOCK_PARAMETERS)


def as_encoding(encoding: Any) -> QuantizationEncoding:
    """A :class:`QuantizationEncoding` from itself, its value or name (``"Q4_1"``, ``"q4_1"``) or a
    ``gguf.GGMLQuantizationType``.

    Raises:
        ValueError: anything else (lists the encodings).
    """
    if isinstance(encoding, QuantizationEncoding):
        return encoding
    if isinstance(encoding, str):
        try:
            return QuantizationEncoding(encoding.upper())
        except ValueError:
            pass
    else:
        try:
            import gguf

            if isinstance(encoding, gguf.GGMLQuantizationType):
                return QuantizationEncoding.from_gguf(encoding)
        except ImportError:  # pragma: no cover
            pass
    raise ValueError(
        f"unknown quantization encoding {encoding!r}; expected a QuantizationEncoding "
        f"({', '.join(e.value for e in QuantizationEncoding)})"
    )
