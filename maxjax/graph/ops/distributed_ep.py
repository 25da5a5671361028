"""``ops.distributed_ep``: MAX's expert-parallel dispatch and combine ops (MAX's
``max.graph.ops.distributed_ep``).

MAX runs these as GPU-only NVSHMEM kernels that move tokens between devices through buffers
addressed by raw device pointers (``send_ptrs``/``recv_ptrs``/``recv_count_ptrs``, host tensors of
uint64 addresses) and atomic counters. maxjax has no such kernels and cannot run them. A graph
records them as MAX does (same arguments, one output per declared type, on each device, so a
program's graph builds and its output types are MAX's), and the graph raises
``NotImplementedError`` naming the op when it is compiled to run. Called on concrete arrays (eager
mode) they raise at once. Nothing is ever computed in their place.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

from maxjax.graph.graph import Node, current_graph
from maxjax.graph.type import TensorType
from maxjax.graph.value import TensorValue

__all__ = [
    "combine", "dispatch_block_scaled_nv", "dispatch_block_scaled_nv_dyn_global_scales", "dispatch_bf16",
    "dispatch_fp8", "dispatch_mxfp4",
]  # fmt: skip


def _message(op: str) -> str:
    return (
        f"ops.distributed_ep.{op}: MAX's expert-parallel kernel is a GPU-only NVSHMEM kernel (raw device "
        "pointers and atomic counters); maxjax cannot run it"
    )


def _unsupported(op: str) -> Any:
    def run(*args: Any) -> Any:
        raise NotImplementedError(_message(op))

    run.__name__ = f"distributed_ep.{op}"
    return run


_RUNNERS = {
    op: _unsupported(op)
    for op in (
        "dispatch_bf16", "dispatch_fp8", "dispatch_block_scaled_nv", "dispatch_block_scaled_nv_dyn_global_scales",
        "dispatch_mxfp4", "combine",
    )
}  # fmt: skip


def _record(op: str, tensors: Sequence[Any], out_types: Sequence[TensorType]) -> list[TensorValue]:
    """One graph node of ``op`` reading ``tensors`` and giving values of ``out_types`` (it raises
    NotImplementedError when the graph is compiled); raises at once outside a graph."""
    graph = next((t._graph for t in tensors if isinstance(t, TensorValue) and t._graph is not None), None)
    graph = graph or current_graph()
    if graph is None:
        raise NotImplementedError(_message(op))
    args = tuple(t for t in tensors if isinstance(t, TensorValue) and t._graph is graph)
    types = list(out_types)
    node = graph._add_node(
        Node(
            "op",
            f"distributed_ep.{op}",
            [t.to_shape_dtype_struct() for t in types],
            fn=_RUNNERS[op],
            args=args,
            treedef=jax.tree.structure(tuple(types)) if len(types) > 1 else None,
            device=types[0].device if types else None,
            dtypes=[t.dtype for t in types],
        )
    )
    return [TensorValue._from_node(graph, node, i) for i in range(len(types))]


def _dispatch(
    op: str, input_tokens: Sequence[Any], topk_ids: Sequence[Any], ptrs: Sequence[Any], extra: Sequence[Sequence[Any]],
    output_types_per_device: Sequence[Sequence[TensorType]],
) -> list[tuple[TensorValue, ...]]:
    """Per device ``i``: one node over its tokens, ids, the pointer tensors and ``extra[k][i]``,
    giving ``output_types_per_device[i]``."""
    if len(input_tokens) == 0:
        raise ValueError("input_tokens must be non-empty")
    out = []
    for i, types in enumerate(output_types_per_device):
        tensors = [input_tokens[i], topk_ids[i], *ptrs, *(e[i] for e in extra)]
        out.append(tuple(_record(op, tensors, types)))
    return out


def dispatch_bf16(
    input_tokens: list[Any],
    topk_ids: list[Any],
    send_ptrs: Any,
    recv_ptrs: Any,
    recv_count_ptrs: Any,
    atomic_counters: list[Any],
    output_types_per_device: list[list[TensorType]],
    *,
    hidden_size: int,
    top_k: int,
    n_experts: int,
    max_token_per_rank: int,
    n_gpus_per_node: int,
    n_nodes: int,
    fused_shared_expert: bool,
) -> list[tuple[TensorValue, ...]]:
    """BF16 token dispatch to the experts' devices (MAX's; see the module docstring).

    Returns:
        Per device, values of its 4 declared types: ``(output_tokens, row_offsets, expert_ids, src_info)``.

    Raises:
        ValueError: no input tokens (MAX's check).
        NotImplementedError: when run (eagerly at once; in a graph when it is compiled).
    """
    ptrs = (send_ptrs, recv_ptrs, recv_count_ptrs)
    return _dispatch("dispatch_bf16", input_tokens, topk_ids, ptrs, (), output_types_per_device)


def dispatch_fp8(
    input_tokens: list[Any],
    topk_ids: list[Any],
    send_ptrs: Any,
    recv_ptrs: Any,
    recv_count_ptrs: Any,
    atomic_counters: list[Any],
    output_types_per_device: list[list[TensorType]],
    *,
    hidden_size: int,
    top_k: int,
    n_experts: int,
    max_token_per_rank: int,
    n_gpus_per_node: int,
    n_nodes: int,
    fused_shared_expert: bool,
    dispatch_scale_granularity: str,
) -> list[tuple[TensorValue, ...]]:
    """FP8 token dispatch (MAX's; see the module docstring).

    Returns:
        Per device, values of its 5 declared types: ``(output_tokens, output_scales, row_offsets,
        expert_ids, src_info)``.

    Raises:
        ValueError: no input tokens (MAX's check).
        NotImplementedError: when run (eagerly at once; in a graph when it is compiled).
    """
    ptrs = (send_ptrs, recv_ptrs, recv_count_ptrs)
    return _dispatch("dispatch_fp8", input_tokens, topk_ids, ptrs, (), output_types_per_device)


def dispatch_block_scaled_nv(
    input_tokens: list[Any],
    topk_ids: list[Any],
    send_ptrs: Any,
    recv_ptrs: Any,
    recv_count_ptrs: Any,
    input_scales: list[Any],
    atomic_counters: list[Any],
    output_types_per_device: list[list[TensorType]],
    *,
    hidden_size: int,
    top_k: int,
    n_experts: int,
    max_token_per_rank: int,
    n_gpus_per_node: int,
    n_nodes: int,
    fused_shared_expert: bool,
) -> list[tuple[TensorValue, ...]]:
    """NVFP4 token dispatch with a static input scale per device (MAX's; see the module docstring).

    Returns:
        Per device, values of its 6 declared types: ``(output_tokens, output_scales, row_offsets,
        scales_offsets, expert_ids, src_info)``.

    Raises:
        ValueError: no input tokens (MAX's check).
        NotImplementedError: when run (eagerly at once; in a graph when it is compiled).
    """
    return _dispatch(
        "dispatch_block_scaled_nv", input_tokens, topk_ids, (send_ptrs, recv_ptrs, recv_count_ptrs), (input_scales,),
        output_types_per_device,
    )


def dispatch_block_scaled_nv_dyn_global_scales(
    input_tokens: list[Any],
    topk_ids: list[Any],
    send_ptrs: Any,
    recv_ptrs: Any,
    recv_count_ptrs: Any,
    atomic_counters: list[Any],
    output_types_per_device: list[list[TensorType]],
    *,
    hidden_size: int,
    top_k: int,
    n_experts: int,
    max_token_per_rank: int,
    n_gpus_per_node: int,
    n_nodes: int,
    fused_shared_expert: bool,
) -> list[tuple[TensorValue, ...]]:
    """NVFP4 token dispatch with a global scale per token, ``2688 / rowmax`` (MAX's; see the module
    docstring).

    Returns:
        Per device, values of its 7 declared types: ``(output_tokens, output_scales,
        output_rowwise_scales, row_offsets, scales_offsets, expert_ids, src_info)``.

    Raises:
        ValueError: no input tokens (MAX's check).
        NotImplementedError: when run (eagerly at once; in a graph when it is compiled).
    """
    return _dispatch(
        "dispatch_block_scaled_nv_dyn_global_scales", input_tokens, topk_ids, (send_ptrs, recv_ptrs, recv_count_ptrs),
        (), output_types_per_device,
    )


def dispatch_mxfp4(
    input_tokens: list[Any],
    topk_ids: list[Any],
    send_ptrs: Any,
    recv_ptrs: Any,
    recv_count_ptrs: Any,
    atomic_counters: list[Any],
    output_types_per_device: list[list[TensorType]],
    *,
    hidden_size: int,
    top_k: int,
    n_experts: int,
    max_token_per_rank: int,
    n_gpus_per_node: int,
    n_nodes: int,
    fused_shared_expert: bool,
    mx_format: str = "auto",
) -> list[tuple[TensorValue, ...]]:
    """MXFP4 token dispatch (MAX's; see the module docstring).

    Returns:
        Per device, values of its 5 declared types: ``(output_tokens, output_scales, row_offsets,
        expert_ids, src_info)``.

    Raises:
        ValueError: no input tokens (MAX's check).
        NotImplementedError: when run (eagerly at once; in a graph when it is compiled).
    """
    ptrs = (send_ptrs, recv_ptrs, recv_count_ptrs)
    return _dispatch("dispatch_mxfp4", input_tokens, topk_ids, ptrs, (), output_types_per_device)


def combine(
    input_tokens: list[Any],
    src_info: list[Any],
    send_ptrs: Any,
    recv_ptrs: Any,
    recv_count_ptrs: Any,
    router_weights: list[Any],
    atomic_counters: list[Any],
    output_types: list[TensorType],
    *,
    hidden_size: int,
    top_k: int,
    n_experts: int,
    max_token_per_rank: int,
    n_gpus_per_node: int,
    n_nodes: int,
    fused_shared_expert: bool,
) -> list[TensorValue]:
    """Returns the experts' outputs to the tokens' devices, weighted by ``router_weights`` and
    summed per token (MAX's; see the module docstring).

    Returns:
        One value per device, of its declared type in ``output_types``.

    Raises:
        ValueError: no input tokens (MAX's check).
        NotImplementedError: when run (eagerly at once; in a graph when it is compiled).
    """
    if len(input_tokens) == 0:
        raise ValueError("input_tokens must be non-empty")
    ptrs = [send_ptrs, recv_ptrs, recv_count_ptrs]
    return [
        _record("combine", [input_tokens[i], src_info[i], *ptrs, router_weights[i]], [t])[0]
        for i, t in enumerate(output_types)
    ]
