"""``LazyTensor``: a tensor of a memory-mapped file that is read only where it is indexed.

A multi-process run places each weight's shards from the file on the devices of the process
that owns them (``maxjax.engine.placement``): indexing a ``LazyTensor`` copies out of the map only
the rows and columns it selects, so a process reads the bytes of its own shards and no others.
Every copy is counted per file (:func:`bytes_read`), which is how tests and the sharding
benchmark check it.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from maxjax.graph.weights._host import MappedFile

__all__ = ["LazyTensor", "bytes_read", "host_indexable", "reset_bytes_read"]

_READ: dict[str, int] = {}
_LOCK = threading.Lock()


def bytes_read(path: str | None = None) -> int:
    """Bytes this process has copied out of ``path`` (every file when None) through LazyTensors."""
    with _LOCK:
        return sum(_READ.values()) if path is None else _READ.get(path, 0)


def reset_bytes_read() -> None:
    """Sets the counters of :func:`bytes_read` to zero."""
    with _LOCK:
        _READ.clear()


class LazyTensor:
    """A rank-1 or rank-2 tensor at ``offset`` of a mapped file (row-major), read when indexed.

    ``tensor[rows, cols]`` (rows: an int, slice or integer array; cols: an int or slice) copies
    just those elements; ``np.asarray(tensor)`` copies all of it. :meth:`take_rows` reorders rows
    without reading anything.

    Args:
        mapped: the file's map.
        offset: the tensor's first byte in the file.
        dtype: the stored NumPy dtype.
        shape: the stored shape (rank 1 or 2).
        rows: a row order over the stored rows (None: as stored).
        as_dtype: the dtype it is read as (converted while it is copied out of the map, e.g.
            bfloat16 widened to float32); None: ``dtype``. ``.dtype`` is this one.
    """

    __slots__ = ("mapped", "offset", "dtype", "stored_dtype", "_stored_shape", "rows")

    def __init__(self, mapped: MappedFile, offset: int, dtype: Any, shape: tuple[int, ...], rows: np.ndarray | None = None,
                 as_dtype: Any = None):  # fmt: skip
        if len(shape) not in (1, 2):
            raise ValueError(f"LazyTensor reads rank-1 and rank-2 tensors, got shape {shape}")
        self.mapped, self.offset, self.stored_dtype = mapped, int(offset), np.dtype(dtype)
        self.dtype = self.stored_dtype if as_dtype is None else np.dtype(as_dtype)
        self._stored_shape = tuple(int(d) for d in shape)
        self.rows = None if rows is None else np.asarray(rows, np.int64)

    @property
    def shape(self) -> tuple[int, ...]:
        n = self._stored_shape[0] if self.rows is None else len(self.rows)
        return (n, *self._stored_shape[1:])

    @property
    def ndim(self) -> int:
        return len(self._stored_shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def take_rows(self, index: Any) -> "LazyTensor":
        """The tensor with its rows in the order ``index`` (nothing is read)."""
        index = np.asarray(index, np.int64)
        rows = index if self.rows is None else self.rows[index]
        return LazyTensor(self.mapped, self.offset, self.stored_dtype, self._stored_shape, rows, self.dtype)

    def cast_on_read(self, dtype: Any, narrowing: bool = False) -> "LazyTensor":
        """The tensor read as ``dtype`` (nothing is read now; each read converts as it copies,
        rounding to nearest even where ``dtype`` is narrower).

        ``narrowing``: allow a float dtype narrower than the stored one (float32 to bfloat16,
        asked for by loading a model in bfloat16); without it only widening conversions, which
        lose nothing, are done.

        Raises:
            ValueError: ``dtype`` or the stored dtype is not a float dtype (bfloat16 included), or
                ``dtype`` is narrower than the stored one without ``narrowing``.
        """
        dtype = np.dtype(dtype)
        floats = dtype.kind in "fV" and self.stored_dtype.kind in "fV"
        if not floats or (dtype.itemsize < self.stored_dtype.itemsize and not narrowing):
            raise ValueError(f"cast_on_read: {self.stored_dtype} -> {dtype} is not a widening float conversion")
        return LazyTensor(self.mapped, self.offset, self.stored_dtype, self._stored_shape, self.rows, dtype)

    def _stored(self) -> np.ndarray:
        n = int(np.prod(self._stored_shape)) * self.stored_dtype.itemsize
        return self.mapped.view(self.offset, n).view(self.stored_dtype).reshape(self._stored_shape)

    def __getitem__(self, idx: Any) -> np.ndarray:
        if not isinstance(idx, tuple):
            idx = (idx,)
        rows, rest = idx[0], idx[1:]
        if self.rows is not None:
            rows = self.rows[rows]
        out = np.array(self._stored()[(rows, *rest)], dtype=self.dtype)  # copies (and converts) only what is selected
        self._count_read(out.size * self.stored_dtype.itemsize)
        return out

    def read_into(self, out: np.ndarray) -> np.ndarray:
        """Copies the whole tensor into ``out`` (a writable array of its shape and dtype, e.g. one
        layer of a preallocated stack): one copy out of the map, no temporary; then drops the
        file's pages from this process's resident set (they stay in the page cache).

        Raises:
            ValueError: ``out`` has another shape or dtype.
        """
        if tuple(out.shape) != self.shape or out.dtype != self.dtype:
            raise ValueError(f"read_into: out is {out.dtype}{list(out.shape)}, the tensor is {self.dtype}{list(self.shape)}")
        stored = self._stored()
        if self.rows is None:
            np.copyto(out, stored, casting="same_kind")  # a widening cast_on_read converts here, in the one copy
        elif self.stored_dtype == self.dtype:
            np.take(stored, self.rows, axis=0, out=out)
        else:
            for i, r in enumerate(self.rows):
                np.copyto(out[i], stored[r], casting="same_kind")
        self.done_reading()
        return out

    def source(self) -> tuple[np.ndarray, np.ndarray | None]:
        """For a reader that converts as it copies (the host layout conversion,
        :func:`maxjax.backend.kernels.layouts.convert_layers`): the stored array, a read-only view
        of the map (nothing is read yet), and the stored row of each of the tensor's rows (None:
        the stored order). Call :meth:`done_reading` once it is read."""
        return self._stored(), self.rows

    def in_place(self) -> np.ndarray | None:
        """The whole tensor as a read-only view of the map (nothing is read now; counted as read),
        where it needs no conversion or row order; else None. The view keeps the map open; the
        file must not be modified or truncated while it lives (the OS then kills the process
        with SIGBUS)."""
        if self.rows is not None or self.dtype != self.stored_dtype:
            return None
        view = self._stored()
        self._count_read(view.nbytes)
        return view

    def _count_read(self, nbytes: int) -> None:
        """Adds ``nbytes`` to this file's :func:`bytes_read`."""
        with _LOCK:
            _READ[self.mapped.path] = _READ.get(self.mapped.path, 0) + nbytes

    def done_reading(self) -> None:
        """Counts the tensor as read and drops the file's pages under it from this process's
        resident set (they stay in the page cache)."""
        self._count_read(int(np.prod(self.shape)) * self.stored_dtype.itemsize)
        self.mapped.release(self.offset, int(np.prod(self._stored_shape)) * self.stored_dtype.itemsize)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def to_numpy(self) -> np.ndarray:
        """The whole tensor (read now)."""
        return self[:]

    def __repr__(self) -> str:
        cast = "" if self.dtype == self.stored_dtype else f" read as {self.dtype}"
        return f"LazyTensor({self.stored_dtype}{cast}, {list(self.shape)}, {self.mapped.path}@{self.offset})"


def host_indexable(value: Any) -> Any:
    """A host array of a stored value that can be indexed without reading the rest: a
    ``WeightData``'s data, a LazyTensor or NumPy array as they are, anything else as a NumPy copy."""
    from maxjax.driver import to_host_array
    from maxjax.graph.weights.weight_data import WeightData

    if isinstance(value, (np.ndarray, LazyTensor)):
        return value
    data = value.data if isinstance(value, WeightData) else value
    if isinstance(data, (np.ndarray, LazyTensor)):
        return data
    return to_host_array(data)
