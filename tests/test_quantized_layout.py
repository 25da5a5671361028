"""Program's quantized weight layouts: "unpacked" gives the same numbers as the file's packed blocks."""

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
    for layout in ("packed", "unpacked"):
        prog = Program(g, quantized_layout=layout)
        state = prog.prepare(m.state_dict())
        kinds = {k: type(v).__name__ for k, v in state["weights"].items()}
        expected = "RepackedWeight" if layout == "unpacked" else "ArrayImpl"
        assert kinds == {"embed.weight": expected, "proj.weight": expected}
        outs[layout] = np.asarray(jax.jit(prog.apply)(state, ids)[0])
    np.testing.assert_allclose(outs["unpacked"], outs["packed"], rtol=1e-5, atol=1e-5)
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
    with pytest.raises(ValueError, match="quantized_layout must be 'packed' or 'unpacked'"):
        Program(g, quantized_layout="fast")
