"""``maxjax.engine``: ``InferenceSession`` and ``Model`` (MAX's ``max.engine``), and ``Program``,
the functional form of a loaded graph (``prepare`` the weights once, ``apply`` under ``jax.jit``).
"""

from maxjax.engine.cache import enable_compilation_cache
from maxjax.engine.program import Program
from maxjax.engine.session import InferenceSession, Model, TensorSpec

__all__ = ["InferenceSession", "Model", "Program", "TensorSpec", "enable_compilation_cache"]
