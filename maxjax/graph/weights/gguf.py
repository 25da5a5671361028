"""``GGUFWeights``: Weights from a GGUF file, read by the ``gguf`` package (MAX's class of that name).

The file is parsed by ``gguf.GGUFReader`` (which memory-maps it); maxjax adds two checks to the
reader so that a bad file raises :class:`~maxjax.graph.weights.errors.WeightsFileError` naming the
file and what is wrong, instead of an ``IndexError``, a garbage array or an endless loop:

- every header read is bounds-checked (a length field that lies about sizes is reported with the
  byte offset it points past);
- every tensor's type is known and its data lies inside the file and at the file's alignment
  (checked before the reader builds its arrays, naming the tensor).

Names are the file's (``blk.0.attn_q.weight``). Shapes are row-major: GGUF lists dimensions
fastest-first, so ``ne = [576, 1536]`` is the ``[1536, 576]`` matrix. F32/F16/F64/I8..I64 tensors
load as they are; BF16 tensors (which the reader exposes as raw bytes) are reinterpreted as
``bfloat16`` (MAX gets this wrong: modular/modular#6660); quantized tensors stay packed: ``uint8
[rows, bytes_per_row]`` with their :class:`~maxjax.graph.quantization.QuantizationEncoding` and the
float ``original_shape`` (the file's size in memory; dequantized where they are used).

Opening a GGUF runs the package's parser over all metadata; its per-entry loop over long arrays
(a tokenizer's tokens, merges, token types: 400k entries for Llama 3) is replaced by one pass per
array that gives the same parts (Llama-3.2-1B's metadata: 6.6 s with the package's loop, 0.25 s).
Readers are cached per file (by path, inode, size and modification time): opening the same
unchanged file again reuses its reader and its one memory map.
"""

from __future__ import annotations

import math
import os
import re
import struct
import threading
from collections import OrderedDict
from typing import Any, Iterable

import gguf
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.quantization import QuantizationEncoding
from maxjax.graph.type import DeviceRef, Shape
from maxjax.graph.weight import Weight
from maxjax.graph.graph import did_you_mean
from maxjax.graph.weights._host import MappedFile, to_device
from maxjax.graph.weights.errors import WeightsFileError
from maxjax.graph.weights.lazy import LazyTensor
from maxjax.graph.weights.protocol import HierarchicalWeights, WeightsStore, check_request, select_prefix
from maxjax.graph.weights.summary import TensorInfo
from maxjax.graph.weights.weight_data import WeightData, _wrap_loaded

__all__ = ["GGUFWeights", "open_gguf", "GGUF_PLAIN_DTYPES", "clear_reader_cache", "forget_reader"]

_T = gguf.GGMLQuantizationType
#: GGML tensor types stored as plain arrays -> DType.
GGUF_PLAIN_DTYPES: dict[gguf.GGMLQuantizationType, DType] = {
    _T.F32: DType.float32,
    _T.F16: DType.float16,
    _T.F64: DType.float64,
    _T.BF16: DType.bfloat16,
    _T.I8: DType.int8,
    _T.I16: DType.int16,
    _T.I32: DType.int32,
    _T.I64: DType.int64,
}


_ARRAY, _STRING = int(gguf.GGUFValueType.ARRAY), int(gguf.GGUFValueType.STRING)
_HOST_U64 = struct.Struct("=Q")  # a string's length, in the host's byte order


class _Problem(Exception):
    """A defect found while the reader parses the file (message only; the path is added later)."""


#: numpy dtypes by the spellings the gguf reader passes (``np.uint64``, ``"<u4"``, ...)
_DTYPES: dict[Any, np.dtype] = {}


class _ArrayParts:
    """The parts of an array field as ``gguf.ReaderField.parts`` lists them (a sequence of NumPy
    views of the file: ``head``, then the entries'), each entry's made when it is asked for, so
    that opening a file with a 400k-entry vocabulary makes no 800k arrays."""

    __slots__ = ("head",)
    per_entry = 1

    def __init__(self, head: list[np.ndarray]):
        self.head = head

    def __len__(self) -> int:
        return len(self.head) + self.per_entry * self.count

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"part {i} of {len(self)}")
        h = len(self.head)
        return self.head[i] if i < h else self._entry_part(i - h)

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    @property
    def count(self) -> int:
        """The number of entries."""
        raise NotImplementedError

    def _entry_part(self, j: int) -> np.ndarray:
        raise NotImplementedError


