"""``maxjax.nn.hooks.base_print_hook``: :class:`BasePrintHook` (MAX 26.7's
``max/nn/hooks/base_print_hook.py``): names layers, records what was printed, writes the names.

Differences from MAX 26.7 (documented, deliberate):

- ``export_path``: MAX writes ``{export_path}/{step}/tensor_names.txt`` (one printed name a
  line, in call order) but creates the step directory only in :meth:`step`, so at step 0 its first
  hook call raises ``FileNotFoundError``. maxjax creates the directory when it writes the file.
"""

from __future__ import annotations

import dataclasses
import os
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["BasePrintHook", "LayerInfo"]


@dataclass
class LayerInfo:
    """A named layer and how often it was called in the current step."""

    layer_name: str
    call_count: int = 0


class BasePrintHook(ABC):
    """Base hook for printing a layer's inputs and outputs (MAX's ``BasePrintHook``).

    Called as a layer hook ``(layer, args, kwargs, outputs)``, it prints every input
    (``{name}-input_{i}``, ``{name}-input_{key}``) and the output (``{name}-output``, or
    ``{name}-output_{i}`` / ``{name}-output_{field}`` for tuples, lists and dataclasses) through
    :meth:`print_value`. A layer's name is the one given by :meth:`add_layer`, else its class
    name (``Linear``, ``Linear2``, ... in first-call order); a second call in a step prints as
    ``name(2)``.

    Args:
        export_path: Directory for ``{export_path}/{step}/tensor_names.txt`` (the names printed in
            the step, in order), or None.
        filter: Layer names to print; None or empty prints every layer.
    """

    def __init__(self, export_path: str | None = None, filter: Sequence[str] | None = None) -> None:  # noqa: A002 - MAX's name
        self._known_layers: dict[int, tuple[Any, LayerInfo]] = {}  # id(layer) -> (layer, info), as MAX's IdentityMap
        self._export_path = export_path
        self._current_step = 0
        self._layer_counter: Counter[str] = Counter()
        self._recorded_prints: dict[int, list[str]] = {}
        self._layer_filter: set[str] | None = set(filter) if filter else None

    def add_layer(self, layer: Any, name: str) -> None:
        """Names ``layer`` (a later call for the same layer replaces the name)."""
        self._known_layers[id(layer)] = (layer, LayerInfo(name))

    @property
    def export_path(self) -> str | None:
        """``{export_path}/{step}``, or None without an export path."""
        if self._export_path is None:
            return None
        return os.path.join(self._export_path, str(self._current_step))

    def step(self) -> None:
        """Starts the next step: creates its export directory and resets the call counts."""
        self._current_step += 1
        if export_path := self.export_path:
            os.makedirs(export_path, exist_ok=True)
            for _, info in self._known_layers.values():
                info.call_count = 0
        self.write_keys_file()

    def __call__(self, layer: Any, args: Sequence[Any], kwargs: Mapping[str, Any], outputs: Any) -> None:
        """Prints the inputs and outputs of ``layer`` (returns None: the outputs stay as they are)."""
        if id(layer) not in self._known_layers:
            cls = type(layer).__name__
            self._layer_counter[cls] += 1
            n = self._layer_counter[cls]
            self._known_layers[id(layer)] = (layer, LayerInfo(cls if n == 1 else f"{cls}{n}"))
        info = self._known_layers[id(layer)][1]
        info.call_count += 1
        debug_name = f"{info.layer_name}({info.call_count})" if info.call_count > 1 else info.layer_name
        if self._layer_filter is not None and info.layer_name not in self._layer_filter:
            return
        for n, arg in enumerate(args):
            self.print_and_record(f"{debug_name}-input_{n}", arg)
        for key, value in kwargs.items():
            self.print_and_record(f"{debug_name}-input_{key}", value)
        if self.print_and_record(f"{debug_name}-output", outputs):
            pass
        elif isinstance(outputs, (list, tuple)):
            for n, out in enumerate(outputs):
                self.print_and_record(f"{debug_name}-output_{n}", out)
        elif dataclasses.is_dataclass(outputs):
            for field in dataclasses.fields(outputs):
                self.print_and_record(f"{debug_name}-output_{field.name}", getattr(outputs, field.name))
        else:
            print(f"Was not able to write outputs from {debug_name} (output type was {type(outputs)})")
        self.write_keys_file()

    def print_and_record(self, name: str, value: Any) -> bool:
        """Runs :meth:`print_value` and records ``name`` when it printed."""
        ok = self.print_value(name, value)
        if ok:
            self._recorded_prints.setdefault(self._current_step, []).append(name)
        return ok

    def write_keys_file(self) -> None:
        """Writes the step's printed names, in order, to ``{export_path}/{step}/tensor_names.txt``."""
        if self.export_path and self._current_step in self._recorded_prints:
            os.makedirs(self.export_path, exist_ok=True)
            with open(os.path.join(self.export_path, "tensor_names.txt"), "w") as f:
                for name in self._recorded_prints[self._current_step]:
                    f.write(f"{name}\n")

    @abstractmethod
    def print_value(self, name: str, value: Any) -> bool:
        """Prints ``value`` under ``name``; returns whether it printed."""
        raise NotImplementedError

    def summarize(self) -> None:
        """Prints how many tensors each step printed (MAX's wording)."""
        action = "Saved" if self.export_path else "Printed"
        printed = False
        for step, tensors in self._recorded_prints.items():
            print(f"{action} {len(tensors)} tensors for step {step}.")
            printed = printed or bool(tensors)
        if not printed:
            print("No tensors exported.")
        elif self._export_path:
            print(f"Tensors exported to {self._export_path}")

    def remove(self) -> None:
        """Cleans up: removes the current step's export directory when it is empty."""
        if (export_path := self.export_path) and os.path.isdir(export_path) and not os.listdir(export_path):
            os.rmdir(export_path)
