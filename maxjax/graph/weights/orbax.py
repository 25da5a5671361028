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

Saving over a checkpoint is atomic: the new one is written beside the old one and swapped in by
renames (see :mod:`maxjax.graph.weights._atomic_dir`), so a process killed while saving leaves the
old checkpoint or the new one, complete, and readers open whichever is the last complete one.

Every array's SHA-256 (of its bytes, C order) is kept in the custom metadata with the encodings and
checked when the array is restored, so a damaged data file is an error naming the array, never
different values. (Arrays that span several processes are not hashed: that would gather them.)
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Iterable, Mapping

import jax
import numpy as np

from maxjax.driver import to_jax_array
from maxjax.dtype import DType
from maxjax.graph.graph import did_you_mean
from maxjax.graph.quantization import QuantizationEncoding
from maxjax.graph.type import Shape
from maxjax.graph.weights import _atomic_dir
from maxjax.graph.weights._orbax_calls import one_line, quiet_reads
from maxjax.graph.weights._orbax_metadata import META_KEY, STEP_METADATA, TREE_METADATA, read_metadata
from maxjax.graph.weights.errors import WeightsFileError
from maxjax.graph.weights.protocol import HierarchicalWeights, WeightsStore
from maxjax.graph.weights.summary import TensorInfo
from maxjax.graph.weights.weight_data import WeightData

__all__ = ["save_state", "restore_state", "OrbaxWeights", "is_orbax_checkpoint", "resolve_checkpoint"]


def _ocp() -> Any:
    import orbax.checkpoint as ocp  # imported late: it is slow to import

    return ocp


def is_orbax_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a directory written by an orbax Checkpointer (it has ``_CHECKPOINT_METADATA``
    or ``_METADATA``)."""
    path = os.fspath(path)
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, marker)) for marker in (STEP_METADATA, TREE_METADATA)
    )


def resolve_checkpoint(path: str | os.PathLike[str]) -> str:
    """The directory holding the last complete checkpoint saved at ``path``: ``path`` itself, or,
    after a save that was killed while swapping the new checkpoint in, the one it left beside
    ``path``. Reads only."""
    return _atomic_dir.live_path(os.path.abspath(os.fspath(path)), is_orbax_checkpoint)


def _sha256(arr: Any) -> str | None:
    """SHA-256 of an array's bytes in C order (None for an array this process does not hold whole)."""
    if not getattr(arr, "is_fully_addressable", True):
        return None
    host = np.ascontiguousarray(np.asarray(arr))
    return hashlib.sha256(host.reshape(-1).view(np.uint8)).hexdigest()


