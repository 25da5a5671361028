"""Orbax checkpoints of a module's state: save, restore onto an abstract target, read as ``Weights``.

A checkpoint is an ``orbax-checkpoint`` ``StandardCheckpointer`` directory holding the flat state
dict ``{fqn: jax.Array}`` (the arrays keep their shardings, e.g. ``NamedSharding`` over a mesh).
The quantization encodings of packed weights are kept in the checkpoint's custom metadata, so a
restored Q4_1 weight is again ``WeightData`` with its encoding.

- :func:`save_state` writes a module's (or a state dict's) weights.
- :func:`restore_state` reads them onto an abstract target: ``maxjax.nn.abstract_state(module)``
  (``ShapeDtypeStruct``s with shardings, built from the ``raw_state_dict()`` placeholders), so each
  array lands directly on its devices; the result goes straight into ``module.load_state_dict``.
- :class:`OrbaxWeights` is a checkpoint as a ``Weights`` source (each ``data()`` restores one array).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import jax
import numpy as np

from maxjax.driver import to_jax_array
from maxjax.dtype import DType
from maxjax.graph.graph import did_you_mean
from maxjax.graph.quantization import QuantizationEncoding
from maxjax.graph.type import Shape
from maxjax.graph.weights.errors import WeightsFileError
from maxjax.graph.weights.protocol import HierarchicalWeights, WeightsStore
from maxjax.graph.weights.summary import TensorInfo
from maxjax.graph.weights.weight_data import WeightData

__all__ = ["save_state", "restore_state", "OrbaxWeights", "is_orbax_checkpoint"]

_META_KEY = "maxjax"


def _ocp() -> Any:
    import orbax.checkpoint as ocp  # imported late: it is slow to import

    return ocp


def is_orbax_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a directory written by an orbax Checkpointer (it has ``_CHECKPOINT_METADATA``
    or ``_METADATA``)."""
    path = os.fspath(path)
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, marker)) for marker in ("_CHECKPOINT_METADATA", "_METADATA")
    )


def _state_of(state: Any) -> tuple[dict[str, jax.Array], dict[str, Any]]:
    """``({fqn: jax.Array}, {fqn: encoding info})`` of a Module (anything with ``raw_state_dict``
    and ``state_dict``) or a mapping of arrays."""
    quant: dict[str, Any] = {}
    if hasattr(state, "raw_state_dict") and hasattr(state, "state_dict"):
        values = state.state_dict(auto_initialize=False)  # raises ValueError naming an unloaded weight
        arrays = {}
        for fqn, w in state.raw_state_dict().items():
            arrays[fqn] = to_jax_array(values[fqn], w.sharding)
            enc = w.quantization_encoding
            if enc is not None:
                _, shape = w.original_dtype_and_shape
                quant[fqn] = {"encoding": enc.value, "original_shape": [int(d) for d in shape]}
        return arrays, quant
    if not isinstance(state, Mapping):
        raise TypeError(f"save_state needs a Module or a mapping of arrays, got {type(state).__name__}")
    arrays = {}
    for k, v in state.items():
        if not isinstance(k, str):
            raise TypeError(f"state keys must be str, got {k!r}")
        enc = v.quantization_encoding if isinstance(v, WeightData) else None
        if enc is not None:
            orig = v.original_shape
            quant[k] = {"encoding": enc.value, "original_shape": None if orig is None else [int(d) for d in orig]}
        arrays[k] = to_jax_array(v)
    return arrays, quant


def save_state(directory: str | os.PathLike[str], state: Any, *, overwrite: bool = False) -> str:
    """Writes a state (a Module's loaded weights, or ``{name: array}``) as an orbax checkpoint.

    Arrays are written with their shardings (every process writes its shards); values may be
    ``jax.Array``s, NumPy arrays, Buffers or :class:`WeightData` (quantization encodings are
    kept in the checkpoint's metadata).

    Args:
        directory: the checkpoint directory to create (made absolute).
        state: a ``maxjax.nn.Module`` (every weight must be loaded) or a mapping of arrays.
        overwrite: replace an existing checkpoint at ``directory``.

    Returns:
        The absolute checkpoint path.

    Raises:
        ValueError: a module weight has no value (names it); ``directory`` exists and
            ``overwrite`` is False.
    """
    path = os.path.abspath(os.fspath(directory))
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"{path} already exists; pass overwrite=True to replace it")
    arrays, quant = _state_of(state)
    ocp = _ocp()
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(path, arrays, force=overwrite, custom_metadata={_META_KEY: {"quantization": quant}})
    ckpt.wait_until_finished()
    return path


