"""``maxjax.nn.layer.layer_list``: :class:`LayerList` (MAX 26.7's ``max/nn/layer/layer_list.py``)."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

from maxjax.nn.layer.layer import Layer, Module

__all__ = ["LayerList"]


class LayerList(Module):
    """A list of layers registered as ``"0"``, ``"1"``, ...; calling it chains them (as in MAX).

    ``append``, ``insert`` and ``extend`` register the new layers (MAX 26.7 does not).
    """

    def __init__(self, layers: Sequence[Layer]) -> None:
        super().__init__()
        object.__setattr__(self, "layers", [])
        self.extend(layers)

    def _reregister(self) -> None:
        for k in [k for k in self._sublayers if k.isdigit()]:
            del self._sublayers[k]
            self.__dict__.pop(k, None)
        for i, layer in enumerate(self.layers):
            setattr(self, str(i), layer)

    def append(self, layer: Module) -> None:
        self.layers.append(layer)
        setattr(self, str(len(self.layers) - 1), layer)

    def extend(self, layers: Iterable[Module]) -> None:
        for layer in layers if not isinstance(layers, Module) else [layers]:
            self.append(layer)

    def insert(self, i: int, layer: Module) -> None:
        self.layers.insert(i, layer)
        self._reregister()

    def __getitem__(self, i: int) -> Any:
        if isinstance(i, slice):
            return self.layers[i]
        return self.layers[i]

    def __setitem__(self, i: int, layer: Module) -> None:
        """Replaces layer ``i`` (registered under ``str(i)``, so its weights are renamed too)."""
        self.layers[i] = layer
        self._reregister()

    def __delitem__(self, i: int) -> None:
        """Removes layer ``i``; the later layers move down one index (and take those names)."""
        del self.layers[i]
        self._reregister()

    def __str__(self) -> str:
        return str(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Module]:
        return iter(self.layers)

    def shard(self, devices: Sequence[Any]) -> list["LayerList"]:
        """Per-device LayerLists of each layer's shard ``i``.

        Raises:
            ValueError: a layer has no sharding strategy.
        """
        devices = list(devices)
        per_layer = [layer.shard(devices) for layer in self.layers]
        return [type(self)([shards[i] for shards in per_layer]) for i in range(len(devices))]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Chains the layers: the first gets ``*args, **kwargs``, each next one the previous output."""
        if not self.layers:
            return args[0] if len(args) == 1 else args
        out = self.layers[0](*args, **kwargs)
        for layer in self.layers[1:]:
            out = layer(out)
        return out
