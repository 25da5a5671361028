"""The architectures ``load_model`` knows, each one :class:`Architecture` registered by its folder.

Adding an architecture (Qwen2, Mistral, ...) is a folder of its own under ``maxjax/models/`` with
its config, weight-name adapter and model builder, which calls :func:`register` in its
``__init__``; ``maxjax/models/__init__.py`` imports the folder. Nothing else changes: the loaders
find the architecture here by the GGUF ``general.architecture`` or the Hugging Face
``architectures`` of a checkpoint.

A config must give ``vocab_size``, ``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``
and ``max_position_embeddings`` (the KV cache and context are sized from them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["Architecture", "register", "architectures", "for_gguf", "for_hf_config", "for_module", "read_hf_config"]
__all__ += ["EncoderArchitecture", "register_encoder", "encoder_architectures", "encoder_for_hf_config"]


@dataclass(frozen=True)
class Architecture:
    """What maxjax needs to load and run one causal-LM architecture.

    Attributes:
        name: the registry name (``"llama"``).
        gguf_architectures: GGUF ``general.architecture`` values it loads.
        hf_architectures: Hugging Face ``architectures`` / ``model_type`` values it loads.
        config_from_gguf: ``(GGUFWeights, source) -> config`` (raises ValueError naming the key).
        config_from_hf: ``(config.json dict, source) -> config``.
        weights_from_gguf: ``(GGUFWeights, config) -> {module name: WeightData}``.
        weights_from_hf: ``(Weights, config, dtype) -> {module name: WeightData}``, the float
            tensors in ``dtype`` (the DType the model loads in).
        build: ``(config, dtype, weights_dtype=float32) -> Module`` with unloaded weights (float
            ones in ``weights_dtype``; activations and KV cache in ``dtype``), called as
            ``module(tokens, positions, k_cache, v_cache, last_index) -> (logits, k_cache, v_cache)``.
        module_class: the class ``build`` returns (to find the architecture of a module).
        config_to_hf: ``(config, **extra) -> config.json dict`` (for export; None: not exportable).
        weights_to_hf: ``({module name: array}, config) -> {Hugging Face name: array}`` (for export).
    """

    name: str
    gguf_architectures: tuple[str, ...]
    hf_architectures: tuple[str, ...]
    config_from_gguf: Callable[[Any, str], Any]
    config_from_hf: Callable[[Mapping[str, Any], str], Any]
    weights_from_gguf: Callable[[Any, Any], dict[str, Any]]
    weights_from_hf: Callable[[Any, Any, Any], dict[str, Any]]
    build: Callable[..., Any]
    module_class: type | None = None
    config_to_hf: Callable[..., dict[str, Any]] | None = None
    weights_to_hf: Callable[[Mapping[str, Any], Any], dict[str, Any]] | None = None


_REGISTRY: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    """Adds ``arch`` (replacing one of the same name); returns it.

    Raises:
        ValueError: another registered architecture already claims one of its GGUF or Hugging
            Face names.
    """
    for other in _REGISTRY.values():
        if other.name == arch.name:
            continue
        clash = set(other.gguf_architectures) & set(arch.gguf_architectures) or set(other.hf_architectures) & set(
            arch.hf_architectures
        )
        if clash:
            raise ValueError(f"architecture {arch.name!r}: {sorted(clash)} already belong to {other.name!r}")
    _REGISTRY[arch.name] = arch
    return arch


def architectures() -> list[str]:
    """The registered architectures' names."""
    return sorted(_REGISTRY)


def for_gguf(general_architecture: Any, source: str) -> Architecture:
    """The architecture for a GGUF's ``general.architecture``.

    Raises:
        ValueError: none is registered for it (naming it and the supported ones).
    """
    for arch in _REGISTRY.values():
        if general_architecture in arch.gguf_architectures:
            return arch
    supported = sorted(a for arch in _REGISTRY.values() for a in arch.gguf_architectures)
    raise ValueError(f"{source}: unsupported architecture {general_architecture!r} (supported: {', '.join(supported)})")


