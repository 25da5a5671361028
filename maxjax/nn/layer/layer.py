"""``maxjax.nn.layer.layer``: ``Layer``, ``Module``, ``Shardable`` and the layer hooks.

Mirrors MAX 26.7's ``max/nn/layer/layer.py`` (seeds ``max-nn-Module.txt`` and
``max-pipelines-nn-layer.txt``):

- ``Module.__setattr__`` registers sub-modules by attribute name and Weights by the Weight's own
  name; a weight's fully-qualified name (FQN) is the module path plus that name (``"up.weight"``).
- ``state_dict()`` / ``load_state_dict()`` / ``raw_state_dict()`` give weights their FQNs.
- Hooks (``add_layer_hook``) run after every layer's ``__call__`` with
  ``(layer, args, kwargs, outputs)``; a non-None return replaces the outputs.

Better than MAX 26.7: ``load_state_dict`` checks everything before changing anything and returns
the missing/unexpected keys with ``strict=False``; ``LayerList.append/insert/extend`` register
their layers; ``build_subgraph`` never renames Weights; hooks return removable handles.

Calling a module on JAX or NumPy arrays (eager mode) wraps them as TensorValues for the layer
code and returns JAX arrays; calling it on graph values records into the graph.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Protocol, Sequence, runtime_checkable

import jax
import numpy as np

from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.graph.binding import bind, current_binding
from maxjax.graph.graph import Graph, as_tensor_type, current_graph, layer_scope
from maxjax.graph.type import Shape, StaticDim, TensorType
from maxjax.graph.value import TensorValue
from maxjax.graph.weight import Weight
from maxjax.graph.weights.weight_data import WeightData

__all__ = [
    "Layer",
    "LayerV2",
    "Module",
    "Shardable",
    "add_layer_hook",
    "clear_hooks",
    "recursive_named_layers",
    "HookHandle",
    "LoadStateDictResult",
]

@runtime_checkable
class Shardable(Protocol):
    """What a shardable object has (MAX's ``max.nn.layer.Shardable``; ``Linear`` and ``Weight``
    have it): a ``sharding_strategy`` property with a setter and ``shard(devices)`` returning one
    copy per device."""

    @property
    def sharding_strategy(self) -> Any:
        """The ``ShardingStrategy`` (or None)."""
        ...

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: Any) -> None: ...

    def shard(self, devices: Iterable[Any]) -> Sequence[Any]:
        """One sharded copy per device in ``devices``."""
        ...


# -- hooks ---------------------------------------------------------------------------------------


# Module-global as in MAX (one list, shared by every layer).
_HOOKS: list[Callable[..., Any]] = []


class HookHandle:
    """Returned by :func:`add_layer_hook`; ``handle.remove()`` removes that one hook."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[..., Any]):
        self._fn = fn

    def remove(self) -> None:
        """Removes the hook and drops the handle's reference to it (a hook holding its own
        handle is then freed as soon as its last user lets go, as MAX's hooks are)."""
        if self._fn is None:
            return
        try:
            _HOOKS.remove(self._fn)
        except ValueError:
            pass
        self._fn = None

    def __enter__(self) -> "HookHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def add_layer_hook(fn: Callable[[Any, tuple, dict, Any], Any]) -> HookHandle:
    """Adds ``fn(layer, args, kwargs, outputs)``, called after each layer's ``__call__``.

    Hooks run innermost layer first, in every mode (graph values in graph mode, TensorValues
    holding arrays or tracers otherwise). A hook that returns something other than None replaces
    the layer's outputs. Returns a handle whose ``remove()`` removes this hook.
    """
    _HOOKS.append(fn)
    return HookHandle(fn)


def clear_hooks() -> None:
    """Removes all hooks."""
    _HOOKS.clear()


# -- array boundary ------------------------------------------------------------------------------


def _is_raw_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, Buffer)) and not isinstance(x, TensorValue)


def _wrap_arrays(tree: Any) -> tuple[Any, bool]:
    found = False

    def wrap(x: Any) -> Any:
        nonlocal found
        if _is_raw_array(x):
            found = True
            return TensorValue(x)
        return x

    return jax.tree.map(wrap, tree, is_leaf=lambda x: isinstance(x, TensorValue)), found


