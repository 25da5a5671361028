"""A model module from a checkpoint: a GGUF file or a Hugging Face directory, by its architecture.

The one place a checkpoint becomes a module with its weights loaded: ``CausalLM.from_gguf`` and
``from_pretrained_dir`` run generation on it, ``maxjax inspect --mesh`` shows how it would sit on a
mesh. Opening a checkpoint checks everything (metadata, config, tensors against the config) before
any module is built.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from maxjax.dtype import DType
from maxjax.models.registry import Architecture, for_gguf, for_hf_config, read_hf_config

__all__ = [
    "float_weights_dtype", "kept_16bit_weights", "module_from_gguf", "module_from_pretrained_dir", "open_gguf_checkpoint",
    "open_hf_checkpoint",
]  # fmt: skip


def float_weights_dtype(stored: Any, dtype: DType, policy: Any = None, mesh: Any = None) -> DType:
    """The DType a Hugging Face checkpoint's float weights load in, for a model whose activations
    are ``dtype``: ``dtype``, except that a float32 model keeps a checkpoint whose float tensors
    are all bfloat16 (or all float16) in that dtype where the backend policy's
    ``keep_16bit_weights`` holds and it runs on one device (each product then widens the weights
    exactly: float32 arithmetic, half the memory).

    Args:
        stored: the checkpoint's tensor dtypes (NumPy-style names, ``"bfloat16"``, ``"float32"``,
            or safetensors' ``"BF16"``, ``"F16"``, ...).
        dtype: the model's DType.
        policy: the backend policy, platform or device (None: JAX's default backend's).
        mesh: the mesh the model runs on, or None.
    """
    kept = {_HALF_NAMES.get(str(s).lower()) for s in stored}
    if len(kept) == 1 and None not in kept and _keeps_16bit(dtype, policy, mesh):
        return kept.pop()
    return dtype


#: a checkpoint's 16-bit float dtype names (NumPy-style and safetensors') -> DType
_HALF_NAMES = {"bfloat16": DType.bfloat16, "bf16": DType.bfloat16, "float16": DType.float16, "f16": DType.float16}


def _keeps_16bit(dtype: DType, policy: Any, mesh: Any) -> bool:
    """Whether a model of activations ``dtype`` keeps 16-bit float weights as stored: a float32
    model on one device, where the backend policy's ``keep_16bit_weights`` holds."""
    from maxjax.backend import policy_for

    return dtype == DType.float32 and mesh is None and policy_for(policy).keep_16bit_weights


def kept_16bit_weights(state: dict[str, Any], policy: Any = None, mesh: Any = None, dtype: DType = DType.float32) -> dict[str, Any]:
    """A GGUF checkpoint's state for a model whose activations are ``dtype``: its bfloat16 and
    float16 tensors kept as they are for a float32 model where the backend policy's
    ``keep_16bit_weights`` holds on one device, else converted in their one copy out of the map:
    widened to float32 for a float32 model, to ``dtype`` for a 16-bit one (a bfloat16 model
    rounds F16 values to bfloat16, as it rounds a float32 Hugging Face file)."""
    from maxjax.models.llama.checks import cast_float_weight

    keep = _keeps_16bit(dtype, policy, mesh)
    target = DType.float32 if dtype == DType.float32 else dtype
    return {
        k: wd if keep or not _is_half(getattr(wd, "dtype", None)) else cast_float_weight(wd, target) for k, wd in state.items()
    }


def _is_half(dtype: Any) -> bool:
    """Whether ``dtype`` is a 16-bit float DType (bfloat16, float16: what maxjax's kernel widens
    exactly, ``keep_16bit_weights``)."""
    return isinstance(dtype, DType) and dtype.is_half()


def open_gguf_checkpoint(path: str | os.PathLike[str], *, lazy: bool = False) -> tuple[Architecture, Any, Any]:
    """``(architecture, config, weights)`` of a GGUF of a registered architecture, its metadata
    checked against its tensors.

    Args:
        lazy: the weights read only where indexed (:class:`~maxjax.graph.weights.lazy.LazyTensor`):
            on a mesh each process then reads its own shards.

    Raises:
        ValueError: an unsupported architecture (naming it and the supported ones), a file that
            cannot be read, or metadata that disagrees with the tensors (naming the key or tensor).
    """
    from maxjax.graph.weights import GGUFWeights

    weights = GGUFWeights(path, lazy=lazy)
    arch = for_gguf(weights.metadata.get("general.architecture"), str(path))
    config = arch.config_from_gguf(weights, str(path))  # checks the metadata against the tensors
    return arch, config, weights


