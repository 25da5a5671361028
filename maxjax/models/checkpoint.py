"""A model module from a checkpoint: a GGUF file or a Hugging Face directory, by its architecture.

The one place a checkpoint becomes a module with its weights loaded: ``CausalLM.from_gguf`` and
``from_pretrained_dir`` run generation on it, ``maxjax inspect --mesh`` shows how it would sit on a
mesh.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from maxjax.dtype import DType
from maxjax.models.registry import for_gguf, for_hf_config

__all__ = ["module_from_gguf", "module_from_pretrained_dir"]


def module_from_gguf(path: str | os.PathLike[str], dtype: DType = DType.float32, *, lazy: bool = False) -> tuple[Any, Any, Any]:
    """``(module, config, weights)`` of a GGUF of a registered architecture: the module built for
    its config with the file's weights loaded (quantized ones packed, as in the file).

    Args:
        lazy: load :class:`~maxjax.graph.weights.lazy.LazyTensor` values that read only where
            indexed (on a mesh each process then reads its own shards).

    Raises:
        ValueError: an unsupported architecture (naming it and the supported ones), or a file
            that cannot be read.
    """
    from maxjax.graph.weights import GGUFWeights

    weights = GGUFWeights(path, lazy=lazy)
    arch = for_gguf(weights.metadata.get("general.architecture"), str(path))
    config = arch.config_from_gguf(weights, str(path))
    module = arch.build(config, dtype)
    module.load_state_dict(arch.weights_from_gguf(weights, config), override_quantization_encoding=True, weight_alignment=1)
    return module, config, weights


def module_from_pretrained_dir(directory: str | os.PathLike[str], dtype: DType = DType.float32) -> tuple[Any, Any]:
    """``(module, config)`` of a Hugging Face model directory (``config.json``, ``*.safetensors``).

    Raises:
        ValueError: a missing ``config.json``, no safetensors, or an unsupported architecture.
    """
    from maxjax.graph.weights import load_weights

    d = Path(directory)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{d}: no config.json (a Hugging Face model directory needs one)")
    cfg = json.loads(cfg_path.read_text())
    arch = for_hf_config(cfg, str(cfg_path))
    config = arch.config_from_hf(cfg, str(cfg_path))
    files = sorted(str(p) for p in d.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{d}: no *.safetensors files")
    module = arch.build(config, dtype)
    module.load_state_dict(arch.weights_from_hf(load_weights(files), config), weight_alignment=1)
    return module, config