def for_hf_config(cfg: Mapping[str, Any], source: str) -> Architecture:
    """The architecture for a Hugging Face ``config.json`` (its ``architectures`` or ``model_type``).

    Raises:
        ValueError: none is registered for it (naming it and the supported ones).
    """
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{source}: must be a JSON object, got a {type(cfg).__name__}")
    names = cfg.get("architectures") or [cfg.get("model_type")]
    if not isinstance(names, list):
        names = [names]
    for arch in _REGISTRY.values():
        if any(n in arch.hf_architectures for n in names):
            return arch
    supported = sorted(a for arch in _REGISTRY.values() for a in arch.hf_architectures)
    raise ValueError(f"{source}: unsupported architecture {names} (supported: {', '.join(supported)})")


def for_module(module: Any) -> Architecture:
    """The architecture whose ``build`` makes modules of ``module``'s class.

    Raises:
        ValueError: none does (naming the class and the registered architectures).
    """
    for arch in _REGISTRY.values():
        if arch.module_class is not None and isinstance(module, arch.module_class):
            return arch
    raise ValueError(f"no registered architecture builds a {type(module).__name__} (registered: {', '.join(architectures())})")


def read_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A Hugging Face ``config.json``: UTF-8 text holding one JSON object.

    Raises:
        ValueError: unreadable, not UTF-8, not JSON, or not a JSON object (one line naming the file).
    """
    try:
        text = Path(path).read_bytes().decode("utf-8")
        cfg = json.loads(text)
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    except ValueError as e:  # json.JSONDecodeError
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        kind = "null" if cfg is None else f"a {'list' if isinstance(cfg, list) else type(cfg).__name__}"
        raise ValueError(f"{path}: must be a JSON object, got {kind}")
    return cfg


@dataclass(frozen=True)
class EncoderArchitecture:
    """What maxjax needs to load one sentence-encoder architecture (``load_encoder``).

    Attributes:
        name: the registry name (``"bert"``).
        hf_architectures: Hugging Face ``architectures`` / ``model_type`` values it loads.
        load: ``(model directory) -> encoder`` with ``embed(texts, batch_size=...) -> [n, dim]``.
    """

    name: str
    hf_architectures: tuple[str, ...]
    load: Callable[[Path], Any]


_ENCODERS: dict[str, EncoderArchitecture] = {}


def register_encoder(arch: EncoderArchitecture) -> EncoderArchitecture:
    """Adds the encoder architecture ``arch`` (replacing one of the same name); returns it.

    Raises:
        ValueError: another registered encoder already claims one of its Hugging Face names.
    """
    for other in _ENCODERS.values():
        clash = set(other.hf_architectures) & set(arch.hf_architectures) if other.name != arch.name else set()
        if clash:
            raise ValueError(f"encoder architecture {arch.name!r}: {sorted(clash)} already belong to {other.name!r}")
    _ENCODERS[arch.name] = arch
    return arch


def encoder_architectures() -> list[str]:
    """The registered encoder architectures' names."""
    return sorted(_ENCODERS)


def encoder_for_hf_config(cfg: Mapping[str, Any], source: str) -> EncoderArchitecture:
    """The encoder architecture for a Hugging Face ``config.json`` (its ``architectures`` or
    ``model_type``).

    Raises:
        ValueError: none is registered for it (naming it and the supported ones).
    """
    names = cfg.get("architectures") or [cfg.get("model_type")]
    names = names if isinstance(names, list) else [names]
    for arch in _ENCODERS.values():
        if any(n in arch.hf_architectures for n in names):
            return arch
    supported = sorted(a for arch in _ENCODERS.values() for a in arch.hf_architectures)
    raise ValueError(f"{source}: {names} is not a sentence-encoder architecture (supported: {', '.join(supported)})")
