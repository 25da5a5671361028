"""``ops.non_maximum_suppression`` (MAX's ``max.graph.ops.nms``, ONNX ``NonMaxSuppression``).

Per (batch, class) pair: boxes scoring at or below ``score_threshold`` are dropped, the rest taken
in descending score order (ties by box index), and a box is kept unless its IoU with a box already
kept exceeds ``iou_threshold``, up to ``max_output_boxes_per_class`` boxes. Boxes are
``(y1, x1, y2, x2)`` corners in either order. The result is ``int64 [num_selected, 3]`` rows
``(batch_index, class_index, box_index)``, ordered by batch, class, then selection.

``num_selected`` depends on the data (MAX gives it a symbolic ``out_dim``), which a static-shape
JAX program cannot have: maxjax computes this op only eagerly on concrete arrays. In a graph or
under ``jax.jit`` it raises ``NotImplementedError``. The selection itself is one jnp function
giving a fixed-size mask; only the final row selection runs in NumPy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.ops._core import apply
from maxjax.graph.value import TensorValue

__all__ = ["non_maximum_suppression"]


def _nms_mask(boxes: Any, scores: Any, iou_threshold: Any, score_threshold: Any, *, max_per_class: int) -> Any:
    # boxes: [B, N, 4], scores: [B, C, N] -> (selected [B, C, N] bool in sorted order, order [B, C, N])
    b, c, n = scores.shape
    order = jnp.argsort(-scores.astype(jnp.float32), axis=-1, stable=True)  # [B, C, N], best first
    s = jnp.take_along_axis(scores, order, axis=-1)  # [B, C, N]
    bx = jnp.take_along_axis(boxes[:, None, :, :], order[..., None], axis=2).astype(jnp.float32)  # [B, C, N, 4]
    lo, hi = jnp.minimum(bx[..., :2], bx[..., 2:]), jnp.maximum(bx[..., :2], bx[..., 2:])  # [B, C, N, 2]
    area = jnp.prod(hi - lo, axis=-1)  # [B, C, N]
    inter = jnp.prod(
        jnp.clip(jnp.minimum(hi[..., :, None, :], hi[..., None, :, :]) - jnp.maximum(lo[..., :, None, :], lo[..., None, :, :]), 0), axis=-1
    )  # [B, C, N, N]
    union = area[..., :, None] + area[..., None, :] - inter
    iou = jnp.where(union > 0, inter / jnp.where(union > 0, union, 1), 0.0)  # [B, C, N, N]
    valid = s > score_threshold.astype(s.dtype)
    over = iou > iou_threshold.astype(jnp.float32)

    def step(i: Any, carry: Any) -> Any:
        selected, count = carry  # [B, C, N] bool, [B, C] int32
        hit = jnp.any(selected & over[..., i, :], axis=-1)  # [B, C]
        keep = valid[..., i] & ~hit & (count < max_per_class)
        return selected.at[..., i].set(keep), count + keep.astype(jnp.int32)

    selected, _ = jax.lax.fori_loop(0, n, step, (jnp.zeros((b, c, n), bool), jnp.zeros((b, c), jnp.int32)))
    return selected, order


def non_maximum_suppression(
    boxes: Any,
    scores: Any,
    max_output_boxes_per_class: Any,
    iou_threshold: Any,
    score_threshold: Any,
    out_dim: str = "num_selected",
) -> Any:
    """Greedy non-maximum suppression (see the module docstring). ``boxes [B, N, 4]`` and
    ``scores [B, C, N]`` floats; the three limits are scalar tensors (or numbers).

    Returns:
        ``int64 [num_selected, 3]`` (int32 unless JAX's x64 is on): a TensorValue when any input
        was one, else a JAX array.

    Raises:
        NotImplementedError: in a graph or under ``jax.jit`` (the output size ``out_dim`` depends
            on the data).
        ValueError: ``boxes`` not ``[B, N, 4]`` or ``scores`` not ``[B, C, N]`` matching it.
    """
    args = (boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold)
    tv = any(isinstance(a, TensorValue) for a in args)
    arrays = [a.to_jax() if isinstance(a, TensorValue) and a._graph is None else a for a in args]
    if any(isinstance(a, (TensorValue, jax.core.Tracer)) for a in arrays):
        raise NotImplementedError(
            f"non_maximum_suppression: the number of selected boxes (out_dim {out_dim!r}) depends on the data; maxjax "
            "computes it only eagerly on concrete arrays, not in a graph or under jax.jit"
        )
    boxes, scores = arrays[0], arrays[1]
    if len(boxes.shape) != 3 or boxes.shape[2] != 4:
        raise ValueError(f"non_maximum_suppression: boxes must have shape [batch, num_boxes, 4], got {list(boxes.shape)}")
    if len(scores.shape) != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(
            f"non_maximum_suppression: scores must have shape [batch, num_classes, num_boxes] = "
            f"[{boxes.shape[0]}, C, {boxes.shape[1]}], got {list(scores.shape)}"
        )
    k = int(np.asarray(arrays[2]))
    thresholds = jnp.asarray(arrays[3]), jnp.asarray(arrays[4])
    selected, order = apply(_nms_mask, boxes, scores, *thresholds, _name="non_maximum_suppression", max_per_class=k)
    selected, order = np.asarray(selected), np.asarray(order)
    b, c, _ = np.nonzero(selected)  # row-major: batch, class, then selection order
    rows = np.stack([b, c, order[selected]], axis=1)  # [num_selected, 3]
    out = jnp.asarray(rows, DType.int64.to_jax())
    return TensorValue(out) if tv else out
