"""From bytes of a memory-mapped file to a device array, with one copy and little memory.

Both readers (safetensors, GGUF) keep each file memory-mapped; :func:`to_device` turns the bytes
of one tensor into a ``jax.Array`` on the default device:

- copy (the default): the bytes are copied once, in chunks, into a fresh 64-byte aligned host
  buffer that the CPU backend then adopts without a second copy; after each chunk the file's
  pages are dropped from this process's resident set (``madvise(MADV_DONTNEED)``; they stay in
  the OS page cache). Peak memory is the arrays plus one chunk, and the arrays no longer depend
  on the file.
- ``zero_copy=True`` (CPU only): the array *is* the mapped file (JAX adopts read-only, 64-byte
  aligned host memory without copying). Nothing is read until the array is used and pages can
  be evicted under memory pressure, but the file must not be modified or truncated while such
  arrays live: the OS then kills the process with SIGBUS. Tensors whose bytes are not 64-byte
  aligned in the file (GGUF aligns to 32, safetensors to 8) are copied as in the default mode.

Dtypes that JAX cannot hold exactly (64-bit kinds without ``jax_enable_x64``) come back as a
read-only NumPy array instead, so no value is silently narrowed.
"""

from __future__ import annotations

import math
import mmap
from typing import Any, Sequence

import jax
import numpy as np

__all__ = ["MappedFile", "aligned_empty", "to_device", "jax_holds_exactly"]

_ALIGN = 64  # JAX's CPU client adopts host buffers aligned to 64 bytes without copying
_CHUNK = 8 << 20  # bytes copied between two releases of the file's pages
_PAGE = mmap.PAGESIZE


