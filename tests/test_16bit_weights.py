"""bfloat16 and float16 weights in float32 arithmetic: maxjax's kernel product (each value widened
exactly in a register) against the float32 product of the widened weight, its gradients and
refusals; the policy's routing of a float32 ``x`` times a stored 16-bit weight; a float32 model
loaded from a bfloat16 Hugging Face checkpoint or an F16/BF16 GGUF, which keeps the file's
weights (``keep_16bit_weights``) and gives the logits of the model widened at load; training
such a model."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import llama_files as L
from maxjax.models.loading import load_model
from maxjax.backend import kernels, policy_for
from maxjax.dtype import DType
from maxjax.models import checkpoint
from maxjax.models.loading import memory_plan

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"maxjax's CPU kernels do not run here: {kernels.unavailable_reason()}")

RNG = np.random.default_rng(11)
CPU = policy_for("cpu")
WIDEN_AT_LOAD = dataclasses.replace(CPU, keep_16bit_weights=False)
NO_KERNEL = dataclasses.replace(CPU, native_matmul_max_rows=0, widened_kernel_max_rows=0)
HI = jax.lax.Precision.HIGHEST


def _bf16(*shape: int) -> jax.Array:
    return jnp.asarray((RNG.standard_normal(shape) * 0.05).astype(ml_dtypes.bfloat16))


def _reference(x, w):
    """float64 product of the widened weight: what float32 arithmetic approximates."""
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T


def _close(got, want):
    """float32 sums in another order: within a few ulps of the largest term's sum."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 13, 32])
@pytest.mark.parametrize("rows,cols", [(24, 64), (37, 192), (256, 2048)])
def test_kernel_product_is_the_float32_product_of_the_widened_weight(m, rows, cols):
    x = jnp.asarray(RNG.standard_normal((m, cols)).astype(np.float32))
    w = _bf16(rows, cols)
    got = jax.jit(kernels.widened_matmul)(x, w)
    assert got.shape == (m, rows) and got.dtype == jnp.float32
    _close(got, _reference(x, w))


def test_kernel_takes_leading_axes_and_a_stacked_layer_in_place():
    x = jnp.asarray(RNG.standard_normal((2, 3, 128)).astype(np.float32))  # [batch, seq, cols]
    stack = _bf16(4, 40, 128)  # [layers, rows, cols]
    for layer in (0, 2, 3, 9):  # out of range clamps, as XLA's dynamic-slice does
        got = jax.jit(lambda x, s, l: kernels.widened_matmul(x, s, l))(x, stack, jnp.int32(layer))
        assert got.shape == (2, 3, 40)
        _close(got.reshape(6, 40), _reference(x.reshape(6, 128), stack[min(layer, 3)]))


@pytest.mark.parametrize("widen_rows", [8, 16, 48, 20, 7, 100])
def test_widened_blocks_for_many_rows_give_the_same_product(widen_rows):
    x = jnp.asarray(RNG.standard_normal((70, 128)).astype(np.float32))
    w = _bf16(48, 128)
    got = jax.jit(lambda x, w: kernels.widened_matmul(x, w, widen_rows=widen_rows))(x, w)
    _close(got, _reference(x, w))
    rows = jax.jit(lambda w: kernels.widened_rows(w, 8, 16))(w)  # rows 8..23, exactly widened
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(w[8:24]).astype(np.float32))


@pytest.mark.parametrize("widen_rows", [0, 16])
def test_gradients_are_the_widened_weights(widen_rows):
    x = jnp.asarray(RNG.standard_normal((3, 64)).astype(np.float32))
    w = _bf16(32, 64)
    g = jnp.asarray(RNG.standard_normal((3, 32)).astype(np.float32))

    def loss(x, w):
        return jnp.sum(kernels.widened_matmul(x, w, widen_rows=widen_rows) * g)

    def ref(x, w):
        return jnp.sum(jnp.matmul(x, w.astype(jnp.float32).T, precision=HI) * g)

    dx, dw = jax.grad(loss, argnums=(0, 1))(x, w)
    rx, rw = jax.grad(ref, argnums=(0, 1))(x, w)
    assert dw.dtype == jnp.bfloat16
    _close(dx, rx)
    np.testing.assert_allclose(np.asarray(dw, np.float32), np.asarray(rw, np.float32), rtol=1e-2, atol=1e-3)


