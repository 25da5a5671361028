"""maxjax: the module system of Modular's MAX (``max.graph``, ``max.graph.weights``, ``max.nn``,
``max.engine``), rebuilt on JAX.

A program written for MAX's Python API runs with ``max`` replaced by ``maxjax`` in its imports.
"""

__version__ = "0.1.0"
