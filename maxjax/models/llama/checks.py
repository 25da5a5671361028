"""Checks of a llama checkpoint, run before anything is built or loaded.

A checkpoint's metadata (GGUF key/values, or a Hugging Face ``config.json``) is checked field by
field (type and range) when :class:`~maxjax.models.llama.config.LlamaConfig` reads it; then the
config is checked against the tensors (names, block count, every tensor's shape and type, where
its data lies in a GGUF), the norm weights for NaN and infinities (they are small), and the
tensors' size against the memory available. A checkpoint that lies (``block_count`` 100000 with
2 blocks) is refused in milliseconds, before a module is built.

Every failure is a ``ValueError`` of one line that names the file, the field or tensor at fault,
and what was expected against what was found::

    x.gguf: llama.attention.head_count must be a positive integer, got 0
    x.gguf: tensor blk.0.attn_q.weight has shape [64, 64], expected [96, 64] = [llama.attention.head_count * head size, llama.embedding_length]

The field helpers (:func:`positive_int`, :func:`positive_float`, ...) are not llama's own: other
architectures can use them, and the memory check
(:func:`maxjax.models.loading.check_fits_in_memory`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from maxjax.dtype import DType

__all__ = [
    "INT32_MAX",
    "boolean",
    "check_gguf_tensors",
    "check_hf_tensors",
    "describe",
    "nonnegative_int",
    "positive_float",
    "positive_int",
]

#: Sizes are at most this (positions, ids and shapes are int32 on the device).
INT32_MAX = 2**31 - 1

# -- field values ---------------------------------------------------------------------------------


def describe(value: Any) -> str:
    """``value`` as a message shows it: short, with its kind when that is not obvious."""
    if isinstance(value, bool):
        return f"{value} (a boolean)"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"{text!r} (a string)"
    if isinstance(value, (list, tuple)):
        if len(value) <= 4:
            text = repr(list(value))
            return f"{text if len(text) <= 60 else text[:57] + '...'} (a list)"
        return f"a list of {len(value)} values"
    if isinstance(value, Mapping):
        return "an object" if value else "{} (an object)"
    if value is None:
        return "null"
    if isinstance(value, (int, float, np.integer, np.floating)):
        return repr(value.item() if isinstance(value, np.generic) else value)
    return f"a {type(value).__name__}"


def positive_int(value: Any, what: str, *, maximum: int = INT32_MAX) -> int:
    """``value`` as an int in ``[1, maximum]``.

    Raises:
        ValueError: ``value`` is not an integer (a bool, a float, a string, a list, ... are not)
            or is out of range; the message starts with ``what`` (the file and the field).
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be a positive integer, got {describe(value)}")
    v = int(value)
    if v < 1:
        raise ValueError(f"{what} must be a positive integer, got {v}")
    if v > maximum:
        raise ValueError(f"{what} must be a positive integer of at most {maximum}, got {v}")
    return v


def nonnegative_int(value: Any, what: str) -> int:
    """``value`` as an int >= 0.

    Raises:
        ValueError: not an integer, or negative (the message starts with ``what``).
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {describe(value)}")
    return int(value)


def positive_float(value: Any, what: str) -> float:
    """``value`` (an int or a float) as a finite float > 0.

    Raises:
        ValueError: not a number, NaN, infinite, zero or negative (the message starts with ``what``).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} must be a finite number > 0, got {describe(value)}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float's range
        v = math.inf
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {describe(value)}")
    return v


