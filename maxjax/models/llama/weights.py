"""Llama checkpoints' tensor names and layouts -> the names of :mod:`maxjax.models.llama.model`.

Two sources: llama.cpp's GGUF names (``blk.N.attn_q.weight``) and Hugging Face's
``LlamaForCausalLM`` names (``model.layers.N.self_attn.q_proj.weight``).

llama.cpp stores Q and K of llama models with their rows permuted for its rotary layout
(``convert_hf_to_gguf.py``: ``w.reshape(n_head, 2, out // n_head // 2, in).swapaxes(1, 2)``);
:func:`llama_from_gguf` undoes it as Hugging Face does (``w.reshape(n_head, head_dim // 2, 2,
in).swapaxes(1, 2)``). It is a permutation of whole rows, and every row of a GGUF-quantized matrix
is a whole number of blocks, so it is applied to the packed rows: quantized weights stay packed.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from maxjax.driver import Buffer
from maxjax.graph.weights import WeightData
from maxjax.graph.weights.adapters import NameTable, adapt
from maxjax.graph.weights.lazy import LazyTensor

__all__ = [
    "LLAMA_GGUF_NAMES",
    "LLAMA_HF_NAMES",
    "llama_cpp_permute_rows_index",
    "llama_from_gguf",
    "llama_from_hf",
    "llama_to_hf",
    "unpermute_rows",
    "unpermute_rows_index",
]

#: GGUF llama tensor names (llama.cpp's) -> maxjax llama module names.
LLAMA_GGUF_NAMES: NameTable = (
    (r"token_embd\.weight", "embed_tokens.weight"),
    (r"blk\.(\d+)\.attn_q\.weight", r"layers.\1.self_attn.q_proj.weight"),
    (r"blk\.(\d+)\.attn_k\.weight", r"layers.\1.self_attn.k_proj.weight"),
    (r"blk\.(\d+)\.attn_v\.weight", r"layers.\1.self_attn.v_proj.weight"),
    (r"blk\.(\d+)\.attn_output\.weight", r"layers.\1.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.ffn_gate\.weight", r"layers.\1.mlp.gate_proj.weight"),
    (r"blk\.(\d+)\.ffn_up\.weight", r"layers.\1.mlp.up_proj.weight"),
    (r"blk\.(\d+)\.ffn_down\.weight", r"layers.\1.mlp.down_proj.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", r"layers.\1.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", r"layers.\1.post_attention_layernorm.weight"),
    (r"output_norm\.weight", "norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"rope_freqs\.weight", None),  # Llama 3 rope scaling factors (LlamaConfig refuses rope scaling)
)

#: Hugging Face ``LlamaForCausalLM`` tensor names -> maxjax llama module names.
LLAMA_HF_NAMES: NameTable = (
    (r"model\.embed_tokens\.weight", "embed_tokens.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight", r"layers.\1.self_attn.\2_proj.weight"),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"layers.\1.mlp.\2_proj.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"layers.\1.input_layernorm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"layers.\1.post_attention_layernorm.weight"),
    (r"model\.norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
    (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", None),  # recomputed
)




def unpermute_rows_index(rows: int, n_head: int) -> np.ndarray:
    """Row order that undoes llama.cpp's Q/K permutation: ``w_hf = w_gguf[index]``.

    Equal to HF's ``w.reshape(n_head, head_dim // 2, 2, in).swapaxes(1, 2).reshape(rows, in)``.

    Raises:
        ValueError: ``rows`` is not ``n_head`` heads of an even size.
    """
    if n_head <= 0 or rows % n_head or (rows // n_head) % 2:
        raise ValueError(f"cannot un-permute {rows} rows as {n_head} heads of an even size")
    return np.arange(rows).reshape(n_head, rows // n_head // 2, 2).swapaxes(1, 2).reshape(rows)


def llama_cpp_permute_rows_index(rows: int, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K permutation (HF -> GGUF): ``w_gguf = w_hf[index]``; the inverse of
    :func:`unpermute_rows_index`."""
    if n_head <= 0 or rows % n_head or (rows // n_head) % 2:
        raise ValueError(f"cannot permute {rows} rows as {n_head} heads of an even size")
    return np.arange(rows).reshape(n_head, 2, rows // n_head // 2).swapaxes(1, 2).reshape(rows)


def unpermute_rows(wd: WeightData, n_head: int, name: str | None = None) -> WeightData:
    """``wd`` with llama.cpp's Q/K row permutation undone; packed data stays packed.

    Raises:
        ValueError: the rows are not ``n_head`` heads of an even size.
    """
    rows = int(wd.shape[0])
    logical_rows = int(wd.original_shape[0]) if wd.original_shape is not None else rows
    if logical_rows != rows:
        raise ValueError(f"{wd.name!r}: packed rows ({rows}) are not the matrix rows ({logical_rows})")
    index = unpermute_rows_index(rows, n_head)
    if isinstance(wd.data, LazyTensor):  # reorder without reading
        data = wd.data.take_rows(index)
    else:
        data = Buffer(jnp.take(wd.to_jax(), jnp.asarray(index, dtype=jnp.int32), axis=0))
    return WeightData(data, name or wd.name, wd.dtype, wd.shape, wd.quantization_encoding, wd.original_shape)


def _gguf_heads(weights: Any, n_head: int | None, n_kv_head: int | None) -> tuple[int, int]:
    if n_head is not None and n_kv_head is not None:
        return n_head, n_kv_head
    meta = getattr(weights, "metadata", None)
    if not isinstance(meta, Mapping):
        raise ValueError("pass n_head and n_kv_head: the weights have no GGUF metadata to read them from")
    arch = meta.get("general.architecture", "llama")
    try:
        heads = int(meta[f"{arch}.attention.head_count"]) if n_head is None else n_head
    except KeyError:
        raise ValueError(f"the GGUF metadata has no {arch}.attention.head_count; pass n_head") from None
    kv = meta.get(f"{arch}.attention.head_count_kv", heads) if n_kv_head is None else n_kv_head
    return heads, int(kv)


def llama_from_gguf(
    weights: Any, *, n_head: int | None = None, n_kv_head: int | None = None
) -> dict[str, WeightData]:
    """A llama GGUF checkpoint (llama.cpp names) as maxjax llama names, Q/K rows un-permuted.

    Args:
        weights: a ``GGUFWeights`` (root view), or a mapping of its names to Weights/WeightData.
        n_head: query heads (default: the file's ``{arch}.attention.head_count``).
        n_kv_head: key/value heads (default: ``{arch}.attention.head_count_kv``).

    Returns:
        ``{maxjax name: WeightData}`` (quantized weights packed, with their encodings);
        ``lm_head.weight`` only when the file has ``output.weight`` (absent with tied embeddings).

    Raises:
        ValueError: a tensor name that is not llama's, or head counts that do not divide Q/K.
    """
    heads, kv = _gguf_heads(weights, n_head, n_kv_head)
    permuted = {"self_attn.q_proj.weight": heads, "self_attn.k_proj.weight": kv}

    def transform(target: str, wd: WeightData) -> WeightData:
        for suffix, n in permuted.items():
            if target.endswith(suffix):
                return unpermute_rows(wd, n, target)
        return wd

    return adapt(weights, LLAMA_GGUF_NAMES, transform)


def llama_to_hf(state: Mapping[str, Any], config: Any = None) -> dict[str, Any]:
    """maxjax llama names -> Hugging Face ``LlamaForCausalLM`` names (the inverse of
    :func:`llama_from_hf`): ``model.`` before every name but ``lm_head.weight``, which is left
    out when ``config.tie_word_embeddings`` (Hugging Face ties it to the embedding).

    Raises:
        ValueError: a name that is not a llama weight (adapter keys such as ``lora_A`` included:
            merge them first).
    """
    tied = bool(getattr(config, "tie_word_embeddings", False))
    out = {}
    for name, value in state.items():
        if name == "lm_head.weight":
            if not tied:
                out[name] = value
            continue
        hf = "model." + name
        if not any(re.fullmatch(pattern, hf) for pattern, target in LLAMA_HF_NAMES if target is not None):
            raise ValueError(f"{name!r} is not a weight of a Hugging Face LlamaForCausalLM (merge LoRA adapters first)")
        out[hf] = value
    return out


def llama_from_hf(weights: Any) -> dict[str, WeightData]:
    """A Hugging Face llama checkpoint (``model.layers.N...``) as maxjax llama names.

    Raises:
        ValueError: a tensor name that is not llama's.
    """
    return adapt(weights, LLAMA_HF_NAMES)
