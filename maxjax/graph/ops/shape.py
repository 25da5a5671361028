"""Shape, indexing and creation ops (MAX's ``reshape``, ``transpose``, ``concat``, ``gather``, ...).

Shape arguments may hold ints, :class:`~maxjax.graph.type.Dim` objects and dim names
(``ops.reshape(x, ["batch", -1])``); symbolic dims are resolved when the graph runs.
"""

from __future__ import annotations

import builtins
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.ops._core import apply, assert_valid_axis, check_axis, check_same_device, dtype_of, op_traits
from maxjax.graph.quantization import QuantizedArray
from maxjax.graph.type import DeviceRef, Dim
from maxjax.graph.value import TensorValue

__all__ = [
    "constant", "cast", "reshape", "flatten", "transpose", "permute", "concat", "split", "chunk", "stack",
    "allgather", "squeeze", "unsqueeze", "broadcast_to", "gather", "gather_nd", "slice_tensor", "tile", "pad",
    "repeat_interleave", "outer", "band_part", "range", "shape_to_tensor", "transfer_to", "identity",
    "print", "rebind", "scatter_nd",
]  # fmt: skip


def _dim(d: Any) -> Any:
    """A shape entry: ints stay ints (``-1`` allowed), names and Dims become Dims."""
    if isinstance(d, (str, Dim)):
        return Dim(d)
    if isinstance(d, TensorValue):
        raise TypeError("shape entries must be ints, dim names or Dims, not tensors")
    return int(d)


