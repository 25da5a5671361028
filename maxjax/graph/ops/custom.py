"""MAX's user-defined ops ``max.graph.ops.custom`` / ``max.graph.ops.inplace_custom``, calling
JAX kernels registered by name.

MAX calls a Mojo kernel registered with ``@compiler.register(name)`` and loaded from a package
(``Graph(custom_extensions=[...])``); MAX checks the call against its kernel library when the op
is built (``KernelLibrary.verify_custom_op``). maxjax cannot run Mojo: a kernel is a JAX function
registered under the same name (:func:`maxjax.graph.register_kernel`, or
:meth:`maxjax.graph.KernelLibrary.register` for one graph's library), and the op is that
function, recorded and shape-checked like every other op (:func:`maxjax.graph.ops._core.apply`).

A MAX user porting a custom op writes::

    @register_kernel("my_add_one")
    def my_add_one(x, *, amount: int = 1):      # x: the op's value as a jnp array
        return x + jnp.asarray(amount, x.dtype)

    y = ops.custom("my_add_one", DeviceRef.CPU(), [x], [x.type], parameters={"amount": 2})[0]

Checks, in MAX's order (messages and exception types as MAX 26.7's, observed with MAX):

1. ``values`` holding a :class:`~maxjax.graph.BufferValue` given to ``custom`` (``TypeError``:
   use ``inplace_custom``), or ``inplace_custom`` without one (``TypeError``); ``values`` or
   ``out_types`` not a sequence (``TypeError``); a value that is not a tensor (``ValueError``).
2. a parameter that is not bool, int, float, str or DType (``TypeError``: "unsupported parameter
   type ... for custom op").
3. the kernel name: empty, or not registered in the graph's kernel library (``ValueError``, as MAX
   for a kernel it cannot find; the message says how to register a JAX implementation).
4. (maxjax) the kernel's outputs against ``out_types``: count, dtype and shape (``ValueError``
   naming the kernel, the output, expected and actual), and the values' devices against
   ``device``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable

import jax
import numpy as np

from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.graph.buffer import BufferValue
from maxjax.graph.graph import KernelLibrary, current_graph
from maxjax.graph.ops._core import apply
from maxjax.graph.type import DeviceRef, StaticDim
from maxjax.graph.value import TensorValue

if TYPE_CHECKING:
    from maxjax.driver import Device
    from maxjax.graph.type import Type
    from maxjax.graph.value import Value

__all__ = ["custom", "inplace_custom"]

_PARAMETER_TYPES = (bool, int, float, str, DType)  # MAX's _parameter_attribute (bool before int)


def _sequence(x: Any, what: str, op: str) -> list[Any]:
    if isinstance(x, (str, bytes)) or not isinstance(x, Sequence) and not hasattr(x, "__iter__"):
        raise TypeError(f"ops.{op}: {what} must be a sequence, got {x!r}")
    return list(x)


def _check_values(values: list[Any], op: str) -> None:
    for i, v in enumerate(values):
        if not isinstance(v, (TensorValue, BufferValue, jax.Array, np.ndarray, Buffer)):
            raise ValueError(
                f"ops.{op}: values[{i}] must be a tensor value (TensorValue, BufferValue or array), got {v!r}"
            )


def _check_parameters(parameters: Mapping[str, Any] | None, op: str) -> dict[str, Any]:
    if parameters is None:
        return {}
    for key, value in parameters.items():
        if not isinstance(value, _PARAMETER_TYPES):
            raise TypeError(
                f"unsupported parameter type {type(value)} for custom op (ops.{op} parameter {key!r}={value!r}; "
                "supported: bool, int, float, str, DType)"
            )
    return dict(parameters)


def _library(values: list[Any]) -> KernelLibrary | None:
    """The kernel library of the graph being built (or of the values' graph); None eagerly."""
    for v in values:
        g = v._graph if isinstance(v, (TensorValue, BufferValue)) else None
        if g is not None:
            return g._kernel_library
    g = current_graph()
    return None if g is None else g._kernel_library


def _kernel(name: str, values: list[Any], op: str) -> Callable[..., Any]:
    if not isinstance(name, str) or not name:
        raise ValueError(f"ops.{op}: the kernel name must be a non-empty str, got {name!r}")
    library = _library(values)
    if library is None:
        library = KernelLibrary()  # eagerly: the process-wide kernels
    if name not in library:
        raise ValueError(
            f"no kernel registered for {name!r}: maxjax cannot run Mojo kernels; register a JAX implementation "
            f"with @maxjax.graph.register_kernel({name!r}) (or KernelLibrary.register({name!r}, fn) on the "
            "graph's kernel_library)"
        )
    return library[name]


def _check_devices(values: list[Any], device: DeviceRef, name: str, op: str) -> None:
    for i, v in enumerate(values):
        tv = v._current if isinstance(v, BufferValue) else v
        if isinstance(tv, TensorValue) and tv._graph is not None and tv.device != device:
            raise ValueError(
                f"ops.{op}({name!r}): values[{i}] is on {tv.device}, the op on device={device}; "
                "move it with .to(device)"
            )


def _as_tuple(fn: Callable[..., Any], name: str, expected: list[Any], parameters: dict[str, Any]) -> Callable[..., Any]:
    """The kernel called with its parameters, its result always a tuple of arrays (one array is a
    1-tuple) of the declared count. (Parameters are bound here, not passed through ``apply``'s
    keywords, so that any parameter name is allowed.)"""

    def kernel(*arrays: Any) -> tuple[Any, ...]:
        out = fn(*arrays, **parameters)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(expected):
            raise ValueError(
                f"kernel {name!r} returned {len(out)} value(s), expected {len(expected)} "
                f"({', '.join(str(t) for t in expected) or 'none'})"
            )
        return out

    kernel.__name__ = name
    return kernel


def _mismatch(o: Any, t: Any) -> str | None:
    """How the kernel's result ``o`` differs from the declared type ``t`` (dtype, static dims), or None."""
    aval = o._aval if isinstance(o, TensorValue) else o
    symbolic = isinstance(o, TensorValue) and o._graph is not None
    held = np.dtype(aval.dtype)
    dims = list(o.shape) if symbolic else [StaticDim(int(d)) for d in aval.shape]
    # the dtype JAX holds (int64 is held in 32 bits without x64); eagerly a declared symbolic dim
    # matches any size (arrays have only static sizes)
    same_dtype = held == np.dtype(t.dtype.to_jax())
    same_shape = len(dims) == len(t.shape) and all(
        a == b or not symbolic and not isinstance(b, StaticDim) for a, b in zip(dims, t.shape)
    )
    if same_dtype and same_shape:
        return None
    try:
        got_dtype = repr(DType.from_numpy(held))
    except ValueError:
        got_dtype = str(held)
    return f"{got_dtype}[{', '.join(str(d) for d in dims)}]"


def _record(
    fn: Callable[..., Any], name: str, tensors: list[Any], expected: list[Any], parameters: dict[str, Any], op: str
) -> list[Any]:
    """Runs or records the kernel (:func:`apply`), its outputs declared as ``expected``.

    Raises:
        ValueError: the kernel fails, returns another number of values, or a value of another
            dtype or shape than declared (a node recorded for it is taken back).
    """
    kernel = _as_tuple(fn, name, expected, parameters)
    try:
        outs = list(apply(kernel, *tensors, _name=name, _dtypes=[t.dtype for t in expected]))
    except ValueError as e:
        raise ValueError(f"ops.{op}: {e}") from None
    for i, (o, t) in enumerate(zip(outs, expected)):
        got = _mismatch(o, t)
        if got is not None:
            g = o._graph if isinstance(o, TensorValue) else None
            if g is not None and g._nodes and g._nodes[-1] is o._node:
                g._nodes.pop()  # the graph stays as it was before the failed op
            want = f"{t.dtype!r}[{', '.join(str(d) for d in t.shape)}]"
            raise ValueError(f"ops.{op}({name!r}): output {i} of the kernel is {got}, the declared type is {want}")
    return outs


def custom(
    name: str,
    device: Device | DeviceRef,
    values: Sequence[Value],
    out_types: Sequence[Type],
    parameters: Mapping[str, bool | int | float | str | DType] | None = None,
) -> list[Value]:
    """Calls the custom kernel ``name`` on ``values`` (MAX's ``ops.custom``).

    In maxjax the kernel is a JAX function registered under ``name`` (see the module docstring and
    :func:`maxjax.graph.register_kernel`); it is called as ``fn(*arrays, **parameters)``.

    Args:
        name: the kernel's registered name.
        device: the device the op runs on (:class:`~maxjax.driver.Device` or
            :class:`~maxjax.graph.DeviceRef`); graph values must be on it.
        values: the kernel's tensor arguments (TensorValues, or arrays eagerly); no buffers.
        out_types: one :class:`~maxjax.graph.TensorType` per kernel output (dtype and shape).
        parameters: keyword arguments of the kernel: bool, int, float, str or DType each.

    Returns:
        A list with one value per ``out_types`` entry: graph values in a graph, TensorValues for
        TensorValue arguments, plain JAX arrays for plain arrays (so it runs under ``jax.jit``).

    Raises:
        TypeError: a :class:`~maxjax.graph.BufferValue` among ``values`` (use
            :func:`inplace_custom`), ``values``/``out_types`` not sequences, an unsupported
            parameter type, or ``device`` not a device.
        ValueError: a value that is not a tensor; ``name`` empty or not registered; a value on
            another device than ``device``; the kernel's outputs differ from ``out_types``
            (count, dtype or shape); the kernel fails on its inputs.
    """
    values = _sequence(values, "values", "custom")
    device = DeviceRef.from_device(device)
    if any(isinstance(v, BufferValue) for v in values):
        raise TypeError(
            "custom ops that take buffers or opaque values to do in-place updates should use ops.inplace_custom instead"
        )
    out_types = _sequence(out_types, "out_types", "custom")
    _check_values(values, "custom")
    params = _check_parameters(parameters, "custom")
    fn = _kernel(name, values, "custom")
    _check_devices(values, device, name, "custom")
    return _record(fn, name, values, out_types, params, "custom")


def inplace_custom(
    name: str,
    device: Device | DeviceRef,
    values: Sequence[Value],
    out_types: Sequence[Type] | None = None,
    parameters: Mapping[str, bool | int | float | str | DType] | None = None,
) -> list[Value]:
    """Calls the custom kernel ``name``, which updates the buffers among ``values`` (MAX's
    ``ops.inplace_custom``).

    The registered JAX function is called as ``fn(*arrays, **parameters)``, each buffer given as
    its current value; JAX arrays are immutable, so it returns the buffers' new values first (one
    per buffer, in the order of ``values``, same shape and dtype), then one output per
    ``out_types`` entry. The new values are stored into the buffers (``ops.buffer_store``).

    Args:
        name: the kernel's registered name.
        device: the device the op runs on; graph values must be on it.
        values: the kernel's arguments: at least one :class:`~maxjax.graph.BufferValue`, and
            tensors.
        out_types: the kernel's outputs besides the buffer updates (None or empty: none).
        parameters: keyword arguments of the kernel: bool, int, float, str or DType each.

    Returns:
        A list with one value per ``out_types`` entry (empty without ``out_types``).

    Raises:
        TypeError: no BufferValue among ``values`` (MAX's message), ``values`` not a sequence, an
            unsupported parameter type, or ``device`` not a device.
        ValueError: as :func:`custom`; also a buffer's new value of another shape or dtype.
        NotImplementedError: inside ``ops.cond`` / ``ops.while_loop``, or on a persistent
            ``buffer_create(..., init_value)`` buffer (see :func:`~maxjax.graph.ops.buffer_store`).
    """
    from maxjax.graph.ops.buffer import _check_writable, buffer_store

    values = _sequence(values, "values", "inplace_custom")
    if not any(isinstance(v, BufferValue) for v in values):
        raise TypeError("expected at least one BufferValue or _OpaqueValue as input to an in-place custom op")
    out_types = [] if out_types is None else _sequence(out_types, "out_types", "inplace_custom")
    device = DeviceRef.from_device(device)
    _check_values(values, "inplace_custom")
    params = _check_parameters(parameters, "inplace_custom")
    fn = _kernel(name, values, "inplace_custom")
    _check_devices(values, device, name, "inplace_custom")
    buffers = [v for v in values if isinstance(v, BufferValue)]
    for b in buffers:
        _check_writable(b, "inplace_custom")
    tensors = [v._current if isinstance(v, BufferValue) else v for v in values]
    outs = _record(fn, name, tensors, [b.type for b in buffers] + out_types, params, "inplace_custom")
    for b, new in zip(buffers, outs):
        buffer_store(b, new)
    return outs[len(buffers) :]
