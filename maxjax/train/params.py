"""Parameter selection by name pattern: train some weights, freeze the rest.

A pattern is a shell-style glob over fully-qualified weight names (``fnmatch``: ``*`` matches
across dots), e.g. ``"*lora_*"``, ``"layers.2[0-9].*"``, ``"*.mlp.*"``, ``"norm.weight"``; or a
compiled regular expression (``re.compile(r"layers\\.(1|2)\\..*")``, matched with ``fullmatch``).

    trainable, frozen = split(state, ["*lora_*", "norm.weight"])    # two dicts, same keys as state
    grads = jax.grad(lambda t: loss(merge(t, frozen)))(trainable)    # frozen weights never differentiated

Every pattern must match at least one name: a pattern that matches nothing is almost always a
typo, and training with it would silently freeze what was meant to train.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Iterable, Mapping

from maxjax.graph.graph import did_you_mean

__all__ = ["Patterns", "as_patterns", "matches", "select", "split", "merge"]

#: one pattern (glob string or compiled regex) or a sequence of them
Patterns = Any


def as_patterns(patterns: Patterns) -> list[Any]:
    """``patterns`` as a list (a single string or regex becomes a one-element list).

    Raises:
        TypeError: an element that is neither a string nor a compiled regex.
    """
    items = [patterns] if isinstance(patterns, (str, re.Pattern)) else list(patterns)
    for p in items:
        if not isinstance(p, (str, re.Pattern)):
            raise TypeError(f"a weight-name pattern must be a glob string or a compiled regex, got {type(p).__name__} {p!r}")
    return items


def _match(pattern: Any, name: str) -> bool:
    if isinstance(pattern, re.Pattern):
        return pattern.fullmatch(name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def matches(name: str, patterns: Patterns) -> bool:
    """Whether ``name`` matches any of ``patterns``."""
    return any(_match(p, name) for p in as_patterns(patterns))


def _show(p: Any) -> str:
    return repr(p.pattern) if isinstance(p, re.Pattern) else repr(p)


def select(names: Iterable[str], patterns: Patterns, *, what: str = "trainable") -> list[str]:
    """The names (in their order) that match any of ``patterns``.

    Raises:
        ValueError: a pattern matches no name (one line naming the pattern, with the closest
            name); no patterns at all.
    """
    names = list(names)
    items = as_patterns(patterns)
    if not items:
        raise ValueError(f"no {what} patterns given")
    for p in items:
        if not any(_match(p, n) for n in names):
            hint = did_you_mean(p, names) if isinstance(p, str) else ""
            example = f" (weights look like {names[0]!r})" if names and not hint else ""
            raise ValueError(f"{what} pattern {_show(p)} matches no weight of the {len(names)}.{hint}{example}")
    return [n for n in names if any(_match(p, n) for p in items)]


def split(state: Mapping[str, Any], patterns: Patterns, *, what: str = "trainable") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(selected, rest)``: the entries of ``state`` whose names match ``patterns``, and the others.

    Raises:
        ValueError: see :func:`select`.
    """
    chosen = set(select(state, patterns, what=what))
    return {k: v for k, v in state.items() if k in chosen}, {k: v for k, v in state.items() if k not in chosen}


def merge(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """One dict of several (the inverse of :func:`split`).

    Raises:
        ValueError: a name in more than one part.
    """
    out: dict[str, Any] = {}
    for part in parts:
        for k, v in part.items():
            if k in out:
                raise ValueError(f"weight {k!r} is in more than one part")
            out[k] = v
    return out