def _abstract_target(target: Any) -> dict[str, jax.ShapeDtypeStruct] | None:
    if target is None:
        return None
    if hasattr(target, "raw_state_dict"):  # a Module: its Weights' abstract values, with shardings
        return {k: w.shape_dtype_struct for k, w in target.raw_state_dict().items()}
    if not isinstance(target, Mapping):
        raise TypeError(f"target must be a Module or a mapping of ShapeDtypeStructs/arrays, got {type(target).__name__}")
    out = {}
    for k, v in target.items():
        if isinstance(v, jax.ShapeDtypeStruct):
            out[k] = v
        else:
            shape = tuple(int(d) for d in getattr(v, "shape"))
            out[k] = jax.ShapeDtypeStruct(shape, DType.of(v.dtype).to_jax(), sharding=getattr(v, "sharding", None))
    return out


class OrbaxStore(WeightsStore):
    """The arrays of one orbax checkpoint (metadata read at once; data restored on demand)."""

    kind = "orbax checkpoint"
    format_name = "orbax"

    def __init__(self, directory: str | os.PathLike[str], *, target: Any = None, allocated: dict[str, Any] | None = None):
        super().__init__(allocated)
        self.path = os.path.abspath(os.fspath(directory))
        if not os.path.isdir(self.path):
            raise WeightsFileError(self.path, "no such checkpoint directory")
        if not is_orbax_checkpoint(self.path):
            raise WeightsFileError(self.path, "not an orbax checkpoint (no _CHECKPOINT_METADATA or _METADATA file)")
        ocp = _ocp()
        try:
            meta = ocp.StandardCheckpointer().metadata(self.path)
        except Exception as e:
            raise WeightsFileError(self.path, f"cannot read the orbax checkpoint's metadata: {e}") from None
        tree = getattr(meta.item_metadata, "tree", meta.item_metadata)
        if not isinstance(tree, Mapping) or not all(isinstance(k, str) for k in tree):
            raise WeightsFileError(self.path, "not a flat {name: array} checkpoint (as maxjax's save_state writes)")
        self.meta: dict[str, Any] = dict(tree)
        custom = getattr(meta, "custom_metadata", None) or {}
        self.quant: dict[str, Any] = dict((custom.get(_META_KEY) or {}).get("quantization") or {})
        self.custom_metadata = {k: v for k, v in custom.items() if k != _META_KEY}
        self.target = _abstract_target(target)
        if self.target is not None:
            check_target(self.path, self.meta, self.target, partial=True)

    def names(self) -> list[str]:
        return list(self.meta)

    def describe(self) -> str:
        return f"orbax checkpoint ({self.path})"

    def _abstract(self, name: str) -> jax.ShapeDtypeStruct:
        if self.target is not None and name in self.target:
            a = self.target[name]
            if a.sharding is not None:
                return a
        m = self.meta[name]
        return jax.ShapeDtypeStruct(
            tuple(m.shape), m.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])
        )

    def load(self, name: str) -> WeightData:
        from maxjax.driver import Buffer

        arrays = _restore(self.path, {name: self._abstract(name)}, partial=True)
        arr = arrays[name]
        return _weight_data(name, arr, self.quant.get(name), Buffer)

    def infos(self) -> list[TensorInfo]:
        out = []
        for name in self.sorted_names():
            m = self.meta[name]
            dtype = np.dtype(m.dtype)
            shape = tuple(int(d) for d in m.shape)
            q = self.quant.get(name)
            shown = tuple(q["original_shape"]) if q and q.get("original_shape") else shape
            out.append(
                TensorInfo(
                    name, shown, dtype.name, q["encoding"] if q else None, int(np.prod(shape)) * dtype.itemsize, self.path
                )
            )
        return out

    def file_list(self) -> list[str]:
        return [self.path]

    def file_metadata(self) -> dict[str, Any]:
        return dict(self.custom_metadata)


def _weight_data(name: str, arr: Any, q: Mapping[str, Any] | None, wrap: Any) -> WeightData:
    enc = QuantizationEncoding(q["encoding"]) if q else None
    orig = Shape(q["original_shape"]) if q and q.get("original_shape") else None
    return WeightData(wrap(arr), name, DType.of(arr.dtype), Shape(arr.shape), enc, orig)


