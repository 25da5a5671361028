"""Small synthetic llama checkpoints for tests: a GGUF laid out like SmolLM2's (Q8_0 token
embedding, Q4_1 attention and FFN matrices, F32 norms, a byte-level BPE vocabulary in the metadata)
and a Hugging Face directory (``config.json``, float32 safetensors, ``tokenizer.json``), a few
hundred kilobytes each, written deterministically.

Everything is data that a test can edit before writing: :func:`gguf_metadata` is a list of
``(key, type, value)`` entries (types ``"u32"``, ``"i32"``, ``"u64"``, ``"i64"``, ``"f32"``,
``"f64"``, ``"bool"``, ``"str"``, ``"arr"`` (a list, element type from the values) and
``"arr_str"``), :func:`gguf_tensors` an ordered ``{name: (array, GGML type)}`` mapping, and
:func:`hf_config` a dict; :func:`write_gguf` and :func:`write_hf_dir` write them as they are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

#: The pristine model's sizes.
VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, BLOCKS, CONTEXT = 264, 64, 4, 2, 16, 96, 2, 128
RMS_EPS, ROPE_BASE = 1e-5, 10000.0
#: The pristine model's config, by ``LlamaConfig``'s field names.
CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=FFN,
    num_hidden_layers=BLOCKS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    head_dim=HEAD_DIM,
    rope_theta=ROPE_BASE,
    rms_norm_eps=RMS_EPS,
    max_position_embeddings=CONTEXT,
    tie_word_embeddings=True,
)

#: The per-block tensors: GGUF name -> (Hugging Face name, logical shape).
BLOCK_TENSORS = {
    "attn_norm": ("input_layernorm", (HIDDEN,)),
    "attn_q": ("self_attn.q_proj", (HEADS * HEAD_DIM, HIDDEN)),
    "attn_k": ("self_attn.k_proj", (KV_HEADS * HEAD_DIM, HIDDEN)),
    "attn_v": ("self_attn.v_proj", (KV_HEADS * HEAD_DIM, HIDDEN)),
    "attn_output": ("self_attn.o_proj", (HIDDEN, HEADS * HEAD_DIM)),
    "ffn_norm": ("post_attention_layernorm", (HIDDEN,)),
    "ffn_gate": ("mlp.gate_proj", (FFN, HIDDEN)),
    "ffn_up": ("mlp.up_proj", (FFN, HIDDEN)),
    "ffn_down": ("mlp.down_proj", (HIDDEN, FFN)),
}


def vocabulary() -> list[str]:
    """Two special tokens, the 256 byte tokens of byte-level BPE and six merges."""
    from maxjax.tokenizer import bytes_to_unicode

    return ["<|endoftext|>", "<|im_end|>"] + list(bytes_to_unicode().values()) + ["he", "ll", "hell", "hello", "Ġw", "Ġt"]


def gguf_metadata() -> list[tuple[str, str, Any]]:
    """The pristine GGUF's key/values (``general.architecture`` is added by the writer)."""
    tokens = vocabulary()
    return [
        ("general.name", "str", "synthetic llama"),
        ("llama.block_count", "u32", BLOCKS),
        ("llama.context_length", "u32", CONTEXT),
        ("llama.embedding_length", "u32", HIDDEN),
        ("llama.feed_forward_length", "u32", FFN),
        ("llama.attention.head_count", "u32", HEADS),
        ("llama.attention.head_count_kv", "u32", KV_HEADS),
        ("llama.rope.freq_base", "f32", ROPE_BASE),
        ("llama.attention.layer_norm_rms_epsilon", "f32", RMS_EPS),
        ("llama.rope.dimension_count", "u32", HEAD_DIM),
        ("llama.vocab_size", "u32", VOCAB),
        ("tokenizer.ggml.model", "str", "gpt2"),
        ("tokenizer.ggml.pre", "str", "gpt-2"),
        ("tokenizer.ggml.tokens", "arr_str", tokens),
        ("tokenizer.ggml.token_type", "arr", [3, 3] + [1] * (len(tokens) - 2)),
        ("tokenizer.ggml.merges", "arr_str", ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġ t"]),
        ("tokenizer.ggml.bos_token_id", "u32", 0),
        ("tokenizer.ggml.eos_token_id", "u32", 0),
    ]


def _quantized(a: np.ndarray, qtype: Any) -> np.ndarray:
    import gguf

    return gguf.quants.quantize(a.astype(np.float32), qtype)


def gguf_tensors(seed: int = 0) -> dict[str, tuple[np.ndarray, Any]]:
    """The pristine GGUF's tensors in llama.cpp's order: ``{name: (array, raw GGML type or None)}``
    (quantized arrays are the packed bytes). Q and K are stored as they are (their rows' order is
    llama.cpp's permutation of random rows: any order is a valid model)."""
    import gguf

    T = gguf.GGMLQuantizationType
    rng = np.random.default_rng(seed)
    out: dict[str, tuple[np.ndarray, Any]] = {"token_embd.weight": (_quantized(rng.standard_normal((VOCAB, HIDDEN)), T.Q8_0), T.Q8_0)}
    for i in range(BLOCKS):
        for name, (_, shape) in BLOCK_TENSORS.items():
            if len(shape) == 1:
                out[f"blk.{i}.{name}.weight"] = (1.0 + 0.1 * rng.standard_normal(shape).astype(np.float32), None)
            else:
                w = rng.standard_normal(shape) / np.sqrt(shape[1])
                out[f"blk.{i}.{name}.weight"] = (_quantized(w, T.Q4_1), T.Q4_1)
    out["output_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), None)
    return out


def write_gguf(path: str | Path, metadata: list[tuple[str, str, Any]], tensors: dict[str, tuple[np.ndarray, Any]], arch: str = "llama") -> Path:
    """Writes ``metadata`` and ``tensors`` (see the module doc) with ``gguf.GGUFWriter``."""
    import gguf

    V = gguf.GGUFValueType
    kinds = {"u32": V.UINT32, "i32": V.INT32, "u64": V.UINT64, "i64": V.INT64, "f32": V.FLOAT32, "f64": V.FLOAT64, "bool": V.BOOL, "str": V.STRING}
    w = gguf.GGUFWriter(str(path), arch)
    for key, kind, value in metadata:
        if kind == "arr_str":
            w.add_key_value(key, list(value), V.ARRAY, sub_type=V.STRING)
        elif kind == "arr":
            w.add_array(key, list(value))
        else:
            w.add_key_value(key, value, kinds[kind])
    for name, (array, raw_dtype) in tensors.items():
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_llama_gguf(path: str | Path, seed: int = 0) -> Path:
    """The pristine synthetic llama GGUF."""
    return write_gguf(path, gguf_metadata(), gguf_tensors(seed))


def hf_config() -> dict[str, Any]:
    """The pristine ``config.json``."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": BLOCKS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rope_theta": ROPE_BASE,
        "rms_norm_eps": RMS_EPS,
        "max_position_embeddings": CONTEXT,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def hf_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """The pristine Hugging Face tensors (float32)."""
    rng = np.random.default_rng(seed)
    out = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)}
    for i in range(BLOCKS):
        for hf, shape in BLOCK_TENSORS.values():
            if len(shape) == 1:
                out[f"model.layers.{i}.{hf}.weight"] = 1.0 + 0.1 * rng.standard_normal(shape).astype(np.float32)
            else:
                out[f"model.layers.{i}.{hf}.weight"] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    out["model.norm.weight"] = 1.0 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32)
    return out


def write_hf_dir(directory: str | Path, config: Any, tensors: dict[str, np.ndarray], config_text: bytes | None = None) -> Path:
    """A Hugging Face model directory: ``config.json`` (``config`` as JSON, or ``config_text``
    as it is), ``model.safetensors`` and a ``tokenizer.json`` of :func:`vocabulary`."""
    import safetensors.numpy

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_bytes(config_text if config_text is not None else json.dumps(config).encode())
    safetensors.numpy.save_file(tensors, str(d / "model.safetensors"))
    tok = _tokenizer_json()
    (d / "tokenizer.json").write_text(tok)
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "add_bos_token": False}))
    return d


_TOKENIZER_JSON: list[str] = []


def _tokenizer_json() -> str:
    if not _TOKENIZER_JSON:
        import tempfile

        from maxjax.tokenizer import Tokenizer

        with tempfile.TemporaryDirectory() as tmp:
            p = write_gguf(Path(tmp) / "vocab.gguf", [e for e in gguf_metadata() if e[0].startswith("tokenizer.")], {})
            t = Tokenizer.from_gguf(p)
            t.backend.save(str(Path(tmp) / "tokenizer.json"))
            _TOKENIZER_JSON.append((Path(tmp) / "tokenizer.json").read_text())
    return _TOKENIZER_JSON[0]
