"""``maxjax.graph.weights``: model weights from files (MAX's ``max.graph.weights``).

- :class:`Weights`: the runtime-checkable protocol (hierarchical names, ``data()``, ``allocate()``).
- :class:`WeightData`: one weight's data and metadata.
- :class:`SafetensorWeights` (one file, many, or a sharded ``*.safetensors.index.json``),
  :class:`GGUFWeights` (quantized tensors stay packed), :class:`OrbaxWeights` (orbax checkpoints of
  a module's state; see :func:`save_state` / :func:`restore_state`).
- :func:`load_weights` / :func:`weights_format` / :class:`WeightsFormat`: pick the reader.
- ``WeightsAdapter`` and the name-table machinery of :mod:`maxjax.graph.weights.adapters`
  (each architecture's tables live in its folder of :mod:`maxjax.models`).

Every reader is lazy (headers at construction, tensor data at ``data()``/``allocate()``), keeps one
memory map per file, and raises :class:`WeightsFileError` (a ``ValueError`` naming the file and the
defect) for files it cannot read.
"""

from maxjax.graph.weights.adapters import WeightsAdapter
from maxjax.graph.weights.errors import WeightsFileError
from maxjax.graph.weights.format import WeightsFormat, load_weights, weights_format
from maxjax.graph.weights.gguf import GGUFWeights
from maxjax.graph.weights.orbax import OrbaxWeights, restore_state, save_state
from maxjax.graph.weights.protocol import Weights
from maxjax.graph.weights.safetensors import SafetensorWeights
from maxjax.graph.weights.summary import TensorInfo, WeightsSummary, summarize
from maxjax.graph.weights.weight_data import WeightData

__all__ = [
    "GGUFWeights",
    "OrbaxWeights",
    "SafetensorWeights",
    "TensorInfo",
    "WeightData",
    "Weights",
    "WeightsAdapter",
    "WeightsFileError",
    "WeightsFormat",
    "WeightsSummary",
    "load_weights",
    "restore_state",
    "save_state",
    "summarize",
    "weights_format",
]
