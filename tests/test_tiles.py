"""The ``tiles`` layout (:mod:`maxjax.graph.quantization.tiles`): Q4_0 and Q4_1 in tiles of 16 rows,
multiplied by Q8_0 activations with integer dots in maxjax's CPU kernel."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax.backend import cpu_policy, kernels, policy_for
from maxjax.backend.kernels import layouts
from maxjax.graph.quantization import QuantizationEncoding, QuantizedArray, TiledArray, to_layout
from maxjax.graph.quantization.blocks import q8_0_round

E = QuantizationEncoding
CPU = policy_for("cpu")
PLAIN = cpu_policy(frozenset({"sse4_2"}))  # a CPU without maxjax's kernels: XLA's products
needs_kernel = pytest.mark.skipif(not (kernels.available() and kernels.tiles_built()), reason="the tiles kernel is built for AVX-512 CPUs only")


def _q4_0(rows: int, cols: int, seed: int, enc: E = E.Q4_0) -> np.ndarray:
    """gguf-quantized rows of varied scale (Q4_1: and offset): uint8 [rows, row_bytes]."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 3.0, (rows, 1)).astype(np.float32)
    return gguf.quantize(w + rng.uniform(-1, 1, (rows, 1)).astype(np.float32), gguf.GGMLQuantizationType[enc.value])


def _dequantized(packed: np.ndarray, enc: E = E.Q4_0) -> np.ndarray:
    return gguf.dequantize(packed, gguf.GGMLQuantizationType[enc.value]).astype(np.float64)


def _q8_0(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to Q8_0 blocks as llama.cpp's ``quantize_row_q8_0`` does, float64."""
    return np.asarray(q8_0_round(jnp.asarray(x)), np.float64)


@pytest.mark.parametrize("enc", [E.Q4_0, E.Q4_1])
def test_the_layout_holds_the_files_values_and_the_host_writes_the_same_bytes(enc):
    """Tiles dequantize to gguf's values bit for bit (a weight and a stack of three); rows taken
    out of a tile (an embedding lookup) are gguf's rows; the host conversion from the file's blocks
    (in the stored order, or through a row index) writes the bytes of the ``jnp`` definition."""
    packed = np.stack([_q4_0(48, 256, s, enc) for s in range(3)])
    t = to_layout("tiles", enc, jnp.asarray(packed[0]))
    assert isinstance(t, TiledArray) and t.shape == (48, 256) and t.values.shape == (3, 2048) and t.scale.shape == (3, 128)
    assert (t.offset is None) == (enc == E.Q4_0)
    assert t.nbytes == packed[0].nbytes  # the file's bytes (18 or 20 per block)
    np.testing.assert_array_equal(np.asarray(t.dequantize()), _dequantized(packed[0], enc))
    stack = to_layout("tiles", enc, jnp.asarray(packed))
    assert stack.shape == (3, 48, 256)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(stack.layer(i).dequantize()), _dequantized(packed[i], enc))
    rows = np.array([0, 17, 47, 33, 16])
    np.testing.assert_array_equal(np.asarray(t.take(jnp.asarray(rows)).dequantize()), _dequantized(packed[0], enc)[rows])
    order = np.random.default_rng(1).permutation(48)
    spec = layouts.layout_shapes("tiles", enc.value, 48, 256)
    out = {k: None if v is None else np.zeros((2, *v[0]), v[1]) for k, v in spec.items()}
    layouts.convert_layers("tiles", enc.value, [(packed[0], None), (packed[1], order)], out["values"], out["scale"], out["offset"])
    reordered = to_layout("tiles", enc, jnp.asarray(packed[1][order]))
    for i, want in enumerate((t, reordered)):
        for k in ("values", "scale", "offset"):
            if getattr(want, k) is not None:
                np.testing.assert_array_equal(out[k][i].view(np.uint8), np.asarray(getattr(want, k)).view(np.uint8))


