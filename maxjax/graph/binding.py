"""How a :class:`~maxjax.graph.Weight` gets a value outside a graph: the one binding mechanism.

In graph mode a Weight's value is a graph input (``Graph.add_weight``). Outside graphs, the
module being run binds its weights for the length of the call:

- ``names``: the weights of the module being run by fully-qualified name, so that
  ``ops.call(subgraph, ..., prefix="layers.3.")`` finds ``layers.3.mlp.up_proj.weight``;
- ``values``: arrays or tracers by Weight (functional mode: ``nn.functional_call(module, state,
  ...)``); a Weight with no bound value uses the value ``load_state_dict`` stored on it;
- ``root``: the module being run, so that eager ``ops.call`` can run the layer a subgraph stands
  for (its hooks then see every layer).

Bindings nest: an inner :func:`bind` sees the outer values. Nothing is stored on the Weights.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

__all__ = ["Binding", "bind", "current_binding"]


@dataclass(frozen=True)
class Binding:
    """The weights bound for the call being run (see the module docstring)."""

    names: Mapping[str, Any] = field(default_factory=dict)
    values: Mapping[int, Any] = field(default_factory=dict)
    root: Any = None

    def value_of(self, weight: Any) -> Any:
        """The value bound to ``weight`` (functional mode), or None."""
        return self.values.get(id(weight))


_CURRENT: contextvars.ContextVar[Binding | None] = contextvars.ContextVar("maxjax_binding", default=None)


def current_binding() -> Binding | None:
    """The innermost binding, or None outside any module call."""
    return _CURRENT.get()


@contextlib.contextmanager
def bind(
    names: Mapping[str, Any] | None = None, values: Mapping[Any, Any] | None = None, root: Any = None
) -> Iterator[Binding]:
    """Binds weights for the block (see the module docstring).

    Args:
        names: FQN -> Weight of the module being run (default: the outer binding's).
        values: Weight (or ``id(Weight)``) -> array or tracer; merged over the outer binding's.
        root: the module being run (default: the outer binding's).
    """
    outer = _CURRENT.get()
    new_values = {(k if isinstance(k, int) else id(k)): v for k, v in (values or {}).items()}
    if outer is not None:
        names = outer.names if names is None else names
        root = outer.root if root is None else root
        if outer.values:
            new_values = {**outer.values, **new_values}
    binding = Binding(names or {}, new_values, root)
    token = _CURRENT.set(binding)
    try:
        yield binding
    finally:
        _CURRENT.reset(token)
