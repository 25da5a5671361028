"""The ``Weights`` protocol and the hierarchical naming that every Weights source shares.

``Weights`` is MAX's runtime-checkable protocol (seed ``max-graph-weights-Weights.txt``).
:class:`HierarchicalWeights` implements it over a :class:`WeightsStore` (the tensors of one
checkpoint: names and a loader); a view is a store plus a name, so views are cheap and every view
of one checkpoint shares its open files and its ``allocated_weights``.

Better than MAX 26.7 (``../shared/max-api-26.7.md``):

- ``items()`` matches on whole name components: ``weights.layers[1].items()`` yields
  ``layers.1`` and ``layers.1.*`` but not ``layers.10.*``. Items come in natural order
  (``layers.2`` before ``layers.10``).
- ``allocate`` checks before it records: a failed ``allocate`` leaves ``allocated_weights`` as it was.
- a missing name raises ``KeyError`` with a "did you mean", and says when the name is a prefix.
- ``list(weights)`` raises ``TypeError`` (MAX loops forever through ``__getitem__``).

Names that are also methods (``data``, ``items``, ``name``, ...) or start with ``_`` are reached
with indexing: ``weights.layers[0]["data"]``.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, Protocol, Self, Sequence, runtime_checkable

from maxjax.dtype import DType
from maxjax.graph.graph import did_you_mean
from maxjax.graph.type import DeviceRef, Shape
from maxjax.graph.weight import Weight
from maxjax.graph.weights.weight_data import WeightData

__all__ = ["Weights", "HierarchicalWeights", "WeightsStore", "natural_key", "select_prefix"]


@runtime_checkable
class Weights(Protocol):
    """Hierarchically named access to a checkpoint's weights (MAX's ``max.graph.weights.Weights``).

    ``weights.model.layers[0].attention.weight`` names ``"model.layers.0.attention.weight"``;
    ``data()`` reads it as :class:`WeightData`, ``allocate(...)`` makes a graph
    :class:`~maxjax.graph.Weight` for it and records its data in ``allocated_weights`` (the
    ``weights_registry`` to give ``InferenceSession.load``).
    """

    @property
    def name(self) -> str: ...

    def __getattr__(self, attr: str) -> Self: ...

    def __getitem__(self, idx: int | str) -> Self: ...

    def exists(self) -> bool: ...

    def items(self) -> Iterator[tuple[str, Self]]: ...

    def data(self) -> WeightData: ...

    def allocate(
        self,
        dtype: DType | None = None,
        shape: Iterable[Any] | None = None,
        quantization_encoding: Any = None,
        device: DeviceRef = ...,
    ) -> Weight: ...

    @property
    def allocated_weights(self) -> dict[str, Any]: ...


def natural_key(name: str) -> list[Any]:
    """Sort key putting numeric name components in numeric order (``layers.2`` < ``layers.10``)."""
    parts: list[Any] = re.split(r"(\d+)", name)
    parts[1::2] = [int(p) for p in parts[1::2]]
    return parts


def select_prefix(names: Iterable[str], prefix: str) -> list[str]:
    """The names equal to ``prefix`` or under it at a ``.`` boundary, in natural order."""
    if not prefix:
        return sorted(names, key=natural_key)
    dotted = prefix + "."
    return sorted((n for n in names if n == prefix or n.startswith(dotted)), key=natural_key)


class WeightsStore:
    """The tensors of one checkpoint, as the views of :class:`HierarchicalWeights` see them.

    A subclass implements :meth:`names` and :meth:`load` (and may refine :meth:`make_weight` and
    :meth:`missing`). ``allocated`` is the dict behind ``allocated_weights``.
    """

    #: How messages name the checkpoint ("Safetensor checkpoint", "GGUF file", ...).
    kind = "checkpoint"

    def __init__(self, allocated: dict[str, Any] | None = None):
        self.allocated: dict[str, Any] = {} if allocated is None else allocated
        self._sorted: list[str] | None = None

    # -- to implement ------------------------------------------------------------------------
    def names(self) -> Sequence[str]:
        """Every tensor name."""
        raise NotImplementedError

    def load(self, name: str) -> WeightData:
        """The data of tensor ``name`` (which exists)."""
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------
    def sorted_names(self) -> list[str]:
        if self._sorted is None:
            self._sorted = sorted(self.names(), key=natural_key)
        return self._sorted

    def __contains__(self, name: str) -> bool:
        return name in self._name_set()

    def _name_set(self) -> set[str]:
        cached = getattr(self, "_names_cache", None)
        if cached is None:
            cached = set(self.names())
            self._names_cache = cached
        return cached

    def invalidate(self) -> None:
        """Forget cached name lists (for stores whose names change, such as a graph's)."""
        self._sorted = None
        self.__dict__.pop("_names_cache", None)

    def describe(self) -> str:
        """Where the weights come from, for messages (``"model.safetensors"``)."""
        return self.kind

    def missing(self, name: str) -> KeyError:
        """The ``KeyError`` for a name that is not a tensor (did-you-mean, prefix hint)."""
        names = self.sorted_names()
        if not name:
            return KeyError(
                f"No weight name given: index the weights first (e.g. weights[{names[0]!r}])"
                if names
                else f"The {self.describe()} has no weights"
            )
        under = select_prefix(names, name)
        if under:
            hint = f" It is a prefix of {len(under)} weight(s), e.g. {under[0]!r}: use .items() to list them."
        else:
            hint = did_you_mean(name, names)
        return KeyError(f"{name!r} is not a weight in the {self.describe()}.{hint}")

    def make_weight(
        self,
        name: str,
        wd: WeightData,
        dtype: DType | None,
        shape: Iterable[Any] | None,
        quantization_encoding: Any,
        device: DeviceRef,
    ) -> Weight:
        """Checks the request against the data and returns the graph Weight for it.

        Raises:
            ValueError: ``dtype`` or ``shape`` differ from the data's (MAX's message), or a
                ``quantization_encoding`` is given for unquantized data.
        """
        if quantization_encoding is not None and quantization_encoding != wd.quantization_encoding:
            raise ValueError(
                f"Weight {name!r} in the {self.describe()} is "
                f"{'not quantized' if wd.quantization_encoding is None else wd.quantization_encoding.value}, "
                f"but quantization_encoding={quantization_encoding} was requested"
            )
        check_request(name, wd, dtype, shape)
        return Weight(name, wd.dtype, wd.shape, device, wd.quantization_encoding, align=1)


def check_request(name: str, wd: WeightData, dtype: DType | None, shape: Iterable[Any] | None) -> None:
    """Raises MAX's ``ValueError`` when ``dtype``/``shape`` (if given) differ from ``wd``'s.

    For quantized data the shape may be the packed ``[rows, bytes_per_row]`` or the float
    ``original_shape``; the dtype may be ``uint8`` (packed) only.
    """
    if shape is not None:
        requested = tuple(shape)
        want = Shape(requested)
        ok = want == wd.shape or (wd.original_shape is not None and want == wd.original_shape)
        if not ok:
            raise ValueError(
                f"Value provided to weight {name!r} had different shape "
                f"(expected={requested}, actual={tuple(wd.shape)})"
            )
    if dtype is not None and DType.of(dtype) != wd.dtype:
        raise ValueError(
            f"Value provided to weight {name!r} had different dtype (expected={DType.of(dtype)!r}, "
            f"actual={wd.dtype!r}); to convert, use .data().astype({DType.of(dtype)!r})"
        )


class HierarchicalWeights:
    """A view of a :class:`WeightsStore` at one hierarchical name; implements :class:`Weights`.

    Subclasses (one per format) build their store in ``__init__`` and call
    ``HierarchicalWeights.__init__(self, store, prefix)``.
    """

    __slots__ = ("_store", "_prefix")

    def __init__(self, store: WeightsStore, prefix: str = ""):
        object.__setattr__(self, "_store", store)
        object.__setattr__(self, "_prefix", prefix)

    @classmethod
    def _view(cls, store: WeightsStore, prefix: str) -> Self:
        view = object.__new__(cls)
        HierarchicalWeights.__init__(view, store, prefix)
        return view

    # -- naming ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The hierarchical name of this view (``"layers.0.mlp"``; ``""`` at the root)."""
        return self._prefix

    def _child(self, part: str) -> Self:
        return self._view(self._store, f"{self._prefix}.{part}" if self._prefix else part)

    def __getattr__(self, attr: str) -> Self:
        if attr.startswith("_"):
            raise AttributeError(
                f"{type(self).__name__} has no attribute {attr!r} (for a weight name starting with '_', "
                f"index instead: weights[{attr!r}])"
            )
        return self._child(attr)

    def __getitem__(self, idx: int | str) -> Self:
        if isinstance(idx, bool) or not isinstance(idx, (int, str)):
            raise TypeError(f"weights can be indexed by an int or a str, got {type(idx).__name__}")
        return self._child(str(idx))

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} views are read-only (cannot set {attr!r})")

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(f"{type(self).__name__} is not iterable: use .items() to list its weights")

    def __contains__(self, name: str) -> bool:
        """Whether ``name`` (relative to this view) is a weight: ``"0.mlp.weight" in weights.layers``."""
        full = f"{self._prefix}.{name}" if self._prefix else name
        return full in self._store

    def __dir__(self) -> list[str]:
        prefix = f"{self._prefix}." if self._prefix else ""
        children = {n[len(prefix) :].split(".", 1)[0] for n in select_prefix(self._store.names(), self._prefix)}
        return sorted(set(super().__dir__()) | {c for c in children if c.isidentifier()})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._prefix!r}, {self._store.describe()})"

    # -- queries -----------------------------------------------------------------------------
    def exists(self) -> bool:
        """True if a tensor has exactly this name (False for a prefix of names)."""
        return self._prefix in self._store

    def items(self) -> Iterator[tuple[str, Self]]:
        """``(full name, view)`` of every tensor named this name or under it (``.``-boundary match),
        in natural order."""
        for n in select_prefix(self._store.sorted_names(), self._prefix):
            yield n, self._view(self._store, n)

    def data(self) -> WeightData:
        """The tensor of this name as :class:`WeightData` (read from the file now).

        Raises:
            KeyError: no tensor has this name (with "did you mean", or the prefix it is).
            WeightsFileError: the tensor's data cannot be read (names the file and the tensor).
        """
        if self._prefix not in self._store:
            raise self._store.missing(self._prefix)
        return self._store.load(self._prefix)

    def allocate(
        self,
        dtype: DType | None = None,
        shape: Iterable[Any] | None = None,
        quantization_encoding: Any = None,
        device: DeviceRef = DeviceRef.CPU(),
    ) -> Weight:
        """A graph :class:`~maxjax.graph.Weight` named this name, with the tensor's dtype and shape;
        its data goes into ``allocated_weights`` (the weights registry).

        ``dtype``/``shape`` (when given) must match the tensor's: they are checks, not conversions
        (convert with ``.data().astype(...)``). For a quantized tensor the Weight is the packed
        ``uint8 [rows, bytes_per_row]`` with the tensor's encoding; ``shape`` may be packed or float.

        Raises:
            KeyError: no tensor has this name.
            ValueError: ``dtype``, ``shape`` or ``quantization_encoding`` do not match the tensor (as
                in MAX, but nothing is recorded then).
        """
        wd = self.data()
        weight = self._store.make_weight(self._prefix, wd, dtype, shape, quantization_encoding, device)
        self._store.allocated[self._prefix] = wd.data
        return weight

    @property
    def allocated_weights(self) -> dict[str, Any]:
        """Name -> data of every weight allocated through any view of these weights (one shared dict)."""
        return self._store.allocated
