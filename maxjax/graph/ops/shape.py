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
from maxjax.graph.ops._core import apply, op_traits
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


# -- creation --------------------------------------------------------------------------------
def _constant(*, value: Any) -> Any:
    return jnp.asarray(value)


def constant(value: Any, dtype: DType | None = None, device: DeviceRef | None = None) -> Any:
    """A constant tensor from a Python value or NumPy array (converted to ``dtype`` if given)."""
    arr = np.asarray(value, dtype=None if dtype is None else dtype.to_numpy())
    if arr.dtype == np.float64 and dtype is None and not isinstance(value, np.ndarray):
        arr = arr.astype(np.float32)
    from maxjax.graph.graph import current_graph
    from maxjax.graph.ops._core import const_value

    g = current_graph()
    if g is not None:
        return const_value(g, arr)
    return TensorValue(jnp.asarray(arr))


def _range(*, start: Any, stop: Any, step: Any, dtype: Any) -> Any:
    return jnp.arange(start, stop, step, dtype=dtype)


def _range_dyn(start: Any, step: Any, *, n: Any, dtype: Any) -> Any:
    return (start + step * jnp.arange(n)).astype(dtype)


def range(
    start: Any,
    stop: Any,
    step: Any = 1,
    out_dim: Any = None,
    *,
    dtype: DType = DType.int64,
    device: DeviceRef | None = None,
) -> Any:
    """``[start, stop)`` with ``step`` as a 1-D tensor (like ``jnp.arange``).

    Start/stop/step may be ints or Dims (symbolic allowed). With tensor bounds, ``out_dim`` (the
    length) is required.
    """
    if _is_tensor(start) or _is_tensor(stop) or _is_tensor(step):
        if out_dim is None:
            raise ValueError("range: out_dim is required when start, stop or step is a tensor")
        return apply(_range_dyn, start, step, _name="range", n=_dim(out_dim), dtype=dtype.to_jax())
    return apply(
        _range, _name="range", start=_dim(start), stop=_dim(stop), step=_dim(step), dtype=dtype.to_jax()
    )


def _shape_to_tensor(*, shape: Any) -> Any:
    return jnp.asarray(shape, dtype=jnp.int32)


def shape_to_tensor(shape: Iterable[Any]) -> Any:
    """A 1-D integer tensor holding the (possibly symbolic) sizes of ``shape``."""
    return apply(_shape_to_tensor, _name="shape_to_tensor", shape=_shape(shape))


# -- dtype / device --------------------------------------------------------------------------
def _cast(x: Any, *, dtype: Any) -> Any:
    return x.astype(dtype)


def cast(x: Any, dtype: DType) -> Any:
    """``x`` converted to ``dtype`` (float to int truncates, as ``astype`` does)."""
    if not isinstance(dtype, DType):
        dtype = DType.of(dtype)
    return apply(_cast, x, _name="cast", dtype=dtype.to_jax())


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
    """Asserts ``x`` has ``shape`` (the same number of dims) and returns it with that shape."""
    target = _shape(shape)
    if len(target) != len(x.shape):
        raise ValueError(f"rebind: {message or 'shape mismatch'}: rank {len(x.shape)} vs {len(target)}")
    return reshape(x, target)


# -- reshaping -------------------------------------------------------------------------------
def _reshape(x: Any, *, shape: Any) -> Any:
    return jnp.reshape(x, shape)


def reshape(x: Any, shape: Iterable[Any]) -> Any:
    """``x`` with a new shape (one entry may be ``-1``).

    Raises:
        ValueError: the number of elements does not match.
    """
    return apply(_reshape, x, _name="reshape", shape=_shape(shape))


def _flatten(x: Any, *, start: int, end: int) -> Any:
    nd = x.ndim
    s, e = start % nd if nd else 0, end % nd if nd else 0
    shape = (*x.shape[:s], -1, *x.shape[e + 1 :])
    return jnp.reshape(x, shape)


def flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    """Merges dims ``start_dim..end_dim`` (inclusive) into one."""
    return apply(_flatten, x, _name="flatten", start=start_dim, end=end_dim)


def _swap(x: Any, *, a: int, b: int) -> Any:
    return jnp.swapaxes(x, a, b)


def transpose(x: Any, axis_1: int, axis_2: int) -> Any:
    """``x`` with axes ``axis_1`` and ``axis_2`` swapped (MAX semantics: two axes, not a permutation)."""
    return apply(_swap, x, _name="transpose", a=axis_1, b=axis_2)


