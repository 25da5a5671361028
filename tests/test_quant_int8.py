"""The ``int8`` quantized layout (Int8Array): weights requantized per output channel in 64-column
Hadamard blocks, float32 products for few rows and int8 x int8 -> int32 dots for many, on GGUF
blocks made by the ``gguf`` package and on the bundled SmolLM2."""

from __future__ import annotations

import dataclasses

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax.backend import cpu_policy, kernels, policy_for
from maxjax.graph.quantization import Int8Array, QuantizationEncoding, to_layout
from maxjax.graph.quantization.arrays import hadamard_blocks

CPU = policy_for("cpu")
FLOAT = dataclasses.replace(CPU, int8_min_rows=0)  # float32 products only


def _weight(qtype, rows=96, cols=128, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[:, 5] *= 20  # an outlier column
    packed = jnp.asarray(gguf.quantize(w, qtype))
    enc = QuantizationEncoding.from_gguf(qtype)
    return enc, packed, np.asarray(to_layout("unpacked", enc, packed).dequantize())


def test_hadamard_blocks_are_orthonormal_and_their_own_inverse():
    a = np.random.default_rng(1).standard_normal((3, 192)).astype(np.float32)
    r = np.asarray(hadamard_blocks(jnp.asarray(a), 64))
    np.testing.assert_allclose(np.linalg.norm(r, axis=-1), np.linalg.norm(a, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(hadamard_blocks(jnp.asarray(r), 64)), a, atol=1e-5)
    assert not np.allclose(r[:, 64:128], a[:, 64:128])  # it does move the values


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q4_0])
def test_requantized_weight_is_within_half_a_step_per_row(qtype):
    enc, packed, w = _weight(qtype)
    q = to_layout("int8", enc, packed)
    assert isinstance(q, Int8Array) and q.rotated and q.values.dtype == jnp.int8 and q.shape == (96, 128)
    assert q.nbytes == 96 * 128 + 96 * 4  # one byte a value, one float32 scale a row
    err = np.linalg.norm(np.asarray(q.dequantize()) - w, axis=-1)  # the rotation keeps L2 norms
    bound = np.sqrt(128) * np.asarray(q.scale) / 2  # each rotated value within half a step
    assert (err <= bound * 1.0001).all()
    np.testing.assert_allclose(np.asarray(q.take(jnp.array([3, 90])).dequantize()), np.asarray(q.dequantize())[[3, 90]], atol=1e-6)


def test_few_rows_multiply_in_float32_and_many_rows_in_int8():
    enc, packed, w = _weight(gguf.GGMLQuantizationType.Q8_0)
    q = to_layout("int8", enc, packed)
    wq = np.asarray(q.dequantize(), np.float64)  # the requantized weight
    rng = np.random.default_rng(2)
    for rows in (1, 4, 15):  # below int8_min_rows: float32, the requantized weight's exact product
        x = rng.standard_normal((rows, 128)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(q.matmul(jnp.asarray(x), CPU)), x @ wq.T, rtol=2e-4, atol=2e-4)
    x = rng.standard_normal((2, 16, 128)).astype(np.float32)
    y = np.asarray(q.matmul(jnp.asarray(x), CPU))  # 32 rows: int8 activations
    exact = x @ wq.T
    assert y.shape == (2, 16, 96) and not np.allclose(y, exact, rtol=1e-5, atol=1e-5)  # it is the int8 path
    # each rotated activation is within half its row's step (max |row| / 127) of its int8 value, so
    # output n of a row is within step / 2 * sum |(W H)[n]| of the exact product
    xr = np.asarray(hadamard_blocks(jnp.asarray(x), 64), np.float64)
    step = np.abs(xr).max(-1, keepdims=True) / 127  # [2, 16, 1]
    l1 = np.abs(np.asarray(q.values, np.float64) * np.asarray(q.scale)[:, None]).sum(-1)  # [96]
    assert (np.abs(y - exact) <= step / 2 * l1 * 1.001 + 1e-4).all()
    np.testing.assert_allclose(np.asarray(q.matmul(jnp.asarray(x), FLOAT)), exact, rtol=2e-4, atol=2e-4)
    jitted = jax.jit(lambda x, q: q.matmul(x, CPU))(jnp.asarray(x), q)
    np.testing.assert_allclose(np.asarray(jitted), y, rtol=1e-6, atol=1e-6)


