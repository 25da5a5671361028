"""bfloat16 mixed-precision training (issue 24): ``Trainer(compute_dtype="bfloat16")`` keeps float32
master weights, optimizer state and gradients, follows the float32 loss curve within bfloat16's
rounding, works with LoRA, and is refused on a platform without native bfloat16 matmuls."""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from maxjax import train
from maxjax.backend.policy import cpu_policy, policy_for
from maxjax.graph.layer_weights import StackBits
from train_util import tiny_model, tokens

#: the CPU policy with bfloat16 matmuls accepted (this test machine may have no bfloat16 dot units:
#: XLA:CPU then emulates them, same numerics, only slower)
BF16 = dataclasses.replace(policy_for("cpu"), bfloat16_matmul=True)
STEPS = 6


#: the two bfloat16 recipes, whatever this machine's policy picks (``bfloat16_autocast``: CPUs
#: without AMX-BF16); the AMX kernel's frozen layout is tested in tests/test_amx.py
RECIPES = {
    "bfloat16 activations": dataclasses.replace(BF16, bfloat16_autocast=False, bfloat16_frozen_kernel=False),
    "autocast": dataclasses.replace(BF16, bfloat16_autocast=True, bfloat16_frozen_kernel=False),
}


def _run(compute_dtype, model=None, trainable=None, held_out=True, policy=BF16):
    model = tiny_model(3) if model is None else model
    trainer = train.Trainer(model, optax.adamw(1e-2), trainable=trainable, policy=policy, compute_dtype=compute_dtype)
    state = trainer.init(seed=0)
    losses = []
    for i in range(STEPS):
        state, m = trainer.step(state, tokens(4, 17, seed=40 + i))
        losses.append(float(m["loss"]))
    held = float(trainer.loss(state, tokens(4, 17, seed=99))[0]) if held_out else None
    return trainer, state, np.asarray(losses), held


def _float_dtypes(tree):
    return {str(a.dtype) for a in jax.tree.leaves(tree) if jnp.issubdtype(a.dtype, jnp.floating)}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_bfloat16_keeps_float32_masters_and_follows_the_float32_loss_curve(recipe):
    t32, s32, l32, h32 = _run("float32")
    t16, s16, l16, h16 = _run("bfloat16", policy=RECIPES[recipe])
    assert t16.autocast == (recipe == "autocast") == t16.program.policy.autocast
    # masters, optimizer state (adam's mu/nu) float32; frozen copies and activations bfloat16
    assert _float_dtypes(s16.params) == {"float32"} and _float_dtypes(s16.opt_state) == {"float32"}
    assert t16.program.graph is not t32.program.graph
    logits = jax.eval_shape(t16.logits, s16.params, t16.frozen, jnp.asarray(tokens(2, 8, seed=1)))
    assert logits.dtype == jnp.float32  # the LM head's output, for a float32 loss
    # the first step starts from the same float32 weights (the masters are not rounded to bfloat16)
    for k in s16.params:
        assert s16.params[k].dtype == jnp.float32
    init16, init32 = t16.init(seed=0), t32.init(seed=0)
    for k in init32.params:
        np.testing.assert_array_equal(np.asarray(init16.params[k]), np.asarray(init32.params[k]), err_msg=k)
    # gradients of the bfloat16 forward come back float32
    loss_of = lambda p: t16._loss_fn(p, t16.frozen, jnp.asarray(tokens(4, 17, seed=40)), None)[0]  # noqa: E731
    grads = jax.eval_shape(jax.grad(loss_of), init16.params)
    assert _float_dtypes(grads) == {"float32"}
    # the loss curve: bfloat16 has an 8-bit significand (relative rounding 2**-9 = 0.2%); over a
    # 3-layer model's ~10 rounded ops per layer the loss moves by a few 1e-3 of ln(61) ~ 4.1 nats:
    # 0.03 nats is well inside that noise and far below the curve's own drop (> 0.1 nats here)
    assert l32[0] - l32[-1] > 0.1
    np.testing.assert_allclose(l16, l32, atol=0.03)
    assert abs(h16 - h32) < 0.03
    assert np.abs(l16 - l32).max() > 1e-6  # bfloat16 really ran (not float32 under another name)


