"""Program's quantized weight layouts: every layout gives the same numbers as the file's packed blocks;
the backend policy chooses the layout; ops that read raw bytes keep a weight packed."""

from __future__ import annotations

import dataclasses

import gguf
import jax
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession, Program
from maxjax.graph import DeviceRef, Graph, TensorType, Weight, ops
from maxjax.backend import cpu_policy, policy_for
from maxjax.graph.quantization import (
    DequantizedArray,
    NibbleArray,
    PackedArray,
    QuantizationEncoding,
    UnpackedArray,
    dequantize,
)

RNG = np.random.default_rng(7)
# the CPU policy with float32 activations in maxjax's kernel: the layouts' products are then equal
# bit for bit (Q8_0 activations, the default on CPUs with int8 dots: equal up to float32 rounding)
F32_ACTIVATIONS = dataclasses.replace(policy_for("cpu"), q8_activations=False)


def _quantized(rows, cols, qtype):
    return gguf.quants.quantize(RNG.standard_normal((rows, cols)).astype(np.float32), qtype)


class TinyLM(nn.Module):
    def __init__(self, enc):
        super().__init__()
        self.embed = nn.Embedding(40, 64, DType.float32, DeviceRef.CPU(), quantization_encoding=QuantizationEncoding.Q8_0)
        self.proj = nn.Linear(64, 64, DType.float32, DeviceRef.CPU(), quantization_encoding=enc)
        self.head = nn.Linear(64, 40, DType.float32, DeviceRef.CPU())
        self.head.set_shared_weight("weight", self.embed.weight)

    def __call__(self, ids):
        return self.head(ops.silu(self.proj(self.embed(ids))))


