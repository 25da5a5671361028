"""``SafetensorWeights``: Weights from one or many safetensors files (MAX's class of that name).

Each file is checked by the ``safetensors`` package (``safe_open`` validates the header: sizes,
offsets, dtypes, coverage of the file) when the weights are created; after that the file is held
open once, as a read-only memory map, and nothing more is read until ``data()``/``allocate()``.

Tensor data is taken straight from the map at the offsets of the header that ``safe_open`` has
just validated (read with ``json``; cross-checked against ``safe_open``'s names, dtypes and
shapes), rather than through ``safe_open(...).get_tensor``: that call copies every tensor (the
map's pages plus a copy: twice the memory) and cannot return the float8 kinds as NumPy arrays.
See :mod:`maxjax.graph.weights._host` for the copy and zero-copy modes.

A sharded checkpoint is given as its ``*.safetensors.index.json`` (or the shard files, or the
directory holding them): the index's ``weight_map`` is checked against the shards' headers.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import safetensors

from maxjax.dtype import DType
from maxjax.graph.type import DeviceRef, Shape
from maxjax.graph.weight import Weight
from maxjax.graph.weights._host import MappedFile, to_device
from maxjax.graph.weights.lazy import LazyTensor
from maxjax.graph.weights.errors import WeightsFileError
from maxjax.graph.weights.protocol import HierarchicalWeights, WeightsStore
from maxjax.graph.weights.summary import TensorInfo
from maxjax.graph.weights.weight_data import WeightData, _wrap_loaded

__all__ = ["SafetensorWeights", "SAFETENSORS_DTYPES", "expand_safetensors_paths", "read_index"]

#: safetensors header dtype codes -> DType (the codes ``safe_open(...).get_slice(n).get_dtype()`` gives).
SAFETENSORS_DTYPES: dict[str, DType] = {
    "BOOL": DType.bool,
    "U8": DType.uint8,
    "I8": DType.int8,
    "U16": DType.uint16,
    "I16": DType.int16,
    "U32": DType.uint32,
    "I32": DType.int32,
    "U64": DType.uint64,
    "I64": DType.int64,
    "F16": DType.float16,
    "BF16": DType.bfloat16,
    "F32": DType.float32,
    "F64": DType.float64,
    "F8_E4M3": DType.float8_e4m3fn,
    "F8_E4M3FNUZ": DType.float8_e4m3fnuz,
    "F8_E5M2": DType.float8_e5m2,
    "F8_E5M2FNUZ": DType.float8_e5m2fnuz,
    "F8_E8M0": DType.float8_e8m0fnu,
}
_INDEX_SUFFIX = ".safetensors.index.json"


@dataclass(frozen=True)
class _Entry:
    """Where one tensor's bytes are: file index, absolute byte range, dtype code and shape."""

    file: int
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class _File:
    """One validated, memory-mapped safetensors file."""

    def __init__(self, path: str):
        self.path = path
        try:
            handle = safetensors.safe_open(path, framework="numpy")
        except FileNotFoundError:
            raise WeightsFileError(path, "no such file") from None
        except IsADirectoryError:
            raise WeightsFileError(path, "is a directory, not a safetensors file") from None
        except OSError as e:
            raise WeightsFileError(path, f"cannot open: {e.strerror or e}") from None
        except Exception as e:  # safetensors.SafetensorError and friends
            raise WeightsFileError(path, f"not a valid safetensors file: {_diagnose(path, str(e))}") from None
        self.mapped = MappedFile.open(path)
        header, data_start = _read_header(self.mapped)
        self.metadata: dict[str, str] = dict(header.pop("__metadata__", None) or {})
        self.entries: dict[str, _Entry] = {}
        names = set(handle.keys())
        if names != set(header):
            raise WeightsFileError(path, "the header's tensor names disagree with the safetensors package's")
        for name, info in header.items():
            begin, end = (int(x) for x in info["data_offsets"])
            entry = _Entry(-1, str(info["dtype"]), tuple(int(d) for d in info["shape"]), data_start + begin, data_start + end)
            view = handle.get_slice(name)
            if view.get_dtype() != entry.dtype or tuple(view.get_shape()) != entry.shape:
                raise WeightsFileError(path, f"tensor {name!r}: the header disagrees with the safetensors package")
            self.entries[name] = entry
        del handle  # one open handle per file: the map

    def close(self) -> None:
        self.mapped.close()


