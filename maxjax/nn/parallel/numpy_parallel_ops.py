"""``ParallelArrayOps``: NumPy concatenation split over a thread pool (MAX's
``max.nn.parallel.numpy_parallel_ops``).

``np.copyto`` releases the GIL, so copies of the inputs (or of chunks of large inputs) into one
preallocated output run on several cores at once. The algorithm, checks and chunking heuristic
are MAX 26.7's (``max/nn/parallel/numpy_parallel_ops.py``).
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Sequence

import numpy as np

from maxjax.driver import Buffer, Device

__all__ = ["ParallelArrayOps"]


class ParallelArrayOps:
    """Thread-parallel array operations (MAX's ``ParallelArrayOps``).

    Args:
        accelerator: where :meth:`concatenate` puts its results (MAX: a pinned host buffer of
            that accelerator; maxjax: a buffer on it). ``None``: a host buffer.
        max_workers: threads of the pool.

    Raises:
        ValueError: ``accelerator`` is a host device (MAX's check).
    """

    def __init__(self, accelerator: Device | None = None, max_workers: int = 24) -> None:
        if accelerator is not None and accelerator.is_host:
            raise ValueError("Unable to allocate pinned memory on CPU. A provided device must be a GPU.")
        self._accelerator = accelerator
        self._pool = ThreadPoolExecutor(max_workers=max_workers)
        self._max_workers = max_workers
        self._shutdown = False
        self._shutdown_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, self._finalize_shutdown, self._pool, self._shutdown_lock)

    @staticmethod
    def _finalize_shutdown(pool: ThreadPoolExecutor, shutdown_lock: threading.Lock) -> None:
        with shutdown_lock:
            pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self) -> None:
        try:
            self.shutdown(wait=False)
        except Exception:  # noqa: BLE001 - interpreter teardown: nothing to report to
            pass

    def shutdown(self, wait: bool = True) -> None:
        """Shuts the pool down (``wait=False``: pending copies are cancelled). Idempotent."""
        with self._shutdown_lock:
            if self._shutdown:
                return
            self._shutdown = True
            self._pool.shutdown(wait=wait, cancel_futures=not wait)

    def concatenate(self, arrays: Sequence[np.ndarray], axis: int = 0, min_chunk_size_mb: float = 50.0) -> Buffer:
        """``np.concatenate(arrays, axis)`` as a :class:`~maxjax.driver.Buffer`, copied in parallel.

        Each input is one copy task; with fewer inputs than workers, an input is split along
        ``axis`` into up to ``max_workers // len(arrays)`` chunks of at least ``min_chunk_size_mb``
        MiB. Always a copy, even of one array (as NumPy).

        Raises:
            ValueError: no arrays, or arrays of different dtypes or of shapes differing off ``axis``
                (MAX's messages).
            IndexError: ``axis`` out of range.
            RuntimeError: the pool has been shut down.
        """
        n = len(arrays)
        if n == 0:
            raise ValueError("Cannot concatenate empty list of arrays.")
        first = arrays[0]
        shape, dtype = first.shape, first.dtype
        if axis < 0:
            axis += len(shape)
        if not 0 <= axis < len(shape):
            raise IndexError(f"axis {axis} is out of bounds for array of dimension {len(shape)}")
        if n == 1:
            return self._place(np.array(first, copy=True))
        offsets = [0] * (n + 1)
        for i, arr in enumerate(arrays):
            if arr.dtype != dtype:
                raise ValueError(f"All arrays must have the same dtype. arrays[0]={dtype}, arrays[{i}]={arr.dtype}")
            if arr.shape[:axis] != shape[:axis] or arr.shape[axis + 1 :] != shape[axis + 1 :]:
                dim = next(d for d in range(len(shape)) if d != axis and arr.shape[d] != shape[d])
                raise ValueError(
                    "All arrays must have same shape except along concat axis. "
                    f"Dimension {dim}: arrays[0]={shape[dim]}, arrays[{i}]={arr.shape[dim]}"
                )
            offsets[i + 1] = offsets[i] + arr.shape[axis]
        arrays = [a if a.flags["C_CONTIGUOUS"] else np.ascontiguousarray(a) for a in arrays]
        out_shape = list(shape)
        out_shape[axis] = offsets[n]
        out = np.empty(out_shape, dtype)  # [..., sum of the inputs' sizes along axis, ...]

        def along(start: int, stop: int) -> tuple[slice, ...]:
            return tuple(slice(start, stop) if d == axis else slice(None) for d in range(len(shape)))

        min_chunk_bytes = min_chunk_size_mb * 1024 * 1024
        per_array = max(1, self._max_workers // n)
        work = []
        for i, arr in enumerate(arrays):
            num_chunks = min(per_array, max(1, int(arr.nbytes / min_chunk_bytes))) if per_array > 1 else 1
            if num_chunks >= 2 and arr.nbytes / num_chunks >= min_chunk_bytes:
                size = arr.shape[axis]
                step = -(-size // num_chunks)
                for s in range(0, size, step):
                    e = min(s + step, size)
                    work.append((arr, along(s, e), along(offsets[i] + s, offsets[i] + e)))
            else:
                work.append((arr, along(0, arr.shape[axis]), along(offsets[i], offsets[i + 1])))
        futures = [self._pool.submit(self._copy_array_slice, out, src, s, d) for src, s, d in work]
        for f in as_completed(futures):
            f.result()
        return self._place(out)

    def _place(self, out: np.ndarray) -> Buffer:
        host = Buffer.from_numpy(out)  # shares out's memory
        return host if self._accelerator is None else host.to(self._accelerator)

    @staticmethod
    def _copy_array_slice(
        out: np.ndarray, src: np.ndarray, src_slice: tuple[slice, ...], dst_slice: tuple[slice, ...]
    ) -> None:
        """Copies ``src[src_slice]`` into ``out[dst_slice]`` (a worker's task; releases the GIL)."""
        np.copyto(out[dst_slice], src[src_slice])
