"""Expert-parallel (EP) communication configuration (MAX's ``max.nn.comm.ep.ep_config``).

The arithmetic of MAX's EP buffers: how many tokens a rank holds (:func:`calculate_ep_max_tokens_per_rank`),
how many a device can receive (:meth:`EPConfig.get_max_recv_tokens`) and the bytes of one buffer
group (:func:`estimate_ep_memory_usage`). The EP dispatch/combine kernels themselves are MAX's
GPU-only kernels (see :mod:`maxjax.graph.ops.distributed_ep`); this module is their configuration,
checked as MAX checks it. Source: MAX 26.7 ``max/nn/comm/ep/ep_config.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from maxjax.dtype import DType
from maxjax.nn.quant_config import QuantConfig

__all__ = ["EPConfig", "NUM_GROUPS", "calculate_ep_max_tokens_per_rank", "estimate_ep_memory_usage"]

#: MAX keeps two groups of communication buffers, one for the dispatch phase and one for the
#: combine phase, so that a device still reading one phase's buffers is never overwritten.
NUM_GROUPS = 2


def _ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def _nbytes(dtype: DType) -> int:
    """Bytes of one stored element (float4/float6 kinds: one byte, as MAX's ``size_in_bytes``)."""
    return np.dtype(dtype).itemsize


@dataclass
class EPConfig:
    """Configuration of expert-parallel communication (MAX's ``EPConfig``; same fields and defaults).

    Raises:
        ValueError: (construction) a dispatch dtype other than bfloat16 without a
            ``dispatch_quant_config``, an FP4/uint8 dispatch dtype without an FP4 or MXFP6
            config, an unsupported dispatch dtype, ``nvfp4_dyn_global_scales`` without an NVFP4
            config, ``use_allreduce`` with ``n_nodes > 1``, or ``n_nodes > 1`` without MPI
            (``OMPI_COMM_WORLD_SIZE`` unset) -- MAX's checks and messages.
        NotImplementedError: a float8 dispatch dtype with a non-block-wise input scale (MAX's).
    """

    dispatch_dtype: DType
    combine_dtype: DType
    hidden_size: int
    top_k: int
    n_experts: int
    max_tokens_per_rank: int
    n_gpus_per_node: int
    n_nodes: int
    node_id: int = -1
    dispatch_quant_config: QuantConfig | None = None
    nvfp4_dyn_global_scales: bool = False
    fused_shared_expert: bool = False
    fuse_ffn_combine_send: bool = False
    moe_dim: int = 0
    fused_moe_ready: bool = False
    use_allreduce: bool = False
    max_batch_size: int = 0
    eplb_enabled: bool = False
    num_moe_layers: int = 0
    max_replicas: int = 1
    eplb_phy2log_plan: Any = None
    num_logical_experts: int = 0

    def estimate_memory_usage(self) -> int:
        """Bytes of EP communication buffers per device per buffer group
        (:func:`estimate_ep_memory_usage`; local experts only with ``use_allreduce``)."""
        n_experts = self.n_experts // self.n_nodes if self.use_allreduce else self.n_experts
        qc = self.dispatch_quant_config
        return estimate_ep_memory_usage(
            hidden_size=self.hidden_size,
            dispatch_dtype=self.dispatch_dtype,
            combine_dtype=self.combine_dtype,
            max_tokens_per_rank=self.max_tokens_per_rank,
            n_experts=n_experts,
            n_nodes=self.n_nodes,
            n_gpus_per_node=self.n_gpus_per_node,
            top_k=self.top_k,
            use_allreduce=self.use_allreduce,
            dispatch_element_dtype=qc.mx_element_dtype if qc is not None and qc.is_mx else None,
        )

    def get_max_recv_tokens(self) -> int:
        """The most tokens one device can receive: ``max_tokens_per_rank * min(n_experts, ranks * top_k)``
        (``* min(local experts, top_k)`` with ``use_allreduce``)."""
        n_ranks = self.n_gpus_per_node * self.n_nodes
        if self.use_allreduce:
            return self.max_tokens_per_rank * min(self.n_experts // n_ranks, self.top_k)
        return self.max_tokens_per_rank * min(self.n_experts, n_ranks * self.top_k)

    def _max_recv_tokens_per_expert(self, alignment: int = 32) -> int:
        """The most tokens one local expert can receive (every rank sends it all of its tokens),
        rounded up to a multiple of ``alignment``."""
        n_ranks = self.n_gpus_per_node * self.n_nodes
        return _ceildiv(self.max_tokens_per_rank * n_ranks, alignment) * alignment

    def __post_init__(self) -> None:
        if self.num_logical_experts == 0:
            self.num_logical_experts = self.n_experts
        qc = self.dispatch_quant_config
        if self.dispatch_dtype != DType.bfloat16:
            if qc is None:
                raise ValueError("dispatch_quant_config must be specified when dispatch_dtype is not bfloat16")
            if self.dispatch_dtype.is_float8():
                if not qc.input_scale.is_block:
                    raise NotImplementedError(
                        "Only block-wise quantization is supported for float8_e4m3fn and float8_e4m3fnuz"
                    )
            elif self.dispatch_dtype in (DType.uint8, DType.float4_e2m1fn):
                if not (qc.is_fp4 or qc.is_mxfp6):
                    raise ValueError(
                        "dispatch_quant_config must be an FP4 or MXFP6 configuration when dispatch_dtype is uint8 "
                        "or float4_e2m1fn"
                    )
            else:
                raise ValueError(f"Unsupported dispatch dtype: {self.dispatch_dtype}")
        if self.nvfp4_dyn_global_scales and (qc is None or not qc.is_nvfp4):
            raise ValueError("nvfp4_dyn_global_scales requires an NVFP4 dispatch_quant_config")
        if self.use_allreduce and self.n_nodes > 1:
            raise ValueError("Using allreduce as communication backend is not supported when n_nodes > 1")
        if self.n_nodes > 1 and "OMPI_COMM_WORLD_SIZE" not in os.environ:
            ep_size = self.n_gpus_per_node * self.n_nodes
            raise ValueError(
                f"ep_size={ep_size} with {self.n_gpus_per_node} GPU(s) on this node implies {self.n_nodes}-node "
                "multi-node EP, which requires NVSHMEM initialized via MPI — but OMPI_COMM_WORLD_SIZE is not set. "
                f"For a single-node deployment set ep_size={self.n_gpus_per_node} (the number of GPUs on this node)."
            )


def estimate_ep_memory_usage(
    *,
    hidden_size: int,
    dispatch_dtype: DType,
    combine_dtype: DType,
    max_tokens_per_rank: int,
    n_experts: int,
    n_nodes: int,
    n_gpus_per_node: int,
    top_k: int,
    use_allreduce: bool = False,
    dispatch_element_dtype: DType | None = None,
) -> int:
    """Bytes of EP communication buffers per device per buffer group (MAX's formula): the
    dispatch send buffer (``max_tokens_per_rank`` tokens), the dispatch receive buffer (that many
    per expert, local experts only with ``use_allreduce``), the combine send buffer (multi-node
    only) and the combine receive buffer (``top_k`` per token). A uint8/float4 dispatch token
    counts half a byte per element plus its FP8 scales (one per 16 elements); a uint8 MXFP6 token
    (``dispatch_element_dtype`` a float6 kind) 3/4 byte per element plus one scale per 32."""

    def elems_to_bytes(dtype: DType, n: int) -> int:
        if dtype == DType.uint8 and dispatch_element_dtype in (DType.float6_e2m3fn, DType.float6_e3m2fn):
            return n * 3 // 4 + n // 32
        if dtype in (DType.uint8, DType.float4_e2m1fn):
            return int(n // 2 * _nbytes(dtype) * 1.125)
        return n * _nbytes(dtype)

    n_local_experts = n_experts // (n_gpus_per_node * n_nodes)
    d_token = elems_to_bytes(dispatch_dtype, hidden_size)
    dispatch_send = max_tokens_per_rank * d_token
    dispatch_recv = (n_local_experts if use_allreduce else n_experts) * max_tokens_per_rank * d_token
    c_token = hidden_size * _nbytes(combine_dtype)
    combine_send = (
        max_tokens_per_rank * c_token * min(n_experts, n_gpus_per_node * n_nodes * top_k) if n_nodes > 1 else 0
    )
    combine_recv = top_k * max_tokens_per_rank * c_token
    return dispatch_send + dispatch_recv + combine_send + combine_recv


def calculate_ep_max_tokens_per_rank(
    *, max_batch_input_tokens: int, ep_size: int, data_parallel_degree: int, use_allreduce: bool = False
) -> int:
    """Tokens one rank holds for EP dispatch/combine: the whole batch with ``use_allreduce``, else
    ``ceil(max_batch_input_tokens / tp_size)`` with ``tp_size = ep_size // data_parallel_degree``
    (ceiling, as :func:`maxjax.graph.ops.reducescatter.sum` gives the first ``S % tp`` ranks
    ``ceil(S / tp)`` rows)."""
    if use_allreduce:
        return max_batch_input_tokens
    return _ceildiv(max_batch_input_tokens, ep_size // data_parallel_degree)
