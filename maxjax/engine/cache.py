"""JAX's persistent compilation cache, turned on for maxjax programs."""

from __future__ import annotations

import os

import jax

__all__ = ["enable_compilation_cache"]


def enable_compilation_cache(path: str | None = None) -> str:
    """Turns on JAX's persistent on-disk compilation cache for every program compiled after this.

    A later process compiling the same program (same graph, shapes, devices and JAX version)
    loads it from disk instead of compiling (MAX users ask for this: modular/max#166).

    Args:
        path: the cache folder (default: ``$MAXJAX_CACHE_DIR`` or ``~/.cache/maxjax/jax``).

    Returns:
        The folder used.
    """
    folder = path or os.environ.get("MAXJAX_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "maxjax", "jax")
    os.makedirs(folder, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
