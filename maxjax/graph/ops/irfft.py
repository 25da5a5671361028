"""MAX's module path ``max.graph.ops.irfft`` (``Normalization``, ``irfft``); the definitions are
in :mod:`maxjax.graph.ops.signal`. ``ops.irfft`` stays the function: this module is imported by
``maxjax.graph.ops`` before the function is bound there (as MAX's package does)."""

from maxjax.graph.ops.signal import Normalization, irfft

__all__ = ["Normalization", "irfft"]
