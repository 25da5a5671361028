"""Weights adapters: checkpoint names -> module names, the machinery every architecture uses.

A ``WeightsAdapter`` (MAX's ``Callable[..., dict[str, WeightData]]``) takes a checkpoint's
``Weights`` and returns ``{module name: WeightData}`` for ``module.load_state_dict``.

The name mappings are data: tables of ``(regex over the checkpoint name, replacement)`` pairs,
applied by :func:`rename`; a replacement of None drops the tensor (e.g. rotary tables that are
recomputed). A name no row matches is an error, so a checkpoint of another architecture is not
half-loaded. Each architecture's tables and layout fixes live in its folder of
:mod:`maxjax.models` (``maxjax.models.llama.weights``, ``maxjax.models.bert.weights``).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping, Sequence

from maxjax.graph.weights.weight_data import WeightData

__all__ = ["WeightsAdapter", "NameTable", "adapt", "map_names", "rename"]

#: MAX's adapter type: any callable returning ``{name: WeightData}``.
WeightsAdapter = Callable[..., dict[str, WeightData]]
#: ``(pattern, replacement)`` rows; the pattern must match the whole name; None drops the tensor.
NameTable = Sequence[tuple[str, str | None]]

_COMPILED: dict[str, re.Pattern[str]] = {}


def _pattern(p: str) -> re.Pattern[str]:
    c = _COMPILED.get(p)
    if c is None:
        c = _COMPILED[p] = re.compile(p)
    return c


_UNMATCHED = object()


def rename(name: str, table: NameTable) -> Any:
    """The target name of ``name`` by the first row of ``table`` whose pattern matches all of it.

    Returns the new name, None when the row drops the tensor, or raises ``KeyError`` when no row
    matches.
    """
    for pattern, repl in table:
        m = _pattern(pattern).fullmatch(name)
        if m is not None:
            return None if repl is None else m.expand(repl)
    raise KeyError(name)


def map_names(names: Iterable[str], table: NameTable) -> dict[str, str]:
    """``{checkpoint name: target name}`` for every name the table keeps.

    Raises:
        ValueError: names no row matches (all listed), or two names mapped to one target.
    """
    out: dict[str, str] = {}
    unmatched = []
    targets: dict[str, str] = {}
    for n in names:
        try:
            t = rename(n, table)
        except KeyError:
            unmatched.append(n)
            continue
        if t is None:
            continue
        if t in targets:
            raise ValueError(f"{targets[t]!r} and {n!r} both map to {t!r}")
        targets[t] = n
        out[n] = t
    if unmatched:
        raise ValueError(
            f"{len(unmatched)} tensor name(s) match no row of the name table (another architecture?): "
            f"{unmatched[:8]}"
        )
    return out


def _sources(weights: Any) -> list[tuple[str, Callable[[], WeightData]]]:
    """``(name, loader)`` of every tensor of a Weights source or a ``{name: Weights | WeightData}``."""
    if isinstance(weights, Mapping):
        out = []
        for n, v in weights.items():
            if isinstance(v, WeightData):
                out.append((n, lambda v=v: v))
            else:
                out.append((n, v.data))
        return out
    return [(n, v.data) for n, v in weights.items()]


def adapt(
    weights: Any, table: NameTable, transform: Callable[[str, WeightData], WeightData] | None = None
) -> dict[str, WeightData]:
    """``{target name: WeightData}`` of every tensor ``table`` keeps (see :func:`map_names`), each
    renamed, and passed through ``transform(target, wd)`` when one is given (a layout fix such as
    llama.cpp's Q/K row order). Tensors are loaded one at a time.

    Args:
        weights: a ``Weights`` source, or a mapping of names to ``Weights``/``WeightData``.
        table: the name table.
        transform: ``(target name, WeightData) -> WeightData``, or None.

    Raises:
        ValueError: names no row matches, or two names mapped to one target.
    """
    sources = _sources(weights)
    mapping = map_names([n for n, _ in sources], table)
    out: dict[str, WeightData] = {}
    for n, load in sources:
        target = mapping.get(n)
        if target is None:
            continue
        wd = load()
        wd = WeightData(wd.data, target, wd.dtype, wd.shape, wd.quantization_encoding, wd.original_shape)
        out[target] = transform(target, wd) if transform is not None else wd
    return out