def test_long_rows_multiply_in_column_blocks():
    """A weight with more columns than the policy's ``dequant_col_chunk`` (Llama-3.2-1B's
    ``down_proj``: 8192) multiplies one block of columns at a time; its per-row scale is whole in
    every block."""
    plain = cpu_policy(frozenset({"sse4_2"}))  # a CPU without maxjax's kernel multiplies long rows in blocks
    enc, packed, _ = _weight(gguf.GGMLQuantizationType.Q8_0, rows=32, cols=4 * plain.dequant_col_chunk)
    q = to_layout("int8", enc, packed)
    assert plain.col_chunks(q.shape[1], 1) > 1  # the blocked path is the one taken
    x = np.random.default_rng(3).standard_normal((1, q.shape[1])).astype(np.float32)
    want = x.astype(np.float64) @ np.asarray(q.dequantize(), np.float64).T
    np.testing.assert_allclose(np.asarray(q.matmul(jnp.asarray(x), plain)), want, rtol=1e-4, atol=1e-3)


def test_stacked_layers_slice_and_unrotated_widths_work():
    enc = QuantizationEncoding.Q8_0
    rng = np.random.default_rng(3)
    layers = [rng.standard_normal((8, 96)).astype(np.float32) for _ in range(3)]  # 96: not a multiple of 64
    packed = jnp.asarray(np.stack([gguf.quantize(w, gguf.GGMLQuantizationType.Q8_0) for w in layers]))
    q = to_layout("int8", enc, packed)
    assert q.shape == (3, 8, 96) and not q.rotated
    one = jax.tree.map(lambda a: a[1], q)
    x = rng.standard_normal((16, 96)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(one.matmul(jnp.asarray(x), FLOAT)), x @ np.asarray(one.dequantize()).T, rtol=2e-4, atol=2e-4)
    assert np.abs(np.asarray(one.dequantize()) - layers[1]).max() < 0.05


@pytest.mark.skipif(not kernels.available(), reason=f"maxjax's CPU kernels do not run here: {kernels.unavailable_reason()}")
def test_few_rows_run_in_the_kernel_reading_a_stacked_layer_in_place():
    """Fewer rows than ``int8_min_rows`` (batch-1 decode) multiply an int8 weight in maxjax's
    kernel: a layer of a stack read in place (no slice of the int8 values in the compiled
    program), the float32 product of the requantized weight, differentiable in ``x``; the same
    values as XLA's float32 product on a CPU without the kernel."""
    plain = cpu_policy(frozenset({"sse4_2"}))  # no kernel: XLA's float32 product
    rng = np.random.default_rng(4)
    layers = [rng.standard_normal((48, 256)).astype(np.float32) for _ in range(3)]
    packed = jnp.asarray(np.stack([gguf.quantize(w, gguf.GGMLQuantizationType.Q4_0) for w in layers]))
    q = to_layout("int8", QuantizationEncoding.Q4_0, packed)
    assert q.rotated and CPU.native_matmul(q, 1) and not plain.native_matmul(q, 1)
    for i in range(3):
        wq = np.asarray(q.layer(i).dequantize(), np.float64)  # [48, 256], the requantized layer
        for rows in (1, 3, 15):
            x = jnp.asarray(rng.standard_normal((rows, 256)).astype(np.float32))
            got = np.asarray(q.layer_matmul(x, jnp.int32(i), CPU))
            np.testing.assert_allclose(got, np.asarray(x, np.float64) @ wq.T, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(got, np.asarray(q.layer(i).matmul(x, plain)), rtol=1e-4, atol=1e-4)
    step = jax.jit(lambda x, q, i: q.layer_matmul(x, i, CPU))
    hlo = step.lower(x, q, jnp.int32(1)).compile().as_text()
    assert "maxjax_unpacked_matmul" in hlo and "s8[48,256]" not in hlo  # the layer is not copied out
    g = jax.grad(lambda x: (q.layer_matmul(x, jnp.int32(2), CPU) ** 2).sum())(x)
    g_xla = jax.grad(lambda x: (q.layer(2).matmul(x, plain) ** 2).sum())(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_xla), rtol=1e-4, atol=1e-4)
    head = q.layer(0)  # a 2-D weight (an output head) in the kernel too
    x1 = jnp.asarray(rng.standard_normal((1, 256)).astype(np.float32))
    hlo = jax.jit(lambda x, w: w.matmul(x, CPU)).lower(x1, head).compile().as_text()
    assert "maxjax_unpacked_matmul" in hlo
    np.testing.assert_allclose(np.asarray(head.matmul(x1, CPU)), np.asarray(head.matmul(x1, plain)), rtol=1e-4, atol=1e-4)