def _permute(x: Any, *, dims: Any) -> Any:
    return jnp.transpose(x, dims)


def permute(x: Any, dims: Sequence[int]) -> Any:
    """``x`` with its axes reordered by ``dims``."""
    return apply(_permute, x, _name="permute", dims=tuple(dims))


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


def concat(original_vals: Iterable[Any], axis: int = 0) -> Any:
    """Joins tensors along ``axis``.

    Raises:
        ValueError: no tensors, or their other dims differ.
    """
    vals = list(original_vals)
    if not vals:
        raise ValueError("concat: must provide at least one value")
    return apply(_concat, *vals, _name="concat", axis=axis)


def _stack(*xs: Any, axis: int) -> Any:
    return jnp.stack(xs, axis=axis)


def stack(values: Iterable[Any], axis: int = 0) -> Any:
    """Stacks tensors of one shape along a new axis."""
    vals = list(values)
    if not vals:
        raise ValueError("stack: must provide at least one value")
    return apply(_stack, *vals, _name="stack", axis=axis)


def _split(x: Any, *, sizes: Any, axis: int) -> Any:
    out, start = [], 0
    for s in sizes:
        out.append(jax.lax.slice_in_dim(x, start, start + s, axis=axis))
        start = start + s
    return out


def split(x: Any, split_sizes: Sequence[Any], axis: int = 0) -> list[Any]:
    """Splits ``x`` along ``axis`` into pieces of the given sizes (which must add up to the dim).

    Raises:
        ValueError: the sizes do not add up to the size of ``axis``.
    """
    sizes = tuple(_dim(s) for s in split_sizes)
    total = x.shape[axis]
    summed = builtins.sum((Dim(s) for s in sizes), Dim(0))
    if summed != total:
        raise ValueError(f"split: sizes {list(sizes)} add up to {summed}, but dim {axis} of the input is {total}")
    return list(apply(_split, x, _name="split", sizes=sizes, axis=axis))


