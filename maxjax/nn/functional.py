"""Functional mode (JAX's way): a module as a pure function of a state pytree.

``functional_call(module, state, *inputs)`` runs ``module(*inputs)`` with each weight bound to
``state[fqn]`` (arrays or tracers), so it works under ``jax.jit``, ``jax.grad`` and ``jax.vmap``::

    state = maxjax.nn.state(model)                        # {fqn: jax.Array}
    loss = lambda s, x, y: jnp.mean((functional_call(model, s, x) - y) ** 2)
    grads = jax.jit(jax.grad(loss))(state, x, y)          # same keys as state

Nothing is stored on the module or its Weights: bindings last for the call only.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax

from maxjax.graph.binding import bind
from maxjax.graph.graph import did_you_mean

__all__ = ["functional_call", "state", "abstract_state"]


def functional_call(module: Any, state: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
    """Calls ``module(*args, **kwargs)`` with its weights taken from ``state`` (FQN -> array).

    Weights missing from ``state`` use the value loaded on the module (eager value), so a partial
    state (e.g. only the trainable weights) works. A GGUF-quantized weight's value may be its raw
    bytes or a :class:`~maxjax.graph.quantization.QuantizedArray` of any layout.

    Raises:
        KeyError: a key of ``state`` is not a weight of the module (with "did you mean").
    """
    index = module._fqn_index()
    bindings = {}
    for k, v in state.items():
        w = index.get(k)
        if w is None:
            raise KeyError(f"{k!r} is not a weight of {type(module).__name__}.{did_you_mean(k, index)}")
        bindings[id(w)] = w.as_value(v)
    with bind(names=index, values=bindings, root=module):
        return module(*args, **kwargs)


def state(module: Any) -> dict[str, jax.Array]:
    """The module's weights as ``{fqn: jax.Array}`` (placed on each weight's device or sharding;
    GGUF-quantized weights as :class:`~maxjax.graph.quantization.PackedArray`).

    Weights with no loaded value are zero-filled, as ``state_dict()`` does.
    """
    module.state_dict()  # zero-fills unloaded weights and gives weights their FQNs
    return {fqn: w.array() for fqn, w in module._fqn_index().items()}


def abstract_state(module: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """``{fqn: jax.ShapeDtypeStruct}`` (with shardings) from the module's Weight placeholders."""
    return jax.tree.map(lambda w: w.shape_dtype_struct, module.raw_state_dict())