def _read_header(mapped: MappedFile) -> tuple[dict[str, Any], int]:
    """The JSON header (already validated by ``safe_open``) and where the tensor data starts."""
    n = int.from_bytes(bytes(mapped.array[:8]), "little")
    return json.loads(bytes(mapped.array[8 : 8 + n])), 8 + n


def _diagnose(path: str, library_message: str) -> str:
    """Says what is wrong with a file ``safe_open`` rejected (sizes, offsets), where it can."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if size < 8:
                return f"the file has {size} bytes, fewer than the 8-byte header length (safetensors: {library_message})"
            n = int.from_bytes(head, "little")
            if n > size - 8:
                return (
                    f"the header length field says {n} bytes but only {size - 8} bytes follow it "
                    f"(truncated, or not a safetensors file) (safetensors: {library_message})"
                )
            header = json.loads(f.read(n))
    except Exception:
        return f"{library_message} (file size {os.path.getsize(path) if os.path.exists(path) else '?'} bytes)"
    if not isinstance(header, dict):
        return library_message
    available = size - 8 - n
    furthest = 0
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
            dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        except Exception:
            return f"tensor {name!r} has a malformed header entry {info!r} (safetensors: {library_message})"
        furthest = max(furthest, end)
        if dtype is not None:
            need = math.prod(shape) * dtype.size_in_bytes
            if end - begin != need:
                return (
                    f"tensor {name!r} ({info['dtype']} {shape}) needs {need} bytes but its data_offsets "
                    f"[{begin}, {end}] span {end - begin} (safetensors: {library_message})"
                )
        if end > available:
            return (
                f"tensor {name!r} ends at byte {end} of the data section, but the file holds only {available} "
                f"bytes of data after the {n}-byte header (truncated?) (safetensors: {library_message})"
            )
    if furthest != available:
        return (
            f"the header describes {furthest} bytes of tensor data but the file holds {available} "
            f"(safetensors: {library_message})"
        )
    return library_message


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def read_index(path: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The ``weight_map`` (tensor name -> shard path) and ``metadata`` of a sharded checkpoint's
    ``*.safetensors.index.json``.

    A shard must be named by a relative path that stays in the index's directory. Symlinks may
    lead only into that directory or into the one the index file itself really lives in (the
    Hugging Face cache links an index and its shards alike into ``blobs/``), so an index cannot
    make the loader read a file from elsewhere.

    Raises:
        WeightsFileError: the index is missing, unreadable, not JSON, or has no ``weight_map``
            object; ``metadata`` is not an object; a ``weight_map`` value is not a file name, is
            absolute, or leads out of the index's directory (naming the tensor and the path).
    """
    try:
        with open(path, "rb") as f:
            index = json.loads(f.read())
    except FileNotFoundError:
        raise WeightsFileError(path, "no such file") from None
    except IsADirectoryError:
        raise WeightsFileError(path, "is a directory, not a safetensors index") from None
    except OSError as e:
        raise WeightsFileError(path, f"cannot open: {e.strerror or e}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise WeightsFileError(path, f"not a safetensors index: not valid JSON ({e})") from None
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        found = type(index.get("weight_map") if isinstance(index, dict) else index).__name__
        raise WeightsFileError(path, f"not a safetensors index (needs a 'weight_map' object, found {found})")
    meta = index.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise WeightsFileError(path, f"the index's 'metadata' is not an object (found {type(meta).__name__})")
    base = os.path.dirname(os.path.abspath(path))
    roots = (os.path.realpath(base), os.path.dirname(os.path.realpath(path)))
    shards: dict[str, str] = {}
    for name, shard in index["weight_map"].items():
        if not isinstance(shard, str) or not shard.strip() or "\x00" in shard:
            raise WeightsFileError(path, f"weight_map gives tensor {name!r} the shard {shard!r}, which is not a file name")
        if os.path.isabs(shard):
            raise WeightsFileError(
                path, f"weight_map gives tensor {name!r} the absolute shard path {shard!r}; shards are named relative to the index"
            )
        full = os.path.normpath(os.path.join(base, shard))
        if not _inside(full, base):
            raise WeightsFileError(path, f"weight_map gives tensor {name!r} the shard path {shard!r}, which leads out of {base}")
        real = os.path.realpath(full)
        if not any(_inside(real, root) for root in roots):
            raise WeightsFileError(
                path, f"weight_map gives tensor {name!r} the shard path {shard!r}, a link to {real}, outside {base}"
            )
        shards[name] = full
    return shards, dict(meta or {})


def expand_safetensors_paths(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[str], dict[str, str] | None, dict[str, Any]]:
    """Shard files of ``paths`` (files, ``*.safetensors.index.json``, directories).

    Returns ``(files, weight_map or None, index metadata)``. A directory stands for its index file
    if it has exactly one, else for its ``*.safetensors`` files.

    Raises:
        WeightsFileError: a missing path, an unreadable index (see :func:`read_index`), an index
            naming missing shards, or a directory without safetensors files.
    """
    files: list[str] = []
    weight_map: dict[str, str] | None = None
    meta: dict[str, Any] = {}
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            indexes = sorted(Path(p).glob("*" + _INDEX_SUFFIX))
            if len(indexes) == 1:
                p = str(indexes[0])
            else:
                shards = sorted(str(x) for x in Path(p).glob("*.safetensors"))
                if not shards:
                    raise WeightsFileError(p, "directory has no *.safetensors files")
                files.extend(shards)
                continue
        if p.endswith(".json"):
            shard_map, index_meta = read_index(p)
            weight_map = dict(weight_map or {})
            weight_map.update(shard_map)
            for name, shard in shard_map.items():
                shown = os.path.relpath(shard, os.path.dirname(os.path.abspath(p)))
                if not os.path.exists(shard):
                    raise WeightsFileError(p, f"names shard {shown!r} (for tensor {name!r}), which does not exist")
                if os.path.isdir(shard):
                    raise WeightsFileError(p, f"names shard {shown!r} (for tensor {name!r}), which is a directory")
                if shard not in files:
                    files.append(shard)
            meta.update(index_meta)
        else:
            files.append(p)
    return files, weight_map, meta


class SafetensorsStore(WeightsStore):
    """The tensors of a set of safetensors files."""

    kind = "Safetensor checkpoint"
    format_name = "safetensors"

    def __init__(
        self,
        filepaths: Sequence[str | os.PathLike[str]],
        *,
        tensors: Iterable[str] | None = None,
        tensors_to_file_idx: Mapping[str, int] | None = None,
        allocated: dict[str, Any] | None = None,
        zero_copy: bool = False,
        lazy: bool = False,
    ):
        super().__init__(allocated)
        if isinstance(filepaths, (str, os.PathLike)):
            filepaths = [filepaths]
        paths, index_map, self.index_metadata = expand_safetensors_paths(filepaths)
        if not paths:
            raise ValueError("SafetensorWeights needs at least one file")
        self.zero_copy = zero_copy
        self.lazy = lazy
        self.files: list[_File] = []
        self.entries: dict[str, _Entry] = {}
        try:
            for i, path in enumerate(paths):
                f = _File(path)
                self.files.append(f)
                for name, e in f.entries.items():
                    if name in self.entries:
                        other = self.files[self.entries[name].file].path
                        raise WeightsFileError(path, f"tensor {name!r} is also in {other}")
                    self.entries[name] = _Entry(i, e.dtype, e.shape, e.begin, e.end)
        except BaseException:
            self.close()
            raise
        if index_map is not None:
            self._check_index(index_map)
        if tensors_to_file_idx is not None:
            for name, idx in tensors_to_file_idx.items():
                e = self.entries.get(name)
                if e is None or e.file != idx:
                    raise ValueError(
                        f"tensors_to_file_idx says {name!r} is in file {idx}, but it is "
                        f"{'in no file' if e is None else f'in file {e.file} ({self.files[e.file].path})'}"
                    )
        if tensors is not None:
            keep = set(tensors)
            unknown = sorted(keep - set(self.entries))
            if unknown:
                raise ValueError(f"tensors names weights that are not in the checkpoint: {unknown[:5]}")
            self.entries = {k: v for k, v in self.entries.items() if k in keep}

    def _check_index(self, index_map: dict[str, str]) -> None:
        for name, shard in index_map.items():
            e = self.entries.get(name)
            if e is None or os.path.abspath(self.files[e.file].path) != os.path.abspath(shard):
                where = "no shard" if e is None else self.files[e.file].path
                raise WeightsFileError(shard, f"the index puts tensor {name!r} here, but it is in {where}")
        extra = sorted(set(self.entries) - set(index_map))
        if extra:
            raise WeightsFileError(self.files[self.entries[extra[0]].file].path, f"tensors missing from the index: {extra[:5]}")

    # -- WeightsStore ------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self.entries)

    def describe(self) -> str:
        if len(self.files) == 1:
            return f"Safetensor checkpoint ({self.files[0].path})"
        return f"Safetensor checkpoint ({len(self.files)} files, first {self.files[0].path})"

    def _dtype(self, name: str) -> DType:
        e = self.entries[name]
        dtype = SAFETENSORS_DTYPES.get(e.dtype)
        if dtype is None:
            raise WeightsFileError(
                self.files[e.file].path,
                f"tensor {name!r} has dtype {e.dtype}, which maxjax cannot load "
                f"(supported: {', '.join(SAFETENSORS_DTYPES)})",
            )
        return dtype

    def load(self, name: str, *, as_bytes: bool = False) -> WeightData:
        e = self.entries[name]
        dtype = self._dtype(name)
        f = self.files[e.file]
        if dtype is DType.bool:
            raw = f.mapped.view(e.begin, e.end - e.begin)
            if raw.size and int(raw.max()) > 1:
                bad = int(np.argmax(raw > 1))
                raise WeightsFileError(
                    f.path, f"bool tensor {name!r} holds byte {int(raw[bad])} at offset {e.begin + bad} (must be 0 or 1)"
                )
        if as_bytes:
            np_dtype, shape = np.dtype(np.uint8), _byte_shape(e.shape, dtype)
            dtype = DType.uint8
        else:
            np_dtype, shape = dtype.to_numpy().newbyteorder("<"), e.shape
        if self.lazy and len(shape) in (1, 2) and np_dtype.isnative and dtype is not DType.bool:
            return WeightData(LazyTensor(f.mapped, e.begin, np_dtype, tuple(shape)), name, dtype, Shape(shape))
        data = to_device(f.mapped, e.begin, np_dtype, shape, zero_copy=self.zero_copy)
        return WeightData(_wrap_loaded(data), name, dtype, Shape(shape))

    def infos(self) -> list[TensorInfo]:
        out = []
        for name in self.sorted_names():
            e = self.entries[name]
            dtype = SAFETENSORS_DTYPES.get(e.dtype)
            out.append(
                TensorInfo(name, e.shape, dtype.name if dtype else e.dtype, None, e.end - e.begin, self.files[e.file].path, e.begin)
            )
        return out

    def file_list(self) -> list[str]:
        return [f.path for f in self.files]

    def file_metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = dict(self.index_metadata)
        for f in self.files:
            for k, v in f.metadata.items():
                meta.setdefault(k, v)
        return meta

    def close(self) -> None:
        for f in self.files:
            f.close()


def _byte_shape(shape: tuple[int, ...], dtype: DType) -> tuple[int, ...]:
    if not shape:
        return (dtype.size_in_bytes,)
    return (*shape[:-1], shape[-1] * dtype.size_in_bytes)


class SafetensorWeights(HierarchicalWeights):
    """Weights from safetensors files (MAX's ``SafetensorWeights``).

    Args:
        filepaths: safetensors files, a ``*.safetensors.index.json`` of a sharded checkpoint, or a
            directory holding either (a single path is accepted too).
        tensors: if given, only these tensor names are visible.
        tensors_to_file_idx: optional name -> file index map (checked against the files).
        prefix: the hierarchical name of this view (``""``: the root).
        allocated: the dict that collects allocated data (shared by every view).
        zero_copy: on the CPU, let arrays alias the mapped file instead of copying it (see
            :mod:`maxjax.graph.weights._host`: faster, but the file must then stay unchanged).
        lazy: ``data()`` gives rank-1 and rank-2 tensors as a
            :class:`~maxjax.graph.weights.lazy.LazyTensor` (read when placed, straight from the
            map, and convertible on read with ``cast_on_read``; the file must stay unchanged).

    ``data()`` gives the tensor as stored (any safetensors dtype maxjax has a ``DType`` for:
    bool, all ints, float16/32/64, bfloat16, the float8 kinds) in a ``WeightData`` whose ``data``
    is a :class:`~maxjax.driver.Buffer` (a NumPy array for 64-bit kinds without x64).

    Raises:
        WeightsFileError: a file is missing, truncated, corrupted or not safetensors (the message
            names the file, and the tensor or the sizes that are wrong); a tensor is in two files;
            an index disagrees with its shards.
        ValueError: no files.
    """

    __slots__ = ()

    def __init__(
        self,
        filepaths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
        *,
        tensors: Iterable[str] | None = None,
        tensors_to_file_idx: Mapping[str, int] | None = None,
        prefix: str = "",
        allocated: dict[str, Any] | None = None,
        zero_copy: bool = False,
        lazy: bool = False,
    ):
        store = SafetensorsStore(
            filepaths,
            tensors=tensors,
            tensors_to_file_idx=tensors_to_file_idx,
            allocated=allocated,
            zero_copy=zero_copy,
            lazy=lazy,
        )
        super().__init__(store, prefix)

    @property
    def metadata(self) -> dict[str, Any]:
        """The files' ``__metadata__`` (and a sharded index's ``metadata``), merged."""
        return self._store.file_metadata()

    @property
    def filepaths(self) -> list[str]:
        """The safetensors files, in the order they were given."""
        return [f.path for f in self._store.files]

    def allocate(
        self,
        dtype: DType | None = None,
        shape: Iterable[Any] | None = None,
        quantization_encoding: Any = None,
        device: DeviceRef = DeviceRef.CPU(),
    ) -> Weight:
        """As :meth:`HierarchicalWeights.allocate` (the Weight has ``align=1``, as in MAX).

        Raises:
            ValueError: a ``quantization_encoding`` is given (safetensors holds no GGUF blocks), or
                ``dtype``/``shape`` differ from the tensor's.
            KeyError: no tensor has this name.
        """
        if quantization_encoding is not None:
            raise ValueError(
                f"Cannot allocate {self._prefix!r} with quantization_encoding={quantization_encoding}: "
                "safetensors weights are not GGUF-quantized"
            )
        return super().allocate(dtype, shape, None, device)

    def allocate_as_bytes(self, dtype: DType | None = None) -> Weight:
        """A ``uint8`` Weight holding the tensor's raw bytes: the last dim times the item size
        (a scalar becomes ``[itemsize]``); the bytes go into ``allocated_weights``.

        Raises:
            KeyError: no tensor has this name.
            ValueError: ``dtype`` is given and is not the tensor's.
        """
        if self._prefix not in self._store:
            raise self._store.missing(self._prefix)
        real = self._store._dtype(self._prefix)
        if dtype is not None and DType.of(dtype) != real:
            raise ValueError(f"Weight {self._prefix!r} has dtype {real!r}, not {DType.of(dtype)!r}")
        wd = self._store.load(self._prefix, as_bytes=True)
        weight = Weight(self._prefix, DType.uint8, wd.shape, DeviceRef.CPU(), align=1)
        self._store.allocated[self._prefix] = wd.data
        return weight

    def close(self) -> None:
        """Releases the files' memory maps (arrays already loaded stay valid)."""
        self._store.close()

    def __enter__(self) -> "SafetensorWeights":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
