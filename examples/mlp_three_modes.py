"""A MAX program with only its imports changed, run three ways.

The model code below is MAX's own style (``nn.Module``, ``Weight``, ``ops``); the imports say
``maxjax`` instead of ``max``. It runs as a MAX graph through ``InferenceSession``, as a pure
function under ``jax.jit``/``jax.grad`` (training one optax-free SGD step), and eagerly.
"""

import jax
import jax.numpy as jnp
import numpy as np

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType, Weight, ops


class Linear(nn.Module):
    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.weight = Weight("weight", DType.float32, (out_dim, in_dim), DeviceRef.CPU())

    def __call__(self, x):
        return x @ self.weight.T


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = Linear(5, 10)
        self.gate = Linear(5, 10)
        self.down = Linear(10, 5)

    def __call__(self, x):
        return self.down(ops.silu(self.gate(x)) * self.up(x))


def main() -> None:
    rng = np.random.default_rng(0)
    model = MLP()
    model.load_state_dict({k: rng.standard_normal(v.shape).astype(np.float32) * 0.5 for k, v in model.state_dict().items()})
    x = rng.standard_normal((3, 5)).astype(np.float32)

    # 1. Graph mode: MAX's way.
    graph = Graph("mlp", forward=model, input_types=[TensorType(DType.float32, ["batch", 5], DeviceRef.CPU())])
    print(graph)
    compiled = InferenceSession().load(graph, weights_registry=model.state_dict())
    graph_out = compiled.execute(x)[0].to_numpy()

    # 2. Functional mode: JAX's way (jit, grad).
    state = nn.state(model)
    forward = jax.jit(lambda s, x: nn.functional_call(model, s, x))
    loss = lambda s: jnp.mean(forward(s, x) ** 2)  # noqa: E731
    grads = jax.grad(loss)(state)
    stepped = {k: state[k] - 0.1 * grads[k] for k in state}

    # 3. Eager mode: notebooks.
    eager_out = np.asarray(model(x))

    print(f"graph vs eager     max |diff| = {np.abs(graph_out - eager_out).max():.2e}")
    print(f"graph vs jit       max |diff| = {np.abs(graph_out - np.asarray(forward(state, x))).max():.2e}")
    print(f"loss before / after one SGD step: {float(loss(state)):.4f} / {float(loss(stepped)):.4f}")


if __name__ == "__main__":
    main()
