"""Issue 23 (load at memory speed): GGUF weights read in place from the mapped file (``mapped``).

The kernel's products against the nibbles and unpacked kernels (bit for bit) and against the
gguf package's dequantizer; the layout's other ops against the stored blocks'; a tiny Llama GGUF
loaded by the CPU policy, whose Q4_0 weights then alias the file's map, against the same file
loaded into ``nibbles``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax.backend import BackendPolicy, kernels, policy_for
from maxjax.engine.placement import place_layers
from maxjax.graph.quantization import MappedArray, PackedArray, QuantizationEncoding, to_layout
from maxjax.graph.quantization.blocks import q8_0_round
from maxjax.graph.weights._host import MappedFile
from maxjax.graph.weights.lazy import LazyTensor

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"maxjax's CPU kernels do not run here: {kernels.unavailable_reason()}")

E = QuantizationEncoding
RNG = np.random.default_rng(23)


def _blocks(enc: E, rows: int, cols: int, seed: int) -> np.ndarray:
    """gguf-quantized rows of varied scale: uint8 [rows, row_bytes]."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 3.0, (rows, 1)).astype(np.float32)
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType[enc.value])


@pytest.mark.parametrize("enc", [E.Q4_0, E.Q8_0])
@pytest.mark.parametrize("layers,rows,cols", [(None, 64, 256), (3, 130, 512), (None, 7, 96)])
def test_kernel_is_bit_identical_to_the_converted_layouts(enc, layers, rows, cols):
    """Products of 1 to 11 activation rows with a mapped weight (2-D, or each layer of a stack;
    an odd number of rows) equal the nibbles (Q4_0, even rows) or unpacked kernel's bit for bit,
    and the float64 product of gguf's dequantized values closely; the prompt path's dequantized
    rows are gguf's values bit for bit."""
    n = layers or 1
    packed = np.stack([_blocks(enc, rows, cols, s) for s in range(n)])
    if layers is None:
        packed = packed[0]
    mapped = to_layout("mapped", enc, jnp.asarray(packed))
    assert isinstance(mapped, MappedArray) and mapped.shape == (*packed.shape[:-2], rows, cols)
    other = to_layout("nibbles" if enc == E.Q4_0 else "unpacked", enc, jnp.asarray(packed))
    assert other.layout == ("nibbles" if enc == E.Q4_0 and rows % 2 == 0 else "unpacked")
    want_w = gguf.quants.dequantize(packed.reshape(n * rows, -1), gguf.GGMLQuantizationType[enc.value]).reshape(n, rows, cols)
    for m in (1, 3, 8, 11):
        x = RNG.standard_normal((m, cols)).astype(np.float32)
        for i in range(n):
            layer = None if layers is None else jnp.int32(i)
            got = np.asarray(kernels.quantized_matmul(jnp.asarray(x), mapped, layer))
            np.testing.assert_array_equal(got, np.asarray(kernels.quantized_matmul(jnp.asarray(x), other, layer)))
            np.testing.assert_allclose(got, x.astype(np.float64) @ want_w[i].T.astype(np.float64), rtol=1e-4, atol=1e-3)
    for i in range(n):
        layer = None if layers is None else jnp.int32(i)
        rows_out = np.asarray(kernels.mapped_rows(mapped, jnp.int32(2), rows - 3, layer))
        np.testing.assert_array_equal(rows_out, want_w[i][2 : rows - 1])


def _q8_0(x: np.ndarray) -> np.ndarray:
    """``x`` [m, cols] as llama.cpp's ``quantize_row_q8_0`` rounds it, in NumPy: per 32 values
    d = max |x| / 127 in float32 and q = round-half-even(x * (1 / d)); returned as d * q, float64."""
    xb = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(xb).max(-1) / np.float32(127)).astype(np.float32)  # [m, blocks]
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.rint(xb * inv[..., None])
    return (q * d[..., None].astype(np.float64)).reshape(x.shape)


# (encoding, layout): every layout whose products take Q8_0 activations (Q4_0 and Q4_1 nibbles;
# unpacked int8 and uint8 values, with and without offsets; the file's Q4_0 and Q8_0 blocks)
Q8_0_CASES = [(E.Q4_0, "mapped"), (E.Q8_0, "mapped"), (E.Q4_0, "nibbles"), (E.Q4_1, "nibbles"),
              (E.Q4_0, "unpacked"), (E.Q4_1, "unpacked"), (E.Q8_0, "unpacked")]  # fmt: skip


