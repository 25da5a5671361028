"""``maxjax.nn.layer``: MAX 26.7's ``max.nn.layer`` package (``Layer``, ``Module``, ``LayerList``,
``MissingLayer``, ``Shardable``, ``add_layer_hook``, ``clear_hooks``).

The Module core is :mod:`maxjax.nn.layer.layer`, ``LayerList`` is in ``layer_list``, and
``MissingLayer`` in ``missing_layer``, as in MAX. maxjax's own names (``LayerV2``, ``HookHandle``,
``LoadStateDictResult``, ``recursive_named_layers``) and ``Sequential`` (which lives in
:mod:`maxjax.nn.sequential`, as in MAX) are importable from here too, as before the split.
"""

from maxjax.nn.layer.layer import (
    HookHandle,
    Layer,
    LayerV2,
    LoadStateDictResult,
    Module,
    Shardable,
    _HOOKS,
    _STRUCTURE,
    _init_registry,
    _module_paths,
    _run_layer_at,
    _unwrap,
    _wrap_arrays,
    _wrap_call,
    add_layer_hook,
    clear_hooks,
    recursive_named_layers,
)
from maxjax.nn.layer.layer_list import LayerList
from maxjax.nn.layer.missing_layer import MissingLayer
from maxjax.nn.sequential import Sequential  # noqa: E402  (after LayerList, which it subclasses)

__all__ = [
    "Layer",
    "LayerList",
    "MissingLayer",
    "Module",
    "Shardable",
    "add_layer_hook",
    "clear_hooks",
]
