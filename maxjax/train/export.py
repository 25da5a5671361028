"""Export trained weights as a Hugging Face model directory: safetensors with Hugging Face names.

    weights = merge_lora(model, trainer.state_dict(state))     # plain names, adapters merged
    save_pretrained("out/smollm2-docs", model, weights, config, tokenizer)
    # then: maxjax generate --model out/smollm2-docs   (or transformers' from_pretrained)

The directory holds ``model.safetensors`` (float32 or bfloat16, names as Hugging Face's
``LlamaForCausalLM``: ``model.layers.N...``; ``lm_head.weight`` only when untied),
``config.json`` (the architecture's Hugging Face config), the tokenizer's files
(:meth:`maxjax.tokenizer.Tokenizer.save_pretrained`) and ``maxjax_export.json`` (what wrote it).

It is written to a temporary folder beside ``directory`` and renamed into place: a failed export
leaves nothing behind, and an existing folder is replaced only when it is an earlier maxjax export
(a folder of anything else is refused, unchanged).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.quantization import QuantizedArray

__all__ = ["save_pretrained", "MARKER"]

#: the file that marks a directory written by :func:`save_pretrained`
MARKER = "maxjax_export.json"


def _float(name: str, value: Any, dtype: Any) -> jax.Array:
    if isinstance(value, QuantizedArray):
        value = value.dequantize()
    arr = jnp.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value)
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        raise ValueError(f"weight {name!r} is {arr.dtype}: export writes float weights (dequantize it first)")
    return arr.astype(dtype)


def save_pretrained(
    directory: str | os.PathLike[str],
    module: Any,
    weights: Mapping[str, Any],
    config: Any,
    tokenizer: Any = None,
    *,
    dtype: DType = DType.float32,
) -> str:
    """Writes ``weights`` (``{maxjax name: array}`` of ``module``'s architecture, no adapter keys)
    as a Hugging Face model directory (see the module docstring).

    Args:
        module: the model (its architecture is found with :func:`maxjax.models.registry.for_module`).
        weights: every weight by maxjax name (e.g. :func:`~maxjax.train.lora.merge_lora` of a
            trained state); quantized values are dequantized.
        config: the architecture's config (``LlamaConfig``).
        tokenizer: a :class:`maxjax.tokenizer.Tokenizer` to write beside the weights (None: none).
        dtype: ``DType.float32`` or ``DType.bfloat16``.

    Returns:
        The directory's absolute path.

    Raises:
        ValueError: ``directory`` exists and is not empty nor an earlier maxjax export; a weight
            that is not the architecture's (e.g. a LoRA adapter: merge first) or not float; an
            architecture without export support; another dtype.
    """
    from safetensors.flax import save_file

    from maxjax.models.registry import for_module

    if dtype not in (DType.float32, DType.bfloat16):
        raise ValueError(f"export dtype must be float32 or bfloat16, got {dtype!r}")
    target = os.path.abspath(os.fspath(directory))
    if os.path.exists(target):
        if not os.path.isdir(target):
            raise ValueError(f"{target} exists and is not a directory: not overwriting it")
        if os.listdir(target) and not os.path.isfile(os.path.join(target, MARKER)):
            raise ValueError(f"{target} exists and is not an earlier maxjax export: not overwriting it")
    arch = for_module(module)
    if arch.weights_to_hf is None or arch.config_to_hf is None:
        raise ValueError(f"architecture {arch.name!r} has no Hugging Face export")
    hf = arch.weights_to_hf(weights, config)
    jdtype = dtype.to_jax()
    arrays = {name: _float(name, v, jdtype) for name, v in hf.items()}
    extra: dict[str, Any] = {"torch_dtype": "float32" if dtype == DType.float32 else "bfloat16"}
    if tokenizer is not None:
        if tokenizer.bos_token_id is not None:
            extra["bos_token_id"] = tokenizer.bos_token_id
        if tokenizer.eos_token_id is not None:
            extra["eos_token_id"] = tokenizer.eos_token_id
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        save_file(arrays, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(arch.config_to_hf(config, **extra), f, indent=2)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        n = int(sum(np.prod(a.shape) for a in arrays.values()))
        with open(os.path.join(tmp, MARKER), "w", encoding="utf-8") as f:
            json.dump({"architecture": arch.name, "tensors": len(arrays), "parameters": n, "dtype": dtype.name}, f, indent=2)
        if os.path.exists(target):
            old = tempfile.mkdtemp(prefix=".replaced-", dir=parent)
            os.rename(target, os.path.join(old, "x"))
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