def open_hf_checkpoint(
    directory: str | os.PathLike[str], *, lazy: bool = False, dtype: DType = DType.float32, policy: Any = None, mesh: Any = None
) -> tuple[Architecture, Any, dict[str, Any]]:
    """``(architecture, config, state)`` of a Hugging Face model directory (``config.json``,
    ``*.safetensors``), the tensors checked against the config, float ones in
    :func:`float_weights_dtype` (``dtype``, the DType the model loads in; or a bfloat16 file's
    own bfloat16 for a float32 model, where ``policy`` keeps it and there is no ``mesh``).

    ``lazy``: tensors are read from the map when placed (one copy, converted on the way where the
    file's dtype is not ``dtype``, e.g. bfloat16 to float32; none where it is and the layout allows),
    not when opened.

    Raises:
        ValueError: a missing or bad ``config.json``, no safetensors, an unsupported architecture,
            or tensors that disagree with the config.
    """
    from maxjax.graph.weights import load_weights

    d = Path(directory)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{d}: no config.json (a Hugging Face model directory needs one)")
    cfg = read_hf_config(cfg_path)
    arch = for_hf_config(cfg, str(cfg_path))
    config = arch.config_from_hf(cfg, str(cfg_path))
    files = sorted(str(p) for p in d.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{d}: no *.safetensors files")
    from maxjax.graph.weights import summarize

    weights = load_weights(files, lazy=lazy)
    weights_dtype = float_weights_dtype({i.dtype for i in summarize(weights).tensors}, dtype, policy, mesh)
    return arch, config, arch.weights_from_hf(weights, config, weights_dtype)  # checks the tensors against the config


def build(arch: Architecture, config: Any, state: dict[str, Any], dtype: DType = DType.float32, *, quantized: bool) -> Any:
    """The architecture's module for ``config`` with ``state`` loaded (quantized GGUF weights take
    their values' packed dtype, shape and encoding; a float checkpoint's weights are built in the
    dtype ``open_hf_checkpoint`` gave them: ``dtype``, or bfloat16 kept for a float32 model; a
    GGUF's float tensors stay float32)."""
    if quantized:
        module = arch.build(config, dtype)
        for name, weight in module.raw_state_dict().items():  # F16/BF16 matrices kept as in the file
            kept = getattr(state.get(name), "dtype", None)
            if _is_half(kept) and weight.dtype != kept:
                weight.retype(None, kept, weight.shape)
    else:
        kept = {wd.dtype for wd in state.values()}  # see float_weights_dtype
        module = arch.build(config, dtype, weights_dtype=kept.pop() if len(kept) == 1 and _is_half(next(iter(kept))) else dtype)
    module.load_state_dict(state, override_quantization_encoding=quantized, weight_alignment=1)
    return module


def module_from_gguf(
    path: str | os.PathLike[str], dtype: DType = DType.float32, *, lazy: bool = False, policy: Any = None, mesh: Any = None
) -> tuple[Any, Any, Any]:
    """``(module, config, weights)``: :func:`open_gguf_checkpoint` and the module built with its
    weights (quantized ones packed, as in the file; F16/BF16 matrices as :func:`kept_16bit_weights`
    says for ``policy`` and ``mesh``)."""
    arch, config, weights = open_gguf_checkpoint(path, lazy=lazy)
    state = kept_16bit_weights(arch.weights_from_gguf(weights, config), policy, mesh, dtype)
    return build(arch, config, state, dtype, quantized=True), config, weights


def module_from_pretrained_dir(
    directory: str | os.PathLike[str], dtype: DType = DType.float32, *, lazy: bool = False, policy: Any = None, mesh: Any = None
) -> tuple[Any, Any]:
    """``(module, config)``: :func:`open_hf_checkpoint` (for ``policy`` and ``mesh``) and the
    module built with its weights."""
    arch, config, state = open_hf_checkpoint(directory, lazy=lazy, dtype=dtype, policy=policy, mesh=mesh)
    return build(arch, config, state, dtype, quantized=False), config
