"""``maxjax.engine``: ``InferenceSession`` and ``Model`` (MAX's ``max.engine``), and ``Program``,
the functional form of a loaded graph (``prepare`` the weights once, ``apply`` under ``jax.jit``).

Every public name of MAX 26.7's ``max.engine`` is here; MAX's compiled-artifact (MEF) and Mojo
runtime switches answer as MAX does when off, or refuse by name (see :mod:`maxjax.engine.session`).
"""

from maxjax.engine.cache import enable_compilation_cache
from maxjax.engine.program import Program
from maxjax.engine.session import (
    ArtifactBodyMismatch,
    CompilationStopped,
    CompiledModel,
    CompileOnlyExecutionError,
    CompileOnlyModel,
    CustomExtensionsType,
    DebugConfig,
    GPUProfilingMode,
    InferenceSession,
    LogLevel,
    MefStore,
    MissingArtifactError,
    Model,
    PrintStyle,
    TensorSpec,
    read,
)

__all__ = [
    "ArtifactBodyMismatch", "CompilationStopped", "CompileOnlyExecutionError", "CompileOnlyModel", "CompiledModel",
    "DebugConfig", "InferenceSession", "LogLevel", "MefStore", "MissingArtifactError", "Model", "PrintStyle",
    "TensorSpec", "read",
    # maxjax
    "Program", "enable_compilation_cache",
]  # fmt: skip