def test_lora_with_bfloat16():
    def lora_model():
        m = tiny_model(3)
        train.apply_lora(m, ["q_proj", "v_proj"], rank=4, alpha=8, key=jax.random.key(1))
        return m

    t16, s16, l16, _ = _run("bfloat16", lora_model(), "*lora_*", held_out=False)
    assert all("lora_" in n for n in t16.trainable_names)
    assert _float_dtypes(s16.params) == {"float32"} and _float_dtypes(s16.opt_state) == {"float32"}
    assert _float_dtypes(t16.frozen) == {"bfloat16"}  # frozen base weights: half the memory
    assert l16[0] - l16[-1] > 0.02  # the adapters learn (random tokens: 0.049 nats in 6 steps here)
    weights = t16.trained_weights(s16)
    b = weights["layers.0.self_attn.q_proj.lora_B.weight"]
    assert b.dtype == jnp.float32 and float(jnp.abs(b).max()) > 0  # the adapters trained


def test_bfloat16_refused_without_native_bfloat16_matmul():
    no_bf16 = cpu_policy(frozenset({"avx", "avx2", "fma"}))
    assert not no_bf16.bfloat16_matmul
    assert cpu_policy(frozenset({"avx2", "avx512f", "avx512_bf16"})).bfloat16_matmul
    assert cpu_policy(frozenset({"avx2", "amx_bf16"})).bfloat16_matmul
    with pytest.raises(ValueError, match=r"compute_dtype='bfloat16'.*no avx512_bf16 or amx_bf16 in its CPU flags.*compute_dtype='float32'.*bfloat16_matmul=True"):
        train.Trainer(tiny_model(0), optax.sgd(0.1), policy=no_bf16, compute_dtype="bfloat16")
    with pytest.raises(ValueError, match=r"compute_dtype must be one of \('float32', 'bfloat16'\), got 'float16'"):
        train.Trainer(tiny_model(0), optax.sgd(0.1), compute_dtype="float16")


def test_bfloat16_products_ask_for_float32_results_forward_and_backward():
    """``bfloat16_float32_dots`` (CPU): a bfloat16 stored-weight product and both of its cotangent
    products are dots with float32 results (accumulated in float32, rounded to bfloat16 after),
    and their values are the float32 product's to bfloat16 rounding."""
    policy = cpu_policy()
    assert policy.bfloat16_float32_dots
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 7, 96)), jnp.bfloat16)  # [batch, seq, in]
    w = jnp.asarray(rng.standard_normal((48, 96)), jnp.bfloat16)  # [out, in]

    def loss(pol):
        return lambda x, w: jnp.sum(jnp.sin(pol.matmul_t(x, w, stored=True).astype(jnp.float32)))

    grad = jax.grad(loss(policy), argnums=(0, 1))
    hlo = jax.jit(grad).lower(x, w).as_text()
    dots = [ln for ln in hlo.splitlines() if "dot_general" in ln]
    assert len(dots) == 3 and all("-> tensor<" in ln and "xf32>" in ln.split("->")[-1] for ln in dots), dots
    gx, gw = grad(x, w)
    assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
    xf, wf = np.asarray(x, np.float64), np.asarray(w, np.float64)
    y = policy.matmul_t(x, w, stored=True)  # bfloat16 [3, 7, 48]
    np.testing.assert_allclose(np.asarray(y, np.float64), xf @ wf.T, rtol=2**-8, atol=1e-6)  # one rounding
    g = np.asarray(jnp.cos(y.astype(jnp.float32)).astype(jnp.bfloat16), np.float64)  # d loss / d y as the bwd sees it
    np.testing.assert_allclose(np.asarray(gx, np.float64), g @ wf, rtol=2**-7, atol=1e-2)
    np.testing.assert_allclose(np.asarray(gw, np.float64), np.einsum("bso,bsi->oi", g, xf), rtol=2**-7, atol=1e-2)
    off = dataclasses.replace(policy, bfloat16_float32_dots=False)  # XLA's own bfloat16 dots
    off_dots = [ln for ln in jax.jit(jax.grad(loss(off), argnums=(0, 1))).lower(x, w).as_text().splitlines() if "dot_general" in ln]
    assert off_dots and not any("xf32>" in ln.split("->")[-1] for ln in off_dots)


