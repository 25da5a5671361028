"""``maxjax.nn.comm.ep``: MAX's expert-parallel communication configuration (``max.nn.comm.ep``).

MAX's ``EPBatchManager``, ``EPCommBuffers`` and ``EPCommInitializer`` allocate NVSHMEM buffers for
its GPU-only dispatch/combine kernels and are not provided; the configuration and its arithmetic
(:mod:`maxjax.nn.comm.ep.ep_config`) are.
"""

from maxjax.nn.comm.ep.ep_config import EPConfig, calculate_ep_max_tokens_per_rank

__all__ = ["EPConfig", "calculate_ep_max_tokens_per_rank"]