def boolean(value: Any, what: str) -> bool:
    """``value`` as a bool.

    Raises:
        ValueError: not a bool (``"true"``, 1 and null are not; the message starts with ``what``).
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{what} must be true or false, got {describe(value)}")
    return bool(value)


# -- tensors --------------------------------------------------------------------------------------

#: The tensors of one block: GGUF name, Hugging Face name, kind ("norm" or "matrix") and logical
#: shape in terms of the config (see ``_dims``).
_BLOCK: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("attn_norm", "input_layernorm", "norm", ("hidden",)),
    ("attn_q", "self_attn.q_proj", "matrix", ("q_rows", "hidden")),
    ("attn_k", "self_attn.k_proj", "matrix", ("kv_rows", "hidden")),
    ("attn_v", "self_attn.v_proj", "matrix", ("kv_rows", "hidden")),
    ("attn_output", "self_attn.o_proj", "matrix", ("hidden", "q_rows")),
    ("ffn_norm", "post_attention_layernorm", "norm", ("hidden",)),
    ("ffn_gate", "mlp.gate_proj", "matrix", ("ffn", "hidden")),
    ("ffn_up", "mlp.up_proj", "matrix", ("ffn", "hidden")),
    ("ffn_down", "mlp.down_proj", "matrix", ("hidden", "ffn")),
)
#: The other tensors: GGUF name, Hugging Face name, kind, shape.
_GLOBAL: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("token_embd.weight", "model.embed_tokens.weight", "matrix", ("vocab", "hidden")),
    ("output_norm.weight", "model.norm.weight", "norm", ("hidden",)),
    ("output.weight", "lm_head.weight", "matrix", ("vocab", "hidden")),
)


def _dims(config: Any) -> dict[str, int]:
    c = config
    return {
        "vocab": c.vocab_size,
        "hidden": c.hidden_size,
        "ffn": c.intermediate_size,
        "q_rows": c.num_attention_heads * c.head_dim,
        "kv_rows": c.num_key_value_heads * c.head_dim,
    }


def _gguf_labels(meta: Mapping[str, Any], arch: str) -> dict[str, str]:
    head = f"{arch}.attention.key_length" if f"{arch}.attention.key_length" in meta else f"head size ({arch}.embedding_length / {arch}.attention.head_count)"
    vocab = f"{arch}.vocab_size" if f"{arch}.vocab_size" in meta else "vocabulary size (tokenizer.ggml.tokens)"
    return {
        "vocab": vocab,
        "hidden": f"{arch}.embedding_length",
        "ffn": f"{arch}.feed_forward_length",
        "q_rows": f"{arch}.attention.head_count * {head}",
        "kv_rows": f"{arch}.attention.head_count_kv * {head}",
    }


_HF_LABELS = {
    "vocab": "vocab_size",
    "hidden": "hidden_size",
    "ffn": "intermediate_size",
    "q_rows": "num_attention_heads * head_dim",
    "kv_rows": "num_key_value_heads * head_dim",
}


def _check_shape(where: str, name: str, shape: tuple[int, ...], dims: tuple[str, ...], values: dict[str, int], labels: dict[str, str]) -> None:
    want = [values[d] for d in dims]
    if list(shape) != want:
        raise ValueError(
            f"{where}: tensor {name} has shape {list(shape)}, expected {want} = [{', '.join(labels[d] for d in dims)}]"
        )


def _blocks_present(where: str, indices: set[int], count: int, count_name: str, prefix: str) -> None:
    """``indices`` (the blocks that have tensors) must be exactly ``range(count)``."""
    beyond = [i for i in indices if i >= count]
    if beyond:
        i = min(beyond)
        raise ValueError(f"{where}: {count_name} is {count}, but the file has tensors of block {i} ({prefix}{i}.*)")
    if len(indices) != count:
        missing = next(i for i in range(count) if i not in indices)
        have = f"blocks {prefix}0 to {prefix}{max(indices)}" if indices and len(indices) == max(indices) + 1 else f"{len(indices)} blocks"
        raise ValueError(f"{where}: {count_name} is {count}, but the file has no tensors of block {missing} ({prefix}{missing}.*): it has {have}")


def _non_finite(values: np.ndarray) -> str | None:
    bad = np.flatnonzero(~np.isfinite(values.astype(np.float32, copy=False)))
    if not bad.size:
        return None
    return f"holds {bad.size} non-finite value(s) ({values.reshape(-1)[bad[0]]} at index {int(bad[0])})"


#: Hugging Face tensor dtypes the llama takes (converted on load to the dtype it is loaded in).
HF_FLOAT_DTYPES = ("float32", "bfloat16", "float16")
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def cast_float_weight(wd: Any, dtype: Any) -> Any:
    """A float32/bfloat16/float16 WeightData in ``dtype`` (a float DType, wider or narrower: a
    model loaded in bfloat16 rounds a float32 file's values): a
    :class:`~maxjax.graph.weights.lazy.LazyTensor` is converted as it is read (``cast_on_read``,
    no copy now); other data now (``astype``). Data already in ``dtype``, and other dtypes, are
    returned as they are."""
    from maxjax.graph.weights import WeightData
    from maxjax.graph.weights.lazy import LazyTensor

    if wd.dtype == dtype or wd.dtype not in (DType.float32, DType.bfloat16, DType.float16):
        return wd
    if isinstance(wd.data, LazyTensor):
        return WeightData(wd.data.cast_on_read(dtype.to_numpy(), narrowing=True), wd.name, dtype, wd.shape)
    return wd.astype(dtype)


def _gguf_type_ok(kind: str, qtype: Any) -> bool:
    """Whether the llama module takes a GGUF tensor of this type: F32 (its weights are float32),
    or for a matrix F16 or BF16 (kept as stored, widened in each product, or widened at load:
    the policy's ``keep_16bit_weights``) or a quantized type maxjax reads (kept packed)."""
    from maxjax.graph.quantization import QuantizationEncoding

    if qtype.name == "F32":
        return True
    if kind == "norm":
        return False
    if qtype.name in ("F16", "BF16"):  # kept as they are, widened exactly in each product
        return True
    try:
        QuantizationEncoding.from_gguf(qtype)
    except ValueError:
        return False
    return True


def _gguf_floats(tensor: Any, reader: Any) -> np.ndarray:
    """A float GGUF tensor's values (BF16, which the reader gives as bytes, widened to float32)."""
    data = np.asarray(tensor.data)
    if tensor.tensor_type.name != "BF16":
        return data
    u16 = data.reshape(-1).view(np.uint16)
    if reader.byte_order == "S":
        u16 = u16.byteswap()
    return (u16.astype(np.uint32) << 16).view(np.float32)


def check_gguf_tensors(weights: Any, config: Any, source: str, arch: str = "llama") -> None:
    """Checks a llama GGUF's tensor headers against ``config`` before anything is built.

    In order: every tensor is llama's; the blocks present are exactly ``{arch}.block_count``;
    every expected tensor is there; the tensors lie one after another as their types and shapes
    say (a type or a dimension rewritten in the header moves where a tensor would end); each
    tensor has the shape the config gives and a type the model takes (norms F32, matrices F32 or
    a quantized type maxjax reads); a block tensor has one type in every block;
    the tensors fit in the memory available
    (:func:`~maxjax.models.loading.check_fits_in_memory`); the norm weights are finite.

    Args:
        weights: an open ``GGUFWeights``.
        config: its :class:`~maxjax.models.llama.config.LlamaConfig`.
        source: the file, as messages name it.

    Raises:
        ValueError: the first disagreement, naming the file, the GGUF tensor (``blk.0.attn_q.weight``)
            and the metadata keys it disagrees with, expected against actual.
    """
    reader = weights.reader
    meta = weights.metadata
    tensors = list(reader.tensors)
    by_name = {t.name: t for t in tensors}
    roles = {g: (kind, dims) for g, _, kind, dims in _BLOCK}
    block_re = re.compile(r"blk\.(0|[1-9]\d*)\.(\w+)\.weight")
    blocks: set[int] = set()
    globals_ = {g: (kind, dims) for g, _, kind, dims in _GLOBAL}
    expect: dict[str, tuple[str, tuple[str, ...]]] = {}
    for t in tensors:
        m = block_re.fullmatch(t.name)
        if m and m.group(2) in roles:
            blocks.add(int(m.group(1)))
            expect[t.name] = roles[m.group(2)]
        elif t.name in globals_:
            expect[t.name] = globals_[t.name]
        elif t.name == "rope_freqs.weight":
            raise ValueError(f"{source}: Llama 3 rope frequency scaling (rope_freqs.weight) is not supported")
        else:
            raise ValueError(
                f"{source}: tensor {t.name} is not a llama tensor (llama has token_embd.weight, output_norm.weight, "
                f"output.weight and blk.N.{{{','.join(r[0] for r in _BLOCK)}}}.weight)"
            )
    n = config.num_hidden_layers
    _blocks_present(source, blocks, n, f"{arch}.block_count", "blk.")
    for name in ("token_embd.weight", "output_norm.weight"):
        if name not in by_name:
            raise ValueError(f"{source}: tensor {name} is missing")
    for i in range(n):
        for role, *_ in _BLOCK:
            if f"blk.{i}.{role}.weight" not in by_name:
                raise ValueError(f"{source}: tensor blk.{i}.{role}.weight is missing ({arch}.block_count is {n})")

    # where the data lies: one tensor after another, each padded to the alignment (as llama.cpp requires)
    align = int(reader.alignment)
    start = int(reader.data_offset)
    at = 0
    prev = None
    for t in tensors:
        rel = int(t.data_offset) - start
        if rel != at:
            if prev is None:
                raise ValueError(f"{source}: tensor {t.name}'s data starts at offset {rel} of the data section, expected 0")
            shape = list(reversed([int(d) for d in prev.shape]))
            raise ValueError(
                f"{source}: tensor {prev.name} ({prev.tensor_type.name} {shape}: {int(prev.n_bytes)} bytes at offset "
                f"{at - _padded(int(prev.n_bytes), align)} of the data section) would end at {at}, but the next tensor, "
                f"{t.name}, starts at {rel}: the header's type or shape of {prev.name} (or the offset of {t.name}) is corrupted"
            )
        at = rel + _padded(int(t.n_bytes), align)
        prev = t

    values, labels = _dims(config), _gguf_labels(meta, arch)
    for t in tensors:
        kind, dims = expect[t.name]
        shape = tuple(reversed([int(d) for d in t.shape]))
        _check_shape(source, t.name, shape, dims, values, labels)
        if not _gguf_type_ok(kind, t.tensor_type):
            allowed = "F32" if kind == "norm" else f"F32, F16, BF16 or a quantized type maxjax reads ({', '.join(_quantized_types())})"
            raise ValueError(f"{source}: tensor {t.name} is {t.tensor_type.name}; maxjax's llama takes a {kind} weight as {allowed}")
    for role, *_ in _BLOCK:
        types = [by_name[f"blk.{i}.{role}.weight"].tensor_type.name for i in range(n)]
        if len(set(types)) > 1:
            common, count = max(((ty, types.count(ty)) for ty in dict.fromkeys(types)), key=lambda x: x[1])
            if count * 2 > n:
                i = next(i for i, ty in enumerate(types) if ty != common)
                odd = f"blk.{i}.{role}.weight is {types[i]}, but {count} of the {n} blocks' {role} are {common}"
            else:
                i = next(i for i, ty in enumerate(types) if ty != types[0])
                odd = f"blk.0.{role}.weight is {types[0]}, but blk.{i}.{role}.weight is {types[i]}"
            raise ValueError(
                f"{source}: tensor {odd}: maxjax runs every block with one program, so a block tensor must have one type in every block"
            )
    total = sum(int(t.n_bytes) for t in tensors)
    if getattr(getattr(weights, "_store", None), "lazy", False):  # on a mesh each process reads its shards only
        import jax

        total //= max(1, jax.process_count())
    from maxjax.models.loading import check_fits_in_memory

    check_fits_in_memory(total, source)
    for t in tensors:
        if expect[t.name][0] == "norm":
            bad = _non_finite(_gguf_floats(t, reader))
            if bad:
                raise ValueError(f"{source}: tensor {t.name} {bad}")


def _quantized_types() -> list[str]:
    from maxjax.graph.quantization import QuantizationEncoding

    return [e.value for e in QuantizationEncoding if e.is_gguf]


def _padded(n: int, align: int) -> int:
    return -(-n // align) * align




def check_hf_tensors(weights: Any, config: Any, dtype: DType = DType.float32) -> None:
    """Checks a Hugging Face llama checkpoint's tensors (names, ``num_hidden_layers``, shapes,
    dtypes (float ones, converted to the load dtype), finite norms, size in ``dtype`` against the
    memory available) against ``config`` before anything is built or loaded; only the headers and
    the norm weights are read.

    Args:
        weights: the checkpoint's ``SafetensorWeights`` (``load_weights(files)``).
        config: its :class:`~maxjax.models.llama.config.LlamaConfig`.
        dtype: the DType the weights load in.

    Raises:
        ValueError: the first disagreement, naming the safetensors file, the tensor and the
            ``config.json`` keys it disagrees with, expected against actual.
    """
    from maxjax.graph.weights import summarize

    infos = summarize(weights).tensors
    files = sorted({i.file for i in infos}) or list(getattr(weights, "_store").file_list())
    cfg_name = str(Path(files[0]).parent / "config.json") if files else "config.json"
    roles = {h: (kind, dims) for _, h, kind, dims in _BLOCK}
    globals_ = {h: (kind, dims) for _, h, kind, dims in _GLOBAL}
    layer_re = re.compile(r"model\.layers\.(0|[1-9]\d*)\.(.+)\.weight")
    layers: set[int] = set()
    by_name = {}
    expect: dict[str, tuple[str, tuple[str, ...]]] = {}
    for info in infos:
        m = layer_re.fullmatch(info.name)
        by_name[info.name] = info
        if m and m.group(2) in roles:
            layers.add(int(m.group(1)))
            expect[info.name] = roles[m.group(2)]
        elif info.name in globals_:
            expect[info.name] = globals_[info.name]
        elif re.fullmatch(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", info.name):
            continue  # recomputed
        else:
            raise ValueError(
                f"{info.file}: tensor {info.name} is not a llama tensor (llama has model.embed_tokens.weight, model.norm.weight, "
                f"lm_head.weight and model.layers.N.{{{','.join(r[1] for r in _BLOCK)}}}.weight)"
            )
    n = config.num_hidden_layers
    _blocks_present(cfg_name, layers, n, "num_hidden_layers", "model.layers.")
    required = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if config.tie_word_embeddings else ["lm_head.weight"])
    for name in required:
        if name not in by_name:
            why = " (config.json's tie_word_embeddings is false)" if name == "lm_head.weight" else ""
            raise ValueError(f"{', '.join(files)}: tensor {name} is missing{why}")
    for i in range(n):
        for _, role, *_ in _BLOCK:
            if f"model.layers.{i}.{role}.weight" not in by_name:
                raise ValueError(f"{', '.join(files)}: tensor model.layers.{i}.{role}.weight is missing (num_hidden_layers is {n})")
    values = _dims(config)
    for name, (kind, dims) in expect.items():
        info = by_name[name]
        _check_shape(info.file, name, tuple(info.shape), dims, values, _HF_LABELS)
        if info.dtype not in HF_FLOAT_DTYPES:  # converted to the load dtype as they load
            raise ValueError(
                f"{info.file}: tensor {name} is {info.dtype}; maxjax's llama takes {', '.join(HF_FLOAT_DTYPES)} weights "
                "(converted to the dtype the model loads in: float32 by default)"
            )
    from maxjax.models.loading import check_fits_in_memory

    item = np.dtype(dtype.to_numpy()).itemsize
    check_fits_in_memory(sum(i.nbytes * item // max(1, _ITEMSIZE.get(i.dtype, 4)) for i in infos), ", ".join(files))
    for name, (kind, _) in expect.items():
        if kind == "norm":
            bad = _non_finite(np.asarray(weights[name].data().to_numpy()))
            if bad:
                raise ValueError(f"{by_name[name].file}: tensor {name} {bad}")