def test_bfloat16_recomputes_layers_where_the_policy_says_unless_told():
    """``remat=None`` (default) is the policy's ``bfloat16_remat`` for bfloat16 and off for
    float32; an explicit ``remat`` is honoured; recomputing gives the same step."""
    model = tiny_model(3)
    assert policy_for("cpu").bfloat16_remat and not policy_for("gpu").bfloat16_remat
    assert train.Trainer(model, optax.sgd(0.1), policy=BF16, compute_dtype="bfloat16").program.remat
    assert not train.Trainer(model, optax.sgd(0.1), policy=BF16).program.remat
    no_remat = dataclasses.replace(BF16, bfloat16_remat=False)
    kept = train.Trainer(model, optax.sgd(0.1), policy=no_remat, compute_dtype="bfloat16")
    forced = train.Trainer(model, optax.sgd(0.1), policy=no_remat, compute_dtype="bfloat16", remat=True)
    off = train.Trainer(model, optax.sgd(0.1), policy=BF16, compute_dtype="bfloat16", remat=False)
    assert not kept.program.remat and forced.program.remat and not off.program.remat
    batch = tokens(2, 9, seed=5)
    (s1, m1), (s2, m2) = off.step(off.init(seed=0), batch), forced.step(forced.init(seed=0), batch)
    # equal here (the recomputed layer rounds as the first pass did); a CPU whose XLA fuses the
    # two passes differently may round a bfloat16 op differently: far below the step's update (3e-2)
    assert float(m1["loss"]) == pytest.approx(float(m2["loss"]), rel=1e-3)
    for k in s1.params:
        np.testing.assert_allclose(np.asarray(s1.params[k]), np.asarray(s2.params[k]), rtol=0, atol=1e-4, err_msg=k)


def test_frozen_bfloat16_stacks_are_scanned_as_their_bits_with_identical_steps():
    """Where the policy says (CPU), the frozen bfloat16 stacks reach the layer scan as uint16 bit
    patterns (XLA:CPU slices those in place); the step is bit-identical to the plain one."""
    def lora_model():
        m = tiny_model(3)
        train.apply_lora(m, ["q_proj", "up_proj"], rank=4, alpha=8, key=jax.random.key(1))
        return m

    assert policy_for("cpu").bfloat16_stack_bits and not policy_for("gpu").bfloat16_stack_bits
    bits_policy = dataclasses.replace(BF16, bfloat16_frozen_kernel=False)  # (the AMX kernel's layout: tests/test_amx.py)
    plain_policy = dataclasses.replace(bits_policy, bfloat16_stack_bits=False)
    bits = train.Trainer(lora_model(), optax.adam(1e-2), trainable="*lora_*", policy=bits_policy, compute_dtype="bfloat16")
    plain = train.Trainer(lora_model(), optax.adam(1e-2), trainable="*lora_*", policy=plain_policy, compute_dtype="bfloat16")
    batch = tokens(2, 9, seed=5)
    s1, s2 = bits.init(seed=0), plain.init(seed=0)
    # the Trainer holds the stacks as their bits (converted once): the step slices them and
    # widens each layer's slice, and never converts a whole stack
    stacked = {e for e, w in bits._where.items() if w[0] == "stacked" and e in bits.frozen}
    assert stacked and all(isinstance(bits.frozen[e], StackBits) and bits.frozen[e].bits.dtype == jnp.uint16 for e in stacked)
    for e in stacked:
        np.testing.assert_array_equal(np.asarray(bits.frozen[e].value()).view(np.uint16), np.asarray(plain.frozen[e]).view(np.uint16))
    jaxpr = str(jax.make_jaxpr(bits.logits)(s1.params, bits.frozen, jnp.asarray(batch[:, :-1])))
    assert "bitcast_convert_type[new_dtype=bfloat16]" in jaxpr and "new_dtype=uint16" not in jaxpr
    # a bfloat16 stack handed to logits is converted there
    as_bf16 = {e: v.value() if isinstance(v, StackBits) else v for e, v in bits.frozen.items()}
    assert "new_dtype=uint16" in str(jax.make_jaxpr(bits.logits)(s1.params, as_bf16, jnp.asarray(batch[:, :-1])))
    assert "bitcast_convert_type" not in str(jax.make_jaxpr(plain.logits)(s2.params, plain.frozen, jnp.asarray(batch[:, :-1])))
    for _ in range(2):
        (s1, m1), (s2, m2) = bits.step(s1, batch), plain.step(s2, batch)
        assert float(m1["loss"]) == float(m2["loss"])
    for k in s1.params:
        np.testing.assert_array_equal(np.asarray(s1.params[k]), np.asarray(s2.params[k]), err_msg=k)
    assert {str(v.dtype) for v in jax.tree.leaves(plain.frozen)} == {"bfloat16"}
    got, want = bits.state_dict(s1), plain.state_dict(s2)
    assert got.keys() == want.keys()  # state_dict widens the bits back
    for name, v in want.items():
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(v), err_msg=name)
    assert bits.trained_weights(s1).keys() == plain.trained_weights(s2).keys() == set(bits.trainable_names)