def chunk(x: Any, chunks: int, axis: int = 0) -> list[Any]:
    """Splits ``x`` into ``chunks`` pieces along ``axis`` (the last may be smaller, like torch.chunk).

    Raises:
        ValueError: the axis is symbolic or ``chunks`` is not positive.
    """
    n = x.shape[axis]
    if not hasattr(n, "__index__"):
        raise ValueError(f"chunk: dim {axis} must be static, got {n}")
    n = int(n)
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    size = -(-n // chunks)
    sizes = [min(size, n - i) for i in builtins.range(0, n, size)]
    return split(x, sizes, axis)


def _squeeze(x: Any, *, axis: int) -> Any:
    return jnp.squeeze(x, axis=axis)


def squeeze(x: Any, axis: int) -> Any:
    """Removes size-1 axis ``axis``."""
    return apply(_squeeze, x, _name="squeeze", axis=axis)


def _unsqueeze(x: Any, *, axis: int) -> Any:
    return jnp.expand_dims(x, axis)


def unsqueeze(x: Any, axis: int) -> Any:
    """Inserts a size-1 axis at ``axis`` (negative counts from the end of the result)."""
    return apply(_unsqueeze, x, _name="unsqueeze", axis=axis)


def _broadcast_to(x: Any, *, shape: Any) -> Any:
    return jnp.broadcast_to(x, shape)


def broadcast_to(x: Any, shape: Iterable[Any], out_dims: Iterable[Any] | None = None) -> Any:
    """``x`` broadcast to ``shape``."""
    return apply(_broadcast_to, x, _name="broadcast_to", shape=_shape(out_dims if out_dims is not None else shape))


def _tile(x: Any, *, repeats: Any) -> Any:
    return jnp.tile(x, repeats)


def tile(x: Any, repeats: Iterable[Any]) -> Any:
    """``x`` repeated ``repeats[i]`` times along each axis ``i``."""
    return apply(_tile, x, _name="tile", repeats=_shape(repeats))


def _pad(x: Any, *, widths: Any, mode: str, value: Any) -> Any:
    if mode == "constant":
        return jnp.pad(x, widths, mode="constant", constant_values=value)
    return jnp.pad(x, widths, mode=mode)


def pad(input: Any, paddings: Iterable[int], mode: str = "constant", value: Any = 0) -> Any:
    """Pads ``input``; ``paddings`` is flat: ``[before_0, after_0, before_1, after_1, ...]``.

    Raises:
        ValueError: ``paddings`` does not hold two entries per axis.
    """
    p = [_dim(v) for v in paddings]
    if len(p) != 2 * len(input.shape):
        raise ValueError(f"pad: expected {2 * len(input.shape)} paddings for rank {len(input.shape)}, got {len(p)}")
    widths = tuple((p[2 * i], p[2 * i + 1]) for i in builtins.range(len(input.shape)))
    return apply(_pad, input, _name="pad", widths=widths, mode=mode, value=value)


def _repeat_interleave(x: Any, *, repeats: int, axis: Any) -> Any:
    return jnp.repeat(x, repeats, axis=axis)


def repeat_interleave(x: Any, repeats: int, axis: int | None = None, out_dim: Any = None) -> Any:
    """Each element repeated ``repeats`` times along ``axis`` (flattened when ``axis`` is None)."""
    return apply(_repeat_interleave, x, _name="repeat_interleave", repeats=int(repeats), axis=axis)


def _outer(a: Any, b: Any) -> Any:
    return jnp.outer(a, b)


def outer(lhs: Any, rhs: Any) -> Any:
    """The outer product of two vectors."""
    return apply(_outer, lhs, rhs, _name="outer")


def _band_part(x: Any, *, lower: Any, upper: Any, exclude: bool) -> Any:
    m, n = x.shape[-2], x.shape[-1]
    i = jnp.arange(m)[:, None]
    j = jnp.arange(n)[None, :]
    keep = jnp.ones((m, n), dtype=bool)
    if lower is not None and lower >= 0:
        keep = keep & (i - j <= lower)
    if upper is not None and upper >= 0:
        keep = keep & (j - i <= upper)
    if exclude:
        keep = ~keep
    return jnp.where(keep, x, jnp.zeros((), x.dtype))


def band_part(x: Any, num_lower: int | None = None, num_upper: int | None = None, exclude: bool = False) -> Any:
    """Keeps a band of the last two axes: ``i - j <= num_lower`` and ``j - i <= num_upper`` (None or
    negative: unbounded); zeros elsewhere. ``exclude=True`` keeps the complement.

    ``band_part(ones, None, 0)`` is a lower-triangular (causal) mask.
    """
    return apply(_band_part, x, _name="band_part", lower=num_lower, upper=num_upper, exclude=exclude)


# -- indexing --------------------------------------------------------------------------------
@op_traits(accepts_quantized=True)
def _gather(x: Any, idx: Any, *, axis: int) -> Any:
    if isinstance(x, QuantizedArray):  # rows of a quantized weight, still quantized
        if axis not in (0, -x.ndim):
            raise ValueError(f"gather: a quantized weight ({x!r}) can only be gathered by rows (axis 0), got axis {axis}")
        return x.take(idx)
    return jnp.take(x, idx, axis=axis, mode="clip")


def gather(input: Any, indices: Any, axis: int = -1) -> Any:
    """Picks slices of ``input`` along ``axis`` by integer ``indices`` (``jnp.take``).

    The result's shape is ``input.shape[:axis] + indices.shape + input.shape[axis+1:]``.
    Out-of-range indices are clamped (XLA semantics; MAX leaves them undefined).
    """
    return apply(_gather, input, indices, _name="gather", axis=axis)


def _gather_nd(x: Any, idx: Any, *, batch_dims: int) -> Any:
    k = idx.shape[-1]
    if batch_dims:
        f = lambda xx, ii: _gather_nd(xx, ii, batch_dims=batch_dims - 1)  # noqa: E731
        return jax.vmap(f)(x, idx)
    return x[tuple(jnp.moveaxis(idx, -1, 0)[i] for i in builtins.range(k))]


def gather_nd(input: Any, indices: Any, batch_dims: int = 0) -> Any:
    """Gathers slices of ``input`` by index tuples in the last axis of ``indices``."""
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
    """
    if not isinstance(indices, tuple):
        indices = (indices,)
    spec: list[Any] = []
    tensors: list[Any] = []
    for ix in indices:
        if isinstance(ix, tuple) and len(ix) == 2 and isinstance(ix[0], slice):
            ix = ix[0]
        if _is_tensor(ix):
            spec.append(_TENSOR)
            tensors.append(ix)
        elif isinstance(ix, slice):
            spec.append(slice(*(None if v is None else _dim(v) for v in (ix.start, ix.stop, ix.step))))
        elif ix is None or ix is Ellipsis:
            spec.append(ix)
        else:
            spec.append(_dim(ix))
    return apply(_slice, x, *tensors, _name="slice", spec=tuple(spec))


from maxjax.graph.ops.scatter import scatter_nd  # noqa: E402 - MAX's scatter family lives in scatter.py