class _NumberParts(_ArrayParts):
    """``[..., one 1-element array per entry]`` of an array of numbers held as one view."""

    __slots__ = ("values",)

    def __init__(self, head: list[np.ndarray], values: np.ndarray):
        super().__init__(head)
        self.values = values

    @property
    def count(self) -> int:
        return int(self.values.shape[0])

    def _entry_part(self, j: int) -> np.ndarray:
        return self.values[j : j + 1]

    def contents(self, index_or_slice: Any) -> Any:
        return self.values[index_or_slice].tolist()


class _StringParts(_ArrayParts):
    """``[..., (uint64 length, uint8 bytes) per entry]`` of an array of strings, from where each
    string starts in the file and its length."""

    __slots__ = ("plain", "starts", "lengths", "_strings")
    per_entry = 2

    def __init__(self, head: list[np.ndarray], plain: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
        super().__init__(head)
        self.plain, self.starts, self.lengths = plain, starts, lengths
        self._strings: list[str] | None = None

    @property
    def count(self) -> int:
        return int(self.starts.shape[0])

    def _entry_part(self, j: int) -> np.ndarray:
        k, is_bytes = divmod(j, 2)
        start = int(self.starts[k])
        if is_bytes:
            return self.plain[start : start + int(self.lengths[k])]
        return self.plain[start - 8 : start].view(np.uint64)

    def contents(self, index_or_slice: Any) -> Any:
        if self._strings is None:  # decoded once, in one pass (UTF-8, strict: as the package does)
            raw = memoryview(self.plain)
            self._strings = [str(raw[s : s + n], "utf-8") for s, n in zip(self.starts.tolist(), self.lengths.tolist())]
        out = self._strings[index_or_slice]
        return out if isinstance(out, str) else list(out)


class _ArrayField(gguf.ReaderField):
    """A ``gguf.ReaderField`` of an array whose parts are an :class:`_ArrayParts`: ``contents``
    gives what the package's gives, decoded in one pass."""

    __slots__ = ()

    def contents(self, index_or_slice: Any = slice(None)) -> Any:
        return self.parts.contents(index_or_slice)


class _CheckedReader(gguf.GGUFReader):
    """``gguf.GGUFReader`` with bounds checks on header reads and tensor data (see module doc).

    ``data`` is a plain ``ndarray`` view of the reader's ``numpy.memmap`` (kept as ``memmap``):
    slicing a memmap subclass costs about three times as much, and the parser slices it hundreds
    of thousands of times for a large vocabulary.
    """

    @property
    def data(self) -> np.ndarray:  # type: ignore[override]
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self.memmap = value
        self._plain = value.view(np.ndarray) if isinstance(value, np.memmap) else value
        self._size = int(self._plain.shape[0])

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        # gguf.GGUFReader._get with a bounds check, and without its per-call ``np.empty`` (for the
        # item size) and byte-order view in the host's order: the parser calls it once or twice per
        # vocabulary entry (half a million times for Llama 3's tokenizer), and this halves its time.
        offset, count = int(offset), int(count)
        dt = _DTYPES.get(dtype)
        if dt is None:
            dt = _DTYPES.setdefault(dtype, np.dtype(dtype))
        end = offset + dt.itemsize * count
        if offset < 0 or count < 0 or end > self._size:
            raise _Problem(
                f"truncated or corrupted header: reading {count} x {dt.name} "
                f"({dt.itemsize * count} bytes) at offset {offset} goes past the end of the file ({self._size} bytes)"
            )
        arr = self._plain[offset:end].view(dt)
        order = self.byte_order if override_order is None else override_order
        return arr if order == "I" else arr.view(dt.newbyteorder(order))

    def _build_fields(self, offs: int, count: int) -> int:
        # gguf.GGUFReader._build_fields, except that an array read by the passes below keeps its
        # parts as an _ArrayParts (made on demand) in an _ArrayField (whose contents decode in one
        # pass): the same fields, parts, data indices and types.
        for _ in range(count):
            orig_offs = offs
            kv_klen, kv_kdata = self._get_str(offs)
            offs += int(kv_klen.nbytes + kv_kdata.nbytes)
            raw_kv_type = self._get(offs, np.uint32)
            offs += int(raw_kv_type.nbytes)
            head = [kv_klen, kv_kdata, raw_kv_type]
            field_size, field_parts, field_idxs, field_types = self._get_field_parts(offs, raw_kv_type[0])
            name = str(bytes(kv_kdata), encoding="utf-8")
            if isinstance(field_parts, _ArrayParts):
                field_parts.head[:0] = head
                data = list(range(field_idxs.start + len(head), field_idxs.stop + len(head), field_idxs.step))
                field: Any = _ArrayField(orig_offs, name, field_parts, data, field_types)
            else:
                field = gguf.ReaderField(orig_offs, name, head + field_parts, [i + len(head) for i in field_idxs], field_types)
            self._push_field(field, skip_sum=True)
            offs += field_size
        return offs

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, Any, Any, list[Any]]:
        # An array of strings (a tokenizer's tokens and merges: 400k entries for Llama 3) or of
        # numbers (token types, scores) in the host's byte order is read in one pass below;
        # everything else by the package's own method. The package's loop recurses once per entry
        # (an enum lookup, two reads and list bookkeeping each: 3.2 s of a Llama-3.2-1B file's
        # 4.7 s load); these give the same parts, made when asked for.
        if int(raw_type) == _ARRAY and self.byte_order == "I":
            raw_itype = self._get(orig_offs, np.uint32)
            itype = int(raw_itype[0])
            if itype == _STRING:
                return self._string_array_parts(orig_offs, raw_itype)
            scalar = self.gguf_scalar_to_np.get(itype)  # keyed by an IntEnum: an int finds it, an unknown type does not
            if scalar is not None:
                return self._scalar_array_parts(orig_offs, raw_itype, scalar)
        return super()._get_field_parts(orig_offs, raw_type)

    def _scalar_array_parts(self, orig_offs: int, raw_itype: np.ndarray, scalar: Any) -> tuple[int, Any, range, list[Any]]:
        """``gguf.GGUFReader._get_field_parts`` of an array of numbers (a tokenizer's token types
        and scores), part for part: ``[item type, length, one 1-element array per entry]``, data
        indices ``2, 3, ...``, types ``[ARRAY, item type]`` (``[ARRAY]`` when empty)."""
        alen = self._get(orig_offs + 4, np.uint64)
        n = int(alen[0])
        values = self._get(orig_offs + 12, scalar, n)  # bounds-checked; one view of every entry
        types = [gguf.GGUFValueType.ARRAY] + ([gguf.GGUFValueType(int(raw_itype[0]))] if n else [])
        return 12 + int(values.nbytes), _NumberParts([raw_itype, alen], values), range(2, n + 2), types

    def _string_array_parts(self, orig_offs: int, raw_itype: np.ndarray) -> tuple[int, Any, range, list[Any]]:
        """``gguf.GGUFReader._get_field_parts`` of an array of strings at ``orig_offs``, part for
        part: ``[item type, length, (string length, string bytes) per entry]``, the entries' data
        indices ``3, 5, 7, ...`` and types ``[ARRAY, STRING]`` (``[ARRAY]`` when empty). One pass
        finds where each string lies; the parts are views made when asked for."""
        alen = self._get(orig_offs + 4, np.uint64)
        n = int(alen[0])
        size, raw = self._size, memoryview(self._plain)
        starts: list[int] = []
        lengths: list[int] = []
        add_start, add_length = starts.append, lengths.append
        length_at = _HOST_U64.unpack_from  # the host's order: byte_order "I" (half the time of int.from_bytes on a slice)
        offs = orig_offs + 12
        for _ in range(n):
            end = offs + 8
            if end > size:
                self._get(offs, np.uint64)  # raises the bounds error, naming the offset
            (slen,) = length_at(raw, offs)
            if end + slen > size:
                self._get(end, np.uint8, slen)  # raises the bounds error
            add_start(end)
            add_length(slen)
            offs = end + slen
        types = [gguf.GGUFValueType.ARRAY] + ([gguf.GGUFValueType.STRING] if n else [])
        parts = _StringParts([raw_itype, alen], self._plain, np.array(starts, np.int64), np.array(lengths, np.int64))
        return offs - orig_offs, parts, range(3, 2 * n + 2, 2), types

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        size = int(self.data.shape[0])
        align = int(self.alignment)
        for fld in fields:
            _, name_data, _, dims, raw_dtype, offset_tensor = fld.parts
            name = bytes(name_data).decode("utf-8", errors="replace")
            raw = int(raw_dtype[0])
            try:
                qtype = gguf.GGMLQuantizationType(raw)
                block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise _Problem(f"tensor {name!r} has unknown GGML tensor type {raw}") from None
            ne = [int(d) for d in dims]
            shape = list(reversed(ne))
            if ne and ne[0] % block:
                raise _Problem(
                    f"tensor {name!r} ({qtype.name} {shape}): rows of {ne[0]} elements are not a whole "
                    f"number of {block}-element blocks"
                )
            nbytes = math.prod(ne) * type_size // block
            rel = int(offset_tensor[0])
            start = int(start_offs) + rel
            if rel % align:
                raise _Problem(f"tensor {name!r}: data offset {rel} is not a multiple of the file's alignment {align}")
            if start + nbytes > size:
                raise _Problem(
                    f"tensor {name!r} ({qtype.name} {shape}, {nbytes} bytes at offset {start}) extends past the "
                    f"end of the file ({size} bytes): the file is truncated or its header is corrupted"
                )
        super()._build_tensors(start_offs, fields)