def _unwrap(tree: Any) -> Any:
    return jax.tree.map(
        lambda x: x.to_jax() if isinstance(x, TensorValue) and x._graph is None else x,
        tree,
        is_leaf=lambda x: isinstance(x, TensorValue),
    )


def _wrap_call(call: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(call, "_maxjax_wrapped", False):
        return call

    @functools.wraps(call)
    def __call__(self: "Layer", *args: Any, **kwargs: Any) -> Any:
        (args, kwargs), boundary = _wrap_arrays((args, kwargs))
        with contextlib.ExitStack() as stack:
            if current_graph() is None:
                if (boundary or current_binding() is None) and isinstance(self, Module):
                    stack.enter_context(bind(names=self._fqn_index(), root=self))
                stack.enter_context(jax.named_scope(type(self).__name__))
            else:  # graph mode: nodes remember the layer path for the compiled program's op names
                stack.enter_context(layer_scope(type(self).__name__))
            out = call(self, *args, **kwargs)
            for hook in tuple(_HOOKS):
                result = hook(self, args, kwargs, out)
                if result is not None:
                    out = result
        return _unwrap(out) if boundary else out

    __call__._maxjax_wrapped = True  # type: ignore[attr-defined]
    return __call__


class Layer:
    """Base class of layers (MAX's deprecated ``Layer``): wraps ``__call__`` to run the hooks."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__call__" in cls.__dict__:
            cls.__call__ = _wrap_call(cls.__dict__["__call__"])  # type: ignore[method-assign]


# -- Module --------------------------------------------------------------------------------------

_STRUCTURE = [0]  # bumped when any module's registered children or weights change


class LoadStateDictResult(NamedTuple):
    """What ``load_state_dict(strict=False)`` did not match (PyTorch's ``_IncompatibleKeys``)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _init_registry(module: "Module") -> None:
    d = module.__dict__
    if "_sublayers" not in d:
        d["_sublayers"] = {}
        d["_layer_weights"] = {}
        d["_weight_attrs"] = {}
        d["_shared_keys"] = set()
        d["_cache"] = {}


def _value_meta(fqn: str, value: Any) -> tuple[Shape, DType, Any]:
    """Shape, dtype and the NumPy array (if the value is host memory) of a state-dict value.

    Raises:
        ValueError: the value is not an array maxjax understands, or its dtype has no ``DType``
            (complex, string, object, datetime, byte-swapped), naming the weight and the dtype.
    """

    def dtype_of(dtype: Any) -> DType:
        try:
            return DType.of(dtype)
        except (ValueError, TypeError):
            raise ValueError(
                f"Value provided to weight '{fqn}' had unsupported dtype (actual={dtype}): maxjax loads bool, "
                "integer and real floating-point dtypes in native byte order, not complex, string, object or "
                "datetime values."
            ) from None

    if isinstance(value, WeightData):  # its own shape/dtype; the host array for the alignment check
        return Shape(value.shape), value.dtype, value.data if isinstance(value.data, np.ndarray) else None
    if isinstance(value, np.ndarray):
        return Shape(value.shape), dtype_of(value.dtype), value
    if isinstance(value, (jax.Array, Buffer)):
        return Shape(value.shape), dtype_of(value.dtype), None
    if isinstance(value, TensorValue) and value._array is not None:
        return Shape(value.shape), value.dtype, None
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        try:
            arr = np.from_dlpack(value)
        except Exception:
            arr = None
        if arr is not None:
            return Shape(arr.shape), dtype_of(arr.dtype), arr
    raise ValueError(
        f"The class type of {fqn!r} value ({type(value)}) is not an array type that we understand. "
        "Please use a numpy array, a jax.Array, a maxjax.driver.Buffer, a WeightData or a DLPack array."
    )


def _fmt_shape(shape: Shape, weightdata: bool) -> str:
    return repr(shape) if weightdata else str(tuple(int(d) if hasattr(d, "__index__") else str(d) for d in shape))


class Module(Layer):
    """Base class for model components with weight management (MAX's ``max.nn.Module``).

    Sub-modules and Weights assigned as attributes are registered (subclasses need not call
    ``super().__init__()``). See the module docstring for naming.
    """

    def __init__(self) -> None:
        _init_registry(self)

    def __setattr__(self, name: str, value: Any) -> None:
        _init_registry(self)
        d = self.__dict__
        old = d.get(name)
        if isinstance(old, Module) and d["_sublayers"].get(name) is old and not isinstance(value, Module):
            del d["_sublayers"][name]
            _STRUCTURE[0] += 1
        if isinstance(old, Weight):
            key = d["_weight_attrs"].pop(name, None)
            if key is not None and key not in d["_weight_attrs"].values():
                d["_layer_weights"].pop(key, None)
                d["_shared_keys"].discard(key)
            _STRUCTURE[0] += 1
        if isinstance(value, Module):
            d["_sublayers"][name] = value
            _STRUCTURE[0] += 1
        elif isinstance(value, Weight):
            existing = d["_layer_weights"].get(value.name)
            if existing is not None and existing is not value:
                other = next((a for a, k in d["_weight_attrs"].items() if k == value.name), "?")
                raise ValueError(
                    f"{type(self).__name__}.{name}: a different Weight named {value.name!r} is already attribute "
                    f"{other!r} of this module; two weights cannot share a fully-qualified name. Give the Weights "
                    "distinct names."
                )
            d["_layer_weights"][value.name] = value
            d["_weight_attrs"][name] = value.name
            _STRUCTURE[0] += 1
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)
        object.__delattr__(self, name)

    # -- structure -------------------------------------------------------------------------
    @property
    def sublayers(self) -> dict[str, "Module"]:
        _init_registry(self)
        return dict(self._sublayers)

    @property
    def layer_weights(self) -> dict[str, Weight]:
        """This module's own weights, keyed by the Weight's name (shared ones included)."""
        _init_registry(self)
        return dict(self._layer_weights)

    def named_modules(self) -> Iterator[tuple[str, "Module"]]:
        """``(prefix, module)`` for this module and every descendant, breadth first, each module once.

        The prefix ends with a dot (``"layers.3."``); the root's is ``""``.
        """
        seen: set[int] = set()
        queue: deque[tuple[str, Module]] = deque([("", self)])
        while queue:
            prefix, m = queue.popleft()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield prefix, m
            _init_registry(m)
            for name, child in m._sublayers.items():
                # MAX's StackedLinear(stacked=False) leaves its attribute name out of its
                # children's names (``_omit_module_attr_name``)
                omit = getattr(child, "_omit_module_attr_name", False)
                queue.append((prefix if omit else f"{prefix}{name}.", child))

    def _named_weights(self) -> list[tuple[str, Weight]]:
        """``(fqn, weight)`` for every owned (not shared) weight, in module order; no renaming.

        Raises:
            ValueError: two weights have the same fully-qualified name (as MAX 26.7 raises), e.g.
                ``a.b.w`` as weight ``w`` of module ``a.b`` and weight ``b.w`` of module ``a``.
        """
        out = []
        owners: dict[str, str] = {}
        for prefix, m in self.named_modules():
            for key, w in m._layer_weights.items():
                if key in m._shared_keys:
                    continue
                fqn = prefix + key
                owner = prefix[:-1] or "<root>"
                if fqn in owners:
                    raise ValueError(
                        f"Duplicate weight FQN '{fqn}' produced by two distinct attribute paths: '{owners[fqn]}' and "
                        f"'{owner}'. Two weights cannot share the same fully-qualified name in a module's state_dict."
                    )
                owners[fqn] = owner
                out.append((fqn, w))
        return out

    def _fqn_index(self) -> dict[str, Weight]:
        """FQN -> Weight, cached until the structure of any module changes."""
        _init_registry(self)
        cached = self._cache.get("fqn_index")
        if cached is not None and cached[0] == _STRUCTURE[0]:
            return cached[1]
        index = dict(self._named_weights())
        self._cache["fqn_index"] = (_STRUCTURE[0], index)
        return index

    def replace_module(self, name: str, module: "Module") -> None:
        """Replaces the registered child ``name``.

        Raises:
            KeyError: no child of that name is registered.
        """
        _init_registry(self)
        if name not in self._sublayers:
            raise KeyError(f"{type(self).__name__} has no sub-module {name!r} (has {sorted(self._sublayers)})")
        setattr(self, name, module)

    # -- weights ---------------------------------------------------------------------------
    def raw_state_dict(self) -> dict[str, Weight]:
        """Every owned Weight by FQN (the Weights are given their FQNs as names, as in MAX)."""
        out = {}
        for fqn, w in self._named_weights():
            w.name = fqn
            out[fqn] = w
        return out

    def state_dict(self, auto_initialize: bool = True) -> dict[str, Any]:
        """Every owned weight's value by FQN: the objects given to ``load_state_dict``.

        Weights with no value get zeros, as in MAX 26.7: a host ``Buffer.zeros(shape, dtype)``
        (``.to_numpy()`` shares its memory), kept as the weight's value, unless
        ``auto_initialize`` is False.

        Raises:
            ValueError: ``auto_initialize=False`` and a weight has no value (names it).
        """
        out = {}
        for fqn, w in self.raw_state_dict().items():
            if w.value is None:
                if not auto_initialize:
                    raise ValueError(f"Weight '{fqn}' was not initialized.")
                if not Shape.is_static(w.shape):
                    raise ValueError(f"Weight '{fqn}' has a symbolic shape {w.shape} and cannot be zero-filled")
                w.set_value(Buffer.zeros([int(d) for d in w.shape], w.dtype))
            out[fqn] = w.value
        return out

    def load_state_dict(
        self,
        state_dict: Mapping[str, Any],
        *,
        override_quantization_encoding: bool = False,
        weight_alignment: int | None = None,
        strict: bool = True,
    ) -> LoadStateDictResult:
        """Sets the values of all weights from ``state_dict`` (FQN -> array, Buffer or WeightData).

        Every value is checked (type, shape, dtype, quantization encoding, alignment) and, with
        ``strict=True``, the key sets must match, before anything changes: when this raises, the
        module is as it was. Values are kept as given (no copy); they reach the device when used.

        Args:
            override_quantization_encoding: take dtype, shape and encoding from ``WeightData`` values.
            weight_alignment: byte alignment required of host arrays (default: each weight's
                ``align`` or its dtype's).
            strict: raise on missing or unexpected keys; with False they are returned instead.

        Returns:
            ``LoadStateDictResult(missing_keys, unexpected_keys)``.

        A weight declared with symbolic dims (``["batch", 1024]``) takes a value of its rank whose
        static dims match; the symbolic ones take any size.

        Raises:
            ValueError: ``state_dict`` is not a mapping, or has a key that is not a ``str`` (names
                it, whatever ``strict`` says); ``weight_alignment`` is not a positive int; a value of
                the wrong type, shape, dtype (or one maxjax has no ``DType`` for: complex, string,
                object) or alignment (naming the weight, the expected and the actual; several such
                problems are reported together, on one line); or, with ``strict=True``, missing or
                unexpected keys (all of them, each missing one with "did you mean").
        """
        if not isinstance(state_dict, Mapping):
            raise ValueError(
                f"load_state_dict() needs a mapping of weight names to arrays, got a {type(state_dict).__name__}"
            )
        bad_keys = [k for k in state_dict if not isinstance(k, str)]
        if bad_keys:
            more = f" (and {len(bad_keys) - 1} more)" if len(bad_keys) > 1 else ""
            raise ValueError(
                f"load_state_dict() keys must be weight names (str), got {bad_keys[0]!r} of type "
                f"{type(bad_keys[0]).__name__}{more}"
            )
        if weight_alignment is not None and (
            not isinstance(weight_alignment, int) or isinstance(weight_alignment, bool) or weight_alignment < 1
        ):
            raise ValueError(f"load_state_dict() weight_alignment must be a positive int, got {weight_alignment!r}")

        from maxjax.graph.type import StaticDim, SymbolicDim

        def shape_differs(expected: Shape, actual: Shape) -> bool:
            # rank and every static dim must match; a symbolic dim takes any size (the same one
            # wherever its name recurs in this weight's shape)
            if len(expected) != len(actual):
                return True
            sizes: dict[str, Any] = {}
            for e, a in zip(expected, actual):
                if isinstance(e, StaticDim):
                    if e != a:
                        return True
                elif isinstance(e, SymbolicDim):
                    if sizes.setdefault(e.name, a) != a:
                        return True
            return False

        named = self._named_weights()
        fqns = {fqn for fqn, _ in named}
        errors: list[str] = []
        missing: list[str] = []
        plan: list[tuple[str, Weight, Any, Any]] = []
        for fqn, w in named:
            if fqn not in state_dict or state_dict[fqn] is None:
                missing.append(fqn)
                continue
            value = state_dict[fqn]
            try:
                shape, dtype, host = _value_meta(fqn, value)
            except ValueError as e:
                errors.append(str(e))
                continue
            is_wd = isinstance(value, WeightData)
            enc = getattr(value, "quantization_encoding", None) if is_wd else None
            override = None
            if override_quantization_encoding and enc is not None:
                override = (enc, dtype, shape)
            else:
                bad_shape = shape_differs(w.shape, shape)
                bad_dtype = dtype != w.dtype
                exp_s, act_s = _fmt_shape(w.shape, is_wd), _fmt_shape(shape, is_wd)
                end = "" if is_wd else "."
                shape_diff = f"shape (expected={exp_s}, actual={act_s})"
                if bad_shape and not Shape.is_static(w.shape):  # MAX's words for a symbolic weight
                    if len(w.shape) != len(shape):
                        shape_diff = f"shape rank (expected={len(w.shape)}, actual={len(shape)})"
                    else:
                        dims = [
                            f"dim[{i}]: expected {int(e)}, got {int(a)}"
                            for i, (e, a) in enumerate(zip(w.shape, shape))
                            if isinstance(e, StaticDim) and e != a
                        ]
                        if dims:
                            shape_diff = f"shape ({', '.join(dims)})"
                if bad_shape and bad_dtype:
                    errors.append(
                        f"Value provided to weight '{fqn}' had different {shape_diff} "
                        f"and dtype (expected={w.dtype!r}, actual={dtype!r}){end}"
                    )
                elif bad_shape:
                    errors.append(f"Value provided to weight '{fqn}' had different {shape_diff}{end}")
                elif bad_dtype:
                    errors.append(
                        f"Value provided to weight '{fqn}' had different dtype (expected={w.dtype!r}, "
                        f"actual={dtype!r}){end}"
                    )
                elif enc is not None and w.quantization_encoding is not None and enc != w.quantization_encoding:
                    errors.append(
                        f"Value provided to weight '{fqn}' had different quantization encoding "
                        f"(expected={w.quantization_encoding}, actual={enc}); pass "
                        "override_quantization_encoding=True to take the value's"
                    )
            align = weight_alignment or w.align or dtype.align
            if host is not None and align > 1 and host.size and host.ctypes.data % align:
                errors.append(
                    f"Found unaligned weight '{fqn}' (expected alignment={align}). If you are using a "
                    "memory-mapped file, pass weight_alignment=1 to load_state_dict."
                )
            plan.append((fqn, w, value, override))
        if errors:
            raise ValueError("; ".join(errors))
        unexpected = [k for k in state_dict if k not in fqns or state_dict[k] is None]
        if strict and (missing or unexpected):
            parts = []
            if missing:
                hints = []
                for m in missing:
                    close = difflib.get_close_matches(m, unexpected or list(state_dict), n=1, cutoff=0.6)
                    if close:
                        hints.append(f"For '{m}', did you mean '{close[0]}'?")
                parts.append("Missing required weights: " + ", ".join(missing) + ("; " + "; ".join(hints) if hints else ""))
            if unexpected:
                parts.append("Unexpected keys in state_dict: " + ", ".join(unexpected))
            raise ValueError("load_state_dict() strict=True validation failed. " + "; ".join(parts))
        # commit: nothing above changed the module
        for fqn, w, value, override in plan:
            if override is not None:
                w.retype(*override)
            w.name = fqn
            w.set_value(value)
        return LoadStateDictResult(missing, unexpected)

    def set_shared_weight(self, name: str, weight: Weight) -> None:
        """Sets attribute ``name`` to a Weight owned by another module (tied weights).

        The weight is used by this module but skipped by its ``raw_state_dict``/``load_state_dict``:
        for tied embeddings the only key is the owner's (``embed.weight``).
        """
        setattr(self, name, weight)
        self._shared_keys.add(self._weight_attrs[name])
        _STRUCTURE[0] += 1

    def to(self, *devices: Any, sharding_strategy: Any = None, axis: str = "tp") -> None:
        """Places this module's weights.

        - ``to(device)``: every weight on ``device`` (a ``DeviceRef``, ``Device`` or ``jax.Device``).
        - ``to(*devices, sharding_strategy=s)``: MAX's form: sets ``s`` on every weight (they can
          then be ``shard``-ed over ``devices``).
        - ``to(mesh, axis="tp")`` with a ``jax.sharding.Mesh``: every weight on the mesh, split over
          mesh axis ``axis`` by its sharding strategy (set by the layers' ``sharding_strategy``
          setters), replicated without one (see ``Weight.place``). All or nothing: when a weight
          cannot be placed, no weight changes.

        Raises:
            ValueError: no device given, or (mesh) a weight that cannot be placed (names it).
        """
        import jax

        from maxjax.graph.type import DeviceRef

        if not devices:
            raise ValueError("Module.to needs at least one device")
        weights = [w for _, w in self._named_weights()]
        if len(devices) == 1 and isinstance(devices[0], jax.sharding.Mesh):
            mesh = devices[0]
            before = [w.mesh for w in weights]
            try:
                for w in weights:
                    w.place(mesh, axis)
            except ValueError:
                for w, old in zip(weights, before):
                    w._mesh = old
                    w._array_cache = None
                raise
            return
        refs = [DeviceRef.from_device(d) for d in devices]
        self.devices = refs  # type: ignore[attr-defined]
        for w in weights:
            if sharding_strategy is not None:
                w.sharding_strategy = sharding_strategy
            else:
                w.device = refs[0]

    def shard(self, devices: Sequence[Any]) -> list["Module"]:
        """Per-device copies of this module (MAX's per-device style): copy ``i`` holds each
        sublayer's shard ``i`` (``child.shard(devices)[i]``) and each of its own weights' shard
        ``i``. Layers with their own rule (``Linear``, ``MLP``, norms, attention) override this.

        Raises:
            ValueError: a sublayer or weight has no sharding strategy (names it).
        """
        devices = list(devices)
        _init_registry(self)
        parts: dict[str, list[Any]] = {}
        for name, child in self._sublayers.items():
            try:
                parts[name] = child.shard(devices)
            except ValueError as e:
                raise ValueError(f"{type(self).__name__}.{name}: {e}") from None
        for attr, key in self._weight_attrs.items():
            if key not in self._shared_keys:
                parts[attr] = getattr(self, attr).shard(devices)
        out = []
        for i in range(len(devices)):
            copy = object.__new__(type(self))
            for k, v in self.__dict__.items():
                if k not in ("_sublayers", "_layer_weights", "_weight_attrs", "_shared_keys", "_cache") and k not in parts:
                    object.__setattr__(copy, k, v)
            _init_registry(copy)
            for name, shards in parts.items():
                setattr(copy, name, shards[i])
            out.append(copy)
        return out

    # -- graphs ----------------------------------------------------------------------------
    def build_subgraph(
        self,
        name: str,
        input_types: Sequence[Any] | None = None,
        weight_prefix: str = "",
        *,
        inputs: Sequence[Any] | None = None,
    ) -> Graph:
        """Traces this layer once into a subgraph for ``ops.call(subgraph, *args, prefix=...)``.

        Accepts the seed's ``input_types`` and MAX 26.7's ``inputs`` (types or values). Nested
        inputs (lists, tuples, dicts of them) are flattened into the subgraph's inputs, as MAX does,
        and the layer is called with the structure rebuilt; ``ops.call`` takes the flat values.
        Weights whose names start with ``weight_prefix`` become placeholders keyed without it; the
        Weight objects are not renamed. Inside a graph the subgraph belongs to the current graph;
        outside one (eager/functional mode) it is a standalone graph, cached per input types.

        In eager mode (concrete arrays, not tracers), ``ops.call(subgraph, ..., prefix=P)`` runs
        the layer found at ``P`` in the module being run, so layer hooks see every layer's
        output; under ``jax.jit``/``jax.grad`` and in graphs the subgraph runs (traced once).

        Raises:
            ValueError: both or neither of ``input_types`` and ``inputs`` given.
        """
        if (input_types is None) == (inputs is None):
            raise ValueError("build_subgraph: pass the input types (input_types= or inputs=), exactly once")
        given = list(input_types if input_types is not None else inputs)  # type: ignore[arg-type]
        flat, structure = jax.tree.flatten(given, is_leaf=lambda t: not isinstance(t, (list, tuple, dict)))
        types = [as_tensor_type(t) for t in flat]
        parent = current_graph()
        if parent is not None:
            sub = parent.add_subgraph(name, input_types=types, _weight_prefix=weight_prefix)
        else:
            _init_registry(self)
            key = ("subgraph", name, tuple(types), weight_prefix, _STRUCTURE[0])
            cached = self._cache.get(key)
            if cached is not None:
                return cached
            sub = Graph(name, input_types=types, _weight_prefix=weight_prefix)
        with sub:
            out = self(*jax.tree.unflatten(structure, sub.inputs))
            sub.output(*(out if isinstance(out, (list, tuple)) else [out]))
        sub._eager_runner = functools.partial(_run_layer_at, self, weight_prefix, structure)
        if parent is None:  # cached once whole: a trace that raised leaves no subgraph without output behind
            self._cache[key] = sub
        return sub

    def trace(self, *input_types: TensorType, name: str | None = None, **kwargs: Any) -> Graph:
        """A graph of this module called on inputs of ``input_types``."""
        return Graph(name or type(self).__name__, forward=self, input_types=input_types)

    def compile(
        self, *input_types: TensorType, session: Any, weights: Mapping[str, Any] | None = None, name: str | None = None, **kwargs: Any
    ) -> Any:
        """Traces this module and loads it into ``session`` with ``weights`` (default: its state dict)."""
        graph = self.trace(*input_types, name=name)
        return session.load(graph, weights_registry=weights if weights is not None else self.state_dict())

    def __repr__(self) -> str:
        _init_registry(self)
        return f"{type(self).__name__}({len(self._sublayers)} layers, {len(self._layer_weights)} weights)"


LayerV2 = Module


def _module_paths(root: Module) -> tuple[dict[str, Module], dict[int, str]]:
    """``({path: module}, {id(module): path})`` under ``root`` (paths without a trailing dot;
    ``""`` is root), cached until the structure of any module changes."""
    _init_registry(root)
    cached = root._cache.get("module_paths")
    if cached is None or cached[0] != _STRUCTURE[0]:
        paths = {prefix[:-1]: m for prefix, m in root.named_modules()}
        cached = (_STRUCTURE[0], paths, {id(m): p for p, m in paths.items()})
        root._cache["module_paths"] = cached
    return cached[1], cached[2]


def _run_layer_at(source: Module, weight_prefix: str, structure: Any, prefix: str, args: Sequence[Any]) -> list[Any] | None:
    """Eager ``ops.call`` of a subgraph built from ``source``: runs the layer the call stands for.

    The subgraph's placeholder weights ``weight_prefix + k`` are read as ``prefix + k``, so the
    layer at ``prefix`` (the path ``source`` has relative to ``weight_prefix``, moved under
    ``prefix``) in the module being run is the one to call. Returns None when there is no such
    layer of ``source``'s class (the caller then runs the subgraph).
    """
    binding = current_binding()
    root = binding.root if binding is not None else None
    if not isinstance(root, Module):
        return None
    paths, ids = _module_paths(root)
    own = ids.get(id(source))
    if own is None:
        return None
    rel = own + "." if own else ""
    if not rel.startswith(weight_prefix):
        return None
    target = paths.get((prefix + rel[len(weight_prefix) :]).rstrip("."))
    if target is None or type(target) is not type(source):
        return None
    out = target(*jax.tree.unflatten(structure, list(args)))
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return [o if isinstance(o, TensorValue) else TensorValue(o) for o in outs]


def recursive_named_layers(parent: Module, prefix: str = "") -> Iterable[tuple[str, Module]]:
    """``(name, layer)`` for ``parent`` and every descendant, depth first (names without a
    trailing dot: ``""``, ``"layers"``, ``"layers.0"``, ...)."""
    stack: list[tuple[str, Module]] = [(prefix, parent)]
    while stack:
        name, layer = stack.pop()
        yield name, layer
        children = list(layer.sublayers.items())
        for child_name, child in reversed(children):
            stack.append((f"{name}.{child_name}" if name else child_name, child))
