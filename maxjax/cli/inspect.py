r"""``maxjax inspect PATH...``: a checkpoint's metadata and every tensor (name, shape, dtype/encoding, bytes).

    maxjax inspect model.gguf                 # metadata and every tensor, like gguf-dump
    maxjax inspect model.safetensors --filter 'layers\.0\.'
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from maxjax.cli.errors import CLIError

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a .gguf or .safetensors file, a *.safetensors.index.json, or a checkpoint directory "
        "(orbax, or safetensors shards); each PATH is shown on its own",
    )
    p.add_argument("--filter", metavar="REGEX", help="only tensors whose name matches REGEX (re.search)")
    p.add_argument("--no-metadata", action="store_true", help="leave out the metadata table")
    p.add_argument("--max-items", type=int, default=8, metavar="N", help="array items shown per metadata value (default 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--mesh", metavar="AXES",
        help="show how a model (a GGUF or a Hugging Face directory) sits on a mesh, e.g. dp=2,tp=4: each weight's "
        "PartitionSpec and bytes per device (tensor parallel over tp)",
    )  # fmt: skip
    p.add_argument("--cpu-devices", type=int, metavar="N", help="give this process N host CPU devices (for --mesh on a CPU)")
    p.add_argument(
        "--quantized-layout", default="auto", choices=("auto", "nibbles", "unpacked", "packed", "dequantized", "mapped"),
        help="with --mesh: the runtime layout of quantized weights (default: the backend policy's)",
    )  # fmt: skip


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def _show_value(value: Any, max_items: int) -> str:
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in value})
        head = ", ".join(_show_value(v, max_items) for v in value[:max_items])
        more = f", ... ({len(value)} items)" if len(value) > max_items else ""
        return f"[{head}{more}]" + (f"  <{len(value)} x {'|'.join(kinds)}>" if len(value) > max_items else "")
    if isinstance(value, str):
        one = value.replace("\n", "\\n")
        return repr(one if len(one) <= 200 else one[:200] + "...")
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


def _json_value(value: Any, max_items: int) -> Any:
    if isinstance(value, (list, tuple)):
        return [_json_value(v, max_items) for v in value[:max_items]] + (
            [f"... ({len(value)} items)"] if len(value) > max_items else []
        )
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200, highlight=False)


def run_mesh(args: argparse.Namespace) -> int:
    """``inspect --mesh``: the placement of each weight of a model on a mesh, from shapes alone."""
    from maxjax.backend import policy_for
    from maxjax.engine.mesh import make_mesh, parse_mesh, use_cpu_devices
    from maxjax.engine.placement import placement_report
    from maxjax.graph import ShardingStrategy
    from maxjax.models.checkpoint import module_from_gguf, module_from_pretrained_dir

    axes = parse_mesh(args.mesh)
    if args.cpu_devices is not None:
        use_cpu_devices(args.cpu_devices)
    if len(args.paths) != 1:
        raise CLIError("--mesh shows one model: give one PATH")
    mesh = make_mesh(axes)
    path = args.paths[0]
    if os.path.isdir(path):
        module, _ = module_from_pretrained_dir(path, mesh=mesh)
    else:
        module, _, _ = module_from_gguf(path, lazy=True, mesh=mesh)
    tp = int(axes.get("tp", 1))
    if tp > 1:
        module.sharding_strategy = ShardingStrategy.tensor_parallel(tp)
    module.to(mesh, axis="tp" if "tp" in axes else next(iter(axes)))
    layout = policy_for(mesh.devices.flat[0]).quantized_layout if args.quantized_layout == "auto" else args.quantized_layout
    pattern = re.compile(args.filter) if args.filter else None
    rows = [r for r in placement_report(module, layout) if pattern is None or pattern.search(r["name"])]
    mesh_text = ", ".join(f"{k}={v}" for k, v in axes.items())
    if args.json:
        print(json.dumps({"path": path, "mesh": axes, "quantized_layout": layout,
                          "weights": [{**r, "spec": None if r["spec"] is None else [None if a is None else a for a in r["spec"]]} for r in rows]},
                         indent=1, default=str))  # fmt: skip
        return 0
    from rich.table import Table

    console = _console()
    table = Table(title=f"{path} on mesh {mesh_text} (quantized layout {layout})", title_justify="left")
    for col, justify in (("name", "left"), ("shape", "left"), ("on devices", "left"), ("PartitionSpec", "left"),
                         ("layout", "left"), ("bytes / device", "right")):  # fmt: skip
        table.add_column(col, justify=justify, no_wrap=True)
    for r in rows:
        table.add_row(r["name"], str(r["shape"]), str(r["runtime_shape"]), str(r["spec"]), r["layout"], f"{r['bytes_per_device']:,}")
    console.print(table)
    per_device, total = sum(r["bytes_per_device"] for r in rows), sum(r["bytes"] for r in rows)
    console.print(f"{len(rows)} weight(s): {_human(per_device)} per device, {_human(total)} in all")
    return 0


def run(args: argparse.Namespace) -> int:
    """``maxjax inspect PATH...``: metadata and every tensor (name, shape, dtype/encoding, bytes)."""
    from maxjax.graph.weights import load_weights, summarize

    if args.mesh:
        return run_mesh(args)

    try:
        pattern = re.compile(args.filter) if args.filter else None
    except re.error as e:
        raise CLIError(f"--filter: invalid regular expression {args.filter!r}: {e}") from None
    if args.max_items < 0:
        raise CLIError("--max-items must be >= 0")
    reports = []
    for path in args.paths:
        weights = load_weights([path])
        summary = summarize(weights)
        tensors = [t for t in summary.tensors if pattern is None or pattern.search(t.name)]
        reports.append((path, summary, tensors))
    if args.json:
        out = []
        for path, s, tensors in reports:
            out.append(
                {
                    "path": path,
                    "format": s.format,
                    "files": s.files,
                    "metadata": {} if args.no_metadata else {k: _json_value(v, args.max_items) for k, v in s.metadata.items()},
                    "tensors": [
                        {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "encoding": t.encoding, "bytes": t.nbytes}
                        for t in tensors
                    ],
                    "memory_plan": _memory_plan(path),
                }
            )
        print(json.dumps(out if len(out) > 1 else out[0], indent=1))
        return 0
    from rich.table import Table

    console = _console()
    for path, s, tensors in reports:
        size = sum(os.path.getsize(f) for f in s.files if os.path.isfile(f))
        console.print(f"[bold]{path}[/bold]: {s.format}, {len(s.files)} file(s), {len(s.tensors)} tensors")
        if not args.no_metadata and s.metadata:
            meta = Table(title="metadata", title_justify="left", show_lines=False)
            meta.add_column("key", no_wrap=True)
            meta.add_column("value", overflow="fold")
            for k, v in s.metadata.items():
                meta.add_row(k, _show_value(v, args.max_items))
            console.print(meta)
        table = Table(title="tensors", title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("name", no_wrap=True)
        table.add_column("shape", no_wrap=True)
        table.add_column("dtype / encoding", no_wrap=True)
        table.add_column("bytes", justify="right")
        for i, t in enumerate(tensors):
            table.add_row(str(i), t.name, "[" + ", ".join(str(d) for d in t.shape) + "]", t.encoding or t.dtype, f"{t.nbytes:,}")
        console.print(table)
        shown = sum(t.nbytes for t in tensors)
        files = f"; file(s) {_human(size)}" if size else ""
        console.print(f"{len(tensors)} tensor(s) shown, {_human(shown)} of tensor data{files}")
        plan = _memory_plan(path)
        if plan is not None:
            console.print(
                f"to run: weights {_human(plan['weights'])} in their run-time layout "
                f"({plan['layout']} for quantized tensors), KV cache {_human(plan['kv_cache'])} for {plan['kv_tokens']:,} "
                f"tokens at batch 1, {_human(plan['total'])} in all, "
                + (f"{_human(plan['available'])} available" if plan.get("available") is not None else "free memory unknown")
            )
    return 0


def _memory_plan(path: str) -> dict[str, Any] | None:
    """:func:`maxjax.models.loading.memory_plan` of a model (a ``.gguf`` file or a directory with a
    ``config.json``) with the memory available beside it; None for other checkpoints or a model it
    cannot plan (the loader's checks name the fault)."""
    from pathlib import Path

    from maxjax.models.loading import available_memory, memory_plan

    p = Path(path)
    if not (p.suffix == ".gguf" and p.is_file() or (p / "config.json").is_file()):
        return None
    try:
        plan = memory_plan(p)
    except (ValueError, OSError):
        return None
    if plan is not None:
        avail = available_memory()
        plan["available"] = avail[0] if avail else None
    return plan
