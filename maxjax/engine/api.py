"""``maxjax.engine.api``: where MAX keeps ``InferenceSession`` and ``Model`` (``max.engine.api``);
the same objects as :mod:`maxjax.engine`, defined in :mod:`maxjax.engine.session`."""

from maxjax.engine.session import (
    CompiledModel,
    GPUProfilingMode,
    InferenceSession,
    Model,
    PrintStyle,
    TensorSpec,
)

__all__ = ["CompiledModel", "GPUProfilingMode", "InferenceSession", "Model", "PrintStyle", "TensorSpec"]
