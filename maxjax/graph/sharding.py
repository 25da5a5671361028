"""``ShardingStrategy`` and ``Segment``: how a weight splits across devices, as MAX 26.7 defines it.

The presets, their shard functions and their predicates are MAX's (``max/graph/weight.py`` of
``max==26.7.0``): a shard function takes the weight (a ``Weight``, a graph value or an array), the
device index ``i`` and the device count, and returns shard ``i``; uneven splits give the lower
device indices one more row, column or head (:func:`compute_shard_range`).

Every preset but ``replicate`` and the placeholders splits one axis into :class:`Segment`\\ s
(``rowwise`` is one even segment on axis 0, ``gate_up`` two even halves, ``stacked_qkv`` three
head-aware ones, ...). :func:`device_layout` uses that to lay all the shards of a weight out as
*one* array for a ``jax.sharding.Mesh`` axis: each device's shard, padded with zeros to the largest
shard, in device order, so that every device's shard is a contiguous block of equal size (the
``NamedSharding`` of the SPMD path) whatever the split.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np

__all__ = [
    "DeviceLayout",
    "Segment",
    "ShardingStrategy",
    "axiswise_sharding_strategy",
    "col_sharding_strategy",
    "compute_shard_range",
    "device_layout",
    "expert_parallel_sharding_strategy",
    "gate_up_sharding_strategy",
    "head_aware_col_sharding_strategy",
    "replicate_sharding_strategy",
    "row_sharding_strategy",
    "segmented_sharding_strategy",
    "stacked_qkv_sharding_strategy",
    "tensor_parallel_sharding_strategy",
]


def compute_shard_range(shard_dim: int, shard_idx: int, num_devices: int) -> tuple[int, int]:
    """``[start, end)`` of shard ``shard_idx`` of ``shard_dim`` items over ``num_devices`` devices:
    the first ``shard_dim % num_devices`` shards get one item more (MAX's ``_compute_shard_range``)."""
    base_size, remainder = divmod(shard_dim, num_devices)
    if shard_idx < remainder:
        start = shard_idx * (base_size + 1)
        return start, start + base_size + 1
    start = remainder * (base_size + 1) + (shard_idx - remainder) * base_size
    return start, start + base_size


def _concat(pieces: Sequence[Any], axis: int) -> Any:
    from maxjax.graph.value import TensorValue

    if any(isinstance(p, TensorValue) for p in pieces):
        from maxjax.graph import ops

        return ops.concat(pieces, axis=axis)
    return jnp.concatenate(pieces, axis=axis)


def _rank(weight: Any) -> int:
    return len(weight.shape)


def col_sharding_strategy(weight: Any, i: int, num_devices: int) -> Any:
    """Shard ``i``: a block of columns (axis 1)."""
    start, end = compute_shard_range(int(weight.shape[1]), i, num_devices)
    return weight[:, start:end]


def row_sharding_strategy(weight: Any, i: int, num_devices: int) -> Any:
    """Shard ``i``: a block of rows (axis 0)."""
    start, end = compute_shard_range(int(weight.shape[0]), i, num_devices)
    return weight[start:end]


def replicate_sharding_strategy(weight: Any, i: int, num_devices: int) -> Any:
    """Every device gets the whole weight."""
    return weight[:]


def head_aware_col_sharding_strategy(weight: Any, i: int, num_devices: int, num_heads: int, head_dim: int) -> Any:
    """Shard ``i``: the columns of its attention heads (an output projection whose heads do not
    divide evenly). FP4/MXFP6-packed widths (half, three quarters) are handled as MAX does."""
    head_start, head_end = compute_shard_range(num_heads, i, num_devices)
    col_start, col_end = head_start * head_dim, head_end * head_dim
    logical_in_dim = num_heads * head_dim
    actual_cols = int(weight.shape[1])
    if actual_cols * 2 == logical_in_dim:
        col_start, col_end = col_start // 2, col_end // 2
    elif actual_cols * 4 == logical_in_dim * 3:
        col_start, col_end = col_start * 3 // 4, col_end * 3 // 4
    return weight[:, col_start:col_end]


@dataclass(frozen=True)
class Segment:
    """One contiguous region of a segmented weight and how it splits (MAX's ``Segment``).

    Attributes:
        size: the region's extent along the sharded axis.
        num_heads: for a head-aware segment, its heads (``size == num_heads * head_dim``); the
            region then splits in whole heads. None: split evenly in single slots.
    """

    size: int
    num_heads: int | None

    @staticmethod
    def even(size: int) -> "Segment":
        """A segment of ``size`` slots split evenly across devices."""
        return Segment(size=size, num_heads=None)

    @staticmethod
    def head_aware(num_heads: int, head_dim: int) -> "Segment":
        """A segment of ``num_heads * head_dim`` slots split by head."""
        return Segment(size=num_heads * head_dim, num_heads=num_heads)

    def shard_range(self, i: int, num_devices: int) -> tuple[int, int]:
        """``[start, end)`` slots of this segment on device ``i``."""
        if self.num_heads is None:
            return compute_shard_range(self.size, i, num_devices)
        head_dim = self.size // self.num_heads
        head_start, head_end = compute_shard_range(self.num_heads, i, num_devices)
        return head_start * head_dim, head_end * head_dim


def segmented_sharding_strategy(weight: Any, i: int, num_devices: int, *, axis: int, segments: Sequence[Segment]) -> Any:
    """Shard ``i``: each segment's slice for device ``i``, concatenated along ``axis``.

    Raises:
        ValueError: the segments do not cover the axis (or half of it, for FP4-packed weights).
    """
    rank = _rank(weight)
    if axis < 0:
        axis += rank
    logical_total = sum(seg.size for seg in segments)
    actual = int(weight.shape[axis])
    if actual == logical_total:
        packed_factor = 1
    elif actual * 2 == logical_total:
        packed_factor = 2
    else:
        raise ValueError(
            f"Segmented sharding: segments cover {logical_total} slots along axis {axis}, but weight has {actual} "
            f"(expected {logical_total} or {logical_total // 2} for packed FP4)."
        )
    pieces = []
    offset = 0
    for seg in segments:
        seg_start, seg_end = seg.shard_range(i, num_devices)
        slices: list[slice] = [slice(None)] * rank
        slices[axis] = slice((offset + seg_start) // packed_factor, (offset + seg_end) // packed_factor)
        pieces.append(weight[tuple(slices)])
        offset += seg.size
    return _concat(pieces, axis)


def stacked_qkv_sharding_strategy(weight: Any, i: int, num_devices: int, num_heads: int, head_dim: int) -> Any:
    """Shard ``i`` of a stacked ``[3 * num_heads * head_dim, in]`` QKV weight: its heads of Q, K and V.

    Raises:
        ValueError: the rows are not three blocks of ``num_heads * head_dim``.
    """
    total_rows = int(weight.shape[0])
    if total_rows % 3 != 0:
        raise ValueError(f"Stacked QKV weight must have shape [3*hidden_size, hidden_size], got shape {weight.shape}")
    expected_hidden = num_heads * head_dim
    if total_rows // 3 != expected_hidden:
        raise ValueError(
            f"Weight hidden_size {total_rows // 3} doesn't match num_heads * head_dim = {num_heads} * {head_dim} = "
            f"{expected_hidden}"
        )
    seg = Segment.head_aware(num_heads, head_dim)
    return segmented_sharding_strategy(weight, i, num_devices, axis=0, segments=(seg, seg, seg))


def tensor_parallel_sharding_strategy(weight: Any, i: int, num_devices: int) -> Any:
    """A placeholder, as in MAX: modules implement their own tensor-parallel split."""
    raise NotImplementedError(
        "tensor_parallel_sharding_strategy is a placeholder and should not be called directly. "
        "Modules are expected to implement their own tensor parallel sharding strategy."
    )


def expert_parallel_sharding_strategy(weight: Any, i: int, num_devices: int) -> Any:
    """A placeholder, as in MAX: modules implement their own expert-parallel split."""
    raise NotImplementedError(
        "expert_parallel_sharding_strategy is a placeholder and should not be called directly. "
        "Modules are expected to implement their own expert parallel sharding strategy."
    )


def gate_up_sharding_strategy(weight: Any, i: int, num_devices: int, axis: int) -> Any:
    """Shard ``i`` of a fused gate/up weight: each half split evenly along ``axis``.

    Raises:
        ValueError: the axis has an odd size.
    """
    full_dim = int(weight.shape[axis])
    if full_dim % 2 != 0:
        raise ValueError(f"Dimension {axis} must be even for gate_up sharding, got {full_dim}")
    half = full_dim // 2
    return segmented_sharding_strategy(weight, i, num_devices, axis=axis, segments=(Segment.even(half), Segment.even(half)))


def axiswise_sharding_strategy(weight: Any, i: int, num_devices: int, axis: int) -> Any:
    """Shard ``i``: a block along ``axis``."""
    rank = _rank(weight)
    if axis < 0:
        axis += rank
    start, end = compute_shard_range(int(weight.shape[axis]), i, num_devices)
    slices: list[slice] = [slice(None)] * rank
    slices[axis] = slice(start, end)
    return weight[tuple(slices)]


def _is(shard: Any, fn: Callable[..., Any]) -> bool:
    return (shard.func if isinstance(shard, partial) else shard) is fn


@dataclass(frozen=True)
class ShardingStrategy:
    """How a :class:`~maxjax.graph.Weight` splits across ``num_devices`` devices (MAX's
    ``ShardingStrategy``): ``shard(weight, i, num_devices)`` gives shard ``i``."""

    num_devices: int
    shard: Callable[[Any, int, int], Any]

    def __call__(self, weight: Any, i: int) -> Any:
        """Shard ``i`` of ``weight``."""
        return self.shard(weight, i, self.num_devices)

    # -- predicates (MAX's) ------------------------------------------------------------------
    @property
    def is_rowwise(self) -> bool:
        return self.shard is row_sharding_strategy

    @property
    def is_colwise(self) -> bool:
        return self.shard is col_sharding_strategy

    @property
    def is_head_aware_colwise(self) -> bool:
        return _is(self.shard, head_aware_col_sharding_strategy)

    @property
    def is_replicate(self) -> bool:
        return self.shard is replicate_sharding_strategy

    @property
    def is_stacked_qkv(self) -> bool:
        return _is(self.shard, stacked_qkv_sharding_strategy)

    @property
    def is_tensor_parallel(self) -> bool:
        return self.shard is tensor_parallel_sharding_strategy

    @property
    def is_expert_parallel(self) -> bool:
        return self.shard is expert_parallel_sharding_strategy

    @property
    def is_gate_up(self) -> bool:
        return _is(self.shard, gate_up_sharding_strategy)

    @property
    def is_segmented(self) -> bool:
        return _is(self.shard, segmented_sharding_strategy)

    @property
    def is_axiswise(self) -> bool:
        return _is(self.shard, axiswise_sharding_strategy)

    @property
    def sharded_axis(self) -> int | None:
        """0 for rowwise/stacked_qkv, 1 for columnwise/head_aware_columnwise, the configured axis
        (possibly negative) for gate_up/axiswise/segmented, None for replicate and placeholders."""
        if self.is_rowwise or self.is_stacked_qkv:
            return 0
        if self.is_colwise or self.is_head_aware_colwise:
            return 1
        if self.is_gate_up or self.is_axiswise or self.is_segmented:
            return self.shard.keywords["axis"]  # type: ignore[attr-defined]
        return None

    # -- presets (MAX's) ---------------------------------------------------------------------
    @staticmethod
    def rowwise(num_devices: int) -> "ShardingStrategy":
        return ShardingStrategy(num_devices=num_devices, shard=row_sharding_strategy)

    @staticmethod
    def columnwise(num_devices: int) -> "ShardingStrategy":
        return ShardingStrategy(num_devices=num_devices, shard=col_sharding_strategy)

    @staticmethod
    def axiswise(axis: int, num_devices: int) -> "ShardingStrategy":
        return ShardingStrategy(num_devices=num_devices, shard=partial(axiswise_sharding_strategy, axis=axis))

    @staticmethod
    def replicate(num_devices: int) -> "ShardingStrategy":
        return ShardingStrategy(num_devices=num_devices, shard=replicate_sharding_strategy)

    @staticmethod
    def stacked_qkv(num_devices: int, num_heads: int, head_dim: int) -> "ShardingStrategy":
        fn = partial(stacked_qkv_sharding_strategy, num_heads=num_heads, head_dim=head_dim)
        return ShardingStrategy(num_devices=num_devices, shard=fn)

    @staticmethod
    def head_aware_columnwise(num_devices: int, num_heads: int, head_dim: int) -> "ShardingStrategy":
        fn = partial(head_aware_col_sharding_strategy, num_heads=num_heads, head_dim=head_dim)
        return ShardingStrategy(num_devices=num_devices, shard=fn)

    @staticmethod
    def tensor_parallel(num_devices: int) -> "ShardingStrategy":
        """A placeholder (as in MAX): a module's ``sharding_strategy`` setter turns it into
        strategies for its weights; the weights themselves cannot be split by it."""
        return ShardingStrategy(num_devices=num_devices, shard=tensor_parallel_sharding_strategy)

    @staticmethod
    def expert_parallel(num_devices: int) -> "ShardingStrategy":
        """A placeholder (as in MAX), like :meth:`tensor_parallel`."""
        return ShardingStrategy(num_devices=num_devices, shard=expert_parallel_sharding_strategy)

    @staticmethod
    def gate_up(num_devices: int, axis: int = 2) -> "ShardingStrategy":
        return ShardingStrategy(num_devices=num_devices, shard=partial(gate_up_sharding_strategy, axis=axis))

    @staticmethod
    def segmented(num_devices: int, axis: int, segments: Sequence[Segment]) -> "ShardingStrategy":
        fn = partial(segmented_sharding_strategy, axis=axis, segments=tuple(segments))
        return ShardingStrategy(num_devices=num_devices, shard=fn)

    # -- as one array on a mesh axis ----------------------------------------------------------
    def segments_for(self, shape: Sequence[int]) -> tuple[int, tuple[Segment, ...]] | None:
        """``(axis, segments)`` this strategy splits an array of ``shape`` into; None for
        replicate.

        Raises:
            NotImplementedError: the tensor/expert-parallel placeholders.
            ValueError: a custom shard function (no segments are known), or an axis the shape
                does not have.
        """
        rank = len(shape)

        def axis_of(a: int) -> int:
            if not -rank <= a < rank:
                raise ValueError(f"axis {a} out of range for a rank-{rank} weight of shape {tuple(shape)}")
            return a % rank

        if self.is_replicate:
            return None
        if self.is_tensor_parallel or self.is_expert_parallel:
            self.shard(None, 0, self.num_devices)  # raises MAX's NotImplementedError
        if self.is_rowwise:
            return axis_of(0), (Segment.even(int(shape[axis_of(0)])),)
        if self.is_colwise:
            return axis_of(1), (Segment.even(int(shape[axis_of(1)])),)
        kw = self.shard.keywords if isinstance(self.shard, partial) else {}
        if self.is_axiswise:
            a = axis_of(kw["axis"])
            return a, (Segment.even(int(shape[a])),)
        if self.is_head_aware_colwise:
            a = axis_of(1)
            if int(shape[a]) != kw["num_heads"] * kw["head_dim"]:
                raise ValueError(f"head_aware_columnwise: {kw['num_heads']} heads of {kw['head_dim']} are not the {shape[a]} columns")
            return a, (Segment.head_aware(kw["num_heads"], kw["head_dim"]),)
        if self.is_stacked_qkv:
            seg = Segment.head_aware(kw["num_heads"], kw["head_dim"])
            if int(shape[axis_of(0)]) != 3 * seg.size:
                raise ValueError(f"stacked_qkv: 3 x {seg.size} rows expected, the weight has {shape[0]}")
            return axis_of(0), (seg, seg, seg)
        if self.is_gate_up:
            a = axis_of(kw["axis"])
            half = int(shape[a]) // 2
            if int(shape[a]) % 2:
                raise ValueError(f"Dimension {a} must be even for gate_up sharding, got {shape[a]}")
            return a, (Segment.even(half), Segment.even(half))
        if self.is_segmented:
            a = axis_of(kw["axis"])
            segments = tuple(kw["segments"])
            if sum(s.size for s in segments) != int(shape[a]):
                raise ValueError(f"segmented: segments cover {sum(s.size for s in segments)} slots, axis {a} has {shape[a]}")
            return a, segments
        raise ValueError(f"a custom shard function ({self.shard!r}) has no known segments to lay out on a mesh")


@dataclass(frozen=True)
class DeviceLayout:
    """All of a strategy's shards of one weight as one array for a mesh axis (see the module
    docstring): along ``axis``, position ``p`` holds source index ``index[p]`` of the weight, or
    zero where ``index[p] == -1`` (padding); device ``i`` holds positions ``[i * block, (i + 1) *
    block)``, of which the first ``sizes[i]`` are its shard."""

    axis: int
    index: np.ndarray
    block: int
    sizes: tuple[int, ...]

    @property
    def num_devices(self) -> int:
        return len(self.sizes)

    @property
    def is_identity(self) -> bool:
        return bool(np.array_equal(self.index, np.arange(len(self.index))))

    def shape(self, shape: Sequence[Any]) -> tuple[Any, ...]:
        """The laid-out array's shape."""
        out = list(shape)
        out[self.axis] = len(self.index)
        return tuple(out)

    def apply(self, array: Any) -> Any:
        """The weight laid out (NumPy in, NumPy out; JAX arrays in, JAX arrays out)."""
        if self.is_identity:
            return array
        xp = np if isinstance(array, np.ndarray) else jnp
        taken = xp.take(array, np.maximum(self.index, 0), axis=self.axis)
        if (self.index >= 0).all():
            return taken
        keep = (self.index >= 0).reshape([-1 if a == self.axis else 1 for a in range(array.ndim)])
        return xp.where(keep, taken, xp.zeros((), taken.dtype))

    def for_packed(self, encoding: Any, rank: int, name: str = "weight") -> "DeviceLayout":
        """This layout (made for a quantized weight's logical shape, of ``rank``) on its GGUF
        blocks ``[..., rows, bytes_per_row]``: rows move whole; along the columns only whole blocks
        can move (zero bytes are a zero block in every GGUF format).

        Raises:
            ValueError: a column split that cuts a block (names the weight and the sizes).
        """
        if self.axis != rank - 1:
            return self
        bpe, bsize = encoding.block_parameters
        blocks = self.index.reshape(-1, bpe) if len(self.index) % bpe == 0 else None
        first = None if blocks is None else blocks[:, 0]
        whole = self.block % bpe == 0 and all(size % bpe == 0 for size in self.sizes)
        if not whole or blocks is None or (first[first >= 0] % bpe).any() or not np.array_equal(
            blocks, np.where(first[:, None] >= 0, first[:, None] + np.arange(bpe), -1)
        ):
            sizes = sorted(set(self.sizes))
            raise ValueError(
                f"{name}: its column split into shards of {sizes} columns cuts {encoding.value} blocks of {bpe} "
                f"columns; a quantized weight can only be split between blocks"
            )
        block_index = np.where(first >= 0, first // bpe, -1)
        byte_index = np.where(block_index[:, None] >= 0, block_index[:, None] * bsize + np.arange(bsize), -1).reshape(-1)
        return DeviceLayout(self.axis, byte_index, self.block // bpe * bsize, tuple(s // bpe * bsize for s in self.sizes))

    def shard(self, laid_out: Any, i: int) -> Any:
        """Device ``i``'s shard (without padding) from the laid-out array (MAX's shard ``i``)."""
        slices: list[slice] = [slice(None)] * len(laid_out.shape)
        slices[self.axis] = slice(i * self.block, i * self.block + self.sizes[i])
        return laid_out[tuple(slices)]


def device_layout(strategy: ShardingStrategy, shape: Sequence[int]) -> DeviceLayout | None:
    """The :class:`DeviceLayout` of ``strategy`` for a weight of ``shape``; None when every device
    gets the whole weight (replicate).

    Raises:
        ValueError / NotImplementedError: see :meth:`ShardingStrategy.segments_for`.
    """
    found = strategy.segments_for(shape)
    if found is None:
        return None
    axis, segments = found
    n = strategy.num_devices
    per_device = []
    for i in range(n):
        idx, offset = [], 0
        for seg in segments:
            start, end = seg.shard_range(i, n)
            idx.extend(range(offset + start, offset + end))
            offset += seg.size
        per_device.append(idx)
    block = max(len(p) for p in per_device)
    index = np.full(n * block, -1, np.int64)
    for i, p in enumerate(per_device):
        index[i * block : i * block + len(p)] = p
    return DeviceLayout(axis, index, block, tuple(len(p) for p in per_device))
