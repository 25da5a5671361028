"""The host CPU's instruction-set features, read once from the operating system.

On Linux they are the ``flags`` (x86) or ``Features`` (Arm) line of ``/proc/cpuinfo``; elsewhere
the set is empty (and the CPU policy takes its portable choices). Benchmarks record
:func:`cpu_vector_features` beside every figure, since a tuning that wins with AVX-512 can lose
with AVX2 only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

__all__ = ["cpu_features", "cpu_vector_features", "native_isa", "release_freed_heap", "VECTOR_FEATURE_PREFIXES"]

#: flags that say what vector units the CPU has (x86 AVX/AMX families, Arm NEON/SVE)
VECTOR_FEATURE_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4", "asimd", "neon", "sve", "sme")


@functools.lru_cache(maxsize=None)
def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (``{"avx2", "avx512f", ...}``), or an empty set where unknown.

    Args:
        cpuinfo: the file to read (``/proc/cpuinfo``; a test passes a copy of another machine's).
    """
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_vector_features() -> dict[str, object]:
    """The machine and its vector features, for benchmark records:
    ``{"machine": "x86_64", "vector_features": ["avx", "avx2", ...]}``."""
    flags = cpu_features()
    return {
        "machine": platform.machine(),
        "vector_features": sorted(f for f in flags if f.startswith(VECTOR_FEATURE_PREFIXES)),
    }


def native_isa(flags: frozenset[str]) -> str | None:
    """The instruction set maxjax's CPU kernels (:mod:`maxjax.backend.kernels`) are built for on
    a CPU with ``flags``: ``"avx512"`` (F, BW), ``"avx2"`` (with FMA and F16C), or None (none)."""
    if {"avx512f", "avx512bw", "f16c"} <= flags:
        return "avx512"
    if {"avx2", "fma", "f16c"} <= flags:
        return "avx2"
    return None


@functools.lru_cache(maxsize=None)
def _malloc_trim() -> "ctypes._CFuncPtr | None":
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_heap() -> bool:
    """Gives the pages of memory the process has freed back to the operating system: glibc keeps
    freed blocks in its arenas (one per thread that allocated), where they stay resident.
    XLA's compiler frees most of what it allocates when a compile ends (tens to a hundred MB);
    ``malloc_trim(0)`` (glibc 2.8 and later) releases them. Costs a few tens of milliseconds.

    Returns:
        Whether memory was released (False where the C library has no ``malloc_trim``).
    """
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