@pytest.mark.parametrize("enc,layout", Q8_0_CASES)
@pytest.mark.parametrize("layers,rows,cols", [(None, 64, 256), (3, 130, 576), (None, 7, 96)])
def test_q8_0_activations_are_llama_cpps_arithmetic(enc, layout, layers, rows, cols):
    """``activations="Q8_0"`` (2-D weights, or each layer of a stack; SmolLM2's 576 columns; an odd
    number of blocks and of rows) gives
    llama.cpp's products of each weight with Q8_0 activations (``ggml_vec_dot_q4_0_q8_0``,
    ``_q4_1_q8_1``, ``_q8_0_q8_0``: exact integer dots, scaled): the float64 product of gguf's
    dequantized weight and the activations as ``quantize_row_q8_0`` rounds them, up to float32
    summation, for 1 to 9 activation rows, an all-zero block among them; those differ from the
    float32 products by that rounding; and the cotangent is the float32 product's."""
    n = layers or 1
    packed = np.stack([_blocks(enc, rows, cols, 40 + s) for s in range(n)])
    w = to_layout(layout, enc, jnp.asarray(packed if layers else packed[0]))
    assert w.layout == ("unpacked" if layout == "nibbles" and rows % 2 else layout)  # nibbles pair rows
    want_w = gguf.quants.dequantize(packed.reshape(n * rows, -1), gguf.GGMLQuantizationType[enc.value]).reshape(n, rows, cols)
    for m in (1, 2, 9):
        x = RNG.standard_normal((m, cols)).astype(np.float32) * 2
        x[0, 32:64] = 0
        for i in range(n):
            layer = None if layers is None else jnp.int32(i)
            got = np.asarray(kernels.quantized_matmul(jnp.asarray(x), w, layer, activations="Q8_0"))
            want = _q8_0(x) @ want_w[i].T.astype(np.float64)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
            exact = np.asarray(kernels.quantized_matmul(jnp.asarray(x), w, layer))
            err = np.abs(got - exact).max() / np.abs(exact).max()
            assert 1e-5 < err < 5e-2, err  # the activations' int8 rounding (3 blocks a row at least), no more
    x = jnp.asarray(RNG.standard_normal((2, cols)).astype(np.float32))
    layer = None if layers is None else jnp.int32(n - 1)
    g = [jax.grad(lambda x, a=a: kernels.quantized_matmul(x, w, layer, activations=a).sum())(x) for a in ("Q8_0", "float32")]
    np.testing.assert_array_equal(np.asarray(g[0]), np.asarray(g[1]))