@pytest.mark.parametrize("enc,qtype", [(QuantizationEncoding.Q4_0, gguf.GGMLQuantizationType.Q4_0), (QuantizationEncoding.Q8_0, gguf.GGMLQuantizationType.Q8_0)])
def test_unpacked_layout_matches_packed(enc, qtype):
    m = TinyLM(enc)
    sd = {"embed.weight": _quantized(40, 64, gguf.GGMLQuantizationType.Q8_0), "proj.weight": _quantized(64, 64, qtype)}
    m.load_state_dict(sd)
    g = Graph("tiny", forward=m, input_types=[TensorType(DType.int32, ["batch", 3], DeviceRef.CPU())])
    ids = RNG.integers(0, 40, (2, 3)).astype(np.int32)
    outs = {}
    for layout in ("packed", "nibbles", "unpacked", "dequantized"):
        prog = Program(g, quantized_layout=layout, policy=F32_ACTIVATIONS)
        state = prog.prepare(m.state_dict())
        kinds = {k: type(v) for k, v in state["weights"].items()}
        expected = {"packed": PackedArray, "unpacked": UnpackedArray, "dequantized": DequantizedArray}
        expected["nibbles"] = UnpackedArray  # Q8_0 (the embedding) has 8-bit values: no nibbles
        proj = NibbleArray if layout == "nibbles" and enc is QuantizationEncoding.Q4_0 else expected[layout]
        assert kinds == {"embed.weight": expected[layout], "proj.weight": proj}
        assert state["weights"]["proj.weight"].shape == (64, 64)  # the logical shape, in every layout
        outs[layout] = np.asarray(jax.jit(prog.apply)(state, ids)[0])
        if layout in ("nibbles", "unpacked"):  # the default policy's activations, whichever they are
            prog = Program(g, quantized_layout=layout)
            outs[layout + " default"] = np.asarray(jax.jit(prog.apply)(prog.prepare(m.state_dict()), ids)[0])
    np.testing.assert_array_equal(outs["nibbles"], outs["unpacked"])
    np.testing.assert_allclose(outs["nibbles default"], outs["unpacked default"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(outs["nibbles default"], outs["nibbles"], rtol=0.02, atol=0.02 * np.abs(outs["nibbles"]).max())
    np.testing.assert_allclose(outs["unpacked"], outs["packed"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs["dequantized"], outs["packed"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs["packed"], np.asarray(m(ids)), rtol=1e-5, atol=1e-5)


def test_weights_used_as_bytes_stay_packed():
    class Bytes(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 8, DType.float32, DeviceRef.CPU(), quantization_encoding=QuantizationEncoding.Q8_0)

        def __call__(self, x):
            return self.proj(x), ops.cast(self.proj.weight, DType.float32)  # a use of the raw bytes

    m = Bytes()
    m.load_state_dict({"proj.weight": _quantized(8, 64, gguf.GGMLQuantizationType.Q8_0)})
    g = Graph("b", forward=m, input_types=[TensorType(DType.float32, [1, 64], DeviceRef.CPU())])
    assert g._packed_only == {"proj.weight"}  # recorded when the cast read the bytes: no graph walk
    prog = Program(g, quantized_layout="unpacked")
    state = prog.prepare(m.state_dict())
    assert isinstance(state["weights"]["proj.weight"], PackedArray)
    x = RNG.standard_normal((1, 64)).astype(np.float32)
    y, raw = jax.jit(prog.apply)(state, x)
    np.testing.assert_array_equal(np.asarray(raw), m.state_dict()["proj.weight"].astype(np.float32))
    with pytest.raises(ValueError, match="quantized_layout must be one of 'packed', 'unpacked', 'nibbles', 'dequantized', 'int8', 'mapped', 'tiles' or None"):
        Program(g, quantized_layout="fast")


def test_the_policy_picks_the_layout_from_the_cpu_features():
    assert cpu_policy(frozenset({"avx2", "avx512f"})).quantized_layout == "nibbles"
    assert cpu_policy(frozenset({"avx2", "fma"})).quantized_layout == "unpacked"
    assert cpu_policy(frozenset({"avx2"})).compiler_options(np.float32) == {"xla_cpu_use_xnnpack": False}
    wide = cpu_policy(frozenset({"avx512f"}))
    assert wide.compiler_options(np.float32)["xla_cpu_prefer_vector_width"] == 512
    assert "xla_cpu_prefer_vector_width" not in wide.compiler_options(jax.numpy.bfloat16)
    gpu = policy_for("gpu")
    assert gpu.precision is None and gpu.compiler_options(np.float32) is None and gpu.quantized_layout == "unpacked"
    assert gpu.weight_left_max_rows == 0 and gpu.dequant_row_chunk == 0 and gpu.attention_grouped(16, 128, 3)
    # attention: grouped query heads for one new token per row with AVX-512, for batched decode only without
    avx512, avx2 = cpu_policy(frozenset({"avx2", "avx512f"})), cpu_policy(frozenset({"avx2", "fma"}))
    assert [avx512.attention_grouped(b, s, 3) for b, s in ((1, 1), (8, 1), (1, 128), (8, 128))] == [True, True, False, False]
    assert [avx2.attention_grouped(b, s, 3) for b, s in ((1, 1), (8, 1), (1, 128), (8, 128))] == [False, True, False, False]
    assert not avx512.attention_grouped(8, 1, 1)  # one query head per KV head: nothing to group
    m = TinyLM(QuantizationEncoding.Q4_0)
    m.raw_state_dict()  # full names
    g = Graph("tiny", forward=m, input_types=[TensorType(DType.int32, ["batch", 3], DeviceRef.CPU())])
    assert Program(g).quantized_layout == policy_for(None).quantized_layout
    assert Program(g, policy=cpu_policy(frozenset({"avx512f"}))).quantized_layout == "nibbles"


def test_matmul_of_a_large_weight_in_row_blocks_matches():
    packed = _quantized(3072, 64, gguf.GGMLQuantizationType.Q8_0)  # twelve 256-row blocks
    r = UnpackedArray.from_packed(QuantizationEncoding.Q8_0, jax.numpy.asarray(packed))
    cpu = F32_ACTIVATIONS
    assert cpu.dequant_row_chunk == 256 and cpu.row_chunks(3072, 6) == 12 and cpu.row_chunks(3072, 1) == 1
    assert cpu.row_chunks(512, 6) == 2 and cpu.row_chunks(384, 6) == 1 and cpu.row_chunks(3000, 6) == 1
    w = np.asarray(dequantize(QuantizationEncoding.Q8_0, jax.numpy.asarray(packed)), np.float64)
    x = RNG.standard_normal((2, 3, 64)).astype(np.float32)
    for policy in (F32_ACTIVATIONS, policy_for("gpu")):  # in row blocks, and whole
        out = np.asarray(jax.jit(lambda x, r: r.matmul(x, policy))(x, r))
        assert out.shape == (2, 3, 3072)
        np.testing.assert_allclose(out, x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("cls,qtype", [(UnpackedArray, gguf.GGMLQuantizationType.Q8_0), (NibbleArray, gguf.GGMLQuantizationType.Q4_0)])
def test_a_stacked_layer_in_row_blocks_matches(cls, qtype):
    """A prompt's product with one layer of a stacked weight (more rows than the CPU kernel takes)
    is formed one block of rows at a time, each block sliced out of the stack; it equals the
    product with the layer sliced whole, and the layer index is clamped as a slice clamps it."""
    enc = QuantizationEncoding(qtype.name)
    layers = [_quantized(3072, 64, qtype) for _ in range(3)]  # twelve 256-row blocks a layer
    stack = cls.from_packed(enc, jax.numpy.asarray(np.stack(layers)))
    cpu = F32_ACTIVATIONS
    x = RNG.standard_normal((2, 20, 64)).astype(np.float32)  # 40 rows: past the kernel's 32
    assert cpu.row_chunks(3072, 40) == 12 and not cpu.native_matmul(stack, 40)
    for layer, source in ((1, 1), (7, 2), (-3, 0)):
        got = np.asarray(jax.jit(lambda x, w, i: w.layer_matmul(x, i, cpu))(x, stack, np.int32(layer)))
        whole = np.asarray(jax.jit(lambda x, w: w.matmul(x, policy_for("gpu")))(x, stack.layer(source)))  # no row blocks
        want = x.astype(np.float64) @ np.asarray(dequantize(enc, jax.numpy.asarray(layers[source])), np.float64).T
        assert got.shape == (2, 20, 3072)
        np.testing.assert_allclose(got, whole, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("layout", [UnpackedArray, NibbleArray, PackedArray, DequantizedArray])
def test_matmul_of_long_rows_in_column_blocks_matches(layout):
    packed = _quantized(32, 8192, gguf.GGMLQuantizationType.Q4_0)  # Llama-3.2-1B down_proj's 8192 columns
    r = layout.from_packed(QuantizationEncoding.Q4_0, jax.numpy.asarray(packed))
    cpu = cpu_policy(frozenset({"sse4_2"}))  # without maxjax's kernel: column blocks
    assert cpu.col_chunks(8192, 1) == 4 and cpu.col_chunks(8192, 8) == 1 and cpu.col_chunks(8192, 40) == 4
    assert cpu.col_chunks(2048, 1) == 1 and policy_for("gpu").col_chunks(8192, 1) == 1
    for flags in ({"avx512f", "avx512bw", "f16c"}, {"avx2", "fma", "f16c"}):  # the kernel's CPUs: none
        assert cpu_policy(frozenset(flags)).col_chunks(8192, 40) == 1
    w = np.asarray(dequantize(QuantizationEncoding.Q4_0, jax.numpy.asarray(packed)), np.float64)
    for lead in [(1,), (40,)]:  # in four column blocks on the CPU, whole on the GPU policy
        x = RNG.standard_normal((*lead, 8192)).astype(np.float32)
        for policy in (cpu, policy_for("gpu")):
            out = np.asarray(jax.jit(lambda x, r: r.matmul(x, policy))(x, r))
            np.testing.assert_allclose(out, x.astype(np.float64) @ w.T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("lead", [(1,), (2,), (4, 4), (17,), (2, 64)])
def test_matmul_t_on_either_side_of_the_weight_left_range(lead):
    """1 row and more than 16 rows: x @ w.T; 2 to 16 rows: (w @ x.T).T. Same numbers, same gradient."""
    cpu = F32_ACTIVATIONS
    assert cpu.weight_left_max_rows == 16
    packed = _quantized(96, 64, gguf.GGMLQuantizationType.Q4_1)
    nib = NibbleArray.from_packed(QuantizationEncoding.Q4_1, jax.numpy.asarray(packed))
    w = np.asarray(nib.dequantize())
    x = RNG.standard_normal((*lead, 64)).astype(np.float32)
    expected = x.astype(np.float64) @ w.astype(np.float64).T
    for f, weight in ((cpu.matmul_t, w), (lambda x, q: q.matmul(x, cpu), nib)):
        out = np.asarray(jax.jit(f)(x, weight))
        assert out.shape == (*lead, 96)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda x: (cpu.matmul_t(x, w) ** 2).sum())(x)
    np.testing.assert_allclose(np.asarray(grad), 2 * expected @ w.astype(np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_stored_weight_is_contracted_in_its_stored_layout(dtype):
    """A stored float32 weight (``stored=True``: a float ``Linear``) of the activations' dtype is
    one ``dot_general`` over its axis 1, with no transpose for XLA:CPU to materialise (one row of a
    float32 [2048, 8192] weight: 97 ms transposed, 3.8 ms in place); a bfloat16 one is the
    opposite, ``matmul(x, w.T)`` with float32 sums (one bfloat16 row contracted over the weight's
    axis 1 widened the whole weight first: 20x slower, see ``_float32_dot_t``). The platform
    policy's ``autocast`` is off, so equal dtypes never take the autocast product. (XLA's forms:
    where maxjax's kernel runs, a few bfloat16 rows multiply there instead,
    tests/test_16bit_weights.py.)"""
    cpu = dataclasses.replace(F32_ACTIVATIONS, native_matmul_max_rows=0, widened_kernel_max_rows=0)
    assert not cpu.autocast
    w = jax.numpy.asarray(RNG.standard_normal((48, 64)), dtype)  # [out, in]
    x = jax.numpy.asarray(RNG.standard_normal((1, 64)), dtype)
    hlo = jax.jit(lambda x, w: cpu.matmul_t(x, w, stored=True)).lower(x, w).as_text()
    assert hlo.count("dot_general") == 1, hlo
    if dtype == "float32":
        assert "transpose" not in hlo and "contracting_dims = [1] x [1]" in hlo, hlo
    else:
        assert "transpose" in hlo and "contracting_dims = [1] x [0]" in hlo and "-> tensor<1x48xf32>" in hlo, hlo
    out = np.asarray(cpu.matmul_t(x, w, stored=True), np.float64)
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    np.testing.assert_allclose(out, want, rtol=1e-5 if dtype == "float32" else 2**-7, atol=1e-5 if dtype == "float32" else 5e-2)


def test_a_new_encoding_is_one_class():
    """An int8-per-row encoding, written here as one QuantizedArray subclass and registered for an
    encoding maxjax does not run itself (GPTQ stands in), runs through Weight, ops.qmatmul,
    ops.gather + ops.dequantize, graph mode, eager and functional modes with nothing else changed."""
    import jax.numpy as jnp

    from maxjax.graph.quantization import QuantizedArray, register_encoding

    @jax.tree_util.register_pytree_node_class
    class Int8Rows(QuantizedArray):
        """Stored as uint8 [rows, cols + 4]: int8 values, then the row's float32 scale."""

        layout = "int8_rows"
        __slots__ = ("values", "scale")

        def _leaves(self):
            return (self.values, self.scale)

        def _from_leaves(self, leaves):
            self.values, self.scale = leaves

        @property
        def shape(self):
            return tuple(self.values.shape)

        def dequantize(self):
            return self.values.astype(jnp.float32) * self.scale[..., None]

        def take(self, indices):
            return jax.tree.map(lambda a: jnp.take(a, indices, axis=0, mode="clip"), self)

        @classmethod
        def from_stored(cls, encoding, stored):
            obj = object.__new__(cls)
            obj.encoding = encoding
            if isinstance(stored, jax.ShapeDtypeStruct):  # the abstract value a graph records
                rows, width = stored.shape
                obj.values = jax.ShapeDtypeStruct((rows, width - 4), jnp.int8)
                obj.scale = jax.ShapeDtypeStruct((rows,), jnp.float32)
            else:
                stored = jnp.asarray(stored)
                obj.values = jax.lax.bitcast_convert_type(stored[:, :-4], jnp.int8)
                obj.scale = jax.lax.bitcast_convert_type(stored[:, -4:], jnp.float32)
            return obj

    enc = QuantizationEncoding.GPTQ
    values = RNG.integers(-127, 128, (6, 16)).astype(np.int8)
    scale = RNG.uniform(0.01, 0.1, 6).astype(np.float32)
    stored = np.concatenate([values.view(np.uint8), scale.view(np.uint8).reshape(6, 4)], axis=1)
    dense = values.astype(np.float32) * scale[:, None]

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = Weight("w", DType.uint8, (6, 20), DeviceRef.CPU(), quantization_encoding=enc)

        def __call__(self, x, ids):
            return ops.qmatmul(enc, None, x, self.w), ops.dequantize(enc, ops.gather(self.w, ids, axis=0))

    register_encoding(enc, Int8Rows)
    try:
        m = Model()
        m.load_state_dict({"w": stored})
        x = RNG.standard_normal((3, 16)).astype(np.float32)
        ids = np.array([5, 0], np.int32)
        types = [TensorType(DType.float32, ["b", 16], DeviceRef.CPU()), TensorType(DType.int32, [2], DeviceRef.CPU())]
        g = Graph("new_encoding", forward=m, input_types=types)
        assert g._nodes[[n.kind for n in g._nodes].index("weight")].out_avals[0].shape == (6, 16)  # the logical shape
        prog = Program(g)
        state = prog.prepare(m.state_dict())
        assert isinstance(state["weights"]["w"], Int8Rows)
        for y, rows in (jax.jit(prog.apply)(state, x, ids), m(x, ids), nn.functional_call(m, {"w": stored}, x, ids)):
            np.testing.assert_allclose(np.asarray(y), x @ dense.T, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(np.asarray(rows), dense[ids])
    finally:
        register_encoding(enc, None)


def test_a_quantized_graph_output_is_the_weights_gguf_bytes_as_in_max():
    q = _quantized(8, 64, gguf.GGMLQuantizationType.Q8_0)
    emb = nn.Embedding(8, 64, DType.float32, quantization_encoding=QuantizationEncoding.Q8_0)
    emb.load_state_dict({"weight": q})
    with Graph("rows", input_types=[TensorType(DType.int32, [2], DeviceRef.CPU())]) as g:
        g.output(ops.gather(emb.weight, g.inputs[0], axis=0), emb(g.inputs[0]))
    assert g._packed_only == {"weight"}  # its bytes are read, so it stays in the file's layout
    raw, rows = InferenceSession().load(g, weights_registry=emb.state_dict()).execute(np.array([1, 3], np.int32))
    np.testing.assert_array_equal(raw.to_numpy(), q[[1, 3]])
    np.testing.assert_array_equal(rows.to_numpy(), gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)[[1, 3]])