@needs_kernel
@pytest.mark.parametrize("enc", [E.Q4_0, E.Q4_1])
@pytest.mark.parametrize("rows,cols", [(48, 256), (16, 2048), (128, 96)])
def test_products_are_llama_cpps_q8_0_arithmetic_and_each_row_its_own(rows, cols, enc):
    """1 to 40 activation rows (decode, a batch, a prompt) in the kernel: the float64 product of
    gguf's dequantized weight and the activations rounded to Q8_0 blocks, up to float32 sums; a
    row's outputs are the same bit for bit alone and among 40 rows (per-row integer dots, the
    blocks summed in one order); no kernel (XLA) gives the same values."""
    packed = _q4_0(rows, cols, 3, enc)
    t = to_layout("tiles", enc, jnp.asarray(packed))
    w = _dequantized(packed, enc)
    x = np.random.default_rng(4).standard_normal((40, cols)).astype(np.float32)
    whole = np.asarray(t.matmul(jnp.asarray(x), CPU))
    want = _q8_0(x) @ w.T
    np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    for m in (1, 3, 8, 11):
        np.testing.assert_array_equal(np.asarray(t.matmul(jnp.asarray(x[:m]), CPU)), whole[:m])
    np.testing.assert_array_equal(np.asarray(t.matmul(jnp.asarray(x[29:30]), CPU)), whole[29:30])
    np.testing.assert_allclose(np.asarray(t.matmul(jnp.asarray(x), PLAIN)), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@needs_kernel
def test_a_stacked_layer_is_read_in_place_and_the_gradient_is_the_weights():
    packed = np.stack([_q4_0(32, 128, s) for s in range(3)])
    stack = to_layout("tiles", E.Q4_0, jnp.asarray(packed))
    x = jnp.asarray(np.random.default_rng(5).standard_normal((2, 128)).astype(np.float32))
    for i in range(3):
        got = np.asarray(stack.layer_matmul(x, jnp.int32(i), CPU))
        np.testing.assert_array_equal(got, np.asarray(stack.layer(i).matmul(x, CPU)))
        np.testing.assert_allclose(got, _q8_0(np.asarray(x)) @ _dequantized(packed[i]).T, rtol=1e-5, atol=1e-4)
    hlo = jax.jit(lambda x, w, i: w.layer_matmul(x, i, CPU)).lower(x, stack, jnp.int32(1)).compile().as_text()
    assert "maxjax_tiles_matmul" in hlo and "u8[2,1024]" not in hlo  # the layer's values are not copied out (layer(i) would)
    g = jax.grad(lambda x: stack.layer_matmul(x, jnp.int32(2), CPU).sum())(x)
    np.testing.assert_allclose(np.asarray(g), np.broadcast_to(_dequantized(packed[2]).sum(0), (2, 128)), rtol=1e-5, atol=1e-5)


def test_what_the_layout_cannot_take_is_refused():
    with pytest.raises(ValueError, match=r"tiles layout takes Q4_0 and Q4_1 with rows a multiple of 16, got Q4_0 \[8, 64\]"):
        TiledArray.from_packed(E.Q4_0, jnp.asarray(_q4_0(8, 64, 0)))
    q8 = gguf.quantize(np.ones((16, 64), np.float32), gguf.GGMLQuantizationType.Q8_0)
    assert to_layout("tiles", E.Q8_0, jnp.asarray(q8)).layout == "unpacked"  # as every layout a weight cannot take
    if kernels.available() and kernels.tiles_built():
        t = to_layout("tiles", E.Q4_0, jnp.asarray(_q4_0(16, 64, 0)))
        with pytest.raises(ValueError, match=r"tiles layout multiplies Q8_0 activations only"):
            kernels.quantized_matmul(jnp.ones((1, 64), jnp.float32), t)


@needs_kernel
def test_a_q4_0_model_in_tiles_runs_the_q8_0_arithmetic(tiny_q4_0):
    """``load_model(quantized_layout="tiles")``: every quantized weight of the tiny Llama is a
    TiledArray (converted on the host), the policy rounds activations to Q8_0, and its prompt
    logits and greedy tokens are those of the mapped layout's Q8_0 arithmetic (the same values,
    summed in another order); a prompt's last logits equal a 1-token prefill's continuation."""
    from maxjax.models import load_model

    lm = load_model(tiny_q4_0, quantized_layout="tiles")
    ref = load_model(tiny_q4_0, arithmetic="q8_0", policy=dataclasses.replace(CPU, mapped_encodings=("Q4_0",)))
    weights = [x for x in jax.tree.leaves(lm.state, is_leaf=lambda x: isinstance(x, QuantizedArray)) if isinstance(x, QuantizedArray)]
    assert weights and all(isinstance(x, TiledArray) and isinstance(x.values, jax.Array) for x in weights)
    assert lm.program.policy.q8_activations
    ids = np.asarray([lm.encode_prompt("Hello there, how are you today")], np.int32)
    n = ids.shape[1]
    got = np.asarray(lm.prefill(ids, [n], *lm.new_cache(1, 32))[1])
    want = np.asarray(ref.prefill(ids, [n], *ref.new_cache(1, 32))[1])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    a = lm.generate(["Hello there"], max_new_tokens=8, stop_at_eos=False)[0].token_ids
    b = ref.generate(["Hello there"], max_new_tokens=8, stop_at_eos=False)[0].token_ids
    assert a == b


def test_tiles_with_another_arithmetic_is_one_line(tiny_q4_0, capsys):
    from maxjax.cli import main

    assert main(["generate", "--model", str(tiny_q4_0), "--quantized-layout", "tiles", "--arithmetic", "float32", "--max-new-tokens", "2", "hi"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "maxjax generate: error: quantized_layout='tiles' multiplies Q8_0 activations (arithmetic='q8_0'), not arithmetic='float32'"
    ]


@needs_kernel
def test_weights_that_make_no_whole_tiles_take_the_layout_they_took_before(tmp_path):
    """With Q8_0 activations the policy tiles the Q4_0 and Q4_1 weights whose rows make whole
    tiles (the test Llama's Q4_1 blocks); a Q4_0 token embedding of 264 rows is read in place from
    the file (``mapped``), as without tiles, and the model's logits are those of every weight in
    the layout it took before (mapped and nibbles), up to float32 sums."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import llama_files as L

    from maxjax.models import load_model

    tensors = L.gguf_tensors()
    embd = np.random.default_rng(7).standard_normal((L.VOCAB, L.HIDDEN)).astype(np.float32)
    tensors["token_embd.weight"] = (gguf.quantize(embd, gguf.GGMLQuantizationType.Q4_0), gguf.GGMLQuantizationType.Q4_0)
    path = L.write_gguf(tmp_path / "m.gguf", L.gguf_metadata(), tensors)
    lm = load_model(path, arithmetic="q8_0")
    layouts_of = {(x.layout, x.encoding.value) for x in jax.tree.leaves(lm.state, is_leaf=lambda x: isinstance(x, QuantizedArray)) if isinstance(x, QuantizedArray)}
    assert layouts_of == {("mapped", "Q4_0"), ("tiles", "Q4_1")}
    before = load_model(path, arithmetic="q8_0", policy=dataclasses.replace(CPU, tiled_encodings=()))
    ids = np.asarray([[5, 9, 40, 7, 200]], np.int32)
    got = np.asarray(lm.prefill(ids, [5], *lm.new_cache(1, 16))[1])
    want = np.asarray(before.prefill(ids, [5], *before.new_cache(1, 16))[1])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_tiles_through_the_policy_is_refused_with_another_arithmetic(tiny_q4_0):
    from maxjax.models import load_model

    policy = dataclasses.replace(CPU, quantized_layout="tiles")
    with pytest.raises(ValueError, match=r"quantized_layout='tiles' multiplies Q8_0 activations \(arithmetic='q8_0'\), not arithmetic='float32'"):
        load_model(tiny_q4_0, policy=policy, arithmetic="float32")
