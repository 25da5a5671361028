"""``maxjax.backend``: the choices maxjax makes per platform (CPU, GPU, TPU), in one place.

Layer code, ops and the quantized-weight classes are backend-neutral: whatever depends on the
platform (the float32 matmul precision, GEMM operand order, how quantized weights are laid out in
memory, XLA compiler options for maxjax's own jits, the attention layout) is a field or method of
one :class:`BackendPolicy`, chosen from the device platform by :func:`policy_for` (the CPU policy
also reads the CPU's vector features). Nothing here is a global mode: a policy is an object that
``maxjax.engine.Program`` holds and passes to the ops that ask for it when it traces a graph.
"""

from maxjax.backend.cpu import cpu_features, cpu_vector_features
from maxjax.backend.policy import BackendPolicy, cpu_policy, gpu_policy, policy_for, tpu_policy

__all__ = ["BackendPolicy", "cpu_features", "cpu_policy", "cpu_vector_features", "gpu_policy", "policy_for", "tpu_policy"]