def test_a_weight_of_no_rows_requantizes_to_an_empty_one():
    packed = jnp.zeros((2, 0, 72), jnp.uint8)  # two layers of no Q4_0 rows of 128 values
    q = to_layout("int8", QuantizationEncoding.Q4_0, packed)
    assert q.shape == (2, 0, 128) and q.scale.shape == (2, 0)


def test_requantizing_in_blocks_of_rows_equals_all_at_once():
    """A weight of more rows than one conversion block is requantized block by block (bounded
    float32 temporaries); each row's int8 values and scale are those of converting it alone."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2, 4096, 64)).astype(np.float32) * rng.uniform(0.1, 4, (2, 4096, 1)).astype(np.float32)
    packed = np.stack([gguf.quantize(a, gguf.GGMLQuantizationType.Q8_0) for a in w])  # 8192 rows: two blocks
    whole = to_layout("int8", QuantizationEncoding.Q8_0, jnp.asarray(packed))
    parts = [to_layout("int8", QuantizationEncoding.Q8_0, jnp.asarray(packed[i])) for i in range(2)]  # one block each
    assert whole.shape == (2, 4096, 64)
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(whole.values[i]), np.asarray(parts[i].values))
        np.testing.assert_array_equal(np.asarray(whole.scale[i]), np.asarray(parts[i].scale))


def test_smollm2_in_int8_generates_and_scores_like_float32(capsys):
    from maxjax.cli import main

    assert main(["generate", "--quantized-layout", "int8", "--max-new-tokens", "6", "The quick brown fox"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "6 new tokens" in err
    from maxjax.models import load_model

    f32, i8 = load_model(), load_model(quantized_layout="int8")
    tokens = np.asarray(f32.tokenizer.encode_batch(["The capital of France is Paris. The capital of Italy is Rome."])[0], np.int32)[None]
    la = np.asarray(f32.prefill(tokens, [tokens.shape[1]], *f32.new_cache(1, 64))[1])
    lb = np.asarray(i8.prefill(tokens, [tokens.shape[1]], *i8.new_cache(1, 64))[1])
    assert la.argmax() == lb.argmax()
    pa, pb = jax.nn.softmax(la[0]), jax.nn.softmax(lb[0])
    assert float(jnp.abs(pa - pb).sum()) < 0.1  # total variation of the next-token distribution


def test_int8_on_a_mesh_is_refused_in_one_line(capsys):
    from maxjax.cli import main

    assert main(["generate", "--quantized-layout", "int8", "--mesh", "tp=2", "--max-new-tokens", "2", "hi"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "maxjax generate: error: quantized_layout='int8' is not supported on a device mesh yet (its per-row scales and "
        "64-column rotation blocks are not split over devices); use 'unpacked' or 'nibbles' with a mesh"
    ]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--arithmetic", "int8", "--quantized-layout", "nibbles"], "arithmetic='int8' needs quantized_layout='int8', got 'nibbles'"),
        (["--arithmetic", "float32", "--quantized-layout", "int8"],
         "arithmetic='float32' keeps the file's values exactly; quantized_layout='int8' requantizes them"),
        (["--arithmetic", "int8", "--mesh", "tp=2"],
         "arithmetic='int8' is not supported on a device mesh yet; float32 runs there (arithmetic='float32')"),
    ],
)  # fmt: skip
def test_arithmetic_that_cannot_run_is_one_line(argv, message, capsys):
    from maxjax.cli import main

    assert main(["generate", *argv, "--max-new-tokens", "2", "hi"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"maxjax generate: error: {message}"]


def test_arithmetic_int8_loads_the_int8_layout_and_float_models_are_refused(tmp_path):
    import llama_files as L

    from maxjax.models import load_model

    lm = load_model(arithmetic="int8")
    assert lm.program.quantized_layout == "int8"
    assert isinstance(lm.state["stacked"][0]["mlp.down_proj.weight"], Int8Array)
    assert load_model(arithmetic="auto").program.quantized_layout == CPU.quantized_layout  # the policy: float32
    d = L.write_hf_dir(tmp_path / "hf", L.hf_config(), L.hf_tensors())
    with pytest.raises(ValueError, match=r"arithmetic='int8' needs a GGUF-quantized model; .*hf has float weights"):
        load_model(d, arithmetic="int8")
    with pytest.raises(ValueError, match="arithmetic must be one of auto, float32, int8, q8_0, got 'int4'"):
        load_model(arithmetic="int4")
