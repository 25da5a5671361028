"""Device meshes from a spec: ``"dp=2,tp=4"`` -> a ``jax.sharding.Mesh`` over the devices present.

The CLI's ``--mesh`` and ``--cpu-devices`` and multi-process runs (``jax.distributed``) start here.
"""

from __future__ import annotations

import math
import os
import re
import socket
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np

__all__ = ["parse_mesh", "make_mesh", "use_cpu_devices", "initialize_distributed"]

_AXIS = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([0-9]+)$")


def parse_mesh(spec: str) -> dict[str, int]:
    """``"dp=2,tp=4"`` -> ``{"dp": 2, "tp": 4}`` (axis names are identifiers, sizes at least 1).

    Raises:
        ValueError: a syntax error, a size below 1, or an axis named twice (quotes the part at fault).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"mesh spec {spec!r}: expected axis=size pairs separated by commas, e.g. 'dp=2,tp=4'")
    axes: dict[str, int] = {}
    for part in spec.split(","):
        m = _AXIS.match(part.strip())
        if m is None:
            raise ValueError(f"mesh spec {spec!r}: {part.strip()!r} is not axis=size (e.g. 'tp=4')")
        name, size = m.group(1), int(m.group(2))
        if size < 1:
            raise ValueError(f"mesh spec {spec!r}: axis {name!r} has size {size}; sizes are at least 1")
        if name in axes:
            raise ValueError(f"mesh spec {spec!r}: axis {name!r} is named twice")
        axes[name] = size
    return axes


def make_mesh(axes: str | Mapping[str, int], devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
    """A mesh of ``axes`` (a spec string or ``{name: size}``) over the first ``prod(sizes)`` of
    ``devices`` (default: ``jax.devices()``, every process's devices in a multi-process run).

    Raises:
        ValueError: a bad spec, more mesh positions than devices (with both counts), or devices of
            more than one kind (names them).
    """
    axes = parse_mesh(axes) if isinstance(axes, str) else dict(axes)
    devices = list(jax.devices() if devices is None else devices)
    kinds = sorted({d.platform for d in devices})
    if len(kinds) > 1:
        raise ValueError(f"mesh over devices of mixed kinds {kinds}: a mesh needs devices of one kind")
    need = math.prod(axes.values())
    if need > len(devices):
        shape = ", ".join(f"{k}={v}" for k, v in axes.items())
        hint = " (on a CPU, --cpu-devices N or jax_num_cpu_devices gives N host devices)" if kinds == ["cpu"] else ""
        raise ValueError(f"mesh {shape} needs {need} devices, but only {len(devices)} are present{hint}")
    grid = np.asarray(devices[:need], dtype=object).reshape(tuple(axes.values()))
    return jax.sharding.Mesh(grid, tuple(axes), axis_types=(jax.sharding.AxisType.Auto,) * len(axes))


def use_cpu_devices(n: int) -> None:
    """Gives this process ``n`` host CPU devices (``jax_num_cpu_devices``); call it before JAX has
    set up its devices.

    Raises:
        ValueError: ``n`` below 1, or JAX's devices are already set up with another count.
    """
    if n < 1:
        raise ValueError(f"--cpu-devices must be at least 1, got {n}")
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError as e:  # the backend is already initialized
        have = len(jax.devices("cpu"))
        if have != n:
            raise ValueError(f"cannot give this process {n} CPU devices: JAX already runs with {have} ({e})") from None


def initialize_distributed(coordinator: str, num_processes: int, process_id: int, timeout_s: int | None = None) -> None:
    """Joins a multi-process run (``jax.distributed.initialize``): ``coordinator`` is
    ``HOST:PORT`` of process 0, which listens there. ``timeout_s`` (default:
    ``$MAXJAX_COORDINATOR_TIMEOUT`` or 60) bounds the wait for the other processes.

    Raises:
        ValueError: a bad address, process count or id, or the coordinator cannot be reached
            within ``timeout_s`` seconds (names the address).
    """
    if not re.match(r"^[^:\s]+:[0-9]+$", coordinator or ""):
        raise ValueError(f"--coordinator {coordinator!r}: expected HOST:PORT (e.g. 127.0.0.1:9876)")
    if num_processes < 1:
        raise ValueError(f"--num-processes must be at least 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"--process-id must be in [0, {num_processes}), got {process_id}")
    if timeout_s is None:
        timeout_s = int(os.environ.get("MAXJAX_COORDINATOR_TIMEOUT", "60"))
    if process_id != 0:  # XLA aborts the process when it cannot register: see that the address answers first
        host, port = coordinator.rsplit(":", 1)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise ValueError(
                        f"process {process_id} of {num_processes} could not join the run at coordinator {coordinator} "
                        f"within {timeout_s} s: nothing answers there ({e.strerror or e})"
                    ) from None
                time.sleep(0.2)
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
            initialization_timeout=timeout_s,
        )  # fmt: skip
    except Exception as e:  # jaxlib raises its own error types for a coordinator it cannot reach
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"process {process_id} of {num_processes} could not join the run at coordinator {coordinator} within "
            f"{timeout_s} s: {first}"
        ) from None