def _state_of(state: Any) -> tuple[dict[str, jax.Array], dict[str, Any]]:
    """``({fqn: jax.Array}, {fqn: encoding info})`` of a Module (anything with ``raw_state_dict``
    and ``state_dict``) or a mapping of arrays."""
    quant: dict[str, Any] = {}
    if hasattr(state, "raw_state_dict") and hasattr(state, "state_dict"):
        values = state.state_dict(auto_initialize=False)  # raises ValueError naming an unloaded weight
        arrays = {}
        for fqn, w in state.raw_state_dict().items():
            arrays[fqn] = w.storage_array(values[fqn])  # the declared layout, sharded as stored
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
    kept in the checkpoint's metadata, with each array's SHA-256).

    The checkpoint is written beside ``directory`` and renamed into place when complete; an
    existing one is replaced only then (atomically: a process killed meanwhile leaves the old
    checkpoint or the new one, each whole, and ``restore_state`` finds the last complete one).
    What an earlier, interrupted save left beside ``directory`` is completed or removed first.

    Args:
        directory: the checkpoint directory to create (made absolute).
        state: a ``maxjax.nn.Module`` (every weight must be loaded) or a mapping of arrays.
        overwrite: replace an existing checkpoint at ``directory``.

    Returns:
        The absolute checkpoint path.

    Raises:
        ValueError: a module weight has no value (names it); ``directory`` exists and
            ``overwrite`` is False.
        TypeError: ``state`` is neither a Module nor a mapping with ``str`` keys.
        OSError: the checkpoint cannot be written or renamed into place.
    """
    path = os.path.abspath(os.fspath(directory))
    primary = jax.process_index() == 0
    if primary:
        _atomic_dir.recover(path, is_orbax_checkpoint)
    _sync("maxjax_save_state_recovered")
    if os.path.lexists(path) and not overwrite:
        raise ValueError(f"{path} already exists; pass overwrite=True to replace it")
    arrays, quant = _state_of(state)
    sums = {k: h for k, a in arrays.items() if (h := _sha256(a)) is not None}
    ocp = _ocp()
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(
            _atomic_dir.staging_path(path), arrays, custom_metadata={META_KEY: {"quantization": quant, "sha256": sums}}
        )
        ckpt.wait_until_finished()
    if primary:
        _atomic_dir.swap_in(path)
    _sync("maxjax_save_state_swapped")
    return path


def _sync(name: str) -> None:
    """A barrier across processes (nothing to do in a single process)."""
    if jax.process_count() > 1:
        _ocp().multihost.sync_global_processes(name)


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
        requested = os.path.abspath(os.fspath(directory))
        self.path = resolve_checkpoint(requested)
        if not os.path.isdir(self.path):
            raise WeightsFileError(requested, "no such checkpoint directory")
        if not is_orbax_checkpoint(self.path):
            raise WeightsFileError(self.path, f"not an orbax checkpoint (no {STEP_METADATA} or {TREE_METADATA} file)")
        _ocp()
        info = read_metadata(self.path)
        self.meta: dict[str, Any] = info.arrays
        self.quant: dict[str, Any] = info.quantization
        self.sha256: dict[str, str] = info.sha256
        self.custom_metadata = info.custom
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

        arrays = self.restore({name: self._abstract(name)}, partial=True)
        arr = arrays[name]
        return _weight_data(name, arr, self.quant.get(name), Buffer)

    def restore(self, abstract: dict[str, jax.ShapeDtypeStruct], *, partial: bool) -> dict[str, jax.Array]:
        """Restores the arrays of ``abstract`` and checks each against its recorded SHA-256.

        Raises:
            WeightsFileError: orbax/tensorstore cannot read an array (the cause, on one line), or an
                array's bytes differ from its checksum (names the array).
        """
        ocp = _ocp()
        ckptr = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
        args = ocp.args.PyTreeRestore(
            item=abstract,
            restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
            partial_restore=partial,
        )
        try:
            with quiet_reads():
                arrays = ckptr.restore(self.path, args=args)
        except Exception as e:
            names = ", ".join(sorted(abstract)[:3]) + (", ..." if len(abstract) > 3 else "")
            raise WeightsFileError(self.path, f"cannot restore {names}: {one_line(e)}") from None
        finally:
            ckptr.close()
        for name in abstract:
            want = self.sha256.get(name)
            got = _sha256(arrays[name]) if want is not None else None
            if got is not None and got != want:
                raise WeightsFileError(
                    self.path,
                    f"array {name!r} does not match its checksum (SHA-256 {got[:16]}..., recorded {want[:16]}...): "
                    "the checkpoint's data is damaged",
                )
        return arrays

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
        raise ValueError(f"{path}: cannot restore onto this target: " + "; ".join(problems))


def restore_state(directory: str | os.PathLike[str], target: Any = None) -> dict[str, jax.Array]:
    """Reads a checkpoint written by :func:`save_state` as ``{fqn: jax.Array}``.

    Args:
        directory: the checkpoint (after a save killed while swapping a new checkpoint in, the last
            complete one it left, see :func:`resolve_checkpoint`).
        target: where the arrays go: a ``maxjax.nn.Module`` (its ``abstract_state``: shapes, dtypes
            and each Weight's ``sharding``), or a mapping of ``jax.ShapeDtypeStruct`` (with
            shardings). Must name exactly the checkpoint's arrays. None: every array on the
            default device.

    Returns:
        ``{fqn: jax.Array}``, ready for ``module.load_state_dict``. Quantized weights come back as
        their packed ``uint8`` arrays (use :class:`OrbaxWeights` for ``WeightData`` with encodings).

    Raises:
        ValueError: the target's names, shapes or dtypes differ from the checkpoint's (all listed).
        WeightsFileError: not an orbax checkpoint; a damaged metadata file (naming it and the
            defect); orbax cannot read an array (the cause); an array differs from its recorded
            SHA-256 (naming the array).
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
    return store.restore(abstract, partial=False)


class OrbaxWeights(HierarchicalWeights):
    """An orbax checkpoint written by :func:`save_state`, as a ``Weights`` source.

    Args:
        directory: the checkpoint directory.
        target: optional Module or mapping of ``ShapeDtypeStruct``s: arrays it names are restored
            with its shardings (others on the default device). Checked against the checkpoint.
        prefix: the hierarchical name of this view.
        allocated: the dict that collects allocated data (shared by every view).

    ``data()`` restores one array (quantized ones with their encoding and float shape) and checks
    it against its recorded SHA-256, raising a ``WeightsFileError`` naming it when it differs or
    cannot be read.

    Raises:
        WeightsFileError: not an orbax checkpoint, or a damaged metadata file (naming it and the
            defect).
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
        """Every array under this view (or ``names``) in one orbax restore, as ``WeightData``.

        Raises:
            KeyError: a name that is not in the checkpoint.
            WeightsFileError: orbax cannot read an array, or one differs from its recorded SHA-256.
        """
        from maxjax.driver import Buffer

        store = self._store
        wanted = list(names) if names is not None else [n for n, _ in self.items()]
        for n in wanted:
            if n not in store:
                raise store.missing(n)
        arrays = store.restore({n: store._abstract(n) for n in wanted}, partial=True)
        return {n: _weight_data(n, arrays[n], store.quant.get(n), Buffer) for n in wanted}