def _explain(path: str, e: BaseException) -> str:
    if isinstance(e, _Problem):
        return str(e)
    msg = str(e)
    if msg == "GGUF magic invalid":
        with open(path, "rb") as f:
            head = f.read(4)
        return f"not a GGUF file: it starts with {head!r}, a GGUF file starts with b'GGUF'"
    m = re.search(r"version (\d+)", msg)
    if m and "handle" in msg:
        from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

        return (
            f"unsupported GGUF version {m.group(1)} (the gguf package reads versions "
            f"{', '.join(str(v) for v in READER_SUPPORTED_VERSIONS)})"
        )
    if "GGUFValueType" in msg:
        return f"corrupted metadata: {msg}"
    return f"cannot read the GGUF header: {type(e).__name__}: {msg}"


_CACHE: "OrderedDict[tuple[Any, ...], tuple[gguf.GGUFReader, MappedFile]]" = OrderedDict()
_CACHE_SIZE = 4
_LOCK = threading.Lock()


def clear_reader_cache() -> None:
    """Forgets the cached readers (their maps close once no array uses them)."""
    with _LOCK:
        _CACHE.clear()


def forget_reader(path: str | os.PathLike[str]) -> None:
    """Drops ``path``'s reader from the cache (nothing if it is not cached): its parsed metadata
    (two small arrays per tokenizer entry, about 55 MB for Llama 3's 128k tokens and 280k merges)
    is freed once nothing else holds the reader; arrays already read keep their map."""
    real = os.path.realpath(os.fspath(path))
    with _LOCK:
        for key in [k for k in _CACHE if k[0] == real]:
            del _CACHE[key]