def test_bfloat16_lora_data_parallel_on_a_mesh_of_8_devices_equals_one_device():
    """The frozen stacks held as their bits (StackBits) go onto a mesh like any frozen value: a
    data-parallel bfloat16 LoRA step over 8 devices follows the single-device one (bfloat16's
    rounding of the per-device sums apart) and compiles once."""
    devices = jax.devices()
    assert len(devices) == 8
    mesh = jax.sharding.Mesh(np.array(devices), ("dp",))

    def lora_model():
        m = tiny_model(6)
        train.apply_lora(m, ["q_proj", "up_proj"], rank=4, alpha=8, key=jax.random.key(1))
        return m

    single = train.Trainer(lora_model(), optax.adam(1e-2), trainable="*lora_*", policy=BF16, compute_dtype="bfloat16")
    sharded = train.Trainer(lora_model(), optax.adam(1e-2), trainable="*lora_*", policy=BF16, compute_dtype="bfloat16", mesh=mesh)
    bits = [e for e, v in sharded.frozen.items() if isinstance(v, StackBits)]
    assert "layers.*.mlp.down_proj.weight" in bits
    assert all(len(sharded.frozen[e].bits.sharding.device_set) == 8 for e in bits)
    s1, s2 = single.init(seed=0), sharded.init(seed=0)
    for i in range(2):
        batch = tokens(8, 9, seed=30 + i)
        (s1, m1), (s2, m2) = single.step(s1, batch), sharded.step(s2, batch)
        assert float(m2["loss"]) == pytest.approx(float(m1["loss"]), rel=1e-3)
    assert sharded.num_compiles == 1
    for k in s1.params:
        np.testing.assert_allclose(np.asarray(s2.params[k]), np.asarray(s1.params[k]), rtol=2e-2, atol=2e-3, err_msg=k)


def test_autocast_is_the_cpu_recipe_without_amx_and_never_a_platform_default():
    """``bfloat16_autocast``: CPUs without AMX-BF16 (their bfloat16 Trainer keeps float32
    activations); AMX CPUs keep bfloat16 activations for their AMX kernel; GPU and TPU too. No
    platform policy sets ``autocast`` itself: only a bfloat16 Trainer's program has it."""
    zen = cpu_policy(frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"}))
    spr = cpu_policy(frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}))
    assert zen.bfloat16_autocast and not spr.bfloat16_autocast
    assert not policy_for("gpu").bfloat16_autocast and not policy_for("tpu").bfloat16_autocast
    assert not any(p.autocast for p in (zen, spr, policy_for("gpu"), policy_for("tpu"), policy_for("cpu")))
    model = tiny_model(2)
    auto = train.Trainer(model, optax.sgd(0.1), policy=RECIPES["autocast"], compute_dtype="bfloat16")
    plain = train.Trainer(model, optax.sgd(0.1), policy=RECIPES["autocast"])  # float32 steps: no autocast
    assert auto.autocast and auto.program.policy.autocast
    assert not plain.autocast and not plain.program.policy.autocast
    assert not RECIPES["autocast"].autocast  # the Trainer's own copy of the policy, not the one passed


