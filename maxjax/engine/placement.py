"""Placing a weight on a mesh shard by shard: each device's block is read, laid out and converted alone.

For a weight with a ``NamedSharding``, :func:`place_sharded` asks the sharding which block of the
(laid-out) stored array each of this process's devices holds, reads just that block from the
stored value (a NumPy array, a Buffer, or a :class:`~maxjax.graph.weights.lazy.LazyTensor` that
reads only the bytes it is asked for), applies the weight's device layout (padding and order of
its shards, see ``Weight.place``), converts a quantized block to the runtime layout, and puts it on
its device; ``jax.make_array_from_single_device_arrays`` joins the blocks into one global array.
In a multi-process run every process does this for its own devices only, so no process reads or
holds another's shards, and no weight is ever gathered whole onto one device.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.graph.quantization import to_layout
from maxjax.graph.sharding import DeviceLayout
from maxjax.graph.weights._host import _ALIGN, aligned_empty
from maxjax.graph.weights.lazy import host_indexable

__all__ = ["host_layout", "host_stack", "mapped_layout", "place_layers", "place_sharded", "placement_report", "read_block"]


def _stored(value: Any) -> Any:
    """The array-like behind a registry value (a WeightData's data, a Buffer's array), unread."""
    from maxjax.driver import Buffer
    from maxjax.graph.weights.weight_data import WeightData

    if isinstance(value, WeightData):
        value = value.data
    if isinstance(value, Buffer):
        value = value._array
    return value


def _aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    dtype = np.dtype(dtype)
    return aligned_empty(int(np.prod(shape)) * dtype.itemsize).view(dtype).reshape(shape)


def _copy_into(out: np.ndarray, value: Any) -> None:
    """One copy of a stored value into ``out`` (straight out of a mapped file for a LazyTensor)."""
    from maxjax.driver import to_host_array
    from maxjax.graph.weights.lazy import LazyTensor

    value = _stored(value)
    if isinstance(value, LazyTensor):
        value.read_into(out)
        return
    np.copyto(out, to_host_array(value), casting="no")


def host_stack(values: Sequence[Any], transform: Any = None) -> np.ndarray:
    """Layers stacked along a new leading axis ``[len(values), *shape]`` in ONE host buffer.

    The buffer is allocated once (64-byte aligned) and filled layer by layer: each byte is copied
    once, from a mapped file's pages (:class:`~maxjax.graph.weights.lazy.LazyTensor`, whose pages
    are then dropped from the resident set) or from an array, with no temporary whole-layer or
    whole-stack copy. It is returned read-only, so ``jax.device_put`` on the CPU adopts it
    without copying: the stack costs one copy of its bytes in all (``np.stack`` and then
    ``device_put`` of its 16-byte aligned result cost two).

    Args:
        values: the stored values of the layers (WeightData, Buffers, arrays, LazyTensors), all of
            one shape and dtype.
        transform: a function applied to each layer's host value first (e.g. a weight's
            ``to_device_layout``), or None (then nothing is read twice).

    Raises:
        ValueError: the layers differ in shape or dtype (naming the layer).
    """
    from maxjax.driver import to_host_array

    if transform is not None:
        values = [transform(to_host_array(_stored(v))) for v in values]
    first = _stored(values[0])
    shape, dtype = tuple(int(d) for d in first.shape), np.dtype(first.dtype)
    out = _aligned_empty((len(values), *shape), dtype)
    for i, v in enumerate(values):
        s = _stored(v)
        if tuple(int(d) for d in s.shape) != shape or np.dtype(s.dtype) != dtype:
            raise ValueError(f"host_stack: layer {i} is {np.dtype(s.dtype)}{list(s.shape)}, layer 0 is {dtype}{list(shape)}")
        _copy_into(out[i, ...], s)  # a view even for rank-0 layers (out[i] would be a scalar)
    out.flags.writeable = False
    return out


def place_layers(values: Sequence[Any], target: Any, *, stacked: bool, transform: Any = None, encoding: Any = None,
                 quantized_layout: str | None = None, host_conversion: bool = False, in_place: bool = False) -> Any:  # fmt: skip
    """One weight's value (or, ``stacked``, its layers' values stacked) on ``target`` (a device,
    or None for the default one), with one copy of the stored bytes (see :func:`host_stack`).

    A GGUF-quantized weight (``encoding``) is then converted to ``quantized_layout`` on the device
    (the stacked bytes are adopted, not copied, before the conversion), or, with
    ``host_conversion`` (the backend policy's ``host_layout_conversion``) where the encoding and
    layout allow it, converted on the host as it is read, straight into the buffers the device
    adopts (:func:`host_layout`). A value that needs neither stacking nor a transform and is
    already a device array stays as it is. With ``in_place`` (the backend policy's
    ``mapped_float_tensors``), a float tensor of a mapped file that needs no conversion, row order
    or stacking and starts on a 64-byte boundary is adopted where it lies in the map, on a CPU
    device (JAX's CPU client adopts such host memory without a copy): nothing is copied or read.

    Returns:
        A ``jax.Array``, or a :class:`~maxjax.graph.quantization.QuantizedArray`.
    """
    if quantized_layout == "mapped" and encoding is not None and transform is None:
        mapped = mapped_layout(values, encoding, target, stacked=stacked)
        if mapped is not None:
            return mapped
    if host_conversion and encoding is not None and transform is None:
        converted = host_layout(values, encoding, quantized_layout, stacked=stacked)
        if converted is not None:
            return jax.device_put(converted, target)  # adopted on the CPU: aligned and read-only
    stored = _stored(values[0])
    if not stacked and transform is None and encoding is None and isinstance(stored, jax.Array):
        return stored if target is None else jax.device_put(stored, target)
    if stacked:
        host = host_stack(values, transform)
    else:
        host = _stored(values[0])
        from maxjax.driver import to_host_array
        from maxjax.graph.weights.lazy import LazyTensor

        if transform is not None:
            host = transform(to_host_array(host))
        if in_place and encoding is None and isinstance(host, LazyTensor) and _on_cpu(target):
            view = host.in_place()
            if view is not None and view.ctypes.data % _ALIGN == 0:
                return jax.device_put(view, target)  # adopted: the file's pages are the weight
        if isinstance(host, LazyTensor) or not isinstance(host, jax.Array):
            host = host_stack([host])[0]
    device = jax.device_put(host, target)  # adopted on the CPU: aligned and read-only
    if encoding is None:
        return device
    # Waited for, so that the stored bytes are freed before the next weight is read: with JAX's
    # asynchronous dispatch every weight's stored stack would otherwise wait, alive, beside its
    # converted one (Llama-3.2-1B Q4_0: 300 MB more at the peak of the load).
    return jax.block_until_ready(to_layout(quantized_layout, encoding, device))


def _on_cpu(target: Any) -> bool:
    """Whether ``target`` (a device, or None for the default one) is a CPU device."""
    device = target if isinstance(target, jax.Device) else jax.devices()[0] if target is None else None
    return device is not None and device.platform == "cpu"


def mapped_layout(values: Sequence[Any], encoding: Any, target: Any, *, stacked: bool) -> Any:
    """A GGUF-quantized weight (or, ``stacked``, its layers) as a
    :class:`~maxjax.graph.quantization.MappedArray` over its mapped file: nothing is copied or
    read (the file is adopted whole as one device array, :meth:`~maxjax.graph.weights._host.MappedFile.units`, shared
    by every weight of the file).

    Returns:
        The MappedArray, or None where the weight cannot be read in place (the caller copies it
        into the ``mapped`` layout, :meth:`MappedArray.from_packed`): its layers are not all
        tensors of one mapped file, a layer does not start on a 32-byte boundary, the layers'
        row orders differ, or the file cannot be adopted on ``target`` (another platform).
    """
    from maxjax.graph.quantization import MappedArray, as_encoding, layout_for
    from maxjax.graph.quantization.mapped import UNIT
    from maxjax.graph.weights.lazy import LazyTensor

    enc = as_encoding(encoding)
    stored = [_stored(v) for v in values]
    if layout_for("mapped", enc, enc.logical_shape(stored[0].shape)) != "mapped":
        return None  # an encoding the kernel does not read in place: the caller converts it
    if not all(isinstance(s, LazyTensor) and s.stored_dtype == np.uint8 and s.dtype == np.uint8 and s.ndim == 2 for s in stored):
        return None
    mapped = stored[0].mapped
    if mapped.size // UNIT >= 2**31:  # offsets are int32 units
        return None
    if any(s.mapped is not mapped or s.offset % UNIT or s.shape != stored[0].shape for s in stored):
        return None
    order = stored[0].rows
    if any((s.rows is None) != (order is None) or (order is not None and not np.array_equal(s.rows, order)) for s in stored):
        return None
    rows, row_bytes = stored[0]._stored_shape
    if order is not None and len(order) != rows:
        return None
    if any(s.offset + rows * row_bytes > mapped.size // UNIT * UNIT for s in stored):
        return None  # past the last whole unit of the file
    device = target if isinstance(target, jax.Device) else None
    file = mapped.units(device, UNIT)
    if file is None:
        return None
    offsets = np.array([s.offset // UNIT for s in stored], np.int32)
    put = (lambda a: jax.device_put(a, file.sharding))  # beside the file, on its device
    return MappedArray(
        enc, file, put(offsets if stacked else offsets[0]), rows, enc.logical_shape((row_bytes,))[0],
        None if order is None else put(order.astype(np.int32)),
    )


def host_layout(values: Sequence[Any], encoding: Any, layout: str | None, *, stacked: bool) -> Any:
    """A GGUF-quantized weight (or, ``stacked``, its layers stacked) in ``layout``, converted on
    the host straight from its stored blocks (:mod:`maxjax.backend.kernels.layouts`) into fresh
    64-byte aligned, read-only NumPy leaves that ``jax.device_put`` adopts on the CPU; each layer's
    pages of a mapped file are dropped from the resident set once it is converted. As for
    :func:`~maxjax.graph.quantization.to_layout`, a weight the layout cannot take (``nibbles`` of
    Q8_0, or of an odd number of rows) takes ``unpacked``.

    Returns:
        A :class:`~maxjax.graph.quantization.QuantizedArray` with NumPy leaves, or None where the
        host does not convert this encoding to this layout (the caller converts on the device).
    """
    from maxjax.backend.kernels import layouts
    from maxjax.driver import to_host_array
    from maxjax.graph.quantization import LAYOUTS, as_encoding, layout_for
    from maxjax.graph.weights.lazy import LazyTensor

    enc = as_encoding(encoding)
    stored = [_stored(v) for v in values]
    shape = tuple(int(d) for d in enc.logical_shape(stored[0].shape))
    if layout is None or len(shape) != 2:
        return None
    layout = layout_for(layout, enc, shape)
    if not layouts.converts(layout, enc.value):
        return None
    rows, cols = shape
    sources = []
    for s in stored:
        if isinstance(s, LazyTensor) and s.dtype == s.stored_dtype:
            sources.append(s.source())
        else:
            sources.append((np.ascontiguousarray(to_host_array(s)), None))
    spec = layouts.layout_shapes(layout, enc.value, rows, cols)
    leaves = {k: None if v is None else _aligned_empty((len(stored), *v[0]), v[1]) for k, v in spec.items()}

    def done(i: int) -> None:
        if isinstance(stored[i], LazyTensor):
            stored[i].done_reading()

    layouts.convert_layers(layout, enc.value, sources, leaves["values"], leaves["scale"], leaves["offset"], on_layer_done=done)
    for a in leaves.values():
        if a is not None:
            a.flags.writeable = False
    if not stacked:
        leaves = {k: None if a is None else a[0] for k, a in leaves.items()}
    return LAYOUTS[layout](enc, leaves["values"], leaves["scale"], leaves["offset"])


def read_block(value: Any, layout: DeviceLayout | None, index: Sequence[slice]) -> np.ndarray:
    """Block ``index`` (slices over the laid-out stored array) of a stored value: the source
    rows/columns the layout puts there, zeros where it pads."""
    src = host_indexable(value)
    index = tuple(index)
    if layout is None:
        return np.asarray(src[index])
    axis = layout.axis
    positions = np.arange(len(layout.index))[index[axis]]
    source = layout.index[positions]
    selection = list(index)
    selection[axis] = np.maximum(source, 0)
    out = np.asarray(src[tuple(selection)])
    if (source < 0).any():
        keep = (source >= 0).reshape([-1 if a == axis else 1 for a in range(out.ndim)])
        out = np.where(keep, out, np.zeros((), out.dtype))
    return out


def _key(index: Sequence[slice]) -> tuple[Any, ...]:
    return tuple((s.start, s.stop, s.step) for s in index)


def place_sharded(
    values: Sequence[Any],
    layout: DeviceLayout | None,
    stored_shape: Sequence[int],
    target: jax.sharding.NamedSharding,
    *,
    stacked: bool,
    encoding: Any = None,
    quantized_layout: str | None = None,
) -> Any:
    """One weight (or, ``stacked``, one per layer in ``values``) placed with ``target``.

    Args:
        values: the stored values (one, or one per stacked layer).
        layout: the weight's stored device layout (on GGUF bytes for a quantized weight), or None.
        stored_shape: the shape of one laid-out stored value.
        target: the sharding (with a leading unsharded layer axis when ``stacked``).
        stacked: ``values`` are layers stacked along a new leading axis.
        encoding / quantized_layout: for a quantized weight, its encoding and runtime layout.

    Returns:
        A ``jax.Array``, or a :class:`~maxjax.graph.quantization.QuantizedArray` of them.

    Raises:
        NotImplementedError: ``quantized_layout="int8"`` (its per-row scales and column rotation
            are not split over a mesh yet).
    """
    if encoding is not None and quantized_layout == "int8":
        raise NotImplementedError(
            "quantized_layout='int8' is not supported on a device mesh yet (its per-row scales and 64-column "
            "rotation blocks are not split over devices); use 'unpacked' or 'nibbles' with a mesh"
        )
    global_shape = ((len(values),) if stacked else ()) + tuple(int(d) for d in stored_shape)
    blocks: dict[tuple[Any, ...], Any] = {}
    per_device = []
    for device, index in target.addressable_devices_indices_map(global_shape).items():
        index = tuple(index) + (slice(None),) * (len(global_shape) - len(tuple(index)))
        key = _key(index)
        if key not in blocks:
            if stacked:
                layers = range(len(values))[index[0]]
                block = np.stack([read_block(values[i], layout, index[1:]) for i in layers])
            else:
                block = read_block(values[0], layout, index)
            if encoding is not None:
                block = to_layout(quantized_layout, encoding, jnp.asarray(block))
            blocks[key] = block
        per_device.append((device, blocks[key]))
    if encoding is None:
        arrays = [jax.device_put(b, d) for d, b in per_device]
        return jax.make_array_from_single_device_arrays(global_shape, target, arrays)
    abstract = jax.eval_shape(lambda p: to_layout(quantized_layout, encoding, p), jax.ShapeDtypeStruct(global_shape, np.uint8))
    leaves, tree = jax.tree.flatten(abstract)
    joined = []
    for i, leaf in enumerate(leaves):
        arrays = [jax.device_put(jax.tree.leaves(b)[i], d) for d, b in per_device]
        joined.append(jax.make_array_from_single_device_arrays(leaf.shape, target, arrays))
    return jax.tree.unflatten(tree, joined)


def placement_report(module: Any, quantized_layout: str) -> list[dict[str, Any]]:
    """How each weight of a module placed on a mesh (``module.to(mesh)``) sits on its devices, from
    shapes alone (nothing is read): ``{"name", "shape" (declared), "runtime_shape", "spec" (the
    ``PartitionSpec``), "layout" (a quantized weight's runtime layout, else its dtype),
    "bytes_per_device", "bytes"}`` per weight.

    Args:
        module: a module whose weights are placed on a mesh.
        quantized_layout: the runtime layout of GGUF-quantized weights (``"nibbles"``, ...).
    """
    rows = []
    for fqn, w in module.raw_state_dict().items():
        sharding = w.sharding
        shape = tuple(int(d) for d in w.stored_shape)
        if w._is_gguf_quantized():
            value = jax.eval_shape(lambda p: to_layout(quantized_layout, w.quantization_encoding, p), jax.ShapeDtypeStruct(shape, np.uint8))
            layout, runtime = value.layout, tuple(value.shape)
        else:
            value = jax.ShapeDtypeStruct(shape, w.dtype.to_jax())
            layout, runtime = w.dtype.name, shape
        total = per_device = 0
        for leaf in jax.tree.leaves(value):
            nbytes = int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
            total += nbytes
            parts = 1
            if isinstance(sharding, jax.sharding.NamedSharding):
                for axes in sharding.spec:
                    for name in axes if isinstance(axes, tuple) else (axes,) if axes else ():
                        parts *= sharding.mesh.shape[name]
            per_device += nbytes // parts
        spec = sharding.spec if isinstance(sharding, jax.sharding.NamedSharding) else None
        rows.append({"name": fqn, "shape": [int(d) for d in w.shape], "runtime_shape": list(runtime), "spec": spec,
                     "layout": layout, "bytes_per_device": per_device, "bytes": total})  # fmt: skip
    return rows
