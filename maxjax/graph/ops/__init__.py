"""``maxjax.graph.ops``: MAX's graph ops, each one jnp function (see :mod:`maxjax.graph.ops._core`).

Every op works on symbolic graph values (recording a node), on TensorValues holding arrays, and on
plain JAX arrays or tracers (returning plain arrays).
"""

from maxjax.graph.ops import allreduce
from maxjax.graph.ops._core import apply, op_traits
from maxjax.graph.ops.buffer import buffer_create, buffer_load, buffer_store, buffer_store_slice
from maxjax.graph.ops.call import call
from maxjax.dtype import DType
from maxjax.graph.graph import Graph
from maxjax.graph.type import DeviceRef, TensorType
from maxjax.graph.value import TensorValue
from maxjax.graph.ops.control_flow import cond, while_loop
from maxjax.graph.ops.parallel import constant_external, parallel
from maxjax.graph.ops.scatter import (
    masked_scatter, nonzero, scatter, scatter_add, scatter_max, scatter_min, scatter_mul, scatter_nd_add,
    scatter_nd_max, scatter_nd_min, scatter_nd_mul,
)
from maxjax.graph.ops import irfft as _irfft_module  # noqa: F401 - MAX's module path max.graph.ops.irfft (imported before the function irfft is bound)
from maxjax.graph.ops.signal import as_interleaved_complex, hann_window, irfft
from maxjax.graph.ops.conv import conv2d, conv3d
from maxjax.graph.ops.conv_transpose import conv2d_transpose
from maxjax.graph.ops.fold import fold
from maxjax.graph.ops.nms import non_maximum_suppression
from maxjax.graph.ops.pooling import avg_pool2d, max_pool2d, roi_align
from maxjax.graph.ops.resize import InterpolationMode, resize, resize_bicubic, resize_linear, resize_nearest
from maxjax.graph.ops.group_norm import group_norm
from maxjax.graph.ops.elementwise import (
    abs, acos, add, atanh, ceil, cos, div, equal, erf, exp, floor, floor_div, gelu, greater, greater_equal,
    is_inf, is_nan, log, log1p, logical_and, logical_not, logical_or, logical_xor, mod, mul, negate,
    not_equal, pow, relu, round, rsqrt, sigmoid, silu, sin, sqrt, sub, tanh, trunc, where,
)
from maxjax.graph.ops.nn import dequantize, layer_norm, logsoftmax, matmul, qmatmul, rms_norm, softmax
from maxjax.graph.ops.reduction import (
    argmax, argmin, argsort, bottom_k, cumsum, max, mean, min, prod, sum, top_k,
)
from maxjax.graph.ops.shape import (
    allgather,
    band_part, broadcast_to, cast, chunk, concat, constant, flatten, gather, gather_nd, identity, outer, pad,
    permute, print, range, rebind, repeat_interleave, reshape, scatter_nd, shape_to_tensor, slice_tensor, split, squeeze,
    stack, tile, transfer_to, transpose, unsqueeze,
)

from maxjax.graph.ops import complex  # noqa: E402,A004 - MAX's ops.complex namespace
from maxjax.graph.ops import random  # noqa: E402 - MAX's ops.random namespace
from maxjax.graph.ops import distributed_ep, reducescatter  # noqa: E402 - MAX's ops.distributed_ep / ops.reducescatter namespaces
from maxjax.graph.ops.distributed import distributed_broadcast, distributed_scatter, shard_and_stack  # noqa: E402
from maxjax.graph.ops import bundled_allreduce  # noqa: E402 - MAX's ops.bundled_allreduce namespace
from maxjax.graph.ops.collective_rms_norm import allgather_rms_norm, reduce_scatter_rms_norm  # noqa: E402
__all__ = [
    "conv2d", "conv3d", "group_norm", "buffer_create", "buffer_load", "buffer_store", "buffer_store_slice",
    "conv2d_transpose", "fold", "non_maximum_suppression", "avg_pool2d", "max_pool2d", "roi_align",
    "InterpolationMode", "resize", "resize_bicubic", "resize_linear", "resize_nearest",
    "abs", "acos", "add", "allgather", "allreduce", "apply", "argmax", "argmin", "argsort", "atanh", "band_part", "bottom_k",
    "broadcast_to", "call", "cast", "ceil", "chunk", "concat", "constant", "cos", "cumsum", "dequantize",
    "div", "equal", "erf", "exp", "flatten", "floor", "floor_div", "gather", "gather_nd", "gelu", "greater",
    "greater_equal", "identity", "is_inf", "is_nan", "layer_norm", "log", "log1p", "logical_and",
    "logical_not", "logical_or", "logical_xor", "logsoftmax", "matmul", "max", "mean", "min", "mod", "mul",
    "negate", "not_equal", "op_traits", "outer", "pad", "permute", "pow", "print", "prod", "qmatmul", "range", "rebind",
    "relu", "repeat_interleave", "reshape", "rms_norm", "round", "rsqrt", "scatter_nd", "shape_to_tensor", "sigmoid",
    "silu", "sin", "slice_tensor", "softmax", "split", "sqrt", "squeeze", "stack", "sub", "sum", "tanh",
    "tile", "top_k", "transfer_to", "transpose", "trunc", "unsqueeze", "where",
]  # fmt: skip
__all__ += [
    "DType", "DeviceRef", "Graph", "TensorType", "TensorValue", "as_interleaved_complex", "cond", "constant_external",
    "hann_window", "irfft", "masked_scatter", "nonzero", "parallel", "scatter", "scatter_add", "scatter_max",
    "scatter_min", "scatter_mul", "scatter_nd_add", "scatter_nd_max", "scatter_nd_min", "scatter_nd_mul", "while_loop",
]  # fmt: skip
__all__ += ["distributed_broadcast", "distributed_ep", "distributed_scatter", "reducescatter", "shard_and_stack"]
__all__ += ["allgather_rms_norm", "bundled_allreduce", "reduce_scatter_rms_norm"]
from maxjax.graph.ops.custom import custom, inplace_custom  # noqa: E402 - MAX's ops.custom / ops.inplace_custom
__all__ += ["custom", "inplace_custom"]
