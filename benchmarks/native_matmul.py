"""maxjax's CPU matmul kernels (``maxjax.backend.kernels``) against XLA's products of the same
quantized weights, as the backend policy would otherwise form them.

For the weights of Llama-3.2-1B (Q4_0 and Q4_1 in the ``nibbles`` layout, Q8_0 in ``unpacked``:
``[2048, 2048]`` q/o_proj, ``[8192, 2048]`` gate/up, ``[2048, 8192]`` down, and the
``[128256, 2048]`` head) and 1 to 32 activation rows, in one process, the two interleaved round
by round: the median of ``--rounds`` rounds of ``--calls`` jitted calls each. Shown with each
figure: GB/s of weight bytes read. Records the CPU's vector features and the load average.
Writes ``benchmarks/results/native_matmul.json``, ``.txt`` and ``.png`` (``--out`` names another
stem).

``--bfloat16``: bfloat16 weights of the same shapes times float32 activations (a float32 model of
a bfloat16 checkpoint): the policy's product (maxjax's kernel for up to ``native_matmul_max_rows``
rows, widened blocks in XLA's GEMM beyond) against XLA's product of the weight converted in the
program, and against the float32 weight widened at load (what such a model held before
``keep_16bit_weights``). Writes ``bfloat16_matmul.*``.

    python benchmarks/native_matmul.py [--rounds 5] [--calls 20] [--rows 1,2,4,8,16,32]
    python benchmarks/native_matmul.py --bfloat16 [--rows 1,4,16,32,128]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

SHAPES = [("q_proj", 2048, 2048), ("gate_proj", 8192, 2048), ("down_proj", 2048, 8192), ("head", 128256, 2048)]
WEIGHTS = [("q4_0", "nibbles"), ("q4_1", "nibbles"), ("q8_0", "unpacked")]


def _time(f, x, w, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        y = f(x, w)
    y.block_until_ready()
    return (time.perf_counter() - t) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--out", default=None)
    ap.add_argument("--bfloat16", action="store_true", help="bfloat16 weights, float32 activations (see the docstring)")
    args = ap.parse_args()
    if args.bfloat16:
        bfloat16_main(args)
        return
    args.out = args.out or "native_matmul"

    import gguf
    import jax
    import jax.numpy as jnp
    import numpy as np

    from maxjax.backend import cpu_vector_features, kernels, policy_for
    from maxjax.graph.quantization import QuantizationEncoding
    from maxjax.graph.quantization.arrays import NibbleArray, UnpackedArray

    assert kernels.available(), kernels.unavailable_reason()
    cpu = policy_for("cpu")
    xla = dataclasses.replace(cpu, native_matmul_max_rows=0)
    kernel = dataclasses.replace(cpu, native_matmul_max_rows=1 << 30)
    rows_list = [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(0)
    rows_out = []
    for qtype, layout in WEIGHTS:
        enc = QuantizationEncoding(qtype.upper())
        cls = NibbleArray if layout == "nibbles" else UnpackedArray
        for name, n, k in SHAPES:
            if name == "head" and qtype != "q4_0":
                continue
            packed = gguf.quantize((rng.standard_normal((n, k)) * 0.02).astype(np.float32), enc.to_gguf())
            w = cls.from_packed(enc, jnp.asarray(packed))
            jax.block_until_ready(w)
            f_xla = jax.jit(lambda x, w: w.matmul(x, xla))
            f_ker = jax.jit(lambda x, w: w.matmul(x, kernel))
            for m in rows_list:
                if name == "head" and m > 4:
                    continue
                x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
                for f in (f_xla, f_ker):
                    f(x, w).block_until_ready()
                t_x, t_k = [], []
                for _ in range(args.rounds):
                    t_x.append(_time(f_xla, x, w, args.calls))
                    t_k.append(_time(f_ker, x, w, args.calls))
                a, b = statistics.median(t_x), statistics.median(t_k)
                row = {
                    "weight": qtype, "layout": layout, "matrix": name, "shape": [n, k], "rows": m,
                    "bytes": int(w.nbytes), "xla_ms": a * 1e3, "kernel_ms": b * 1e3, "speedup": a / b,
                    "xla_gb_s": w.nbytes / a / 1e9, "kernel_gb_s": w.nbytes / b / 1e9,
                }  # fmt: skip
                rows_out.append(row)
                print(
                    f"{qtype:5} {layout:9} {name:9} [{n:6},{k:5}] rows {m:3}: XLA {a * 1e3:8.3f} ms ({row['xla_gb_s']:5.1f} GB/s)"
                    f"  kernel {b * 1e3:8.3f} ms ({row['kernel_gb_s']:5.1f} GB/s)  {a / b:5.2f}x",
                    flush=True,
                )
    record = {
        "cpu": cpu_vector_features(), "cores": os.cpu_count(), "load_average": os.getloadavg(),
        "policy_native_matmul_max_rows": cpu.native_matmul_max_rows, "rows": rows_out,
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(record, indent=1))
    lines = [f"{r['weight']} {r['matrix']} {r['shape']} rows={r['rows']}: XLA {r['xla_ms']:.3f} ms, kernel {r['kernel_ms']:.3f} ms, {r['speedup']:.2f}x" for r in rows_out]
    (RESULTS / f"{args.out}.txt").write_text("\n".join([json.dumps(record["cpu"]), *lines]) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(WEIGHTS), figsize=(5 * len(WEIGHTS), 4), sharey=True)
    for ax, (qtype, layout) in zip(axes, WEIGHTS):
        for name, _, _ in SHAPES:
            pts = [(r["rows"], r["speedup"]) for r in rows_out if r["weight"] == qtype and r["matrix"] == name]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axvline(cpu.native_matmul_max_rows, color="grey", ls=":", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(f"{qtype} ({layout})")
        ax.set_xlabel("activation rows")
    axes[0].set_ylabel("XLA time / kernel time")
    axes[0].legend()
    fig.suptitle(f"maxjax CPU kernel vs XLA ({', '.join(f for f in record['cpu']['vector_features'] if f.startswith('avx512') or f == 'avx2')[:80]})", fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{args.out}.png", dpi=100)


def bfloat16_main(args: argparse.Namespace) -> None:
    """The ``--bfloat16`` table: three ways to multiply float32 rows by a bfloat16 checkpoint's weight."""
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    from maxjax.backend import cpu_vector_features, kernels, policy_for

    assert kernels.available(), kernels.unavailable_reason()
    cpu = policy_for("cpu")
    xla = dataclasses.replace(cpu, native_matmul_max_rows=0)
    rows_list = [int(r) for r in (args.rows if args.rows != "1,2,4,8,16,32" else "1,4,16,32,128").split(",")]
    rng = np.random.default_rng(0)
    ways = {  # name -> (weight as held, product)
        "float32 weight": (lambda w: w.astype(jnp.float32), jax.jit(lambda x, w: cpu.matmul_t(x, w, stored=True))),
        "XLA widens": (lambda w: w, jax.jit(lambda x, w: xla.matmul_t(x, w, stored=True))),
        "policy (kernel)": (lambda w: w, jax.jit(lambda x, w: cpu.matmul_t(x, w, stored=True))),
    }
    rows_out = []
    for name, n, k in SHAPES:
        w16 = jnp.asarray((rng.standard_normal((n, k)) * 0.02).astype(ml_dtypes.bfloat16))
        held = {way: jax.block_until_ready(hold(w16)) for way, (hold, _) in ways.items()}
        for m in rows_list:
            if name == "head" and m > 4:
                continue
            x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
            times: dict[str, list[float]] = {way: [] for way in ways}
            for way, (_, f) in ways.items():
                f(x, held[way]).block_until_ready()
            for _ in range(args.rounds):
                for way, (_, f) in ways.items():
                    times[way].append(_time(f, x, held[way], args.calls))
            med = {way: statistics.median(t) for way, t in times.items()}
            row = {"matrix": name, "shape": [n, k], "rows": m, "ms": {w: t * 1e3 for w, t in med.items()},
                   "gb_s": {w: held[w].nbytes / t / 1e9 for w, t in med.items()},
                   "speedup_vs_float32": med["float32 weight"] / med["policy (kernel)"]}  # fmt: skip
            rows_out.append(row)
            print(
                f"{name:9} [{n:6},{k:5}] rows {m:3}: " + "  ".join(f"{w} {t * 1e3:8.3f} ms ({row['gb_s'][w]:5.1f} GB/s)" for w, t in med.items())
                + f"  kernel/float32 {row['speedup_vs_float32']:.2f}x",
                flush=True,
            )
    record = {"cpu": cpu_vector_features(), "cores": os.cpu_count(), "load_average": os.getloadavg(), "rows": rows_out}
    out = args.out or "bfloat16_matmul"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{out}.json").write_text(json.dumps(record, indent=1))
    lines = [
        f"{r['matrix']} {r['shape']} rows={r['rows']}: " + ", ".join(f"{w} {t:.3f} ms" for w, t in r["ms"].items())
        + f"; policy {r['speedup_vs_float32']:.2f}x the float32 weight"
        for r in rows_out
    ]  # fmt: skip
    (RESULTS / f"{out}.txt").write_text("\n".join([json.dumps(record["cpu"]), *lines]) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, _, _ in SHAPES:
        pts = [(r["rows"], r["speedup_vs_float32"]) for r in rows_out if r["matrix"] == name]
        ax.plot(*zip(*pts), marker="o", label=name)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("activation rows")
    ax.set_ylabel("float32 weight time / bfloat16 policy time")
    ax.legend()
    fig.suptitle(f"bfloat16 weights, float32 arithmetic ({', '.join(f for f in record['cpu']['vector_features'] if f.startswith('avx512') or f == 'avx2')[:80]})", fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{out}.png", dpi=100)


if __name__ == "__main__":
    main()