def test_autocast_products_round_the_float32_operand_and_sum_in_float32():
    """Under ``autocast`` a stored bfloat16 weight times float32 activations is a dot of bfloat16
    operands with float32 results, forward and in both cotangent products (x's cotangent float32,
    the weight's bfloat16); without it, JAX's promotion multiplies the weight's exact float32
    value by the unrounded activations."""
    auto = dataclasses.replace(cpu_policy(), autocast=True)
    plain = cpu_policy()
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((2, 5, 96)), jnp.float32)  # [batch, seq, in]
    w = jnp.asarray(rng.standard_normal((40, 96)), jnp.bfloat16)  # [out, in]
    xr = np.asarray(x.astype(jnp.bfloat16), np.float64)  # x rounded to bfloat16
    xf, wf = np.asarray(x, np.float64), np.asarray(w, np.float64)
    y = auto.matmul_t(x, w, stored=True)
    assert y.dtype == jnp.float32 and y.shape == (2, 5, 40)
    np.testing.assert_allclose(np.asarray(y, np.float64), xr @ wf.T, rtol=1e-5, atol=1e-5)  # float32 sums of exact products
    y_plain = plain.matmul_t(x, w.astype(jnp.float32), stored=True)  # what promotion computes
    np.testing.assert_allclose(np.asarray(y_plain, np.float64), xf @ wf.T, rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(y) - np.asarray(y_plain)).max() > 1e-3  # the operand really was rounded

    def loss(x, w):
        return jnp.sum(jnp.sin(auto.matmul_t(x, w, stored=True)))

    grad = jax.grad(loss, argnums=(0, 1))
    hlo = jax.jit(grad).lower(x, w).as_text()
    dots = [ln for ln in hlo.splitlines() if "dot_general" in ln]
    assert len(dots) == 3, dots
    for ln in dots:  # bfloat16 operands, float32 results
        ins, out = ln.split("->")
        assert ins.count("xbf16>") == 2 and "xf32>" in out, ln
    gx, gw = grad(x, w)
    assert gx.dtype == jnp.float32 and gw.dtype == jnp.bfloat16
    g = np.asarray(jnp.cos(y).astype(jnp.bfloat16), np.float64)  # the cotangent, rounded as the bwd rounds it
    np.testing.assert_allclose(np.asarray(gx, np.float64), g @ wf, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gw, np.float64), np.einsum("bso,bsi->oi", g, xr), rtol=2**-8, atol=1e-2)


def test_autocast_lora_step_keeps_float32_activations_and_saves_no_bfloat16_stack():
    """An autocast LoRA step: the hidden states are float32 (the logits before the LM head's
    product too), the recomputed layer scan saves its float32 products and no bfloat16 stack
    (XLA:CPU would rewrite a bfloat16 stack whole at every layer), and it trains like the
    bfloat16-activation recipe and like float32."""
    def lora_model():
        m = tiny_model(3)
        train.apply_lora(m, ["q_proj", "up_proj", "down_proj"], rank=4, alpha=8, key=jax.random.key(1))
        return m

    runs = {r: _run("bfloat16", lora_model(), "*lora_*", held_out=False, policy=p) for r, p in RECIPES.items()}
    t32, _, l32, _ = _run("float32", lora_model(), "*lora_*", held_out=False)
    t, s, la, _ = runs["autocast"]
    assert t.program.remat  # the policy's bfloat16_remat
    np.testing.assert_allclose(la, l32, atol=0.03)
    np.testing.assert_allclose(runs["bfloat16 activations"][2], l32, atol=0.03)
    assert np.abs(la - l32).max() > 1e-6  # bfloat16 products really ran
    batch = jnp.asarray(tokens(2, 9, seed=5))
    jaxpr = jax.make_jaxpr(t.logits)(s.params, t.frozen, batch[:, :-1])
    carried = [v.aval for e in jaxpr.eqns if e.primitive.name == "scan" for v in e.outvars]
    assert carried and all(a.dtype != jnp.bfloat16 for a in carried)  # the hidden state [b, s, h] float32
    def stacked(trainer, state, dtype):
        """The per-layer values of at least one row per token (2 x 8 tokens x 32 features) that
        the step's scans stack with ``dynamic_update_slice``, of ``dtype`` (the LoRA factors'
        gradients, rank x features, are smaller)."""
        hlo = trainer._step_jit.lower(state, trainer.frozen, batch, None).as_text()
        found = []
        for ln in hlo.splitlines():
            m = re.search(r"dynamic_update_slice .*: \(tensor<[\dx]+x(\w+)>, tensor<([\dx]+)x\w+>", ln)
            if m and m.group(1) == dtype and math.prod(int(d) for d in m.group(2).split("x")) >= 2 * 8 * 32:
                found.append(ln)
        return found

    assert not stacked(t, s, "bf16")
    # the saved float32 products: the MLP's [2, 8, 48] among them (a recomputed layer saves only
    # its input, the [2, 8, 32] hidden state)
    assert any("x48xf32>" in ln for ln in stacked(t, s, "f32"))
    plain, s2 = runs["bfloat16 activations"][:2]
    assert not stacked(plain, s2, "f32")  # that recipe recomputes its layers whole
