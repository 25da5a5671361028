"""``ops.bundled_allreduce``: MAX's allreduce staged as one ``mo.parallel`` region of per-device
launches (``bundled_allreduce.sum``). The launch layout is MAX's compiler's concern; the numbers
are :func:`maxjax.graph.ops.allreduce.sum`'s, which this is."""

from __future__ import annotations

from typing import Any, Iterable

from maxjax.graph.ops import allreduce

__all__ = ["sum"]


def sum(inputs: Iterable[Any], signal_buffers: Iterable[Any]) -> list[Any]:  # noqa: A001 - MAX's name
    """Each input replaced by the sum of all inputs, on its own device (MAX's
    ``ops.bundled_allreduce.sum``: :func:`maxjax.graph.ops.allreduce.sum` over all devices).

    Raises:
        ValueError: not one signal buffer per input (MAX's check), or allreduce.sum's checks.
    """
    return allreduce.sum(inputs, signal_buffers)
