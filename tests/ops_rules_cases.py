"""The cases of ``tests/test_ops_rules.py``: graph-build calls and what MAX 26.7 does with them.

This module imports neither ``max`` nor ``maxjax``: each case is a function of a namespace ``m``
(``m.ops``, ``m.DType``, ``m.Dim``, ``m.DeviceRef``) and the graph's inputs, so the same table runs
on MAX 26.7 (``~/max267/bin/python scripts/max_reference/ops_rules_probe.py`` prints what MAX does
for every row) and on maxjax (the test). The expected column was filled in from that probe's
output on MAX 26.7.

An input is ``"dtype[dims]"`` (dims comma-separated; names are symbolic dims), optionally with
``@gpu`` for ``DeviceRef.GPU()``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple


class Case(NamedTuple):
    id: str
    inputs: tuple[str, ...]
    call: Callable[..., Any]
    #: MAX's exception type name ("ValueError", "TypeError", "IndexError"), or "ok" when MAX builds it
    expected: str
    #: for "ok": MAX's output type as "dtype[dims]" (first output when there are several)
    out: str = ""


def parse_input(spec: str) -> tuple[str, list[Any], str]:
    """``"float32[2,batch]@gpu"`` -> ``("float32", [2, "batch"], "gpu")``."""
    device = "cpu"
    if "@" in spec:
        spec, device = spec.split("@")
    dtype, dims = spec[:-1].split("[")
    shape: list[Any] = [int(d) if d.lstrip("-").isdigit() else d for d in dims.split(",") if d]
    return dtype, shape, device


def describe(value: Any) -> str:
    """``"dtype[dims]"`` of a graph value (MAX's or maxjax's)."""
    if isinstance(value, (list, tuple)):
        value = value[0]
    return f"{value.dtype.name}[{','.join(str(d) for d in value.shape)}]"


F = "float32[2,3]"

CASES: list[Case] = [
    # -- matmul ---------------------------------------------------------------------------
    Case("matmul_ok", ("float32[2,3]", "float32[3,4]"), lambda m, a, b: m.ops.matmul(a, b), "ok", "float32[2,4]"),
    Case("matmul_inner_mismatch", ("float32[2,3]", "float32[4,5]"), lambda m, a, b: m.ops.matmul(a, b), "ValueError"),
    Case("matmul_batch_mismatch", ("float32[2,3,4]", "float32[5,4,6]"), lambda m, a, b: m.ops.matmul(a, b), "ValueError"),
    Case("matmul_batch_broadcast", ("float32[2,3,4]", "float32[4,6]"), lambda m, a, b: m.ops.matmul(a, b), "ok", "float32[2,3,6]"),
    Case("matmul_dtype_promotes", ("float32[2,3]", "bfloat16[3,4]"), lambda m, a, b: m.ops.matmul(a, b), "ok", "float32[2,4]"),
    Case("matmul_rank1", ("float32[3]", "float32[3,4]"), lambda m, a, b: m.ops.matmul(a, b), "ok", "float32[4]"),
    Case("matmul_devices", ("float32[2,3]", "float32[3,4]@gpu"), lambda m, a, b: m.ops.matmul(a, b), "ValueError"),
    Case("matmul_symbolic_inner", ("float32[2,k]", "float32[j,4]"), lambda m, a, b: m.ops.matmul(a, b), "ValueError"),
    # -- elementwise ----------------------------------------------------------------------
    Case("add_shape_mismatch", ("float32[2,3]", "float32[4]"), lambda m, a, b: m.ops.add(a, b), "ValueError"),
    Case("add_broadcast", ("float32[2,1]", "float32[3]"), lambda m, a, b: m.ops.add(a, b), "ok", "float32[2,3]"),
    Case("add_devices", ("float32[2,3]", "float32[2,3]@gpu"), lambda m, a, b: m.ops.add(a, b), "ValueError"),
    Case("add_two_scalars", (), lambda m: m.ops.add(1, 2), "TypeError"),
    Case("exp_python_scalar", (), lambda m: m.ops.exp(1.0), "TypeError"),
    Case("add_int_tensor_float_scalar", ("int32[2]",), lambda m, a: a + 1.5, "ValueError"),
    Case("add_int8_tensor_big_int", ("int8[2]",), lambda m, a: a + 300, "ValueError"),
    Case("add_float32_unexact_int", ("float32[2]",), lambda m, a: a + 16777217, "ValueError"),
    Case("add_symbolic_broadcast", ("float32[a]", "float32[b]"), lambda m, a, b: m.ops.add(a, b), "ValueError"),
    Case("add_static_dim_to_float", ("float32[2]",), lambda m, a: a + m.Dim(3), "ValueError"),
    Case("add_symbolic_dim_to_int64", ("int64[n]",), lambda m, a: a + a.shape[0], "ok", "int64[n]"),
    Case("logical_and_ints", ("int32[2]", "int32[2]"), lambda m, a, b: m.ops.logical_and(a, b), "ValueError"),
    Case("logical_not_float", ("float32[2]",), lambda m, a: m.ops.logical_not(a), "ValueError"),
    Case("compare_int_float", ("int32[2]", "float32[2]"), lambda m, a, b: a < b, "ValueError"),
    Case("compare_int_float_scalar", ("int32[2]",), lambda m, a: a > 1.5, "ValueError"),
    Case("matmul_int_float", ("int32[2,2]", "float32[2,2]"), lambda m, a, b: a @ b, "ValueError"),
    Case("matmul_int8_float", ("int8[2,2]", "float32[2,2]"), lambda m, a, b: a @ b, "ok", "float32[2,2]"),
    Case("where_scalars_only", ("bool[2]",), lambda m, c: m.ops.where(c, 1.0, 0.0), "TypeError"),
    Case("gather_devices", ("float32[5,3]", "int64[2]@gpu"), lambda m, a, i: m.ops.gather(a, i, axis=0), "ValueError"),
    Case("outer_int_float", ("int32[2]", "float32[3]"), lambda m, a, b: m.ops.outer(a, b), "ValueError"),
    Case("cast_string_dtype", (F,), lambda m, a: m.ops.cast(a, "float32"), "ValueError"),
    # -- concat / stack -------------------------------------------------------------------
    Case("concat_ok", ("float32[2,3]", "float32[4,3]"), lambda m, a, b: m.ops.concat([a, b]), "ok", "float32[6,3]"),
    Case("concat_empty", (), lambda m: m.ops.concat([]), "ValueError"),
    Case("concat_rank_mismatch", ("float32[2,3]", "float32[2,3,1]"), lambda m, a, b: m.ops.concat([a, b]), "ValueError"),
    Case("concat_dim_mismatch", ("float32[2,3]", "float32[3,3]"), lambda m, a, b: m.ops.concat([a, b], axis=1), "ValueError"),
    Case("concat_axis_range", ("float32[2,3]", "float32[2,3]"), lambda m, a, b: m.ops.concat([a, b], axis=2), "IndexError"),
    Case("concat_dtype_mismatch", ("float32[2,3]", "int32[2,3]"), lambda m, a, b: m.ops.concat([a, b]), "ValueError"),
    Case("concat_devices", ("float32[2,3]", "float32[2,3]@gpu"), lambda m, a, b: m.ops.concat([a, b]), "ValueError"),
    Case("concat_symbolic", ("float32[a,3]", "float32[b,3]"), lambda m, a, b: m.ops.concat([a, b]), "ok", "float32[a + b,3]"),
    Case("stack_ok", ("float32[2,3]", "float32[2,3]"), lambda m, a, b: m.ops.stack([a, b], axis=2), "ok", "float32[2,3,2]"),
    Case("stack_empty", (), lambda m: m.ops.stack([]), "ValueError"),
    Case("stack_shape_mismatch", ("float32[2,3]", "float32[3,2]"), lambda m, a, b: m.ops.stack([a, b]), "ValueError"),
    Case("stack_axis_range", ("float32[2,3]", "float32[2,3]"), lambda m, a, b: m.ops.stack([a, b], axis=3), "IndexError"),
    Case("stack_dtype_mismatch", ("float32[2,3]", "int32[2,3]"), lambda m, a, b: m.ops.stack([a, b]), "ValueError"),
    # -- broadcast / reshape --------------------------------------------------------------
    Case("broadcast_to_bad", ("float32[3]",), lambda m, a: m.ops.broadcast_to(a, [4]), "ValueError"),
    Case("broadcast_to_lower_rank", ("float32[2,3]",), lambda m, a: m.ops.broadcast_to(a, [3]), "ValueError"),
    Case("broadcast_to_ok", ("float32[1,3]",), lambda m, a: m.ops.broadcast_to(a, [2, 4, 3]), "ok", "float32[2,4,3]"),
    Case("reshape_count", ("float32[2,3]",), lambda m, a: m.ops.reshape(a, [4]), "ValueError"),
    Case("reshape_two_minus_one", ("float32[2,3]",), lambda m, a: m.ops.reshape(a, [-1, -1]), "ValueError"),
    Case("reshape_minus_one", ("float32[2,3]",), lambda m, a: m.ops.reshape(a, [3, -1]), "ok", "float32[3,2]"),
    Case("reshape_symbolic", ("float32[batch,6]",), lambda m, a: m.ops.reshape(a, ["batch", 2, 3]), "ok", "float32[batch,2,3]"),
    Case("reshape_symbolic_bad", ("float32[batch,6]",), lambda m, a: m.ops.reshape(a, ["batch", 4]), "ValueError"),
    Case("reshape_zero_size", ("float32[0,3]",), lambda m, a: m.ops.reshape(a, [3, 0]), "ok", "float32[3,0]"),
    # -- gather / gather_nd ---------------------------------------------------------------
    Case("gather_ok", ("float32[5,3]", "int64[2]"), lambda m, a, i: m.ops.gather(a, i, axis=0), "ok", "float32[2,3]"),
    Case("gather_axis_range", ("float32[5,3]", "int64[2]"), lambda m, a, i: m.ops.gather(a, i, axis=2), "IndexError"),
    Case("gather_float_indices", ("float32[5,3]", "float32[2]"), lambda m, a, i: m.ops.gather(a, i, axis=0), "ValueError"),
    Case("gather_nd_ok", ("float32[2,3,4]", "int64[5,2]"), lambda m, a, i: m.ops.gather_nd(a, i), "ok", "float32[5,4]"),
    Case("gather_nd_too_deep", ("float32[2,3]", "int64[4,3]"), lambda m, a, i: m.ops.gather_nd(a, i), "ValueError"),
    Case("gather_nd_batch_ok", ("float32[2,3,4]", "int64[2,5,1]"), lambda m, a, i: m.ops.gather_nd(a, i, batch_dims=1), "ok", "float32[2,5,4]"),
    Case("gather_nd_batch_mismatch", ("float32[2,3,4]", "int64[3,1]"), lambda m, a, i: m.ops.gather_nd(a, i, batch_dims=1), "ValueError"),
    Case("gather_nd_batch_too_big", ("float32[2,3]", "int64[2,3,1]"), lambda m, a, i: m.ops.gather_nd(a, i, batch_dims=2), "ValueError"),
    Case("gather_nd_float_indices", ("float32[2,3]", "float32[4,1]"), lambda m, a, i: m.ops.gather_nd(a, i), "ValueError"),
    # -- slicing --------------------------------------------------------------------------
    Case("slice_too_many", (F,), lambda m, a: a[0, 0, 0], "ValueError"),
    Case("slice_int_out_of_range", (F,), lambda m, a: a[5], "ValueError"),
    Case("slice_negative_int", (F,), lambda m, a: a[-1], "ok", "float32[3]"),
    Case("slice_step_zero", (F,), lambda m, a: a[::0], "ValueError"),
    Case("slice_ok", ("float32[4,6]",), lambda m, a: a[1:3, ::2], "ok", "float32[2,3]"),
    Case("slice_ellipsis_none", ("float32[4,6]",), lambda m, a: a[..., None, 1], "ok", "float32[4,1]"),
    # -- transpose / permute --------------------------------------------------------------
    Case("transpose_axis_range", (F,), lambda m, a: m.ops.transpose(a, 0, 2), "IndexError"),
    Case("transpose_negative", (F,), lambda m, a: m.ops.transpose(a, -1, -2), "ok", "float32[3,2]"),
    Case("permute_duplicates", (F,), lambda m, a: m.ops.permute(a, [0, 0]), "ValueError"),
    Case("permute_wrong_length", (F,), lambda m, a: m.ops.permute(a, [0]), "ValueError"),
    Case("permute_out_of_range", (F,), lambda m, a: m.ops.permute(a, [0, 2]), "IndexError"),
    Case("permute_negative", ("float32[2,3,4]",), lambda m, a: m.ops.permute(a, [-1, 0, 1]), "ok", "float32[4,2,3]"),
    # -- squeeze / unsqueeze / flatten ----------------------------------------------------
    Case("squeeze_not_one", (F,), lambda m, a: m.ops.squeeze(a, 0), "ValueError"),
    Case("squeeze_axis_range", ("float32[2,1]",), lambda m, a: m.ops.squeeze(a, 2), "IndexError"),
    Case("squeeze_ok", ("float32[2,1]",), lambda m, a: m.ops.squeeze(a, -1), "ok", "float32[2]"),
    Case("unsqueeze_end", (F,), lambda m, a: m.ops.unsqueeze(a, 2), "ok", "float32[2,3,1]"),
    Case("unsqueeze_negative", (F,), lambda m, a: m.ops.unsqueeze(a, -1), "ok", "float32[2,3,1]"),
    Case("unsqueeze_axis_range", (F,), lambda m, a: m.ops.unsqueeze(a, 4), "ValueError"),
    Case("flatten_axis_range", (F,), lambda m, a: m.ops.flatten(a, 0, 2), "IndexError"),
    Case("flatten_start_after_end", ("float32[2,3,4]",), lambda m, a: m.ops.flatten(a, 2, 1), "ValueError"),
    # -- split / chunk --------------------------------------------------------------------
    Case("split_ok", ("float32[5,3]",), lambda m, a: m.ops.split(a, [2, 3]), "ok", "float32[2,3]"),
    Case("split_sum", ("float32[5,3]",), lambda m, a: m.ops.split(a, [2, 2]), "ValueError"),
    Case("split_negative", ("float32[5,3]",), lambda m, a: m.ops.split(a, [6, -1]), "ValueError"),
    Case("split_axis_range", ("float32[5,3]",), lambda m, a: m.ops.split(a, [1, 2], axis=2), "IndexError"),
    Case("split_symbolic", ("float32[n,3]",), lambda m, a: m.ops.split(a, ["n"]), "TypeError"),
    Case("chunk_ok", ("float32[6,3]",), lambda m, a: m.ops.chunk(a, 3), "ok", "float32[2,3]"),
    Case("chunk_uneven", ("float32[5,3]",), lambda m, a: m.ops.chunk(a, 2), "ValueError"),
    Case("chunk_axis_range", ("float32[6,3]",), lambda m, a: m.ops.chunk(a, 2, axis=2), "IndexError"),
    Case("chunk_symbolic", ("float32[n,3]",), lambda m, a: m.ops.chunk(a, 2), "TypeError"),
    # -- tile / pad / repeat_interleave ---------------------------------------------------
    Case("tile_ok", (F,), lambda m, a: m.ops.tile(a, [2, 1]), "ok", "float32[4,3]"),
    Case("tile_wrong_length", (F,), lambda m, a: m.ops.tile(a, [2]), "ValueError"),
    Case("tile_nonpositive", (F,), lambda m, a: m.ops.tile(a, [0, 1]), "ValueError"),
    Case("pad_ok", (F,), lambda m, a: m.ops.pad(a, [1, 0, 0, 2]), "ok", "float32[3,5]"),
    Case("pad_negative", (F,), lambda m, a: m.ops.pad(a, [-1, 0, 0, 0]), "ValueError"),
    Case("pad_mode", (F,), lambda m, a: m.ops.pad(a, [1, 1, 1, 1], mode="circular"), "ValueError"),
    Case("repeat_interleave_negative", (F,), lambda m, a: m.ops.repeat_interleave(a, -1, axis=0), "ValueError"),
    Case("repeat_interleave_axis_range", (F,), lambda m, a: m.ops.repeat_interleave(a, 2, axis=2), "ValueError"),
    # -- reductions -----------------------------------------------------------------------
    Case("sum_axis_range", (F,), lambda m, a: m.ops.sum(a, axis=2), "ValueError"),
    Case("mean_axis_negative_range", (F,), lambda m, a: m.ops.mean(a, axis=-3), "ValueError"),
    Case("max_axis_range", (F,), lambda m, a: m.ops.max(a, axis=2), "ValueError"),
    Case("argmax_axis_range", (F,), lambda m, a: m.ops.argmax(a, axis=2), "ValueError"),
    Case("argmax_dtype", (F,), lambda m, a: m.ops.argmax(a, axis=0), "ok", "int64[1,3]"),
    Case("cumsum_axis_range", (F,), lambda m, a: m.ops.cumsum(a, axis=2), "ValueError"),
    Case("sum_zero_size", ("float32[0,3]",), lambda m, a: m.ops.sum(a, axis=0), "ok", "float32[1,3]"),
    # -- min / max overloads --------------------------------------------------------------
    Case("max_two_tensors", ("float32[2,3]", "float32[3]"), lambda m, a, b: m.ops.max(a, b), "ok", "float32[2,3]"),
    Case("max_axis", (F,), lambda m, a: m.ops.max(a, axis=0), "ok", "float32[1,3]"),
    Case("max_default_axis", (F,), lambda m, a: m.ops.max(a), "ok", "float32[2,1]"),
    Case("min_tensor_and_axis", ("float32[2,3]", "float32[3]"), lambda m, a, b: m.ops.min(a, b, axis=0), "ValueError"),
    Case("min_scalar_other", (F,), lambda m, a: m.ops.min(a, 0.5), "ok", "float32[2,3]"),
    # -- top_k / argsort / band_part ------------------------------------------------------
    Case("top_k_ok", ("float32[2,5]",), lambda m, a: m.ops.top_k(a, 2), "ok", "float32[2,2]"),
    Case("top_k_indices_dtype", ("float32[2,5]",), lambda m, a: m.ops.top_k(a, 2)[1], "ok", "int64[2,2]"),
    Case("top_k_k_too_big", ("float32[2,5]",), lambda m, a: m.ops.top_k(a, 6), "ValueError"),
    Case("top_k_axis_range", ("float32[2,5]",), lambda m, a: m.ops.top_k(a, 1, axis=2), "ValueError"),
    Case("argsort_ok", ("float32[5]",), lambda m, a: m.ops.argsort(a), "ok", "int64[5]"),
    Case("argsort_rank2", ("float32[2,5]",), lambda m, a: m.ops.argsort(a), "ValueError"),
    Case("band_part_rank1", ("float32[5]",), lambda m, a: m.ops.band_part(a, 0, 0), "ValueError"),
    Case("band_part_ok", ("float32[2,4,4]",), lambda m, a: m.ops.band_part(a, None, 0), "ok", "float32[2,4,4]"),
    # -- where ----------------------------------------------------------------------------
    Case("where_ok", ("bool[2,3]", "float32[2,3]", "float32[3]"), lambda m, c, a, b: m.ops.where(c, a, b), "ok", "float32[2,3]"),
    Case("where_condition_not_bool", ("float32[2,3]", "float32[2,3]", "float32[2,3]"), lambda m, c, a, b: m.ops.where(c, a, b), "ValueError"),
    Case("where_shapes", ("bool[2,3]", "float32[4]", "float32[2,3]"), lambda m, c, a, b: m.ops.where(c, a, b), "ValueError"),
    Case("where_devices", ("bool[2,3]", "float32[2,3]", "float32[2,3]@gpu"), lambda m, c, a, b: m.ops.where(c, a, b), "ValueError"),
    # -- norms / outer / range / rebind ---------------------------------------------------
    Case("layer_norm_ok", ("float32[2,4]", "float32[4]", "float32[4]"), lambda m, x, g, b: m.ops.layer_norm(x, g, b, 1e-5), "ok", "float32[2,4]"),
    Case("layer_norm_gamma_shape", ("float32[2,4]", "float32[3]", "float32[4]"), lambda m, x, g, b: m.ops.layer_norm(x, g, b, 1e-5), "ValueError"),
    Case("layer_norm_beta_shape", ("float32[2,4]", "float32[4]", "float32[3]"), lambda m, x, g, b: m.ops.layer_norm(x, g, b, 1e-5), "ValueError"),
    Case("layer_norm_epsilon", ("float32[2,4]", "float32[4]", "float32[4]"), lambda m, x, g, b: m.ops.layer_norm(x, g, b, 0.0), "ValueError"),
    Case("rms_norm_weight_shape", ("float32[2,4]", "float32[3]"), lambda m, x, w: m.ops.rms_norm(x, w, 1e-5), "ValueError"),
    Case("outer_ok", ("float32[3]", "float32[4]"), lambda m, a, b: m.ops.outer(a, b), "ok", "float32[3,4]"),
    Case("outer_rank2", ("float32[2,3]", "float32[4]"), lambda m, a, b: m.ops.outer(a, b), "ValueError"),
    Case("range_ok", (), lambda m: m.ops.range(0, 10, 3, dtype=m.DType.int64, device=m.DeviceRef.CPU()), "ok", "int64[3]"),
    Case("range_negative_step", (), lambda m: m.ops.range(5, 0, -1, dtype=m.DType.int32, device=m.DeviceRef.CPU()), "ok", "int32[5]"),
    Case("range_float", (), lambda m: m.ops.range(0.0, 1.0, 0.25, dtype=m.DType.float32, device=m.DeviceRef.CPU()), "ok", "float32[4]"),
    Case("range_tensor_needs_out_dim", ("int64[]",), lambda m, n: m.ops.range(0, n, 1, dtype=m.DType.int64, device=m.DeviceRef.CPU()), "ValueError"),
    Case("rebind_ok", ("float32[a,3]",), lambda m, a: m.ops.rebind(a, ["b", 3]), "ok", "float32[b,3]"),
    Case("rebind_rank", ("float32[a,3]",), lambda m, a: m.ops.rebind(a, ["b"]), "ValueError"),
    Case("rebind_method", ("float32[a,3]",), lambda m, a: a.rebind(["b", 3]), "ok", "float32[b,3]"),
    # -- casts and dtypes -----------------------------------------------------------------
    Case("cast_ok", (F,), lambda m, a: m.ops.cast(a, m.DType.int64), "ok", "int64[2,3]"),
    Case("int64_input", ("int64[2,3]",), lambda m, a: a, "ok", "int64[2,3]"),
    Case("int64_gather", ("float32[10,4]", "int64[2,5]"), lambda m, e, t: m.ops.gather(e, t, axis=0), "ok", "float32[2,5,4]"),
    Case("int32_table_int64_indices", ("int32[10,4]", "int64[3]"), lambda m, e, t: m.ops.gather(e, t, axis=0), "ok", "int32[3,4]"),
    Case("int64_plus_int32", ("int64[3]", "int32[3]"), lambda m, a, b: a + b, "ok", "int64[3]"),
    Case("int64_softmax_keeps", ("float64[3]",), lambda m, a: m.ops.softmax(a), "ok", "float64[3]"),
    Case("int64_reshape_keeps", ("int64[2,3]",), lambda m, a: m.ops.reshape(a, [6]), "ok", "int64[6]"),
    Case("int64_concat_keeps", ("int64[2]", "int64[3]"), lambda m, a, b: m.ops.concat([a, b]), "ok", "int64[5]"),
    Case("int64_range_default", (), lambda m: m.ops.range(0, 4, 1, dtype=m.DType.int64, device=m.DeviceRef.CPU()) * 2, "ok", "int64[4]"),
    Case("shape_to_tensor_dtype", ("float32[a,3]",), lambda m, a: m.ops.shape_to_tensor(a.shape), "ok", "int64[2]"),
    Case("zero_size_matmul", ("float32[0,3]", "float32[3,4]"), lambda m, a, b: m.ops.matmul(a, b), "ok", "float32[0,4]"),
    Case("zero_size_concat", ("float32[0,3]", "float32[2,3]"), lambda m, a, b: m.ops.concat([a, b]), "ok", "float32[2,3]"),
    Case("zero_size_softmax", ("float32[2,0]",), lambda m, a: m.ops.softmax(a), "ok", "float32[2,0]"),
]  # fmt: skip


#: (lhs, rhs, op) -> MAX's result dtype name, or its exception type name. lhs/rhs are dtype names,
#: or a Python literal ("1", "1.5", "True") for a weak scalar on that side.
PROMOTION_DTYPES = ["bool", "int8", "uint8", "int32", "int64", "uint32", "float16", "bfloat16", "float32", "float64"]
PROMOTION_OPS = ["add", "div", "floor_div", "mul", "pow", "mod", "max", "equal", "where"]
