"""``maxjax.nn.hooks.print_hook``: :class:`PrintHook` (MAX 26.7's ``max/nn/hooks/print_hook.py``).

``PrintHook()`` registers itself as a layer hook and prints every named layer's inputs and
outputs in MAX's runtime print format (measured on MAX 26.7, CPU)::

    model.lin-output = tensor([[1.3000, 1.6000],
    [2.2000, 5.2000]], dtype=f32, shape=[2,2])

When it prints, by mode:

- graph mode: the hook adds a print op to the graph (as MAX's ``TensorValue.print``); the values
  print each time the compiled model executes, in graph order.
- functional mode (``jax.jit``): the print is a ``jax.debug.callback`` (ordered) inside the
  traced function: values print on each call of the compiled function, not while tracing.
- eager mode: values are concrete and print at once, as each layer returns.

The printing is :func:`format_tensor` on the host copy (``jax.debug.callback``), so it works the
same in all three; under ``jax.vmap`` ordered callbacks are refused by JAX.

Differences from MAX 26.7 (documented, deliberate): ``remove()`` removes only this hook (MAX
calls ``clear_hooks()``, removing every hook); MAX's V3 (``max.experimental.nn``) modules have no
maxjax counterpart, so ``name_layers`` takes maxjax ``Layer``s only.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from collections import deque
from typing import Any, Generator

import jax
import numpy as np

from maxjax.graph.ops._core import apply
from maxjax.graph.value import TensorValue
from maxjax.nn.hooks.base_print_hook import BasePrintHook
from maxjax.nn.layer.layer import Layer, add_layer_hook

__all__ = ["PrintHook", "format_tensor"]

logger = logging.getLogger("max.pipelines")  # MAX's logger name, so its warning filters apply

_EDGE = 3  # MAX shows the first and last 3 entries of an axis longer than 2 * 3


def _dtype_name(dtype: np.dtype) -> str:
    """MAX's short dtype name (``f32``, ``bf16``, ``si32``, ``ui8``, ``bool``)."""
    name = np.dtype(dtype).name
    if name == "bool":
        return "bool"
    if name == "bfloat16":
        return "bf16"
    if name.startswith("float") and name[5:].isdigit():
        return "f" + name[5:]
    if name.startswith("uint"):
        return "ui" + name[4:]
    if name.startswith("int"):
        return "si" + name[3:]
    return name.replace("float", "f").replace("_", "")  # float8_e4m3fn -> f8e4m3fn