def open_gguf(path: str | os.PathLike[str]) -> tuple[gguf.GGUFReader, MappedFile]:
    """The (cached) checked ``gguf.GGUFReader`` of ``path`` and its memory map.

    Raises:
        WeightsFileError: missing, empty, truncated or corrupted file; unknown version or tensor type.
    """
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise WeightsFileError(path, "no such file") from None
    except OSError as e:
        raise WeightsFileError(path, f"cannot open: {e.strerror or e}") from None
    if os.path.isdir(path):
        raise WeightsFileError(path, "is a directory, not a GGUF file")
    if st.st_size == 0:
        raise WeightsFileError(path, "is empty (0 bytes), not a GGUF file")
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    try:
        reader = _CheckedReader(path, "r")
        reader.path = path  # the file's name for messages of readers of its metadata (the tokenizer's)
    except OSError as e:
        raise WeightsFileError(path, f"cannot open: {e.strerror or e}") from None
    except Exception as e:
        raise WeightsFileError(path, _explain(path, e)) from None
    entry = (reader, MappedFile.from_memmap(path, reader.memmap))
    with _LOCK:
        _CACHE[key] = entry
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return entry


def _field_value(field: Any) -> Any:
    try:
        value = field.contents()
    except Exception:  # pragma: no cover - a field the package cannot decode
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value