def test_kernel_refuses_what_it_cannot_multiply():
    x = jnp.zeros((2, 64), jnp.float32)
    with pytest.raises(ValueError, match=r"multiple of 64, got bfloat16\[8, 96\]"):
        kernels.widened_matmul(jnp.zeros((2, 96), jnp.float32), _bf16(8, 96))
    with pytest.raises(ValueError, match="x must be float32, got bfloat16"):
        kernels.widened_matmul(x.astype(jnp.bfloat16), _bf16(8, 64))
    with pytest.raises(ValueError, match="x has 128 features"):
        kernels.widened_matmul(jnp.zeros((2, 128), jnp.float32), _bf16(8, 64))
    with pytest.raises(ValueError, match="needs a layer index"):
        kernels.widened_matmul(x, _bf16(2, 8, 64))
    with pytest.raises(ValueError, match="needs no layer index"):
        kernels.widened_matmul(x, _bf16(8, 64), jnp.int32(0))
    with pytest.raises(ValueError, match="widen_rows must be 0 or positive, got -1"):
        kernels.widened_matmul(x, _bf16(8, 64), widen_rows=-1)
    assert not kernels.takes_widened(jnp.zeros((8, 64), jnp.float32))


@pytest.mark.parametrize("m", [1, 4, 16, 17, 40])
def test_the_policy_widens_a_stored_bfloat16_weight_in_the_kernel(m):
    """float32 ``x`` times a stored bfloat16 weight: the kernel's product for a few rows, XLA's GEMM
    against widened blocks for many; no float32 copy of the whole weight is converted where the
    kernel reads it; the no-kernel policy's product is the same to the order of the sums."""
    x = jnp.asarray(RNG.standard_normal((m, 128)).astype(np.float32))
    w = _bf16(512, 128)
    assert CPU.widens(x, w) and not CPU.widens(x.astype(jnp.bfloat16), w) and not CPU.widens(x, w.astype(jnp.float32))
    assert not dataclasses.replace(CPU, autocast=True).widens(x, w)  # a bfloat16 Trainer's recipe instead
    fn = jax.jit(lambda x, w: CPU.matmul_t(x, w, stored=True))
    hlo = fn.lower(x, w).as_text()
    assert ("maxjax_widened_matmul" in hlo) == (m <= CPU.widened_kernel_max_rows)
    assert ("maxjax_widened_rows" in hlo) == (m > CPU.widened_kernel_max_rows)
    assert "stablehlo.convert" not in hlo  # the weight is never converted by XLA
    _close(fn(x, w), _reference(x, w))
    _close(jax.jit(lambda x, w: NO_KERNEL.matmul_t(x, w, stored=True))(x, w), _reference(x, w))


def test_widened_blocks_are_the_whole_weight_or_as_many_rows_as_fit():
    p = dataclasses.replace(CPU, widened_block_bytes=1 << 20)  # 262144 float32 values
    assert p.widened_rows(256, 1024) == 256  # 1 MiB: whole
    assert p.widened_rows(720, 1024) == 256  # blocks of 256 rows, the last of 208
    assert p.widened_rows(7, 1 << 20) == 1  # not even one row fits: one at a time


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(dtype):
    """The kernel sums each (weight row, activation row) in one order whatever rows share a call:
    a row alone and in a batch of up to ``widened_kernel_max_rows`` give the same bits."""
    x = jnp.asarray(RNG.standard_normal((16, 2048)).astype(np.float32))
    w = _bf16(72, 2048).astype(dtype)
    fn = jax.jit(lambda x, w: CPU.matmul_t(x, w, stored=True))
    whole = np.asarray(fn(x, w))
    for m in (1, 2, 3, 5, 8):
        np.testing.assert_array_equal(np.asarray(fn(x[:m], w)), whole[:m])


def test_which_dtype_a_hugging_face_checkpoint_loads_in():
    f = checkpoint.float_weights_dtype
    assert f({"bfloat16"}, DType.float32, CPU) == DType.bfloat16
    assert f({"BF16"}, DType.float32, CPU) == DType.bfloat16  # safetensors' header names
    assert f({"bfloat16", "float32"}, DType.float32, CPU) == DType.float32  # mixed: widened
    assert f({"float16"}, DType.float32, CPU) == DType.float16
    assert f({"F16"}, DType.float32, CPU) == DType.float16
    assert f({"float16", "bfloat16"}, DType.float32, CPU) == DType.float32
    assert f({"bfloat16"}, DType.float32, WIDEN_AT_LOAD) == DType.float32
    assert f({"bfloat16"}, DType.float32, CPU, mesh=object()) == DType.float32  # XLA's products on a mesh
    assert f({"float32"}, DType.bfloat16, CPU) == DType.bfloat16
    assert f({"bfloat16"}, DType.float32, "gpu") == DType.float32


