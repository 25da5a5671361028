"""The Trainer's step: one compilation per batch shape with weights as arguments, the real SmolLM2
trained in float32 and with LoRA, remat, and data parallel over 8 devices (issue 15)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from maxjax import nn, train
from train_util import TINY, tiny_model, tokens


def test_the_step_compiles_once_and_matches_a_hand_written_optax_loop():
    model = tiny_model(3)
    trainer = train.Trainer(model, optax.adamw(1e-2))
    state = trainer.init(seed=0)
    batches = [tokens(4, 17, seed=20 + i) for i in range(4)]
    losses = []
    for b in batches:
        state, m = trainer.step(state, b)
        losses.append(float(m["loss"]))
        assert float(m["tokens"]) == 4 * 16
    assert trainer.num_compiles == 1 and list(trainer.compile_seconds) == [(4, 17)]
    assert int(state.step) == 4
    # the same run written by hand: functional mode + optax
    params = nn.state(tiny_model(3))
    opt = optax.adamw(1e-2)
    opt_state = opt.init(params)

    def loss_fn(p, t):
        return train.next_token_loss(nn.functional_call(model, p, t[:, :-1]), t)[0]

    @jax.jit
    def step(p, o, t):
        loss, g = jax.value_and_grad(loss_fn)(p, t)
        with jax.numpy_dtype_promotion("standard"):
            u, o = opt.update(g, o, p)
            return optax.apply_updates(p, u), o, loss

    expected = []
    for b in batches:
        params, opt_state, loss = step(params, opt_state, jnp.asarray(b))
        expected.append(float(loss))
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    final = trainer.state_dict(state)
    for k in params:
        np.testing.assert_allclose(np.asarray(final[k]), np.asarray(params[k]), rtol=1e-4, atol=1e-5, err_msg=k)
    # a masked position does not count
    loss_all, n_all = trainer.loss(state, batches[0])
    mask = np.ones((4, 16), np.float32)
    mask[:, :8] = 0
    _, n_half = trainer.loss(state, batches[0], mask)
    assert float(n_all) == 64 and float(n_half) == 32
    with pytest.raises(ValueError, match=r"tokens must be int \[batch, seq \+ 1\]"):
        trainer.step(state, np.zeros((4,), np.int32))


def test_remat_and_bfloat16_train():
    model = tiny_model(4)
    batch = tokens(2, 9, seed=5)
    plain = train.Trainer(model, optax.sgd(0.1))
    remat = train.Trainer(model, optax.sgd(0.1), remat=True)
    assert remat.program.remat and not plain.program.remat
    s1, m1 = plain.step(plain.init(), batch)
    s2, m2 = remat.step(remat.init(), batch)
    assert float(m1["loss"]) == pytest.approx(float(m2["loss"]), rel=1e-6)
    for k in s1.params:
        np.testing.assert_allclose(np.asarray(s1.params[k]), np.asarray(s2.params[k]), rtol=1e-5, atol=1e-6)
    unrolled = train.Trainer(model, optax.sgd(0.1), scan=False)  # every layer inlined: entries by layer name
    assert unrolled.program.chains == [] and "layers.2.mlp.up_proj.weight" in unrolled.entries
    _, m3 = unrolled.step(unrolled.init(), batch)
    assert float(m3["loss"]) == pytest.approx(float(m1["loss"]), rel=1e-6)
    half = train.Trainer(train.dequantized(model, "bfloat16"), optax.adam(1e-2))
    state = half.init()
    assert all(v.dtype == jnp.bfloat16 for v in state.params.values())
    first = None
    for _ in range(2):
        state, m = half.step(state, batch)
        first = first if first is not None else float(m["loss"])
    assert float(m["loss"]) < first and abs(first - float(m1["loss"])) < 0.05


def test_data_parallel_on_a_mesh_of_8_devices_equals_one_device():
    devices = jax.devices()
    assert len(devices) == 8
    mesh = jax.sharding.Mesh(np.array(devices), ("dp",))
    model = tiny_model(6)
    batches = [tokens(8, 9, seed=30 + i) for i in range(2)]
    single = train.Trainer(model, optax.adam(1e-2))
    sharded = train.Trainer(model, optax.adam(1e-2), mesh=mesh)
    s1, s2 = single.init(), sharded.init()
    assert s2.params["layers.*.mlp.up_proj.weight"].sharding.is_fully_replicated
    for b in batches:
        s1, m1 = single.step(s1, b)
        s2, m2 = sharded.step(s2, b)
        assert float(m1["loss"]) == pytest.approx(float(m2["loss"]), rel=1e-5)
    assert len(s2.params["norm.weight"].sharding.device_set) == 8 and sharded.num_compiles == 1
    for k in s1.params:
        np.testing.assert_allclose(np.asarray(s1.params[k]), np.asarray(s2.params[k]), rtol=1e-4, atol=1e-4)  # adam: 1% of a step
    with pytest.raises(ValueError, match="batch 6 does not split over the 8 devices of mesh axis 'dp'"):
        sharded.step(s2, tokens(6, 9))


def test_smollm2_lora_step_compiles_once_with_the_weights_as_arguments():
    from maxjax.models import load_model

    lm = load_model()
    model = train.dequantized(lm.module)
    train.apply_lora(model, ["q_proj", "v_proj"], rank=4, alpha=8, key=jax.random.key(0))
    trainer = train.Trainer(model, optax.adamw(1e-3), trainable="*lora_*")
    state = trainer.init()
    ids = lm.tokenizer.encode(
        "Return the length (the number of items) of an object. The argument may be a sequence (such as a string, "
        "bytes, tuple, list, or range) or a collection (such as a dictionary, set, or frozen set)."
    )
    batch = np.asarray([ids[:17], ids[1:18]], np.int32)
    # no weight is baked into the program: its text is tiny next to the 540 MB of float32 weights
    text = trainer._step_jit.lower(state, trainer.frozen, jnp.asarray(batch), None).as_text()
    assert len(text) < 2_000_000
    losses = []
    for _ in range(3):
        state, m = trainer.step(state, batch)
        losses.append(float(m["loss"]))
    assert trainer.num_compiles == 1 + 0 and losses[-1] < losses[0]
    assert 0 < trainer.compile_seconds[(2, 17)]
