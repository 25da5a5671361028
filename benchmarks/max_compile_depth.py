"""MAX 26.7 side of ``benchmarks/compile_depth.py``: the same stack built with MAX's own API.

Runs ONLY with the ``max`` package (``max==26.7.0``), in its own virtual environment, never in
maxjax's::

    python3 -m venv /work/maxenv && /work/maxenv/bin/pip install max==26.7.0 numpy
    /work/maxenv/bin/python benchmarks/max_compile_depth.py --layers 2 8 32 --out max.json

A stack of L identical blocks (RMSNorm -> Linear(512, 2048) -> silu -> Linear(2048, 512) +
residual, float32, input 8x128x512), written the way MAX's transformers are: one subgraph built
from layer 0 with ``build_subgraph("block", [x], weight_prefix="layers.0.")`` and called once per
layer with ``ops.call(sub, h, prefix=f"layers.{i}.")``. Weights are named with ``state_dict()``
before staging (MAX's ``build_subgraph`` strips the prefix from the names in place).

Phases, with MAX's compile caches in a fresh folder (``XDG_CACHE_HOME`` is pointed at it before
``max`` is imported):

- ``kernel_library_s``: the first compile ever in that cache (a one-matmul graph), which also
  builds the Mojo kernel library; reported on its own. The first block graph still compiles the
  kernels that graph did not need (norm, silu, ...), so the cold compile at the first L is higher;
- per L: ``build_s`` (Python time to stage the Graph), ``cold_load_s`` (``session.load``: compile
  of a graph not in the cache, plus weight binding), ``first_execute_s``, ``run_s`` (median of
  steady-state ``execute`` calls, output copied to NumPy), then the same graph built again from
  fresh modules and loaded again in this process: ``hit_build_s`` and ``hit_load_s`` (a compile
  cache hit).

Compile phases also give ``*_cpu_s``: CPU seconds of the process and its children, which a busy
machine inflates less than wall time. Prints one JSON object on the last line of stdout (and writes
it to ``--out`` when given).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import resource
import tempfile
import time

D, H, BATCH, SEQ = 512, 2048, 8, 128


def layer_weights(i: int):
    """Layer ``i``'s weights (the same in compile_depth.py): MAX layout, Linear weight [out, in]."""
    import numpy as np

    rng = np.random.default_rng(1000 + i)
    return {
        "norm.weight": (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32),
        "up.weight": (rng.standard_normal((H, D)) / np.sqrt(D)).astype(np.float32),
        "down.weight": (0.5 * rng.standard_normal((D, H)) / np.sqrt(H)).astype(np.float32),
    }


def input_array():
    import numpy as np

    return np.random.default_rng(7).standard_normal((BATCH, SEQ, D)).astype(np.float32)