class GGUFStore(WeightsStore):
    """The tensors of one GGUF file."""

    kind = "GGUF file"
    format_name = "gguf"

    def __init__(
        self,
        source: str | os.PathLike[str] | gguf.GGUFReader,
        *,
        tensors: Iterable[str] | None = None,
        allocated: dict[str, Any] | None = None,
        zero_copy: bool = False,
        lazy: bool = False,
    ):
        super().__init__(allocated)
        if isinstance(source, gguf.GGUFReader):
            self.reader = source
            memmap = getattr(source, "memmap", source.data)
            self.path = str(getattr(memmap, "filename", None) or "<GGUFReader>")
            self.mapped = MappedFile.from_memmap(self.path, memmap)
        else:
            self.path = os.fspath(source)
            self.reader, self.mapped = open_gguf(self.path)
        self.zero_copy = zero_copy
        self.lazy = lazy
        self.tensors = {t.name: t for t in self.reader.tensors}
        if tensors is not None:
            keep = set(tensors)
            unknown = sorted(keep - set(self.tensors))
            if unknown:
                raise ValueError(f"tensors names weights that are not in {self.path}: {unknown[:5]}")
            self.tensors = {k: v for k, v in self.tensors.items() if k in keep}
        self._metadata: dict[str, Any] | None = None

    # -- WeightsStore ------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self.tensors)

    def describe(self) -> str:
        return f"GGUF file ({self.path})"

    def missing(self, name: str) -> KeyError:
        if not name:
            return super().missing(name)
        names = self.sorted_names()
        under = select_prefix(names, name)
        if under:
            hint = f" It is a prefix of {len(under)} weight(s), e.g. {under[0]!r}: use .items() to list them."
        else:
            hint = did_you_mean(name, names)
        return KeyError(f"Could not find weight named {name} in {self.path}. Please check that the name is correct.{hint}")

    def layout(self, name: str) -> tuple[DType, np.dtype, tuple[int, ...], QuantizationEncoding | None, tuple[int, ...]]:
        """``(dtype, numpy dtype to read, stored shape, encoding, logical shape)`` of a tensor.

        Raises:
            WeightsFileError: a tensor type maxjax cannot load (names it and the supported ones).
        """
        t = self.tensors[name]
        logical = tuple(int(d) for d in reversed(t.shape.tolist()))
        swapped = self.reader.byte_order == "S"
        plain = GGUF_PLAIN_DTYPES.get(t.tensor_type)
        if plain is not None:
            np_dtype = plain.to_numpy().newbyteorder("S") if swapped else plain.to_numpy()
            return plain, np_dtype, logical, None, logical
        try:
            enc = QuantizationEncoding.from_gguf(t.tensor_type)
        except ValueError:
            supported = [e.value for e in QuantizationEncoding if e.is_gguf] + [k.name for k in GGUF_PLAIN_DTYPES]
            raise WeightsFileError(
                self.path,
                f"tensor {name!r} uses GGML type {t.tensor_type.name}, which maxjax cannot load "
                f"(supported: {', '.join(supported)})",
            ) from None
        if swapped:
            raise WeightsFileError(
                self.path, f"tensor {name!r}: quantized tensors of a byte-swapped (big-endian) GGUF are not supported"
            )
        rows = math.prod(logical[:-1]) if len(logical) > 1 else 1
        packed = enc.packed_shape((rows, logical[-1]))
        return DType.uint8, np.dtype(np.uint8), packed, enc, logical

    def load(self, name: str) -> WeightData:
        dtype, np_dtype, shape, enc, logical = self.layout(name)
        t = self.tensors[name]
        if self.lazy and len(shape) <= 2 and np_dtype.isnative:
            data = LazyTensor(self.mapped, int(t.data_offset), np_dtype, shape)
        else:
            data = _wrap_loaded(to_device(self.mapped, int(t.data_offset), np_dtype, shape, zero_copy=self.zero_copy))
        return WeightData(data, name, dtype, Shape(shape), enc, Shape(logical) if enc is not None else None)

    def make_weight(
        self,
        name: str,
        wd: WeightData,
        dtype: DType | None,
        shape: Iterable[Any] | None,
        quantization_encoding: Any,
        device: DeviceRef,
    ) -> Weight:
        if quantization_encoding is not None and quantization_encoding != wd.quantization_encoding:
            have = "not quantized" if wd.quantization_encoding is None else wd.quantization_encoding.value
            raise ValueError(
                f"Weight {name!r} in {self.path} is {have}, but quantization_encoding={quantization_encoding} "
                "was requested"
            )
        check_request(name, wd, dtype, shape)
        return Weight(name, wd.dtype, wd.shape, device, wd.quantization_encoding, align=1)

    def infos(self) -> list[TensorInfo]:
        out = []
        for name in self.sorted_names():
            t = self.tensors[name]
            logical = tuple(int(d) for d in reversed(t.shape.tolist()))
            plain = GGUF_PLAIN_DTYPES.get(t.tensor_type)
            dtype = plain.name if plain is not None else "uint8"
            enc = None if plain is not None else t.tensor_type.name
            out.append(TensorInfo(name, logical, dtype, enc, int(t.n_bytes), self.path, int(t.data_offset)))
        return out

    def file_list(self) -> list[str]:
        return [self.path]

    def file_metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            self._metadata = {k: _field_value(f) for k, f in self.reader.fields.items()}
        return self._metadata