def check_target(path: str, meta: Mapping[str, Any], target: Mapping[str, jax.ShapeDtypeStruct], *, partial: bool) -> None:
    """Raises ``ValueError`` when ``target`` names unknown arrays (or, unless ``partial``, misses
    some) or differs from the checkpoint in shape or dtype (orbax would silently cast or pad)."""
    problems = []
    for k, a in target.items():
        m = meta.get(k)
        if m is None:
            problems.append(f"{k!r} is not in the checkpoint.{did_you_mean(k, meta)}")
            continue
        if tuple(a.shape) != tuple(m.shape):
            problems.append(f"{k!r}: the target's shape is {tuple(a.shape)}, the checkpoint's {tuple(m.shape)}")
        elif np.dtype(a.dtype) != np.dtype(m.dtype):
            problems.append(f"{k!r}: the target's dtype is {np.dtype(a.dtype)}, the checkpoint's {np.dtype(m.dtype)}")
    if not partial:
        missing = sorted(set(meta) - set(target))
        if missing:
            problems.append(f"the target lacks {len(missing)} array(s) of the checkpoint: {missing[:5]}")
    if problems:
        raise ValueError(f"{path}: cannot restore onto this target:\n  " + "\n  ".join(problems))


def _restore(path: str, abstract: dict[str, jax.ShapeDtypeStruct], *, partial: bool) -> dict[str, jax.Array]:
    ocp = _ocp()
    ckptr = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
    args = ocp.args.PyTreeRestore(
        item=abstract,
        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
        partial_restore=partial,
    )
    try:
        return ckptr.restore(path, args=args)
    except Exception as e:
        names = ", ".join(sorted(abstract)[:3]) + (", ..." if len(abstract) > 3 else "")
        raise WeightsFileError(path, f"cannot restore {names}: {type(e).__name__}: {e}") from None


def restore_state(directory: str | os.PathLike[str], target: Any = None) -> dict[str, jax.Array]:
    """Reads a checkpoint written by :func:`save_state` as ``{fqn: jax.Array}``.

    Args:
        directory: the checkpoint.
        target: where the arrays go: a ``maxjax.nn.Module`` (its ``abstract_state``: shapes, dtypes
            and each Weight's ``sharding``), or a mapping of ``jax.ShapeDtypeStruct`` (with
            shardings). Must name exactly the checkpoint's arrays. None: every array on the
            default device.

    Returns:
        ``{fqn: jax.Array}``, ready for ``module.load_state_dict``. Quantized weights come back as
        their packed ``uint8`` arrays (use :class:`OrbaxWeights` for ``WeightData`` with encodings).

    Raises:
        ValueError: the target's names, shapes or dtypes differ from the checkpoint's (all listed).
        WeightsFileError: not an orbax checkpoint, or orbax fails to read it.
    """
    store = OrbaxStore(directory)
    if target is None:
        abstract = {k: store._abstract(k) for k in store.meta}
    else:
        abstract = _abstract_target(target)
        check_target(store.path, store.meta, abstract, partial=False)
        device0 = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = {
            k: a if a.sharding is not None else jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device0)
            for k, a in abstract.items()
        }
    return _restore(store.path, abstract, partial=False)


class OrbaxWeights(HierarchicalWeights):
    """An orbax checkpoint written by :func:`save_state`, as a ``Weights`` source.

    Args:
        directory: the checkpoint directory.
        target: optional Module or mapping of ``ShapeDtypeStruct``s: arrays it names are restored
            with its shardings (others on the default device). Checked against the checkpoint.
        prefix: the hierarchical name of this view.
        allocated: the dict that collects allocated data (shared by every view).

    ``data()`` restores one array (quantized ones with their encoding and float shape).

    Raises:
        WeightsFileError: not an orbax checkpoint.
        ValueError: ``target`` disagrees with the checkpoint.
    """

    __slots__ = ()

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        target: Any = None,
        prefix: str = "",
        allocated: dict[str, Any] | None = None,
    ):
        super().__init__(OrbaxStore(directory, target=target, allocated=allocated), prefix)

    @property
    def metadata(self) -> dict[str, Any]:
        """The checkpoint's custom metadata (without maxjax's own entry)."""
        return self._store.file_metadata()

    def restore_all(self, names: Iterable[str] | None = None) -> dict[str, WeightData]:
        """Every array under this view (or ``names``) in one orbax restore, as ``WeightData``."""
        from maxjax.driver import Buffer

        store = self._store
        wanted = list(names) if names is not None else [n for n, _ in self.items()]
        for n in wanted:
            if n not in store:
                raise store.missing(n)
        arrays = _restore(store.path, {n: store._abstract(n) for n in wanted}, partial=True)
        return {n: _weight_data(n, arrays[n], store.quant.get(n), Buffer) for n in wanted}