def test_q8_0_activations_are_refused_where_they_cannot_run_and_rounded_instead():
    """An unpacked weight with a scale per 16 values (Q6_K) cannot take Q8_0 activations (32
    per block): the wrapper refuses it with its name, as it refuses an unknown value. A policy
    with ``q8_activations`` multiplies it by the activations rounded to Q8_0
    (:func:`q8_0_round`, llama.cpp's rounding) in float32 instead, in the kernel and in XLA
    alike; a Q4_0 weight's products in the kernel (integer dots) and in XLA (a prompt's rows)
    agree as closely; a policy without it takes the activations as they are."""
    x = jnp.asarray(RNG.standard_normal((3, 256)).astype(np.float32))
    q6_k = to_layout("unpacked", E.Q6_K, jnp.asarray(np.random.default_rng(1).integers(0, 255, (8, 210), dtype=np.uint8)))
    assert q6_k.scale.shape[-1] == 16
    with pytest.raises(ValueError, match=r"Q8_0 activations multiply .* unpacked ones in groups of 32, not UnpackedArray\(Q6_K"):
        kernels.quantized_matmul(x, q6_k, activations="Q8_0")
    q8, f32 = (dataclasses.replace(policy_for("cpu"), q8_activations=v) for v in (True, False))
    xla = dataclasses.replace(q8, native_matmul_max_rows=0)
    rounded = q8_0_round(x)
    np.testing.assert_allclose(np.asarray(rounded), _q8_0(np.asarray(x)), rtol=2e-7, atol=0)  # q * d, rounded once
    for w in (q6_k, to_layout("unpacked", E.Q4_0, jnp.asarray(_blocks(E.Q4_0, 8, 256, 1)))):
        exact = np.asarray(w.matmul(rounded, f32))
        for policy in (q8, xla):  # the kernel (3 rows), XLA
            np.testing.assert_allclose(np.asarray(w.matmul(x, policy)), exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
        assert not np.allclose(np.asarray(w.matmul(x, f32)), exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
    q4 = to_layout("mapped", E.Q4_0, jnp.asarray(_blocks(E.Q4_0, 8, 256, 1)))
    with pytest.raises(ValueError, match="activations must be one of"):
        kernels.quantized_matmul(x, q4, activations="int8")
    g = jax.grad(lambda x: q8_0_round(x).sum())(x)  # straight through, as the kernel's cotangent
    np.testing.assert_array_equal(np.asarray(g), np.ones_like(np.asarray(x)))


def _mapped_file(tmp_path: Path, layers: list[np.ndarray], gap: int = 96) -> tuple[MappedFile, list[int]]:
    """The layers written to a file at 32-byte aligned offsets, ``gap`` bytes of junk between them."""
    path = tmp_path / "weights.bin"
    offsets, out = [], bytearray(b"\xab" * 64)  # a header
    for a in layers:
        offsets.append(len(out))
        out += a.tobytes() + b"\xcd" * gap
        out += b"\0" * (-len(out) % 32)
    path.write_bytes(bytes(out))
    return MappedFile.open(str(path)), offsets


def test_placed_from_a_file_without_a_copy(tmp_path):
    """``place_layers(quantized_layout="mapped")`` of a stack read lazily out of a mapped file,
    its layers unevenly spaced and their rows reordered: the weight's file leaf *is* the map (its
    address), nothing was read, and every op gives what the reordered stored blocks give."""
    enc = E.Q4_0
    stored = [_blocks(enc, 16, 64, s) for s in range(3)]
    mapped, offsets = _mapped_file(tmp_path, stored, gap=96)
    order = RNG.permutation(16)
    values = [LazyTensor(mapped, o, np.uint8, stored[0].shape).take_rows(order) for o in offsets]
    w = place_layers(values, None, stacked=True, encoding="Q4_0", quantized_layout="mapped")
    assert isinstance(w, MappedArray) and w.shape == (3, 16, 64)
    assert w.file.unsafe_buffer_pointer() == mapped.array.ctypes.data  # the map itself
    assert w.nbytes == 3 * stored[0].nbytes + 16 * 4  # its own bytes, not the file's
    want = PackedArray(enc, jnp.asarray(np.stack([s[order] for s in stored])))
    np.testing.assert_array_equal(np.asarray(w.dequantize()), np.asarray(want.dequantize()))
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(w.layer(i).dequantize()), np.asarray(want.dequantize()[i]))
        idx = jnp.asarray([[0, 15], [7, 3]], jnp.int32)
        np.testing.assert_array_equal(np.asarray(w.layer(i).take(idx).dequantize()), np.asarray(want.dequantize()[i][idx]))
    x = jnp.asarray(RNG.standard_normal((5, 64)).astype(np.float32))
    for q8 in (False, True):  # float32 activations, and Q8_0-rounded ones on every path
        cpu = dataclasses.replace(policy_for("cpu"), q8_activations=q8)
        ref = np.asarray(q8_0_round(x) if q8 else x) @ np.asarray(want.dequantize()).transpose(0, 2, 1)  # [3, 5, 16]
        for policy in (cpu, dataclasses.replace(cpu, native_matmul_max_rows=0), dataclasses.replace(cpu, native_matmul_max_rows=2)):
            for i in range(3):  # the kernel (5 rows), XLA on the stored blocks (no kernel), the kernel's dequantized rows for XLA's GEMM
                got = jax.jit(lambda x, w, i: w.layer_matmul(x, i, policy))(x, w, jnp.int32(i))
                np.testing.assert_allclose(np.asarray(got), ref[i], rtol=1e-5, atol=1e-4)
    mapped.close()  # the arrays keep the map alive
    np.testing.assert_array_equal(np.asarray(w.layer(2).dequantize()), np.asarray(want.dequantize()[2]))


def test_row_blocks_of_a_prompt_match_the_whole_product():
    """A prompt's product in blocks of rows (``dequant_row_chunk``), each dequantized by the
    kernel, equals the whole weight's product bit for bit."""
    w = to_layout("mapped", E.Q4_0, jnp.asarray(_blocks(E.Q4_0, 256, 128, 4)))
    x = jnp.asarray(RNG.standard_normal((40, 128)).astype(np.float32))
    cpu = policy_for("cpu")
    whole = jax.jit(lambda x: w.matmul(x, dataclasses.replace(cpu, dequant_row_chunk=0)))(x)
    blocks = jax.jit(lambda x: w.matmul(x, dataclasses.replace(cpu, dequant_row_chunk=64)))(x)
    np.testing.assert_array_equal(np.asarray(whole), np.asarray(blocks))


def test_bad_weights_are_refused():
    file = jnp.zeros((4, 32), jnp.uint8)
    with pytest.raises(ValueError, match=r"file must be uint8 \[units, 32\], got uint8\[4, 16\]"):
        MappedArray(E.Q4_0, jnp.zeros((4, 16), jnp.uint8), jnp.int32(0), 2, 32)
    with pytest.raises(ValueError, match="not a whole number of 32-element blocks"):
        MappedArray(E.Q4_0, file, jnp.int32(0), 2, 48)
    with pytest.raises(ValueError, match=r"order must be \[2\], got \[3\]"):
        MappedArray(E.Q4_0, file, jnp.int32(0), 2, 32, order=jnp.arange(3))
    past = MappedArray(E.Q4_0, file, jnp.int32(3), 4, 32)  # 72 bytes from byte 96 of a 128-byte file
    with pytest.raises(Exception, match="outside the file"):
        jax.block_until_ready(kernels.quantized_matmul(jnp.ones((1, 32), jnp.float32), past))
    with pytest.raises(ValueError, match="maxjax reads only Q4_0 and Q8_0 in place"):
        BackendPolicy(platform="cpu", mapped_encodings=("Q4_1",))


def test_a_q4_0_model_is_read_in_place_and_decodes_as_nibbles(tiny_q4_0):
    """The CPU policy maps Q4_0 (where the CPU has AVX-512): every quantized weight of the tiny
    Llama is a MappedArray over one map of the file (the Q/K weights with their rows reordered),
    and its prompt logits and greedy tokens equal those of the same file loaded into nibbles."""
    from maxjax.graph.quantization import QuantizedArray
    from maxjax.models import load_model

    policy = dataclasses.replace(policy_for("cpu"), mapped_encodings=("Q4_0", "Q8_0"), q8_activations=False)
    lm = load_model(tiny_q4_0, policy=policy)
    ref = load_model(tiny_q4_0, quantized_layout="nibbles", arithmetic="float32")
    weights = [x for x in jax.tree.leaves(lm.state, is_leaf=lambda x: isinstance(x, QuantizedArray)) if isinstance(x, QuantizedArray)]
    assert weights and all(isinstance(x, MappedArray) for x in weights)
    assert len({x.file.unsafe_buffer_pointer() for x in weights}) == 1
    assert any(x.order is not None for x in weights)  # q_proj / k_proj: llama.cpp's permutation undone
    ids = np.asarray([lm.encode_prompt("Hello there, how are")], np.int32)
    logits = [np.asarray(m.prefill(ids, [ids.shape[1]], *m.new_cache(1, 32))[1]) for m in (lm, ref)]
    np.testing.assert_array_equal(logits[0], logits[1])
    (a,) = lm.generate(["Hello there"], max_new_tokens=8, stop_at_eos=False)
    (b,) = ref.generate(["Hello there"], max_new_tokens=8, stop_at_eos=False)
    assert a.token_ids == b.token_ids
    # without the kernel (XLA's products), the scan still reads each layer out of the file in place
    xla = load_model(tiny_q4_0, policy=dataclasses.replace(policy, native_matmul_max_rows=0))
    assert all(isinstance(x, MappedArray) for x in jax.tree.leaves(xla.state, is_leaf=lambda x: isinstance(x, QuantizedArray)) if isinstance(x, QuantizedArray))
    got = np.asarray(xla.prefill(ids, [ids.shape[1]], *xla.new_cache(1, 32))[1])
    np.testing.assert_allclose(got, logits[1], rtol=1e-5, atol=1e-5 * np.abs(logits[1]).max())


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_decode_compiles_before_the_prompt_runs_and_only_once(tiny_q4_0, caplog, temperature):
    """With the CPU policy's ``compile_decode_first``, a model read in place from its file
    compiles its decode step, in a generation at a new shape, before the prefill (so that the
    compiler's memory is given back before the weights' pages are touched), and the decode steps
    then run that program: the model's step compiles twice in all, decode first, greedy or
    sampling. A model whose weights were copied at load (resident already) compiles the prompt
    first."""
    import logging

    from maxjax.models import load_model

    policy = dataclasses.replace(policy_for("cpu"), mapped_encodings=("Q4_0", "Q8_0"))
    assert policy.compile_decode_first
    for layout, mapped in ((None, True), ("nibbles", False)):
        lm = load_model(tiny_q4_0, policy=policy, quantized_layout=layout)
        assert lm.weights_mapped == mapped
        caplog.clear()
        with jax.log_compiles(), caplog.at_level(logging.WARNING):
            g = lm.generate(["Four rows of", "a shape", "for this", "test"], 5, stop_at_eos=False, temperature=temperature, seed=3)
        steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling jit(step)")]
        assert len(steps) == 2, steps
        assert ("int32[4,1]" in steps[0]) == mapped and ("int32[4,1]" in steps[1]) != mapped  # the decode step's tokens
        assert all(len(r.token_ids) == 5 for r in g) and g[0].compile_seconds > 0
        if mapped:  # compiled by the generation: nothing left to do
            assert lm.compile_decode(4, min(128, lm.config.max_position_embeddings), temperature > 0) is False


def test_q8_0_activations_where_asked_for_whatever_the_path(tiny_q4_0):
    """``arithmetic="q8_0"`` (the policy's ``q8_activations``): a Q4_0 model read in place
    multiplies Q8_0-rounded activations, prompt logits close to the float32 ones but not equal;
    ``"float32"`` and the default give the nibbles layout's float32 logits bit for bit. A row's decode logits are the same
    alone and beside another row (integer dots per row), and a prompt's last logits are the same
    whether its rows run in the kernel (a short prompt) or in XLA's GEMM (the rows of a longer
    batch): the rounding is one definition."""
    from maxjax.models import load_model

    policy = dataclasses.replace(policy_for("cpu"), mapped_encodings=("Q4_0", "Q8_0"))
    lms = {a: load_model(tiny_q4_0, policy=policy, arithmetic=a) for a in ("q8_0", "float32")}
    assert [m.program.policy.q8_activations for m in lms.values()] == [True, False]
    ref = load_model(tiny_q4_0, quantized_layout="nibbles")  # auto: float32
    lm = lms["auto"] = lms.pop("q8_0")
    ids = np.asarray([lm.encode_prompt("Hello there, how are")], np.int32)
    n = ids.shape[1]
    logits = {k: np.asarray(m.prefill(ids, [n], *m.new_cache(1, 32))[1]) for k, m in {**lms, "ref": ref}.items()}
    np.testing.assert_array_equal(logits["float32"], logits["ref"])
    err = np.abs(logits["auto"] - logits["ref"]).max() / np.abs(logits["ref"]).max()
    assert 0 < err < 0.05, err
    # the same prompt as row 0 of 40 padded rows (its layers' products then run in XLA)
    wide = np.zeros((40, n), np.int32)
    wide[0] = ids[0]
    many = np.asarray(lm.prefill(wide, [n] * 40, *lm.new_cache(40, 32))[1])[:1]
    np.testing.assert_allclose(many, logits["auto"], rtol=1e-4, atol=1e-4 * np.abs(many).max())
    steps = []
    for tokens in (np.array([5], np.int32), np.array([5, 9], np.int32)):
        k_cache, v_cache = lm.new_cache(len(tokens), 16)
        steps.append(np.asarray(lm.decode_step(tokens, np.zeros(len(tokens), np.int32), k_cache, v_cache)[1])[:1])
    np.testing.assert_allclose(steps[1], steps[0], rtol=1e-5, atol=1e-5 * np.abs(steps[0]).max())


def test_q8_0_arithmetic_is_refused_where_it_cannot_apply(tiny_q4_0, tmp_path):
    """``arithmetic="q8_0"`` with the requantized ``int8`` layout, or on a Hugging Face model
    of float weights: one line that says why and what runs instead."""
    from maxjax.models import load_model

    with pytest.raises(ValueError, match=r"arithmetic='q8_0' multiplies the file's values; quantized_layout='int8' requantizes them"):
        load_model(tiny_q4_0, arithmetic="q8_0", quantized_layout="int8")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"arithmetic='q8_0' needs a GGUF-quantized model; .* has float weights \(arithmetic='float32' runs it\)"):
        load_model(tmp_path, arithmetic="q8_0")


def test_a_mesh_refuses_an_explicit_mapped_layout(tiny_q4_0):
    """A weight split over a mesh cannot be read in place from one file: asking for ``mapped``
    there raises, naming the weight; without asking, the policy's layout is used."""
    from maxjax.models import load_model

    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    mesh = jax.make_mesh((2,), ("tp",), devices=jax.devices()[:2])
    with pytest.raises(ValueError, match=r"quantized_layout='mapped' reads a weight in place from its file on one device"):
        load_model(tiny_q4_0, mesh=mesh, quantized_layout="mapped")