class MappedFile:
    """A read-only memory map of one file, seen as a flat ``uint8`` NumPy array.

    Args:
        path: the file (only used in messages).
        array: the whole file as a read-only ``uint8`` array backed by the map.
        mm: the ``mmap.mmap`` behind ``array`` (for releasing pages), or None.
    """

    __slots__ = ("path", "array", "_mm", "_closed", "_units")

    def __init__(self, path: str, array: np.ndarray, mm: mmap.mmap | None = None):
        self.path = path
        self.array = array
        self._mm = mm
        self._closed = False
        self._units: dict[Any, Any] = {}

    def units(self, device: Any = None, unit: int = 32) -> Any:
        """The whole file as a read-only uint8 ``jax.Array`` ``[size // unit, unit]`` on ``device``
        (a CPU device; None: the default one) that *is* the map: adopted without a copy, made
        once per device (the ``mapped`` quantized layout reads weights out of it in place).

        Returns None where that cannot be: another platform (its memory is not the host's), a
        map that does not start on a 64-byte boundary, a closed or empty map, or a device that
        copied instead of adopting (checked by address), so a caller never holds a second copy
        of a whole file.
        """
        if self._closed or self._mm is None or self.size < unit:
            return None
        device = device if device is not None else jax.devices()[0]
        if getattr(device, "platform", None) != "cpu" or self.array.ctypes.data % _ALIGN:
            return None
        key = (device, unit)
        if key not in self._units:
            host = self.array[: self.size // unit * unit].reshape(-1, unit)
            out = jax.device_put(host, device)
            self._units[key] = out if out.unsafe_buffer_pointer() == host.ctypes.data else None
        return self._units[key]

    @classmethod
    def open(cls, path: str) -> "MappedFile":
        """Maps ``path`` read-only (an empty file gives an empty array).

        Raises:
            OSError: the file cannot be opened or mapped.
        """
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size == 0:
                return cls(path, np.zeros(0, np.uint8), None)
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return cls(path, np.frombuffer(mm, dtype=np.uint8), mm)

    @classmethod
    def from_memmap(cls, path: str, memmap: np.ndarray) -> "MappedFile":
        """Wraps a ``numpy.memmap`` of a whole file (as ``gguf.GGUFReader`` makes)."""
        return cls(path, memmap.view(np.ndarray), getattr(memmap, "_mmap", None))

    @property
    def size(self) -> int:
        return int(self.array.shape[0])

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        """The bytes ``[offset, offset + nbytes)`` as a read-only ``uint8`` view (no copy).

        Raises:
            WeightsFileError: the range is outside the file, the file has shrunk since it was
                mapped (reading it would kill the process with SIGBUS), or the map was closed.
        """
        from maxjax.graph.weights.errors import WeightsFileError

        if self._closed:
            raise WeightsFileError(self.path, "the weights were closed; open them again to read")
        end = offset + nbytes
        if offset < 0 or end > self.size:
            raise WeightsFileError(self.path, f"bytes [{offset}, {end}) are outside the file ({self.size} bytes)")
        if self._mm is not None and nbytes:
            try:
                now = self._mm.size()  # fstat of the mapped file: did someone truncate it?
            except (OSError, ValueError):  # pragma: no cover
                now = None
            if now is not None and now < end:
                raise WeightsFileError(
                    self.path,
                    f"the file shrank to {now} bytes since it was opened ({self.size} bytes); bytes "
                    f"[{offset}, {end}) are gone: reopen it",
                )
        return self.array[offset:end]

    def release(self, offset: int, nbytes: int) -> None:
        """Drops the whole pages of ``[offset, offset + nbytes)`` from this process's resident set.

        The data stays in the page cache and is read again (from there) if touched.
        """
        mm = self._mm
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if mm is None or advice is None or mm.closed:
            return
        start = -(-offset // _PAGE) * _PAGE
        stop = (offset + nbytes) // _PAGE * _PAGE
        if stop > start:
            try:
                mm.madvise(advice, start, stop - start)
            except (OSError, ValueError):  # pragma: no cover - best effort
                pass

    def close(self) -> None:
        """Unmaps the file, unless arrays still use the map (it then goes when they do)."""
        mm, self._mm = self._mm, None
        self._closed = True
        self._units = {}
        self.array = np.zeros(0, np.uint8)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass


def jax_holds_exactly(dtype: np.dtype) -> bool:
    """True when JAX keeps ``dtype`` as it is (False for 64-bit kinds unless x64 is enabled)."""
    try:
        return jax.dtypes.canonicalize_dtype(dtype) == dtype
    except TypeError:
        return False


_BIG = 2 << 20  # buffers this large and larger are maps of their own


def aligned_empty(nbytes: int) -> np.ndarray:
    """A fresh, writable ``uint8`` host buffer of ``nbytes``, 64-byte aligned (so that JAX's CPU
    client adopts it without a copy).

    A buffer of 2 MiB or more is an anonymous memory map of its own (page aligned; its memory goes
    back to the system as soon as the last view of it is freed, whatever malloc's thresholds).
    It is not advised for transparent huge pages: with THP's ``defrag`` in its default
    ``madvise`` mode, an advised fault compacts memory synchronously when no free 2 MiB block is
    at hand, and loading Llama-3.2-1B-shaped bfloat16 safetensors as float32 (4.9 GB of fresh
    buffers) took 2.5-10 s with the advice against 0.7-1.9 s without, after other files had
    filled the page cache (2-core Zen 5; decode speed within 2% either way; GGUF loads, read in
    place, 0.38-0.39 s both ways).
    """
    if nbytes >= _BIG and hasattr(mmap, "MAP_ANONYMOUS"):
        region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return np.frombuffer(region, np.uint8)  # keeps the map alive as long as a view of it lives
    buf = np.empty(nbytes + _ALIGN, np.uint8)
    start = (-buf.ctypes.data) % _ALIGN
    return buf[start : start + nbytes]


def _default_is_cpu() -> bool:
    return jax.devices()[0].platform == "cpu"


def to_device(
    mapped: MappedFile,
    offset: int,
    dtype: np.dtype,
    shape: Sequence[int],
    *,
    zero_copy: bool = False,
) -> Any:
    """The tensor of ``dtype``/``shape`` stored at byte ``offset`` of ``mapped``.

    Returns a ``jax.Array`` on the default device, or a read-only ``numpy.ndarray`` for dtypes JAX
    would narrow (see the module docstring for the copy and zero-copy modes).

    Raises:
        WeightsFileError: the bytes are outside the file, or the file shrank since it was mapped.
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    src = mapped.view(offset, nbytes)
    exact = jax_holds_exactly(dtype.newbyteorder("="))
    if not dtype.isnative:  # pragma: no cover - big-endian hosts only: always byte-swap a copy
        zero_copy = False
    if exact and zero_copy and _default_is_cpu() and src.ctypes.data % _ALIGN == 0:
        return jax.device_put(src.view(dtype).reshape(shape))  # adopted as it is: no copy
    if exact and dtype.isnative and not _default_is_cpu():
        out = jax.device_put(src.view(dtype).reshape(shape))  # one host-to-device copy
        out.block_until_ready()
        mapped.release(offset, nbytes)
        return out
    dst = aligned_empty(nbytes)
    for start in range(0, nbytes, _CHUNK):
        stop = min(start + _CHUNK, nbytes)
        np.copyto(dst[start:stop], src[start:stop])
        mapped.release(offset + start, stop - start)
    host = dst.view(dtype)
    if not dtype.isnative:  # pragma: no cover - big-endian hosts only
        host = host.astype(dtype.newbyteorder("="))
    host = host.reshape(shape)
    host.flags.writeable = False
    if exact:
        return jax.device_put(host)  # adopts the aligned read-only buffer: no second copy
    return host