def test_a_float32_model_keeps_a_bfloat16_checkpoints_weights_and_its_logits(tmp_path):
    """``load_model`` of a bfloat16 directory in float32: the weights stay the file's bfloat16 values
    (half the bytes of the model widened at load), the memory plan counts them so, the activations
    and KV cache are float32, and the logits and greedy tokens are those of the model widened at
    load (float32 arithmetic both: the sums' order differs)."""
    low = {k: v.astype(ml_dtypes.bfloat16) for k, v in L.hf_tensors().items()}
    d = L.write_hf_dir(tmp_path / "bf16", L.hf_config(), low)
    kept, widened = load_model(d), load_model(d, policy=WIDEN_AT_LOAD)
    leaves = jax.tree.leaves(kept.state)
    assert {x.dtype for x in leaves} == {np.dtype(ml_dtypes.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(widened.state)} == {np.dtype(np.float32)}
    assert 2 * sum(x.nbytes for x in leaves) == sum(x.nbytes for x in jax.tree.leaves(widened.state))
    np.testing.assert_array_equal(
        np.asarray(kept.module.state_dict()["layers.1.mlp.up_proj.weight"]), low["model.layers.1.mlp.up_proj.weight"]
    )
    plan, plan32 = memory_plan(d), memory_plan(d, policy=WIDEN_AT_LOAD)
    assert 2 * plan["weights"] == plan32["weights"] and plan["kv_cache"] == plan32["kv_cache"]
    k, v = kept.new_cache(1, 16)
    assert k.dtype == v.dtype == np.float32
    tokens = np.array([[3, 9, 4, 17, 2, 30, 41]], np.int32)
    a = kept.prefill(tokens, [7], *kept.new_cache(1, 16))
    b = widened.prefill(tokens, [7], *widened.new_cache(1, 16))
    _close(a[1], b[1])
    step_a = kept.decode_step(a[0], np.array([7], np.int32), a[2], a[3])[1]
    step_b = widened.decode_step(b[0], np.array([7], np.int32), b[2], b[3])[1]
    _close(step_a, step_b)
    assert kept.generate(["hello"], 8)[0].token_ids == widened.generate(["hello"], 8)[0].token_ids


@pytest.mark.parametrize("m", [1, 3])
def test_bfloat16_activations_take_the_kernel_with_the_same_arithmetic(m):
    """A bfloat16 model's one-row products (``--dtype bfloat16`` decode): ``x`` widened exactly into
    the kernel, whose products of two bfloat16 values are exact in float32 as in XLA's bfloat16
    dot with float32 sums; the result rounded to bfloat16. Gradients are the XLA recipe's."""
    x = jnp.asarray(RNG.standard_normal((m, 256)).astype(ml_dtypes.bfloat16))
    w = _bf16(96, 256)
    fn = jax.jit(lambda x, w: CPU.matmul_t(x, w, stored=True))
    ref = jax.jit(lambda x, w: NO_KERNEL.matmul_t(x, w, stored=True))
    assert "maxjax_widened_matmul" in fn.lower(x, w).as_text()
    assert "maxjax_widened_matmul" not in ref.lower(x, w).as_text()
    got, want = fn(x, w), ref(x, w)
    assert got.dtype == want.dtype == jnp.bfloat16
    exact = _reference(x, w)
    np.testing.assert_allclose(np.asarray(got, np.float64), exact, rtol=2 ** -7, atol=2 ** -7 * float(np.abs(exact).max()))
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2 ** -7, atol=1e-3)
    g = jnp.asarray(RNG.standard_normal((m, 96)).astype(ml_dtypes.bfloat16))
    grads = [jax.grad(lambda x, w, f=f: jnp.sum((f(x, w) * g).astype(jnp.float32)), argnums=(0, 1))(x, w) for f in (fn, ref)]
    for a, b in zip(*grads):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_float32_training_of_kept_bfloat16_weights(tmp_path):
    """A float32 Trainer of a model that kept a bfloat16 checkpoint's weights: full fine-tuning trains
    float32 masters (the losses of the model widened at load), and LoRA keeps the frozen weights
    bfloat16 (multiplied in float32) with the widened model's losses."""
    import optax

    from maxjax import train

    low = {k: v.astype(ml_dtypes.bfloat16) for k, v in L.hf_tensors().items()}
    d = L.write_hf_dir(tmp_path / "bf16", L.hf_config(), low)
    tokens = np.random.default_rng(0).integers(0, L.VOCAB, (2, 16)).astype(np.int32)

    def losses(module, trainable=None):
        t = train.Trainer(module, optax.adam(1e-3), trainable=trainable)
        st, out = t.init(), []
        for _ in range(3):
            st, m = t.step(st, tokens)
            out.append(float(m["loss"]))
        return st, out

    kept, widened = load_model(d).module, load_model(d, policy=WIDEN_AT_LOAD).module
    st, got = losses(kept)
    assert {v.dtype for v in st.params.values()} == {np.dtype(np.float32)}
    np.testing.assert_allclose(got, losses(widened)[1], rtol=1e-4)
    assert got[-1] < got[0]

    def lora(module):
        train.apply_lora(module, ["q_proj", "v_proj"], rank=4, alpha=8.0, key=jax.random.key(0))
        return module

    kept, widened = lora(load_model(d).module), lora(load_model(d, policy=WIDEN_AT_LOAD).module)
    assert kept.layers[0].mlp.up_proj.weight.dtype == DType.bfloat16
    st, got = losses(kept, "*lora_*")
    assert {v.dtype for v in st.params.values()} == {np.dtype(np.float32)}
    np.testing.assert_allclose(got, losses(widened, "*lora_*")[1], rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kernel_widens_float16_as_bfloat16(dtype):
    x = jnp.asarray(RNG.standard_normal((3, 128)).astype(np.float32))
    w = _bf16(40, 128).astype(dtype)
    _close(jax.jit(kernels.widened_matmul)(x, w), _reference(x, w))
    _close(jax.jit(lambda x, w: kernels.widened_matmul(x, w, widen_rows=20))(x, w), _reference(x, w))
    np.testing.assert_array_equal(np.asarray(kernels.widened_rows(w, 0, 40)), np.asarray(w).astype(np.float32))


@pytest.mark.parametrize("ggml", ["F16", "BF16"])
def test_a_gguf_with_16bit_matrices_keeps_them_and_gives_the_float32_files_logits(tmp_path, ggml):
    """A GGUF whose matrices are F16 or BF16 (llama.cpp's unquantized exports): the weights stay as
    stored (Q and K rows un-permuted) and the model's logits are those of the same values stored
    as F32; with the policy that widens at load, its weights are float32."""
    import gguf

    T = gguf.GGMLQuantizationType
    half, wide = {}, {}
    for name, (array, raw) in L.gguf_tensors().items():
        if raw is None:  # norms stay F32
            half[name] = wide[name] = (array, raw)
            continue
        values = (RNG.standard_normal(gguf.quant_shape_from_byte_shape(array.shape, raw)) * 0.2).astype(np.float32)
        stored = gguf.quantize(values, T[ggml])
        half[name] = (stored, T[ggml])
        wide[name] = (gguf.dequantize(stored, T[ggml]).astype(np.float32), None)
    a = load_model(L.write_gguf(tmp_path / "half.gguf", L.gguf_metadata(), half))
    b = load_model(L.write_gguf(tmp_path / "wide.gguf", L.gguf_metadata(), wide))
    c = load_model(tmp_path / "half.gguf", policy=WIDEN_AT_LOAD)
    kept = {"F16": np.float16, "BF16": ml_dtypes.bfloat16}[ggml]
    assert a.module.layers[1].self_attn.q_proj.weight.dtype == DType.from_numpy(np.dtype(kept))
    assert {x.dtype for x in jax.tree.leaves(a.state)} == {np.dtype(kept), np.dtype(np.float32)}  # norms float32
    assert {x.dtype for x in jax.tree.leaves(c.state)} == {np.dtype(np.float32)}
    tokens = np.array([[3, 9, 4, 17, 2, 30, 41]], np.int32)
    logits = [m.prefill(tokens, [7], *m.new_cache(1, 16))[1] for m in (a, b, c)]
    _close(logits[0], logits[1])
    _close(logits[2], logits[1])
    assert a.generate(["hello"], 8)[0].token_ids == b.generate(["hello"], 8)[0].token_ids


def _mapped_ranges(path) -> list[tuple[int, int]]:
    """This process's address ranges that map ``path`` (from /proc/self/maps)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith(str(path)):
                lo, hi = line.split()[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def test_float_tensors_are_adopted_where_they_lie_in_the_map(tmp_path):
    """``mapped_float_tensors``: a safetensors file whose data starts on a 64-byte boundary gives
    per-layer weights that are the file's own pages (their buffers inside this process's map of
    the file), not copies; without it every weight is a copy; the logits are the same."""
    import json
    import struct

    import safetensors.numpy

    low = {k: v.astype(ml_dtypes.bfloat16) for k, v in L.hf_tensors().items()}
    d = L.write_hf_dir(tmp_path / "bf16", L.hf_config(), low)
    path = d / "model.safetensors"
    for pad in range(64):  # metadata of a length that puts the data on a 64-byte boundary
        safetensors.numpy.save_file(low, str(path), metadata={"pad": "x" * pad})
        (n,) = struct.unpack("<Q", path.read_bytes()[:8])
        if (8 + n) % 64 == 0:
            break
    header = json.loads(path.read_bytes()[8 : 8 + n])
    assert all((8 + n + info["data_offsets"][0]) % 64 == 0 for k, info in header.items() if k != "__metadata__")
    adopted = load_model(d)
    copied = load_model(d, policy=dataclasses.replace(CPU, mapped_float_tensors=False))
    ranges = _mapped_ranges(path.resolve())
    assert ranges

    def in_map(x) -> bool:
        p = x.unsafe_buffer_pointer()
        return any(lo <= p < hi for lo, hi in ranges)

    def layer_arrays(lm):
        return [a for a in jax.tree.leaves(lm.state) if a.ndim == 2 and a.shape == (L.FFN, L.HIDDEN)]  # gate/up per layer

    assert layer_arrays(adopted) and all(in_map(a) for a in layer_arrays(adopted))
    assert not any(in_map(a) for a in jax.tree.leaves(copied.state))
    tokens = np.array([[3, 9, 4, 17, 2]], np.int32)
    la = adopted.prefill(tokens, [5], *adopted.new_cache(1, 16))[1]
    lb = copied.prefill(tokens, [5], *copied.new_cache(1, 16))[1]
    np.testing.assert_array_equal(np.asarray(la), np.asarray(lb))


def _half_gguf(tmp_path, ggml: str, only: str | None = None):
    """The tests' llama GGUF with its matrices (or just ``only``) stored as ``ggml`` (F16/BF16)."""
    import gguf

    T = gguf.GGMLQuantizationType
    tensors = {}
    for name, (array, raw) in L.gguf_tensors().items():
        if raw is not None and (only is None or name == only):
            values = (RNG.standard_normal(gguf.quant_shape_from_byte_shape(array.shape, raw)) * 0.2).astype(np.float32)
            array, raw = gguf.quantize(values, T[ggml]), T[ggml]
        tensors[name] = (array, raw)
    return L.write_gguf(tmp_path / f"{ggml}-{only}.gguf", L.gguf_metadata(), tensors)


def test_a_bfloat16_model_of_an_f16_gguf_rounds_its_matrices_to_bfloat16(tmp_path):
    lm = load_model(_half_gguf(tmp_path, "F16"), dtype=DType.bfloat16)
    assert lm.module.layers[0].mlp.up_proj.weight.dtype == DType.bfloat16
    assert len(lm.generate(["hello"], 4)[0].token_ids) == 4


def test_a_float32_trainer_refuses_quantized_weights_beside_a_16bit_one(tmp_path):
    """A GGUF of Q4_1 matrices and an F16 embedding: training every weight names the quantized
    one (as without the F16 one) rather than dequantizing the model silently."""
    import optax

    from maxjax import train

    lm = load_model(_half_gguf(tmp_path, "F16", only="token_embd.weight"))
    assert lm.module.embed_tokens.weight.dtype == DType.float16
    with pytest.raises(ValueError, match="quantized: it cannot be trained"):
        train.Trainer(lm.module, optax.adam(1e-3))
