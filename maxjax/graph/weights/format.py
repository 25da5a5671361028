"""``WeightsFormat``, ``weights_format`` and ``load_weights``: pick the reader for a set of files.

The format comes from the suffix (``.gguf``, ``.safetensors``, ``.safetensors.index.json``) and,
when the suffix says nothing, from the contents: GGUF's magic bytes, or the ``safetensors`` package
accepting the file. A directory is an orbax checkpoint, a sharded safetensors checkpoint, or holds
exactly one GGUF file.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any, Sequence

from maxjax.graph.weights.errors import WeightsFileError

__all__ = ["WeightsFormat", "weights_format", "load_weights", "detect_format"]

_GGUF_MAGIC = b"GGUF"


class WeightsFormat(str, enum.Enum):
    """A checkpoint format (MAX's ``WeightsFormat``; ``orbax`` is maxjax's addition)."""

    gguf = "gguf"
    safetensors = "safetensors"
    orbax = "orbax"


def _sniff(path: str) -> WeightsFormat:
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == _GGUF_MAGIC:
        return WeightsFormat.gguf
    import safetensors

    try:
        safetensors.safe_open(path, framework="numpy")
        return WeightsFormat.safetensors
    except Exception:
        pass
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        raise WeightsFileError(
            path, "looks like a PyTorch checkpoint (zip/pickle), which maxjax does not read: convert it to safetensors"
        )
    if not head:
        raise WeightsFileError(path, "is empty (0 bytes)")
    raise WeightsFileError(
        path, f"unknown weights format: it starts with {head!r}, neither a GGUF nor a valid safetensors file"
    )


def detect_format(path: str | os.PathLike[str]) -> WeightsFormat:
    """The format of one file or directory.

    A path that does not exist is an orbax checkpoint if a save to it was killed while swapping
    the new checkpoint in (see :func:`~maxjax.graph.weights.orbax.resolve_checkpoint`).

    Raises:
        ValueError: the path does not exist (a :class:`WeightsFileError`), or the format is unknown.
    """
    from maxjax.graph.weights.orbax import is_orbax_checkpoint, resolve_checkpoint

    p = os.fspath(path)
    if not os.path.exists(p):
        if is_orbax_checkpoint(resolve_checkpoint(p)):  # a save was killed while swapping it in
            return WeightsFormat.orbax
        raise WeightsFileError(p, "no such file or directory")
    if os.path.isdir(p):
        if is_orbax_checkpoint(p):
            return WeightsFormat.orbax
        d = Path(p)
        if any(d.glob("*.safetensors")) or any(d.glob("*.safetensors.index.json")):
            return WeightsFormat.safetensors
        if any(d.glob("*.gguf")):
            return WeightsFormat.gguf
        raise WeightsFileError(p, "directory holds no orbax checkpoint, safetensors or GGUF files")
    name = p.lower()
    if name.endswith(".gguf"):
        return WeightsFormat.gguf
    if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
        return WeightsFormat.safetensors
    return _sniff(p)


def weights_format(weight_paths: Sequence[str | os.PathLike[str]]) -> WeightsFormat:
    """The one format of ``weight_paths`` (MAX's ``weights_format``).

    Raises:
        ValueError: an empty list, a missing path, an unknown format, or paths of different formats.
    """
    if isinstance(weight_paths, (str, os.PathLike)):
        weight_paths = [weight_paths]
    if not weight_paths:
        raise ValueError("no weight files given: weights_format needs at least one path")
    formats = {os.fspath(p): detect_format(p) for p in weight_paths}
    kinds = set(formats.values())
    if len(kinds) > 1:
        listing = ", ".join(f"{os.path.basename(p)} ({f.value})" for p, f in formats.items())
        raise ValueError(f"weight files of different formats cannot be loaded together: {listing}")
    return kinds.pop()


def _gguf_file(path: str) -> str:
    if os.path.isdir(path):
        found = sorted(str(x) for x in Path(path).glob("*.gguf"))
        if len(found) != 1:
            raise ValueError(f"{path}: holds {len(found)} GGUF files; give the one to load")
        return found[0]
    return path


def load_weights(paths: Sequence[str | os.PathLike[str]], **kwargs: Any) -> Any:
    """A ``Weights`` source for ``paths`` (MAX's ``load_weights``).

    Safetensors: one or many files, an index, or a directory -> :class:`SafetensorWeights`. GGUF:
    exactly one file -> :class:`GGUFWeights`. An orbax checkpoint directory -> :class:`OrbaxWeights`.
    ``kwargs`` go to that class (``zero_copy=True``; ``target=`` for orbax).

    Raises:
        ValueError: an empty list, a missing file, mixed formats, an unknown format, several GGUF
            files or orbax checkpoints; a :class:`WeightsFileError` (a ``ValueError``) for a file
            that cannot be read.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    fmt = weights_format(paths)
    if fmt is WeightsFormat.safetensors:
        from maxjax.graph.weights.safetensors import SafetensorWeights

        return SafetensorWeights(paths, **kwargs)
    if len(paths) != 1:
        raise ValueError(f"{fmt.value}: exactly one path can be loaded, got {len(paths)}: {paths}")
    if fmt is WeightsFormat.gguf:
        from maxjax.graph.weights.gguf import GGUFWeights

        return GGUFWeights(_gguf_file(paths[0]), **kwargs)
    from maxjax.graph.weights.orbax import OrbaxWeights

    return OrbaxWeights(paths[0], **kwargs)