def cpu_s() -> float:
    """CPU seconds of this process (all threads) and its children: robust to a busy machine."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    p.add_argument("--reps", type=int, default=5, help="steady-state executions per L (fewer for L >= 32)")
    p.add_argument("--cache-dir", default=None, help="XDG_CACHE_HOME for MAX (default: a fresh temp folder)")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    cache = args.cache_dir or tempfile.mkdtemp(prefix="max_cache_")
    os.environ["XDG_CACHE_HOME"] = cache  # before importing max: its compile caches go here

    t0 = time.perf_counter()
    import numpy as np
    from max import engine
    from max.driver import Buffer
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, ops
    from max.nn import LayerList, Linear, Module, RMSNorm

    import_s = time.perf_counter() - t0
    import max as max_pkg

    class Block(Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = RMSNorm(D, DType.float32, eps=1e-6)
            self.up = Linear(D, H, DType.float32, DeviceRef.CPU())
            self.down = Linear(H, D, DType.float32, DeviceRef.CPU())

        def __call__(self, x):
            return x + self.down(ops.silu(self.up(self.norm(x))))

    class Stack(Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.layers = LayerList([Block() for _ in range(n)])

        def __call__(self, x):
            sub = self.layers[0].build_subgraph("block", [x], weight_prefix="layers.0.")
            h = x
            for i in range(len(self.layers)):
                h = ops.call(sub, h, prefix=f"layers.{i}.")[0].tensor
            return h

    in_type = TensorType(DType.float32, [BATCH, SEQ, D], DeviceRef.CPU())
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731

    t0 = time.perf_counter()
    session = engine.InferenceSession()
    session_s = time.perf_counter() - t0

    # 1. first compile ever in this cache: builds the kernel library (one matmul graph)
    w0 = np.eye(D, dtype=np.float32)
    lin = Linear(D, D, DType.float32, DeviceRef.CPU())
    lin.load_state_dict({"weight": w0})
    registry = lin.state_dict()
    with Graph("warm", input_types=[in_type]) as g:
        g.output(lin(g.inputs[0].tensor))
    t0, c0 = time.perf_counter(), cpu_s()
    warm = session.load(g, weights_registry=registry)
    kernel_library_s, kernel_library_cpu_s = time.perf_counter() - t0, cpu_s() - c0
    x = input_array()
    xb = Buffer.from_numpy(x)
    warm.execute(xb)
    log(f"MAX: import {import_s:.1f}s, first compile ever (kernel library build) {kernel_library_s:.1f}s "
        f"(cpu {kernel_library_cpu_s:.1f}s)")

    all_weights: dict[int, dict] = {}

    def registry_for(n: int) -> dict:
        out = {}
        for i in range(n):
            if i not in all_weights:
                all_weights[i] = layer_weights(i)
            out.update({f"layers.{i}.{k}": v for k, v in all_weights[i].items()})
        return out

    def build(n: int):
        t0 = time.perf_counter()
        m = Stack(n)
        m.load_state_dict(registry_for(n))
        reg = m.state_dict()  # names the weights (layers.i.*) before staging
        construct = time.perf_counter() - t0
        t0 = time.perf_counter()
        with Graph(f"stack{n}", input_types=[in_type]) as graph:
            graph.output(m(graph.inputs[0].tensor))
        return graph, reg, construct, time.perf_counter() - t0

    results = []
    for n in args.layers:
        r: dict = {"L": n}
        graph, reg, r["construct_s"], r["build_s"] = build(n)
        t0, c0 = time.perf_counter(), cpu_s()
        model = session.load(graph, weights_registry=reg)
        r["cold_load_s"], r["cold_load_cpu_s"] = time.perf_counter() - t0, cpu_s() - c0
        t0 = time.perf_counter()
        out = model.execute(xb)[0].to_numpy()
        r["first_execute_s"] = time.perf_counter() - t0
        reps = args.reps if n < 32 else max(3, args.reps // 2)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            model.execute(xb)[0].to_numpy()
            times.append(time.perf_counter() - t0)
        r["run_s"] = statistics.median(times)
        r["run_min_s"] = min(times)
        r["run_reps"] = reps
        r["out_sample"] = [float(v) for v in out.reshape(-1)[:8]]
        r["out_abs_mean"] = float(np.abs(out).mean())
        del model
        # the same graph again, from fresh modules: a compile-cache hit
        graph, reg, _, r["hit_build_s"] = build(n)
        t0, c0 = time.perf_counter(), cpu_s()
        model = session.load(graph, weights_registry=reg)
        r["hit_load_s"], r["hit_load_cpu_s"] = time.perf_counter() - t0, cpu_s() - c0
        t0 = time.perf_counter()
        model.execute(xb)[0].to_numpy()
        r["hit_first_execute_s"] = time.perf_counter() - t0
        del model, graph, reg
        log(
            f"MAX L={n}: build {r['build_s']:.3f}s, cold load {r['cold_load_s']:.1f}s, "
            f"(cpu {r['cold_load_cpu_s']:.1f}s), cache-hit load {r['hit_load_s']:.2f}s, run {r['run_s'] * 1e3:.1f}ms"
        )
        results.append(r)

    summary = {
        "max_version": getattr(max_pkg, "__version__", "26.7.0"),
        "python": sys.version.split()[0],
        "cache_dir": cache,
        "import_s": import_s,
        "session_s": session_s,
        "kernel_library_s": kernel_library_s,
        "kernel_library_cpu_s": kernel_library_cpu_s,
        "loadavg_end": os.getloadavg(),
        "results": results,
    }
    text = json.dumps(summary)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