def _elem(v: Any, kind: str) -> str:
    if kind == "b":
        return "True" if v else "False"
    if kind in "iu":
        return str(int(v))
    f = float(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "INF" if f > 0 else "-INF"
    return f"{f:.4f}"


def _elide(items: list[Any]) -> tuple[list[Any], list[Any] | None]:
    """(first, last) thirds of ``items`` when longer than ``2 * _EDGE``, else (items, None)."""
    if len(items) > 2 * _EDGE:
        return items[:_EDGE], items[-_EDGE:]
    return items, None


def format_tensor(label: str, value: Any) -> str:
    """``value`` as MAX 26.7's ``ops.print`` shows it (without the trailing newline).

    The tensor is viewed as blocks (the leading axes flattened) of rows by columns; rank 0 and 1
    show as one row (``[[...]]``, as MAX does). Floats print with 4 decimals (``nan``, ``INF``,
    ``-INF``), integers and bools as such. An axis of more than 6 entries shows its first and
    last 3 with MAX's elision marks. The format was taken from MAX 26.7's output on CPU.

    Args:
        label: The name printed before `` = ``.
        value: A host array (any shape, any dtype NumPy holds, bfloat16 included).
    """
    a = np.asarray(value)
    kind = a.dtype.kind if a.dtype.kind in "biu" else "f"
    shape = "[" + ",".join(str(d) for d in a.shape) + "]"
    if a.size == 0:
        body = "[]"
    else:
        cols = a.shape[-1] if a.ndim >= 1 else 1
        rows = a.shape[-2] if a.ndim >= 2 else 1
        blocks = a.reshape(-1, rows, cols)

        def row(r: np.ndarray) -> str:
            first, last = _elide([_elem(v, kind) for v in r])
            return "[" + ", ".join(first) + ("" if last is None else ", ..., " + ", ".join(last)) + "]"

        def block(b: np.ndarray) -> str:
            first, last = _elide([row(r) for r in b])
            return "[" + ",\n".join(first) + ("" if last is None else ",\n ..., \n\n" + ",\n".join(last)) + "]"

        first, last = _elide([block(b) for b in blocks])
        inner = ",\n\n".join(first) + ("" if last is None else "\n ..., \n,\n\n" + ",\n\n".join(last))
        depth = max(a.ndim - 2, 0)
        body = "[" * depth + inner + "]" * depth
    return f"{label} = tensor({body}, dtype={_dtype_name(a.dtype)}, shape={shape})"


def _emit(label: str, value: Any) -> None:
    sys.stdout.write(format_tensor(label, value) + "\n")
    sys.stdout.flush()


def _print_tensor(x: Any, *, label: str) -> Any:
    jax.debug.callback(functools.partial(_emit, label), x, ordered=True)
    return x


class PrintHook(BasePrintHook):
    """Prints the inputs and outputs of layers as they run (MAX's ``max.nn.hooks.PrintHook``).

    Create it before building the graph (or calling the model): it registers itself with
    :func:`~maxjax.nn.layer.add_layer_hook`. :meth:`name_layers` names the layers by attribute
    path (``model``, ``model.lin``, ``model.layers.layers.0``, ...). See the module docstring
    for when each mode prints.

    Args:
        export_path: As in MAX 26.7: values still print to stdout (a warning says so), and
            ``{export_path}/{step}/tensor_names.txt`` lists the printed names of each step.
        filter: Layer names to restrict printing to; None prints every layer.
    """

    def __init__(self, export_path: str | None = None, filter: list[str] | None = None) -> None:  # noqa: A002 - MAX's name
        super().__init__(export_path=export_path, filter=filter)
        self._handle = add_layer_hook(self)
        if export_path is not None:
            logger.warning("Export path is currently not supported. Values will be printed to stdout with COMPACT format.")

    def name_layers(self, model: Layer) -> None:
        """Names every layer reachable from ``model``'s attributes (lists and tuples included)
        by attribute path, breadth first, as MAX's ``_walk_layers``: a layer reached twice keeps
        the later (deeper) name.

        Raises:
            TypeError: ``model`` is not a ``Layer``.
        """
        if not isinstance(model, Layer):
            raise TypeError(
                f"PrintHook.name_layers expects a maxjax.nn Layer (MAX's V2 Layer), got {type(model).__name__}."
            )
        for layer, name in _walk_layers(model):
            self.add_layer(layer, name)

    def print_value(self, name: str, value: Any) -> bool:
        """Prints a tensor value (a ``TensorValue`` or array) under ``name``; False for anything else."""
        if isinstance(value, TensorValue):
            apply(_print_tensor, value, _name="print", label=name)
            return True
        if isinstance(value, (jax.Array, np.ndarray)):
            _print_tensor(value, label=name)
            return True
        return False

    def remove(self) -> None:
        """Removes this hook (only this one) and an empty export directory of the current step."""
        super().remove()
        self._handle.remove()

    def __del__(self) -> None:
        self.summarize()


def _walk_layers(model: Layer) -> Generator[tuple[Layer, str], None, None]:
    """``(layer, name)`` for ``model`` (``"model"``) and every layer in its attributes, lists
    and tuples, breadth first (MAX's ``max.nn.hooks.print_hook._walk_layers``). A layer reached by
    two paths is yielded for each. A reference back to an enclosing layer is not followed (MAX
    26.7 loops forever on one)."""
    queue: deque[tuple[Any, str, frozenset[int]]] = deque([(model, "model", frozenset())])
    while queue:
        obj, name, above = queue.popleft()
        if isinstance(obj, Layer):
            yield obj, name
            items: Any = obj.__dict__.items()
            above = above | {id(obj)}
        else:  # a list or tuple
            items = enumerate(obj)
        for k, v in items:
            if isinstance(v, (Layer, list, tuple)) and id(v) not in above:
                queue.append((v, f"{name}.{k}", above))