class GGUFWeights(HierarchicalWeights):
    """Weights from a GGUF file (MAX's ``GGUFWeights``).

    Args:
        source: the file's path, or an open ``gguf.GGUFReader``.
        tensors: if given, only these tensor names are visible.
        prefix: the hierarchical name of this view (``""``: the root).
        allocated: the dict that collects allocated data (shared by every view).
        zero_copy: on the CPU, let arrays alias the mapped file instead of copying it (see
            :mod:`maxjax.graph.weights._host`).
        lazy: ``data()`` gives a :class:`~maxjax.graph.weights.lazy.LazyTensor` (rank 1 and 2)
            that reads only where it is indexed (a process of a multi-process run reads only the
            bytes of its own shards).

    ``data()`` of a quantized tensor is ``uint8 [rows, bytes_per_row]`` with
    ``quantization_encoding`` and the float ``original_shape``; of other tensors, the array in
    row-major shape. ``metadata`` gives the file's key/value fields.

    Raises:
        WeightsFileError: a missing, empty, truncated or corrupted file, an unknown GGUF version or
            tensor type (the message names the file, and the tensor or byte offset).
    """

    __slots__ = ()

    def __init__(
        self,
        source: str | os.PathLike[str] | gguf.GGUFReader,
        tensors: Iterable[str] | None = None,
        prefix: str = "",
        allocated: dict[str, Any] | None = None,
        *,
        zero_copy: bool = False,
        lazy: bool = False,
    ):
        super().__init__(GGUFStore(source, tensors=tensors, allocated=allocated, zero_copy=zero_copy, lazy=lazy), prefix)

    @property
    def metadata(self) -> dict[str, Any]:
        """The file's key/value fields as Python values (``{"llama.block_count": 30, ...}``)."""
        return self._store.file_metadata()

    @property
    def reader(self) -> gguf.GGUFReader:
        """The underlying ``gguf.GGUFReader``."""
        return self._store.reader

    @property
    def path(self) -> str:
        """The GGUF file's path."""
        return self._store.path
