"""The device arguments ``generate``, ``inspect`` and ``serve`` share: a mesh, CPU devices, multi-process runs."""

from __future__ import annotations

import argparse
from typing import Any

from maxjax.cli.errors import CLIError

__all__ = ["add_mesh_arguments", "mesh_from_arguments"]


def add_mesh_arguments(p: argparse.ArgumentParser) -> None:
    """The device arguments ``generate``, ``inspect`` and ``serve`` share."""
    g = p.add_argument_group("devices")
    g.add_argument("--mesh", metavar="AXES", help="run on a device mesh, e.g. dp=2,tp=4: tensor parallel over tp, data parallel over dp")
    g.add_argument("--cpu-devices", type=int, metavar="N", help="give this process N host CPU devices (for --mesh on a CPU)")
    g.add_argument("--coordinator", metavar="HOST:PORT", help="multi-process run: process 0's address (jax.distributed)")
    g.add_argument("--num-processes", type=int, default=1, metavar="N", help="multi-process run: how many processes (default 1)")
    g.add_argument("--process-id", type=int, default=0, metavar="I", help="multi-process run: this process's index (default 0)")


def mesh_from_arguments(args: argparse.Namespace) -> Any:
    """Sets up the devices the arguments ask for (CPU devices, joining a multi-process run) and
    returns the ``--mesh`` mesh, or None.

    Raises:
        ValueError: a bad ``--mesh`` or device argument (names it).
    """
    from maxjax.engine.mesh import initialize_distributed, make_mesh, parse_mesh, use_cpu_devices

    axes = parse_mesh(args.mesh) if args.mesh else None  # syntax errors before anything starts
    if args.cpu_devices is not None:
        use_cpu_devices(args.cpu_devices)
    if args.coordinator or args.num_processes != 1:
        if not args.coordinator:
            raise CLIError("--num-processes needs --coordinator HOST:PORT")
        initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    return None if axes is None else make_mesh(axes)
