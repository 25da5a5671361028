"""One layer code, three modes (DESIGN.md): graph, functional (jit/grad/vmap, optax) and eager."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType, TensorValue, ops

RNG = np.random.default_rng(3)


class Block(nn.Module):
    """RMSNorm -> MLP (SwiGLU) -> residual, then LayerNorm; built from maxjax.nn layers."""

    def __init__(self, dim=8, hidden=16):
        super().__init__()
        self.norm = nn.RMSNorm(dim, DType.float32, eps=1e-6)
        self.mlp = nn.MLP(DType.float32, None, dim, hidden, [DeviceRef.CPU()])
        self.out_norm = nn.LayerNorm(dim, [DeviceRef.CPU()], DType.float32)
        self.proj = nn.Linear(dim, 3, DType.float32, DeviceRef.CPU(), has_bias=True)

    def __call__(self, x):
        h = x + self.mlp(self.norm(x))
        return self.proj(self.out_norm(h))


def _loaded_block():
    b = Block()
    sd = {k: (RNG.standard_normal(v.shape) * 0.5).astype(np.float32) for k, v in b.state_dict().items()}
    b.load_state_dict(sd)
    return b


def _graph_run(module, x):
    t = TensorType(DType.float32, ["batch", "seq", x.shape[-1]], DeviceRef.CPU())
    g = Graph("block", forward=module, input_types=[t])
    return InferenceSession().load(g, weights_registry=module.state_dict()).execute(x)[0].to_numpy()


def test_graph_functional_and_eager_agree():
    b = _loaded_block()
    x = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    graph_out = _graph_run(b, x)
    eager_out = b(jnp.asarray(x))
    assert isinstance(eager_out, jax.Array)
    functional_out = jax.jit(lambda s, x: nn.functional_call(b, s, x))(nn.state(b), x)
    np.testing.assert_allclose(np.asarray(eager_out), graph_out, atol=1e-5)
    np.testing.assert_allclose(np.asarray(functional_out), graph_out, atol=1e-5)
    # eager on a TensorValue returns TensorValues (hooks and notebooks see MAX's methods)
    tv_out = b(TensorValue(jnp.asarray(x)))
    assert isinstance(tv_out, TensorValue) and tv_out.dtype == DType.float32
    assert str(tv_out.shape) == "[2, 5, 3]"


def test_grad_reaches_every_weight_and_matches_finite_differences():
    b = _loaded_block()
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    state = nn.state(b)

    def loss(s):
        return jnp.mean(nn.functional_call(b, s, x) ** 2)

    grads = jax.jit(jax.grad(loss))(state)
    assert set(grads) == set(state)
    assert all(float(jnp.abs(g).max()) > 0 for g in grads.values())
    # directional finite difference check (float32, central differences)
    direction = {k: jnp.asarray(RNG.standard_normal(v.shape).astype(np.float32)) for k, v in state.items()}
    eps = 1e-2
    plus = loss({k: state[k] + eps * direction[k] for k in state})
    minus = loss({k: state[k] - eps * direction[k] for k in state})
    fd = (plus - minus) / (2 * eps)
    analytic = sum(jnp.vdot(grads[k], direction[k]) for k in state)
    np.testing.assert_allclose(float(analytic), float(fd), rtol=2e-2)


def test_vmap_over_examples():
    b = _loaded_block()
    x = RNG.standard_normal((4, 3, 8)).astype(np.float32)
    per_example = jax.vmap(lambda xi: nn.functional_call(b, nn.state(b), xi))(x)
    np.testing.assert_allclose(np.asarray(per_example), np.asarray(b(x)), atol=1e-5)


def test_optax_training_reduces_loss_and_module_is_untouched():
    b = _loaded_block()
    before = {k: np.asarray(v) for k, v in nn.state(b).items()}
    x = RNG.standard_normal((16, 4, 8)).astype(np.float32)
    y = RNG.standard_normal((16, 4, 3)).astype(np.float32)
    params = nn.state(b)
    opt = optax.adam(1e-2)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((nn.functional_call(b, p, x) - y) ** 2))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    with jax.numpy_dtype_promotion("standard"):  # optax's own arithmetic is not strict-promotion clean
        for _ in range(30):
            params, opt_state, loss = step(params, opt_state)
            losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0]
    # training is functional: the module's own values are unchanged until loaded back
    assert all(np.array_equal(before[k], np.asarray(v)) for k, v in nn.state(b).items())
    b.load_state_dict({k: np.asarray(v) for k, v in params.items()})
    np.testing.assert_allclose(
        float(jnp.mean((b(x) - y) ** 2)), float(jnp.mean((nn.functional_call(b, params, x) - y) ** 2)), rtol=1e-5
    )


def test_abstract_state_is_shape_dtype_structs_for_eval_shape():
    b = Block()
    abstract = nn.abstract_state(b)
    assert abstract["mlp.gate_proj.weight"] == jax.ShapeDtypeStruct((16, 8), jnp.float32)
    mapped = jax.tree.map(lambda w: w.shape_dtype_struct, b.raw_state_dict())
    assert mapped == abstract
    out = jax.eval_shape(lambda s, x: nn.functional_call(b, s, x), abstract, jax.ShapeDtypeStruct((2, 7, 8), jnp.float32))
    assert out.shape == (2, 7, 3)


def test_functional_call_rejects_unknown_keys():
    b = Block()
    with pytest.raises(KeyError, match="'mlp.gate_proj.weigth' is not a weight of Block. Did you mean 'mlp.gate_proj.weight'"):
        nn.functional_call(b, {"mlp.gate_proj.weigth": np.zeros((16, 8), np.float32)}, np.zeros((1, 8), np.float32))


def test_functional_state_under_named_sharding():
    b = _loaded_block()
    mesh = jax.make_mesh((8,), ("data",), devices=jax.devices("cpu")[:8])
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    batch_sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    state = jax.device_put(nn.state(b), replicated)
    x = jax.device_put(RNG.standard_normal((8, 3, 8)).astype(np.float32), batch_sharded)
    out = jax.jit(lambda s, x: nn.functional_call(b, s, x))(state, x)
    assert out.sharding.is_equivalent_to(batch_sharded, out.ndim)
    np.testing.assert_allclose(np.asarray(out), np.asarray(b(np.asarray(x))), atol=1e-5)


def test_eager_intermediates_are_inspectable():
    b = _loaded_block()
    x = TensorValue(jnp.asarray(RNG.standard_normal((1, 2, 8)).astype(np.float32)))
    h = b.norm(x)
    assert isinstance(h, TensorValue)
    ref = np.asarray(x) / np.sqrt(np.mean(np.asarray(x) ** 2, -1, keepdims=True) + 1e-6) * np.asarray(b.norm.weight.value)
    np.testing.assert_allclose(h.to_numpy(), ref, rtol=1e-5, atol=1e-6)
    assert "float32[1, 2, 8]" in repr(h)
    assert ops.mean(h, axis=-1).shape == [1, 2, 1]