def _shape(shape: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(_dim(d) for d in shape)


def _is_tensor(x: Any) -> bool:
    return isinstance(x, (TensorValue, jax.Array, np.ndarray))


def _value(x: Any) -> TensorValue:
    """A tensor argument as a TensorValue (arrays wrapped; graph values as they are)."""
    if isinstance(x, TensorValue):
        return x
    if isinstance(x, (jax.Array, np.ndarray)):
        return TensorValue(x)
    from maxjax.driver import Buffer

    if isinstance(x, Buffer):
        return TensorValue(x)
    raise TypeError(f"expected a tensor, got {type(x).__name__}: {x!r}")


def _rank(x: Any) -> int:
    return len(x.shape)


def _static(d: Any) -> int | None:
    """The size of a static dim, None for a symbolic one."""
    d = Dim(d) if not isinstance(d, Dim) else d
    return d.dim if hasattr(d, "dim") else None


def _same_dim(a: Any, b: Any) -> bool:
    return Dim(a) == Dim(b)


def _product(dims: Iterable[Any]) -> Dim:
    dims = [Dim(d) for d in dims]
    if any(_static(d) == 0 for d in dims):  # 0 elements (the other sizes may multiply past int64)
        return Dim(0)
    out: Dim = Dim(1)
    for d in dims:
        out = out * d
    return out


# -- creation --------------------------------------------------------------------------------
def _constant(*, value: Any) -> Any:
    return jnp.asarray(value)


def constant(value: Any, dtype: DType | None = None, device: DeviceRef | None = None) -> Any:
    """A constant tensor from a Python scalar, a (nested) sequence or an array (MAX's ``ops.constant``).

    ``value``: a Python scalar or rectangular nested sequence, or an array (NumPy, JAX, a
    :class:`~maxjax.driver.Buffer`, any DLPack producer). ``dtype``/``device``: required for a
    Python value while a graph is built (MAX 26.7's rule); for an array they default to its own,
    and ``dtype`` must equal it. Outside a graph (maxjax's eager mode) a Python value without a
    dtype takes NumPy's (float values as float32) and ``device`` is ignored.

    Raises:
        TypeError: ``dtype`` is a sub-byte type; while a graph is built, a Python value without
            ``dtype`` or ``device`` (MAX's "Literal constants must explicitly set a dtype and device").
        ValueError: ``dtype`` differs from an array's dtype (MAX's "DType must match input dtype");
            a Python int outside the range of ``dtype`` (MAX's "Unsafe cast"); a nested sequence that
            is not rectangular.
    """
    if dtype is not None and dtype.size_in_bits < 8:
        raise TypeError(f"Cannot create a constant of type '{dtype}' since it is a sub-byte type.")
    from maxjax.graph.graph import current_graph

    if current_graph() is not None:
        if not hasattr(value, "__dlpack__"):
            if dtype is None or device is None:
                raise TypeError(
                    f"constant: Literal constants must explicitly set a dtype and device (got dtype={dtype}, "
                    f"device={device} for {type(value).__name__} {_short_repr(value)})"
                )
        elif dtype is not None:
            have = value.dtype if isinstance(value.dtype, DType) else DType.from_numpy(np.dtype(value.dtype))
            if have != dtype:
                raise ValueError(
                    f"constant: DType must match input dtype: dtype={dtype!r} != value.dtype={have!r} "
                    f"(cast the array first, e.g. array.astype(...))"
                )
    return literal_constant(value, dtype, device)


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def literal_constant(value: Any, dtype: DType | None = None, device: DeviceRef | None = None) -> Any:
    """maxjax's own constants (layers' scalars and tables): :func:`constant` without MAX's
    build-time demands on its caller. ``value`` is converted to ``dtype`` when given (a Python int
    out of its range raises ``ValueError``); ``device`` None is the graph's default device.

    Raises:
        ValueError: a Python int outside the range of ``dtype``; a nested sequence that is not
            rectangular.
    """
    try:
        arr = np.asarray(value, dtype=None if dtype is None else dtype.to_numpy())
    except OverflowError:
        raise ValueError(
            f"constant: Unsafe cast: Refusing to implicitly promote external array with value {value!r} "
            f"out of range for DType {dtype}"
        ) from None
    if arr.dtype == np.float64 and dtype is None and not isinstance(value, np.ndarray):
        arr = arr.astype(np.float32)
    from maxjax.graph.graph import current_graph
    from maxjax.graph.ops._core import const_value

    g = current_graph()
    if g is not None:
        return _on_device(const_value(g, arr), device)
    return TensorValue(jnp.asarray(arr))


def _range(*, start: Any, step: Any, n: Any, dtype: Any) -> Any:
    return jnp.asarray(start, dtype) + jnp.asarray(step, dtype) * jnp.arange(n, dtype=dtype)


def _range_dyn(start: Any, step: Any, *, n: Any, dtype: Any) -> Any:
    return jnp.asarray(start).astype(dtype) + jnp.asarray(step).astype(dtype) * jnp.arange(n, dtype=dtype)


def range(
    start: Any,
    stop: Any,
    step: Any = 1,
    out_dim: Any = None,
    *,
    dtype: DType = DType.int64,
    device: DeviceRef | None = None,
) -> Any:
    """``start, start + step, ...``: a 1-D tensor of ``dtype`` with MAX's length
    ``(stop - start) // step`` (0 for ``step == 0``), so ``range(0, 10, 3)`` has 3 values, as in
    MAX 26.7 (whose compiled graph then fails: MAX asks for ``stop - start`` divisible by ``step``).

    Start/stop/step may be ints, floats or Dims (symbolic allowed). With a tensor among them,
    ``out_dim`` (the length) is required. ``dtype`` and ``device`` are keyword-only and required
    in MAX; maxjax defaults them to int64 and the CPU.

    Raises:
        ValueError: a tensor bound and no ``out_dim``, or a tensor bound that is not a scalar.
    """
    dtype = dtype if isinstance(dtype, DType) else DType.of(dtype)
    if _is_tensor(start) or _is_tensor(stop) or _is_tensor(step):
        if out_dim is None:
            raise ValueError("range: Dynamic ranges must provide an explicit out_dim (start, stop or step is a tensor)")
        for name, v in (("start", start), ("stop", stop), ("step", step)):
            if _is_tensor(v) and _rank(v) != 0:
                raise ValueError(f"range: range expected scalar values as inputs! ({name} has shape {list(v.shape)})")
            if isinstance(v, TensorValue) and v._graph is not None and v.device != DeviceRef.CPU():
                raise ValueError(f"range: Range input values must be on CPU ({name} is on {v.device})")
        n = _dim(out_dim)
        Dim(n)  # ValueError for a length beyond int64, as MAX
        out = apply(_range_dyn, start, step, _name="range", _dtypes=[dtype], n=n, dtype=dtype.to_jax())
        return _on_device(out, device)
    if out_dim is None:
        if isinstance(start, float) or isinstance(stop, float) or isinstance(step, float):
            out_dim = int((stop - start) // step) if step != 0 else 0
        else:
            out_dim = (Dim(stop) - Dim(start)) // Dim(step) if _static(step) != 0 else 0
            if _static(out_dim) is not None and _static(out_dim) < 0:
                out_dim = 0
    n = _dim(out_dim)
    Dim(n)  # ValueError for a length beyond int64, as MAX
    s0 = _dim(start) if not isinstance(start, float) else start
    st = _dim(step) if not isinstance(step, float) else step
    return _on_device(apply(_range, _name="range", _dtypes=[dtype], start=s0, step=st, n=n, dtype=dtype.to_jax()), device)


def _on_device(out: Any, device: Any) -> Any:
    """A created value's declared device (MAX's ``device=`` argument) recorded in its graph type,
    as :func:`transfer_to` records a transfer; XLA places the compiled program."""
    if device is not None and isinstance(out, TensorValue) and out._node is not None:
        out._node.device = DeviceRef.from_device(device)
    return out


def _shape_to_tensor(*, shape: Any) -> Any:
    return jnp.asarray(shape, dtype=DType.int64.to_jax())


def shape_to_tensor(shape: Iterable[Any]) -> Any:
    """A 1-D int64 tensor (MAX's dtype; held as int32 without x64) of the (possibly symbolic)
    sizes of ``shape``."""
    return apply(_shape_to_tensor, _name="shape_to_tensor", _dtypes=[DType.int64], shape=_shape(shape))


# -- dtype / device --------------------------------------------------------------------------
def _cast(x: Any, *, dtype: Any) -> Any:
    return x.astype(dtype)


def cast(x: Any, dtype: DType) -> Any:
    """``x`` converted to ``dtype`` (float to int truncates, as ``astype`` does)."""
    if isinstance(dtype, str):
        raise ValueError(f"cast: dtype must be a DType, got the string {dtype!r}")
    if not isinstance(dtype, DType):
        dtype = DType.of(dtype)
    return apply(_cast, x, _name="cast", _dtypes=[dtype], dtype=dtype.to_jax())


def _transfer(x: Any, *, device: Any) -> Any:
    if isinstance(x, jax.core.Tracer):  # inside a jitted program the placement is XLA's
        return x
    return jax.device_put(x, device.jax_device())


def transfer_to(x: Any, device: Any) -> Any:
    """``x`` moved to ``device`` (a DeviceRef). Eagerly the value moves at once; in a compiled
    program (graph mode, ``jax.jit``) the transfer is left to XLA's placement of the program, and
    the value is unchanged."""
    device = DeviceRef.from_device(device)
    out = apply(_transfer, x, _name="transfer_to", device=device)
    if isinstance(out, TensorValue) and out._node is not None:
        out._node.device = device  # the recorded value lives on the target device
    return out


def _identity(x: Any) -> Any:
    return x


def identity(x: Any) -> Any:
    return apply(_identity, x, _name="identity")


def _print(value: Any, *, label: str) -> Any:
    jax.debug.print(label + ": {}", value)
    return value


def print(value: Any, label: str = "debug_tensor") -> None:  # noqa: A001 - MAX's name
    """Prints the value when the graph runs (``jax.debug.print``)."""
    apply(_print, value, _name="print", label=label)


def rebind(x: Any, shape: Iterable[Any], message: str = "", layout: Any = None) -> Any:
    """``x`` with its dims renamed to ``shape`` (same rank): MAX asserts when the graph runs that
    the sizes agree; maxjax refuses a static size that differs when the graph is built.

    Raises:
        ValueError: a different rank, or static sizes that differ (with ``message``).
    """
    target = _shape(shape)
    if len(target) != len(x.shape):
        raise ValueError(
            f"Wrong rank for rebind: v.shape={list(x.shape)} but shape={list(target)}" + (f" ({message})" if message else "")
        )
    for a, b in zip(x.shape, target):
        if _static(a) is not None and isinstance(b, int) and a != b:
            raise ValueError(f"rebind: {message or 'shape mismatch'}: {list(x.shape)} can never be {list(target)}")
    static = tuple(d if isinstance(d, int) else None for d in target)
    out = apply(_rebind, x, _name="rebind", shape=static)
    if isinstance(out, TensorValue) and out._node is not None:  # the new names are metadata only
        aval = out._node.out_avals[0]
        out._node.out_avals[0] = jax.ShapeDtypeStruct(tuple(Dim(d).to_expr() for d in target), aval.dtype)
    return out


def _rebind(x: Any, *, shape: Any) -> Any:
    # the sizes x has when the graph runs; a static target size that differs fails here (MAX
    # asserts it at run time too)
    return jnp.reshape(x, tuple(x.shape[i] if s is None else s for i, s in enumerate(shape)))


# -- reshaping -------------------------------------------------------------------------------
def _reshape(x: Any, *, shape: Any) -> Any:
    return jnp.reshape(x, shape)


def reshape(x: Any, shape: Iterable[Any]) -> Any:
    """``x`` with a new shape (one entry may be ``-1``; sizes may be 0).

    Raises:
        ValueError: more than one ``-1``, or the number of elements does not match (static or
            symbolic: ``[batch, 6]`` cannot become ``[batch, 4]``).
    """
    target = _shape(shape)
    if builtins.sum(1 for d in target if isinstance(d, int) and d == -1) > 1:
        raise ValueError(f"reshape(): at most one -1 dimension is allowed, got {list(target)}")
    if -1 in [d for d in target if isinstance(d, int)] and 0 in [d for d in target if isinstance(d, int)]:
        raise ValueError(f"reshape(): cannot infer -1 dimension when another dimension is 0: {list(target)}")
    if not any(isinstance(d, int) and d == -1 for d in target):
        have, want = _product(x.shape), _product(target)
        if have != want:
            raise ValueError(f"reshape: input {list(x.shape)} has {have} elements, target shape {list(target)} has {want}")
    return apply(_reshape, x, _name="reshape", shape=target)


def _flatten(x: Any, *, start: int, end: int) -> Any:
    nd = x.ndim
    s, e = start % nd if nd else 0, end % nd if nd else 0
    shape = (*x.shape[:s], -1, *x.shape[e + 1 :])
    return jnp.reshape(x, shape)


def flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    """Merges dims ``start_dim..end_dim`` (inclusive) into one.

    Raises:
        IndexError: ``start_dim`` or ``end_dim`` out of range.
        ValueError: ``start_dim`` after ``end_dim``.
    """
    r = _rank(x)
    if r:
        s = check_axis("flatten", start_dim, r, what="start_dim")
        e = check_axis("flatten", end_dim, r, what="end_dim")
        if s > e:
            raise ValueError(f"flatten: start_dim cannot come after end_dim (start_dim={start_dim}, end_dim={end_dim})")
    return apply(_flatten, x, _name="flatten", start=start_dim, end=end_dim)


def _swap(x: Any, *, a: int, b: int) -> Any:
    return jnp.swapaxes(x, a, b)


def transpose(x: Any, axis_1: int, axis_2: int) -> Any:
    """``x`` with axes ``axis_1`` and ``axis_2`` swapped (MAX semantics: two axes, not a permutation).

    Raises:
        IndexError: an axis out of range.
    """
    r = _rank(x)
    if r == 0 and axis_1 in (0, -1) and axis_2 in (0, -1):
        return x if isinstance(x, TensorValue) else apply(_identity, x, _name="transpose")
    check_axis("transpose", axis_1, max(r, 1), what="axis_1")  # MAX: a scalar's axes are -1 and 0
    check_axis("transpose", axis_2, max(r, 1), what="axis_2")
    return apply(_swap, x, _name="transpose", a=axis_1, b=axis_2)


def _permute(x: Any, *, dims: Any) -> Any:
    return jnp.transpose(x, dims)


def permute(x: Any, dims: Sequence[int]) -> Any:
    """``x`` with its axes reordered by ``dims`` (negative entries count from the end).

    Raises:
        ValueError: ``dims`` has another length than the rank, or repeats an axis.
        IndexError: an entry out of range.
    """
    dims = list(dims)
    r = _rank(x)
    if len(dims) != r:
        raise ValueError(f"permute: the rank of the input ({r}) does not match the number of dims used for ordering ({len(dims)})")
    norm = [check_axis("permute", d, r, what="dims entry") for d in dims]
    if len(set(norm)) != len(norm):
        raise ValueError(f"permute: the ordering may not contain duplicate dimensions: {dims}")
    return apply(_permute, x, _name="permute", dims=tuple(norm))


def _concat(*xs: Any, axis: int) -> Any:
    return jnp.concatenate(xs, axis=axis)


def allgather(inputs: Iterable[Any], signal_buffers: Iterable[Any], axis: int = 0, group_size: int | None = None) -> list[Any]:
    """Each input replaced by its group's inputs concatenated along ``axis``, on its own device
    (MAX's ``ops.allgather``; groups are ``group_size`` consecutive inputs, all by default; a group
    of one gives the inputs back).

    Raises:
        ValueError: MAX's checks (signal buffers, group size, unique devices), or inputs of
            another rank, dtype or shape off ``axis`` within a group.
        IndexError: ``axis`` out of range.
    """
    from maxjax.graph.ops.allreduce import as_values, check_devices, check_group, check_signals

    inputs = as_values(inputs)
    check_signals(inputs, signal_buffers)
    if not inputs:
        return inputs
    num = len(inputs)
    group_size = check_group("allgather", inputs, group_size)
    if group_size == 1:
        return inputs
    rank, dtype = inputs[0].rank, inputs[0].dtype
    if not all(x.rank == rank for x in inputs[1:]):
        raise ValueError(f"allgather operation must have the same rank across all input tensors. Got: inputs={inputs}")
    if not all(x.dtype == dtype for x in inputs[1:]):
        raise ValueError(f"allgather operation must have the same dtype across all input tensors. Got: inputs={inputs}")
    check_devices("allgather", inputs)
    if not -rank <= axis < rank:
        raise IndexError(f"Dimension out of range {rank}, axis={axis}")
    axis %= rank
    out = []
    for start in builtins.range(0, num, group_size):
        group = inputs[start : start + group_size]
        for i, d in enumerate(group[0].shape):
            if i != axis and not all(x.shape[i] == d for x in group):
                raise ValueError(
                    "allgather operation inputs must have the same shape in all dimensions except the concatenation "
                    f"dimension within each group. inputs={inputs}"
                )
        gathered = concat([transfer_to(x, group[0].device) for x in group], axis=axis)
        out.extend(transfer_to(gathered, x.device) for x in group)
    return out


def _check_joinable(op: str, vals: list[Any], axis: int | None) -> None:
    """MAX's checks of concat/stack inputs: one rank, one dtype, one device, equal dims off ``axis``."""
    r = _rank(vals[0])
    for i, v in enumerate(vals[1:], 1):
        if _rank(v) != r:
            raise ValueError(f"{op}: inputs must all have the same rank: input 0 is {list(vals[0].shape)}, input {i} is {list(v.shape)}")
    dts = [dtype_of(v) for v in vals]
    for i, d in enumerate(dts[1:], 1):
        if d != dts[0]:
            raise ValueError(f"{op}: inputs must all have the same dtype: input 0 is {dts[0]!r}, input {i} is {d!r}")
    check_same_device(op, *vals)
    for i, v in enumerate(vals[1:], 1):
        for a, (d0, d) in enumerate(zip(vals[0].shape, v.shape)):
            if a != axis and not _same_dim(d0, d):
                raise ValueError(
                    f"{op}: inputs differ on non-concat axis {a}: input 0 is {list(vals[0].shape)}, input {i} is {list(v.shape)}"
                )


def concat(original_vals: Iterable[Any], axis: int = 0) -> Any:
    """Joins tensors along ``axis`` (symbolic sizes add up: ``[a, 3]`` and ``[b, 3]`` give ``[a + b, 3]``).

    Raises:
        ValueError: no tensors, different ranks, dtypes, devices or dims off ``axis``.
        IndexError: ``axis`` out of range.
    """
    vals = list(original_vals)
    if not vals:
        raise ValueError("concat: must provide at least one value")
    check_axis("concat", axis, _rank(vals[0]))
    _check_joinable("concat", vals, axis % _rank(vals[0]))
    if len(vals) == 1:
        return vals[0] if isinstance(vals[0], TensorValue) else apply(_identity, vals[0], _name="concat")
    return apply(_concat, *vals, _name="concat", axis=axis)


def _stack(*xs: Any, axis: int) -> Any:
    return jnp.stack(xs, axis=axis)


def stack(values: Iterable[Any], axis: int = 0) -> Any:
    """Stacks tensors of one shape along a new axis (``axis`` in ``[-rank - 1, rank]``).

    Raises:
        ValueError: no tensors, or different ranks, shapes, dtypes or devices.
        IndexError: ``axis`` out of range.
    """
    vals = list(values)
    if not vals:
        raise ValueError("stack: Expected at least one value to stack")
    rank = _rank(vals[0])
    if any(_rank(v) != rank for v in vals):  # MAX's messages (max/graph/ops/stack.py)
        raise ValueError(f"All inputs to stack must be the same rank, got ranks {[_rank(v) for v in vals]}")
    if any(dtype_of(v) != dtype_of(vals[0]) for v in vals):
        raise ValueError(f"All inputs to stack must have the same dtype, got {[dtype_of(v) for v in vals]}")
    check_axis("stack", axis, rank, extra=1)
    _check_joinable("stack", vals, None)
    return apply(_stack, *vals, _name="stack", axis=axis)


def _split(x: Any, *, sizes: Any, axis: int) -> Any:
    out, start = [], 0
    for s in sizes:
        out.append(jax.lax.slice_in_dim(x, start, start + s, axis=axis))
        start = start + s
    return out


def split(x: Any, split_sizes: Sequence[Any], axis: int = 0) -> list[Any]:
    """Splits ``x`` along ``axis`` into pieces of the given static sizes, which add up to the dim
    (MAX 26.7 converts each size with ``int()``: symbolic sizes are refused). No sizes: ``[]``.

    Raises:
        TypeError: a symbolic size.
        IndexError: ``axis`` out of range.
        ValueError: the sizes do not add up to the size of ``axis``, or one is negative.
    """
    if not split_sizes:
        return []
    sizes = []
    for s in split_sizes:
        d = Dim(s)
        if _static(d) is None:
            raise TypeError(f"split: int({d!r}): split sizes must be static dims, got {list(split_sizes)}")
        sizes.append(_static(d))
    axis = assert_valid_axis("split", axis, _rank(x))
    total = x.shape[axis]
    if Dim(builtins.sum(sizes)) != total:
        raise ValueError(  # MAX's wording (max/graph/ops/split.py)
            f"split: sizes {sizes} add up to {builtins.sum(sizes)}, not dim {axis} of the input: "
            f"Split sizes must sum to dimension value; x.shape[axis]={Dim(total)!r} != sum(sizes={sizes})"
        )
    if any(s < 0 for s in sizes):
        raise ValueError(f"split: Split sizes must be positive: sizes={sizes}")
    return list(apply(_split, x, _name="split", sizes=tuple(sizes), axis=axis))


def chunk(x: Any, chunks: int, axis: int = 0) -> list[Any]:
    """Splits ``x`` into ``chunks`` equal pieces along ``axis`` (MAX 26.7: ``chunks`` must divide
    the static size of the axis).

    Raises:
        ValueError: ``chunks`` does not divide the size, is not positive, or ``x`` is a scalar.
        IndexError: ``axis`` out of range.
        TypeError: the axis has a symbolic size.
    """
    if _rank(x) == 0 and chunks > 1:
        raise ValueError(f"chunk: cannot split scalar value into chunks={chunks}")
    axis = assert_valid_axis("chunk", axis, _rank(x))
    n = _static(x.shape[axis])
    if n is None:  # MAX 26.7 raises this before looking at chunks
        raise TypeError(f"chunk: int({x.shape[axis]!r}): dim {axis} of {list(x.shape)} must be static")
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    if n % chunks:
        raise ValueError(f"chunk: chunks={chunks} must statically divide x.shape[{axis}]={n}")
    return split(x, [n // chunks] * chunks, axis)


def _squeeze(x: Any, *, axis: int) -> Any:
    return jnp.squeeze(x, axis=axis)


def squeeze(x: Any, axis: int) -> Any:
    """Removes size-1 axis ``axis``.

    Raises:
        IndexError: ``axis`` out of range.
        ValueError: the axis does not have size 1.
    """
    a = check_axis("squeeze", axis, _rank(x))
    if x.shape[a] != 1:
        raise ValueError(f"Squeeze dim must be 1, got axis={axis}, shape={list(x.shape)}")
    return apply(_squeeze, x, _name="squeeze", axis=axis)


def _unsqueeze(x: Any, *, axis: int) -> Any:
    return jnp.expand_dims(x, axis)


def unsqueeze(x: Any, axis: int) -> Any:
    """Inserts a size-1 axis at ``axis`` (negative counts from the end of the result).

    Raises:
        ValueError: ``axis`` outside ``[-rank - 1, rank]``.
    """
    check_axis("unsqueeze", axis, _rank(x), extra=1, error=ValueError)
    return apply(_unsqueeze, x, _name="unsqueeze", axis=axis)


def _broadcast_to(x: Any, *, shape: Any) -> Any:
    return jnp.broadcast_to(x, shape)


def broadcast_to(x: Any, shape: Iterable[Any], out_dims: Iterable[Any] | None = None) -> Any:
    """``x`` broadcast to ``shape`` (numpy's rule: trailing axes aligned, an input axis of size 1
    or equal to the output's).

    Raises:
        ValueError: an input dimension that is neither 1 nor the output's (MAX 26.7's words).
    """
    out = _shape(out_dims if out_dims is not None else shape)
    lead = len(out) - _rank(x)
    for i, d in enumerate(x.shape):
        j = i + lead
        if j >= 0 and _static(d) != 1 and not _same_dim(d, out[j]):
            raise ValueError(
                f"broadcast_to: [broadcast_to] input dimension at index {i} ({Dim(d)}) must be either 1 or "
                f"equal to corresponding output dimension at index {j} ({Dim(out[j])})"
            )
    return apply(_broadcast_to, x, _name="broadcast_to", shape=out)


def _tile(x: Any, *, repeats: Any) -> Any:
    return jnp.tile(x, repeats)


def tile(x: Any, repeats: Iterable[Any]) -> Any:
    """``x`` repeated ``repeats[i]`` times along each axis ``i`` (one positive repeat per axis).

    Raises:
        ValueError: not one repeat per axis, or a repeat that is not positive.
    """
    reps = _shape(repeats)
    if len(reps) != _rank(x):
        raise ValueError(
            f"tile: input rank and number of elements in repeats must match: shape={list(x.shape)}, repeats={list(reps)}"
        )
    if any(_static(r) is not None and _static(r) <= 0 for r in reps):
        raise ValueError(f"tile: repeats must all be positive: repeats={list(reps)}")
    return apply(_tile, x, _name="tile", repeats=reps)


def _pad(x: Any, *, widths: Any, mode: str, value: Any) -> Any:
    if mode == "constant":
        return jnp.pad(x, widths, mode="constant", constant_values=value)
    return jnp.pad(x, widths, mode=mode)


def pad(input: Any, paddings: Iterable[int], mode: str = "constant", value: Any = 0) -> Any:
    """Pads ``input``; ``paddings`` is flat: ``[before_0, after_0, before_1, after_1, ...]``.

    Raises:
        ValueError: ``paddings`` does not hold two entries per axis (MAX 26.7 fails an assertion),
            a negative padding, or a mode other than ``constant``, ``reflect`` and ``edge``.
    """
    if mode not in ("constant", "reflect", "edge"):
        raise ValueError(f"pad: unsupported padding mode {mode!r}; expected 'constant', 'reflect', or 'edge'")
    p = [_dim(v) for v in paddings]
    if any(isinstance(v, int) and v < 0 for v in p):
        raise ValueError(f"pad: padding values must be non-negative but given {list(paddings)}")
    if len(p) != 2 * len(input.shape):
        raise ValueError(f"pad: expected {2 * len(input.shape)} paddings for rank {len(input.shape)}, got {len(p)}")
    widths = tuple((p[2 * i], p[2 * i + 1]) for i in builtins.range(len(input.shape)))
    return apply(_pad, input, _name="pad", widths=widths, mode=mode, value=value)


def _repeat_interleave(x: Any, *, repeats: int, axis: Any) -> Any:
    return jnp.repeat(x, repeats, axis=axis)


def repeat_interleave(x: Any, repeats: int, axis: int | None = None, out_dim: Any = None) -> Any:
    """Each element repeated ``repeats`` times along ``axis`` (flattened when ``axis`` is None).

    Raises:
        ValueError: ``repeats`` is not positive (MAX 26.7 refuses 0 too), or ``axis`` out of range.
    """
    if int(repeats) <= 0:
        raise ValueError(f"repeat_interleave: repeat value must be positive, given repeats={repeats}")
    if axis is not None:
        check_axis("repeat_interleave", axis, _rank(x), error=ValueError)
    return apply(_repeat_interleave, x, _name="repeat_interleave", repeats=int(repeats), axis=axis)


def _outer(a: Any, b: Any) -> Any:
    return jnp.outer(a, b)


def outer(lhs: Any, rhs: Any) -> Any:
    """The outer product of two vectors: ``[m]`` and ``[n]`` give ``[m, n]`` (MAX: ``lhs[:, None] *
    rhs[None, :]``, so the dtypes promote as ``mul``).

    Raises:
        ValueError: an input that is not 1-D, or dtypes ``mul`` does not promote.
    """
    from maxjax.graph.ops.elementwise import mul

    if _rank(lhs) != 1 or _rank(rhs) != 1:
        raise ValueError(f"outer expected 1d-tensors as inputs, got shapes {list(lhs.shape)} and {list(rhs.shape)}")
    return mul(unsqueeze(lhs, 1), unsqueeze(rhs, 0))


def _band_part(x: Any, *, lower: Any, upper: Any, exclude: bool) -> Any:
    m, n = x.shape[-2], x.shape[-1]
    i = jnp.arange(m)[:, None]
    j = jnp.arange(n)[None, :]
    keep = jnp.ones((m, n), dtype=bool)
    # a bound of 2**31 - 1 or more keeps every (int32-indexed) row/column: unbounded
    if lower is not None and 0 <= lower < 2**31 - 1:
        keep = keep & (i - j <= lower)
    if upper is not None and 0 <= upper < 2**31 - 1:
        keep = keep & (j - i <= upper)
    if exclude:
        keep = ~keep
    return jnp.where(keep, x, jnp.zeros((), x.dtype))


def band_part(x: Any, num_lower: int | None = None, num_upper: int | None = None, exclude: bool = False) -> Any:
    """Keeps a band of the last two axes: ``i - j <= num_lower`` and ``j - i <= num_upper`` (None or
    negative: unbounded); zeros elsewhere. ``exclude=True`` keeps the complement.

    ``band_part(ones, None, 0)`` is a lower-triangular (causal) mask.

    Raises:
        ValueError: ``x`` has fewer than 2 dims, ``num_lower``/``num_upper`` below -1, or not below
            the static size of its dim (rows for ``num_lower``, columns for ``num_upper``), as MAX.
    """
    lo = -1 if num_lower is None else num_lower
    hi = -1 if num_upper is None else num_upper
    if lo < -1:
        raise ValueError(f"band_part: num_lower={lo} must be non-negative")
    if hi < -1:
        raise ValueError(f"band_part: num_upper={hi} must be non-negative")
    if _rank(x) < 2:
        raise ValueError(f"band_part: input tensor x.shape={list(x.shape)} must have at least 2 dimensions")
    m, n = (_static(d) for d in tuple(x.shape)[-2:])
    if m is not None and lo >= m:
        raise ValueError(f"band_part: num_lower={lo} is out of bounds for dimension size {m}")
    if n is not None and hi >= n:
        raise ValueError(f"band_part: num_upper={hi} is out of bounds for dimension size {n}")
    return apply(_band_part, x, _name="band_part", lower=num_lower, upper=num_upper, exclude=exclude)


# -- indexing --------------------------------------------------------------------------------
@op_traits(accepts_quantized=True)
def _gather(x: Any, idx: Any, *, axis: int) -> Any:
    if isinstance(x, QuantizedArray):  # rows of a quantized weight, still quantized
        if axis not in (0, -x.ndim):
            raise ValueError(f"gather: a quantized weight ({x!r}) can only be gathered by rows (axis 0), got axis {axis}")
        return x.take(idx)
    n = x.shape[axis]
    if isinstance(n, int) and n == 0:  # nothing to read: zeros (MAX leaves such reads undefined)
        a = axis % x.ndim
        return jnp.zeros((*x.shape[:a], *idx.shape, *x.shape[a + 1 :]), x.dtype)
    return jnp.take(x, idx, axis=axis, mode="clip")


def gather(input: Any, indices: Any, axis: int = -1) -> Any:
    """Picks slices of ``input`` along ``axis`` by integer ``indices`` (``jnp.take``).

    The result's shape is ``input.shape[:axis] + indices.shape + input.shape[axis+1:]``.
    Out-of-range indices are clamped (XLA semantics; MAX leaves them undefined).

    Raises:
        IndexError: ``axis`` out of range.
        ValueError: ``indices`` are not integers, or ``input`` and ``indices`` on two devices.
    """
    check_axis("gather", axis, _rank(input))
    idt = dtype_of(indices)
    if idt is not None and not idt.is_integral():
        raise ValueError(f"gather: indices must be integers, got indices.dtype={idt!r}")
    check_same_device("gather", input=input, indices=indices)
    return apply(_gather, input, indices, _name="gather", axis=axis)


def _gather_nd(x: Any, idx: Any, *, batch_dims: int) -> Any:
    k = idx.shape[-1]
    if batch_dims:
        f = lambda xx, ii: _gather_nd(xx, ii, batch_dims=batch_dims - 1)  # noqa: E731
        return jax.vmap(f)(x, idx)
    if k == 0:  # empty index tuples: each selects the whole input
        return jnp.broadcast_to(x, idx.shape[:-1] + x.shape)  # [*idx.shape[:-1], *x.shape]
    return x[tuple(jnp.moveaxis(idx, -1, 0)[i] for i in builtins.range(k))]  # [*idx.shape[:-1], *x.shape[k:]]


def gather_nd(input: Any, indices: Any, batch_dims: int = 0) -> Any:
    """Gathers slices of ``input`` by index tuples in the last axis of ``indices``.

    The first ``batch_dims`` axes of both are batch axes (equal sizes). With ``k =
    indices.shape[-1]``, the result is ``indices.shape[:-1] + input.shape[batch_dims + k:]``.

    Raises:
        ValueError: ``indices`` not integers, a symbolic index depth, batch axes that differ,
            ``batch_dims + k`` more than the rank of ``input``, or ``batch_dims`` not below the rank
            of ``indices``.
    """
    check_same_device("gather_nd", input=input, indices=indices)  # first, as MAX
    idt = dtype_of(indices)
    if idt is not None and not idt.is_integral():
        raise ValueError(f"gather_nd: indices.dtype={idt!r} must be an integer type")
    if batch_dims < 0 or batch_dims >= _rank(indices):
        raise ValueError(f"gather_nd: batch_dims={batch_dims} must be in [0, {_rank(indices) - 1}] for indices {list(indices.shape)}")
    k = _static(indices.shape[-1])
    if k is None:
        raise ValueError(f"gather_nd: the index size (last dim of indices {list(indices.shape)}) must be static")
    if batch_dims + k > _rank(input):
        raise ValueError(
            f"gather_nd: not enough dims in input {list(input.shape)}: batch_dims={batch_dims}, index_size={k} "
            f"(indices {list(indices.shape)})"
        )
    for a in builtins.range(batch_dims):
        if not _same_dim(input.shape[a], indices.shape[a]):
            raise ValueError(
                f"gather_nd: input {list(input.shape)} and indices {list(indices.shape)} must match in their first "
                f"batch_dims={batch_dims} dims"
            )
    return apply(_gather_nd, input, indices, _name="gather_nd", batch_dims=batch_dims)


class _TensorIndex:
    def __repr__(self) -> str:
        return "<tensor>"


_TENSOR = _TensorIndex()


def _slice(x: Any, *tix: Any, spec: Any) -> Any:
    it = iter(tix)
    return x[tuple(next(it) if s is _TENSOR else s for s in spec)]


def slice_tensor(x: Any, indices: Any) -> Any:
    """``x[indices]``: ints, slices (Dim bounds allowed), ``None``, ``...`` and integer tensors.

    MAX's ``(slice, out_dim)`` pairs are accepted; the out_dim is inferred instead.

    Raises:
        ValueError: more indices than dims, an int index out of range of a static dim, or a
            slice step of 0.
    """
    if isinstance(indices, list):  # MAX's SliceIndices: a sequence of indices
        indices = tuple(indices)
    if not isinstance(indices, tuple):
        indices = (indices,)
    shape = list(x.shape)
    used = [ix for ix in indices if ix is not None and ix is not Ellipsis]
    if len(used) > len(shape):
        raise ValueError(f"slice: expected slice indices length {len(used)} to be less than or equal to input rank {len(shape)}")
    dims_of: list[int | None] = [None] * len(indices)  # the input axis each index entry reads
    k = 0
    for i, ix in enumerate(indices):
        if ix is Ellipsis:
            k = len(shape)
            for j in builtins.range(len(indices) - 1, i, -1):
                if indices[j] is not None:
                    k -= 1
                    dims_of[j] = k
            break
        if ix is not None:
            dims_of[i] = k
            k += 1
    for ix, axis in zip(indices, dims_of):
        if isinstance(ix, (int, np.integer)) and not isinstance(ix, bool) and axis is not None:
            n = _static(shape[axis])
            if n is not None and not -n <= ix < n:
                raise ValueError(f"slice: index {ix} out of range of dim {axis} of size {n} (shape {shape})")
        if isinstance(ix, slice) and ix.step is not None and not isinstance(ix.step, Dim) and ix.step == 0:
            raise ValueError(f"slice: step in index {ix} can't be 0")
        if isinstance(ix, slice) and axis is not None:
            _check_slice_order(ix, shape[axis])
    spec: list[Any] = []
    tensors: list[Any] = []
    for ix, axis in zip(indices, dims_of):
        if isinstance(ix, tuple) and len(ix) == 2 and isinstance(ix[0], slice):
            ix = ix[0]
        symbolic = axis is not None and _static(shape[axis]) is None
        if _is_tensor(ix):
            spec.append(_TENSOR)
            tensors.append(ix)
        elif isinstance(ix, slice):
            spec.append(slice(*(None if v is None else _int32_bound(_dim(v), symbolic) for v in (ix.start, ix.stop, ix.step))))
        elif ix is None or ix is Ellipsis:
            spec.append(ix)
        else:
            spec.append(_int32_bound(_dim(ix), symbolic))
    return apply(_slice, x, *tensors, _name="slice", spec=tuple(spec))


def _int32_bound(v: Any, symbolic: bool) -> Any:
    """An int index or slice bound of a ``symbolic`` axis clamped to int32's range, in which JAX
    (no x64) computes such indices: no axis JAX holds is that long, so a bound beyond it (MAX
    allows any int64 on a symbolic dim) selects what the clamped one does. Dims, and bounds of
    static axes (JAX resolves those in Python), are kept."""
    if symbolic and isinstance(v, int) and not -(2**31) < v < 2**31:
        return 2**31 - 1 if v > 0 else -(2**31 - 1)
    return v


def _check_slice_order(ix: slice, dim: Any) -> None:
    """MAX 26.7's rule for int bounds of a positive step: start <= stop (negative bounds counted
    from the end of a static dim).

    Raises:
        ValueError: a decreasing start and stop (MAX's words).
    """
    step = 1 if ix.step is None else ix.step
    start, stop = ix.start, ix.stop
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, stop, step)) or step <= 0:
        return
    n = _static(dim)
    if n is not None:
        start, stop = (v + n if v < 0 else v for v in (start, stop))
    elif (start < 0) != (stop < 0):
        return  # one bound from each end of a symbolic dim: known only when the graph runs
    if start > stop:
        raise ValueError(
            f"slice: start and stop should be increasing for positive step and decreasing for negative step, "
            f"but got start {start}, stop {stop} for step {step}"
        )


from maxjax.graph.ops.scatter import scatter_nd  # noqa: E402 - MAX's scatter family lives in scatter.py
