"""Program's quantized weight layouts: "nibbles" and "unpacked" give the same numbers as the file's packed blocks."""

from __future__ import annotations

import gguf
import jax
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import Program
from maxjax.graph import DeviceRef, Graph, TensorType, ops
from maxjax.graph.quantization import QuantizationEncoding, RepackedWeight

RNG = np.random.default_rng(7)


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
        prog = Program(g, quantized_layout=layout)
        state = prog.prepare(m.state_dict())
        kinds = {k: (type(v).__name__, str(getattr(v, "dtype", ""))) for k, v in state["weights"].items()}
        expected = {"packed": ("ArrayImpl", "uint8"), "unpacked": ("RepackedWeight", ""), "dequantized": ("ArrayImpl", "float32")}
        expected["nibbles"] = expected["unpacked"]  # Q8_0 (the embedding) has 8-bit values
        proj = ("NibbleWeight", "") if layout == "nibbles" and enc is QuantizationEncoding.Q4_0 else expected[layout]
        assert kinds == {"embed.weight": expected[layout], "proj.weight": proj}
        outs[layout] = np.asarray(jax.jit(prog.apply)(state, ids)[0])
    np.testing.assert_array_equal(outs["nibbles"], outs["unpacked"])
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
    state = Program(g, quantized_layout="unpacked").prepare(m.state_dict())
    assert not isinstance(state["weights"]["proj.weight"], RepackedWeight)
    with pytest.raises(ValueError, match="quantized_layout must be 'packed', 'nibbles', 'unpacked' or 'dequantized'"):
        Program(g, quantized_layout="fast")


def test_repacked_matmul_of_a_large_weight_in_row_blocks_matches():
    from maxjax.graph.quantization import dequantize, repack, repacked_matmul

    packed = _quantized(8192 + 4096, 64, gguf.GGMLQuantizationType.Q8_0)  # three 4096-row blocks
    r = repack(QuantizationEncoding.Q8_0, jax.numpy.asarray(packed))
    w = np.asarray(dequantize(QuantizationEncoding.Q8_0, jax.numpy.asarray(packed)), np.float64)
    x = RNG.standard_normal((2, 3, 64)).astype(np.float32)
    out = np.asarray(jax.jit(repacked_matmul)(x, r))
    assert out.shape == (2, 3, 12288)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("lead", [(1,), (2,), (4, 4), (17,), (2, 64)])
def test_matmul_transposed_on_either_side_of_the_swapped_range(lead):
    """1 row and more than 16 rows: x @ w.T; 2 to 16 rows: (w @ x.T).T. Same numbers, same gradient."""
    from maxjax.graph.quantization import SWAPPED_MAX_ROWS, matmul_transposed, repack_nibbles, repacked_matmul

    assert SWAPPED_MAX_ROWS == 16
    packed = _quantized(96, 64, gguf.GGMLQuantizationType.Q4_1)
    nib = repack_nibbles(QuantizationEncoding.Q4_1, jax.numpy.asarray(packed))
    w = np.asarray(nib.dequantize())
    x = RNG.standard_normal((*lead, 64)).astype(np.float32)
    expected = x.astype(np.float64) @ w.astype(np.float64).T
    for f, weight in ((matmul_transposed, w), (repacked_matmul, nib)):
        out = np.asarray(jax.jit(f)(x, weight))
        assert out.shape == (*lead, 96)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda x: (matmul_transposed(x, w) ** 2).sum())(x)
    np.testing.assert_allclose(np.asarray(grad), 2 * expected @ w.astype(np.float64), rtol=1e-4, atol=1e-4)
