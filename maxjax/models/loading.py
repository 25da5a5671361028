"""``load_model``: a model file, directory or cached repo id -> a ready :class:`CausalLM`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from maxjax.dtype import DType
from maxjax.models.causal_lm import CausalLM

__all__ = ["load_model", "resolve_model_path"]


def resolve_model_path(model: str | os.PathLike[str] | None) -> Path:
    """The file or directory for ``model``: None (the bundled SmolLM2 GGUF), a GGUF file, a model
    directory, or a Hugging Face repo id found in the local Hugging Face cache.

    Raises:
        FileNotFoundError: nothing by that name (the message says where it looked).
    """
    from maxjax._bundled import smollm2_gguf_path

    if model is None:
        return smollm2_gguf_path()
    p = Path(model).expanduser()
    if p.exists():
        return p
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/")):
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
        repo = hub / ("models--" + text.replace("/", "--"))
        snapshots = sorted((repo / "snapshots").glob("*"), key=lambda s: s.stat().st_mtime) if repo.is_dir() else []
        for snap in reversed(snapshots):
            if (snap / "config.json").exists() or list(snap.glob("*.gguf")):
                return snap
        raise FileNotFoundError(f"model {text!r}: not a file or directory, and not in the Hugging Face cache at {hub}")
    raise FileNotFoundError(f"model {text!r}: no such file or directory")


def load_model(
    model: str | os.PathLike[str] | None = None,
    *,
    dtype: DType = DType.float32,
    progress: bool = False,
    quantized_layout: str | None = None,
    policy: Any = None,
    mesh: Any = None,
    mesh_axes: tuple[str, str] = ("dp", "tp"),
) -> CausalLM:
    """Loads a model for generation: a GGUF file, a Hugging Face directory (or repo id in the local
    cache), or with no argument the bundled SmolLM2-135M-Instruct (Q4_1 GGUF).

    ``quantized_layout`` is how a GGUF's quantized weights are kept in memory (see
    :class:`CausalLM`; None: the backend policy's choice for the platform), ``policy`` the
    :class:`~maxjax.backend.BackendPolicy` (None: the default backend's); ``mesh`` a
    ``jax.sharding.Mesh`` to run tensor parallel over its ``mesh_axes[1]`` axis and data parallel
    over ``mesh_axes[0]`` (see :class:`CausalLM`).

    Raises:
        FileNotFoundError: no such model.
        ValueError: an unknown format or an unsupported architecture.
    """
    path = resolve_model_path(model)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").exists():
            return CausalLM.from_pretrained_dir(path, dtype, progress, quantized_layout, policy, mesh, mesh_axes)
        if len(ggufs) == 1:
            path = ggufs[0]
        else:
            raise ValueError(f"{path}: neither a Hugging Face model directory (config.json) nor a folder with one .gguf")
    from maxjax.graph.weights import WeightsFormat, weights_format

    fmt = weights_format([path])
    if fmt is not WeightsFormat.gguf:
        raise ValueError(f"{path}: a {fmt.value} file alone cannot be generated from; pass its model directory")
    return CausalLM.from_gguf(path, dtype, progress, quantized_layout, policy, mesh, mesh_axes)
