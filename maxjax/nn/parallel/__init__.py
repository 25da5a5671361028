"""``maxjax.nn.parallel``: MAX's thread-parallel NumPy helpers (``max.nn.parallel``)."""

from maxjax.nn.parallel.numpy_parallel_ops import ParallelArrayOps

__all__ = ["ParallelArrayOps"]
