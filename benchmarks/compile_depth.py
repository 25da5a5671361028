"""Compile time against depth: maxjax (inlined, build_subgraph + ops.call), Flax NNX, MAX 26.7.

A stack of L identical blocks (RMSNorm -> Linear(512, 2048) -> silu -> Linear(2048, 512) +
residual, float32, input 8x128x512), L in 1, 2, 4, 8, 16, 32, 64, four ways on JAX:

- ``a_maxjax_inlined``: a maxjax ``nn.Module`` whose ``__call__`` calls every layer (graph mode,
  ``InferenceSession``): every layer's ops are recorded in the graph;
- ``b_maxjax_subgraph``: MAX's loop, ``sub = layers[0].build_subgraph("block", [x.type],
  weight_prefix="layers.0.")`` then ``h = ops.call(sub, h, prefix=f"layers.{i}.")[0].tensor``
  (graph mode, ``InferenceSession``): the chain is lowered to one ``lax.scan`` over weights
  stacked at ``session.load`` (``maxjax/graph/scan.py``);
- ``c_flax_unrolled``: a hand-written Flax NNX model (``nnx.RMSNorm``, ``nnx.Linear``), a Python
  loop over an ``nnx.List`` of blocks, run as ``jax.jit`` of ``nnx.merge(graphdef, state)(x)``;
- ``d_flax_scan``: the same block created stacked with ``nnx.vmap`` and run with ``nnx.scan``
  (Flax's "scan over layers"), under the same ``jax.jit``.

Every variant gets the same weights (layer i's weights do not depend on L) and the outputs are
checked against each other.

Phases (seconds):

- ``build``: maxjax only, the Python time to build the ``Graph`` (``Graph(..., forward=module)``:
  records every op, running JAX's shape inference per op). Flax has no graph: constructing its
  model (random init, then our weights assigned) is not comparable and is left out, as is the
  maxjax module construction and ``load_state_dict``; ``load`` (maxjax) is ``session.load``: the
  registry check, device placement and, for (b), stacking the layer weights once, timed until
  the weights are on the device (the device_put copies run asynchronously after load returns);
- ``trace``: ``jitted.trace(state, x)`` (Python -> jaxpr; for maxjax, ``Model._run.trace(
  Model._state, x)``: evaluating the recorded graph on tracers);
- ``lower``: ``traced.lower()`` (jaxpr -> StableHLO);
- ``compile``: ``lowered.compile()`` (XLA);
- ``e2e``: what a user waits for from a built model to the first result, on a fresh instance:
  maxjax ``Graph`` build + ``session.load`` + first ``execute`` (blocked); Flax ``nnx.split`` +
  ``jax.jit`` + first call (blocked);
- ``run``: median of steady-state calls of the e2e instance (``Model.execute`` for maxjax,
  the jitted function for Flax) with ``block_until_ready``; fewer calls at large L.

build/load/trace/lower/compile are medians over ``--cycles`` fresh cycles (a new Graph, Model and
``jax.jit`` each time, so nothing is cached). The machine this was written on is shared with other
jobs, so the cycles and the steady-state calls are interleaved across the four variants (a b c d
a b c d ...): load from elsewhere falls on all of them alike. ``(cpu)`` columns are CPU seconds of
the process (all threads), which time-slicing inflates less than wall time; the JSON keeps every
sample, the minimum run time and the load average.

MAX 26.7 (``benchmarks/max_compile_depth.py``) runs in a subprocess with its own virtual
environment's Python (``$MAX_PYTHON`` or ``/work/maxenv/bin/python``) when it exists; it is never
imported here. Its cold compile (a fresh cache folder: the first compile ever also builds MAX's
kernel library, reported on its own), compile-cache hit and execute times join the table.

Prints the table and the issue's targets (PASS/FAIL), saves ``benchmarks/results/compile_depth.png``
(compile time against L, log-log) and ``benchmarks/results/compile_depth.json``.

    python benchmarks/compile_depth.py [--layers 1 2 4 8 16 32 64] [--max-layers 2 8 32] [--no-max]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import jax
import flax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType, ops

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "results"
D, H, BATCH, SEQ = 512, 2048, 8, 128
VARIANTS = ["a_maxjax_inlined", "b_maxjax_subgraph", "c_flax_unrolled", "d_flax_scan"]
LABELS = {
    "a_maxjax_inlined": "(a) maxjax inlined",
    "b_maxjax_subgraph": "(b) maxjax subgraph+call",
    "c_flax_unrolled": "(c) Flax NNX unrolled",
    "d_flax_scan": "(d) Flax NNX nnx.scan",
    "max_subgraph": "MAX 26.7 subgraph+call",
}


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- weights (shared with MAX's script)
_WEIGHTS: dict[int, dict[str, np.ndarray]] = {}


def layer_weights(i: int) -> dict[str, np.ndarray]:
    """Layer ``i``'s weights, MAX layout (Linear weight [out, in]); same as max_compile_depth.py."""
    if i not in _WEIGHTS:
        rng = np.random.default_rng(1000 + i)
        _WEIGHTS[i] = {
            "norm.weight": (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32),
            "up.weight": (rng.standard_normal((H, D)) / np.sqrt(D)).astype(np.float32),
            "down.weight": (0.5 * rng.standard_normal((D, H)) / np.sqrt(H)).astype(np.float32),
        }
    return _WEIGHTS[i]


def registry(n: int) -> dict[str, np.ndarray]:
    return {f"layers.{i}.{k}": v for i in range(n) for k, v in layer_weights(i).items()}


def input_array() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((BATCH, SEQ, D)).astype(np.float32)


# ---------------------------------------------------------------- maxjax models (MAX-style code)
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(D, DType.float32, eps=1e-6)
        self.up = nn.Linear(D, H, DType.float32, DeviceRef.CPU())
        self.down = nn.Linear(H, D, DType.float32, DeviceRef.CPU())

    def __call__(self, x):
        return x + self.down(ops.silu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, n: int, subgraph: bool) -> None:
        super().__init__()
        self.layers = nn.LayerList([Block() for _ in range(n)])
        self.subgraph = subgraph

    def __call__(self, x):
        if not self.subgraph:
            for layer in self.layers:
                x = layer(x)
            return x
        sub = self.layers[0].build_subgraph("block", [x.type], weight_prefix="layers.0.")
        h = x
        for i in range(len(self.layers)):
            h = ops.call(sub, h, prefix=f"layers.{i}.")[0].tensor
        return h


IN_TYPE = TensorType(DType.float32, [BATCH, SEQ, D], DeviceRef.CPU())


def maxjax_module(n: int, subgraph: bool) -> tuple[Stack, dict]:
    m = Stack(n, subgraph)
    m.load_state_dict(registry(n))
    return m, m.state_dict()


def maxjax_build(m: Stack) -> Graph:
    return Graph(f"stack{len(m.layers)}", forward=m, input_types=[IN_TYPE])


# ---------------------------------------------------------------- Flax NNX models
class FBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.norm = nnx.RMSNorm(D, epsilon=1e-6, rngs=rngs)
        self.up = nnx.Linear(D, H, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(H, D, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return x + self.down(nnx.silu(self.up(self.norm(x))))


class FUnrolled(nnx.Module):
    def __init__(self, n: int, rngs: nnx.Rngs) -> None:
        self.layers = nnx.List([FBlock(rngs) for _ in range(n)])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class FScan(nnx.Module):
    def __init__(self, n: int, rngs: nnx.Rngs) -> None:
        @nnx.split_rngs(splits=n)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs: nnx.Rngs) -> FBlock:
            return FBlock(rngs)

        self.layers = create(rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def step(h, layer: FBlock):
            return layer(h)

        return step(x, self.layers)


def _set(var: nnx.Variable, value: np.ndarray) -> None:
    var.set_value(jnp.asarray(value))


def flax_model(n: int, scan: bool) -> nnx.Module:
    """Built with random init, then our weights (NNX Linear kernels are [in, out])."""
    if scan:
        m = FScan(n, nnx.Rngs(0))
        ws = [layer_weights(i) for i in range(n)]
        _set(m.layers.norm.scale, np.stack([w["norm.weight"] for w in ws]))
        _set(m.layers.up.kernel, np.stack([w["up.weight"].T for w in ws]))
        _set(m.layers.down.kernel, np.stack([w["down.weight"].T for w in ws]))
        return m
    m = FUnrolled(n, nnx.Rngs(0))
    for i, blk in enumerate(m.layers):
        w = layer_weights(i)
        _set(blk.norm.scale, w["norm.weight"])
        _set(blk.up.kernel, w["up.weight"].T)
        _set(blk.down.kernel, w["down.weight"].T)
    return m


def flax_jit(m: nnx.Module):
    graphdef, state = nnx.split(m)

    @jax.jit
    def fwd(state, x):
        return nnx.merge(graphdef, state)(x)

    return fwd, state


# ---------------------------------------------------------------- timing
CPU: dict[str, float] = {}  # CPU seconds of the last timed call, by name (a busy machine inflates wall time)


def t(fn, *a, name: str | None = None):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*a)
    if name:
        CPU[name] = time.process_time() - c0
    return out, time.perf_counter() - t0


def steady_interleaved(calls: dict, reps: int) -> dict:
    """Blocked calls of every variant in turn (A B C D A B C D ...), so that load from other
    processes on the machine falls on all of them alike. Per variant: median and min wall seconds
    and median CPU seconds (all threads) of a call."""
    wall: dict = {v: [] for v in calls}
    cpu: dict = {v: [] for v in calls}
    for v, call in calls.items():  # one untimed call each (the e2e call already compiled them)
        jax.block_until_ready(call())
    for _ in range(reps):
        for v, call in calls.items():
            t0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(call())
            wall[v].append(time.perf_counter() - t0)
            cpu[v].append(time.process_time() - c0)
    return {v: {"run": statistics.median(wall[v]), "run_min": min(wall[v]), "run_cpu": statistics.median(cpu[v]),
                "run_reps": reps, "run_samples": wall[v], "run_cpu_samples": cpu[v]} for v in calls}


def reps_for(n: int, base: int) -> int:
    return base if n <= 8 else max(5, base // 2) if n <= 32 else 5


def _median_phases(samples: list[dict]) -> dict:
    """Median of each phase over the repeats, and the samples themselves."""
    out = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    out["samples"] = {k: [s[k] for s in samples] for k in samples[0]}
    return out


def load_ready(g: Graph, reg: dict):
    """``session.load`` and wait until the weights are on the device.

    ``load`` returns before the ``device_put`` copies of the stacked weights are done (they run
    asynchronously, about 0.2 s for L=64 here); without this wait they overlap the next phases and
    inflate trace/lower/compile."""
    model = InferenceSession().load(g, weights_registry=reg)
    jax.block_until_ready(model._state)
    return model


def maxjax_cycle(setup: tuple, x: jax.Array) -> dict:
    """One fresh build/load/trace/lower/compile: a new Graph, a new Model, a new jax.jit."""
    m, reg = setup
    s: dict = {}
    g, s["build"] = t(maxjax_build, m)
    model, s["load"] = t(load_ready, g, reg)  # until the weights are in place
    traced, s["trace"] = t(model._run.trace, model._state, x)
    lowered, s["lower"] = t(traced.lower)
    compiled, s["compile"] = t(lowered.compile, name="compile")
    s["compile_cpu"] = CPU["compile"]
    s["hlo_chars"] = len(compiled.as_text())
    s["scan_chains"] = [len(c.nodes) for c in model._program.chains]
    return s


def flax_cycle(m: nnx.Module, x: jax.Array) -> dict:
    """One fresh jax.jit of the model (a new function: nothing cached) traced, lowered, compiled."""
    s: dict = {}
    fwd, state = flax_jit(m)
    traced, s["trace"] = t(fwd.trace, state, x)
    lowered, s["lower"] = t(traced.lower)
    compiled, s["compile"] = t(lowered.compile, name="compile")
    s["compile_cpu"] = CPU["compile"]
    s["hlo_chars"] = len(compiled.as_text())
    return s


def maxjax_e2e(n: int, subgraph: bool, x: jax.Array) -> tuple[dict, np.ndarray, object]:
    """A fresh module: Graph build + session.load + first execute (blocked); the loaded model's call."""
    m, reg = maxjax_module(n, subgraph)
    t0 = time.perf_counter()
    g = maxjax_build(m)
    model = InferenceSession().load(g, weights_registry=reg)
    out = model.execute(x)[0].to_jax().block_until_ready()
    r = {"e2e": time.perf_counter() - t0, "num_compiles": model.num_compiles}
    return r, np.asarray(out), lambda: model.execute(x)[0].to_jax()


def flax_e2e(m: nnx.Module, x: jax.Array) -> tuple[dict, np.ndarray, object]:
    """nnx.split + a fresh jax.jit + first call (blocked); the jitted call."""
    t0 = time.perf_counter()
    fwd, state = flax_jit(m)
    out = fwd(state, x).block_until_ready()
    return {"e2e": time.perf_counter() - t0}, np.asarray(out), lambda: fwd(state, x)


def measure_depth(n: int, x: jax.Array, cycles: int, reps: int, steady_for: list[str]) -> tuple[dict, dict]:
    """Every variant at depth ``n``. Compile cycles and steady-state calls are interleaved across
    the variants (a b c d a b c d ...), so that load from other processes falls on all alike."""
    setups, res = {}, {}
    for v in VARIANTS:
        if v.startswith(("a_", "b_")):
            setups[v], c = t(maxjax_module, n, v.startswith("b_"))
        else:
            setups[v], c = t(flax_model, n, v.startswith("d_"))
        res[v] = {"construct": c}
    samples: dict = {v: [] for v in VARIANTS}
    for _ in range(cycles):
        for v in VARIANTS:
            samples[v].append(maxjax_cycle(setups[v], x) if v.startswith(("a_", "b_")) else flax_cycle(setups[v], x))
            gc.collect()
    for v in VARIANTS:
        last = samples[v][-1]
        timed = [k for k in last if k not in ("hlo_chars", "scan_chains")]
        res[v].update({k: statistics.median(s[k] for s in samples[v]) for k in timed})
        res[v]["samples"] = {k: [s[k] for s in samples[v]] for k in timed}
        res[v].update({k: last[k] for k in ("hlo_chars", "scan_chains") if k in last})
    outs, calls = {}, {}
    for v in VARIANTS:
        if v.startswith(("a_", "b_")):
            r, outs[v], call = maxjax_e2e(n, v.startswith("b_"), x)
        else:
            r, outs[v], call = flax_e2e(setups[v], x)
        res[v].update(r)
        if v in steady_for:
            calls[v] = call
    for v, rr in steady_interleaved(calls, reps).items():
        res[v].update(rr)
    return res, outs


def run_max(layers: list[int], reps: int, tag: str = "") -> dict:
    py = os.environ.get("MAX_PYTHON") or "/work/maxenv/bin/python"
    if not os.path.exists(py):
        return {"installed": False, "reason": f"MAX 26.7 not installed: no {py} (set $MAX_PYTHON)"}
    out = RESULTS / f"compile_depth{tag}_max_raw.json"
    cmd = [py, str(HERE / "max_compile_depth.py"), "--layers", *map(str, layers), "--reps", str(reps),
           "--out", str(out)]
    log("running MAX 26.7:", " ".join(cmd))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        why = f"max_compile_depth.py exited {p.returncode}"
        return {"installed": True, "failed": True, "reason": why, "wall_s": wall}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res.update(installed=True, wall_s=wall, python=py)
    return res


# ---------------------------------------------------------------- report
def fmt(v: float | None, unit: str = "s") -> str:
    if v is None:
        return "-"
    if unit == "ms":
        return f"{v * 1e3:.1f}"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def table(res: dict, layers: list[int], mx: dict) -> str:
    hdr = (f"{'variant':<26}{'L':>4}{'build':>8}{'load':>8}{'trace':>8}{'lower':>8}{'compile':>9}{'(cpu)':>8}"
           f"{'e2e':>8}{'run ms':>9}{'min ms':>8}{'ms/layer':>9}")
    lines = [hdr, "-" * len(hdr)]
    for v in VARIANTS:
        for n in layers:
            r = res[v].get(str(n))
            if r is None:
                continue
            run = r.get("run")
            lines.append(
                f"{LABELS[v]:<26}{n:>4}{fmt(r.get('build')):>8}{fmt(r.get('load')):>8}{fmt(r['trace']):>8}"
                f"{fmt(r['lower']):>8}{fmt(r['compile']):>9}{fmt(r['compile_cpu']):>8}{fmt(r['e2e']):>8}"
                f"{fmt(run, 'ms') if run else 'n/a':>9}{fmt(r.get('run_min'), 'ms'):>8}"
                f"{fmt(run / n if run else None, 'ms'):>9}"
            )
        lines.append("")
    if mx.get("installed") and not mx.get("failed"):
        lines.append(
            f"MAX 26.7 (max_compile_depth.py, {mx['python']}): import {mx['import_s']:.1f}s; "
            "first compile ever in a fresh "
            f"cache (builds the kernel library, 1-matmul graph) {mx['kernel_library_s']:.1f}s "
            f"(cpu {mx.get('kernel_library_cpu_s', float('nan')):.1f}s)"
        )
        h2 = (f"{'variant':<26}{'L':>4}{'build':>8}{'cold load':>11}{'(cpu)':>8}{'hit load':>10}{'1st exec':>10}"
              f"{'run ms':>9}{'ms/layer':>9}")
        lines += [h2, "-" * len(h2)]
        for r in mx["results"]:
            lines.append(
                f"{LABELS['max_subgraph']:<26}{r['L']:>4}{fmt(r['build_s']):>8}{fmt(r['cold_load_s']):>11}"
                f"{fmt(r.get('cold_load_cpu_s')):>8}{fmt(r['hit_load_s']):>10}{fmt(r['first_execute_s']):>10}"
                f"{fmt(r['run_s'], 'ms'):>9}"
                f"{fmt(r['run_s'] / r['L'], 'ms'):>9}"
            )
    else:
        lines.append(f"MAX 26.7: {mx.get('reason')}")
    return "\n".join(lines)


def targets(res: dict, mx: dict) -> list[tuple[str, bool | None, str]]:
    b, c, d = res["b_maxjax_subgraph"], res["c_flax_unrolled"], res["d_flax_scan"]
    out = []

    def get(tab, n, k):
        return tab.get(str(n), {}).get(k)

    def alt(tab1, n1, tab2, n2):  # the same ratio on the best cycle and on CPU seconds
        mn = min(tab1[str(n1)]["samples"]["compile"]) / min(tab2[str(n2)]["samples"]["compile"])
        cpu = get(tab1, n1, "compile_cpu") / get(tab2, n2, "compile_cpu")
        return f"(best of cycles: {mn:.2f}x; CPU seconds: {cpu:.2f}x)"

    b64, b2 = get(b, 64, "compile"), get(b, 2, "compile")
    if b64 and b2:
        out.append(("(b) compile at L=64 within 1.5x of (b) at L=2", b64 <= 1.5 * b2,
                    f"median {b64:.3f}s vs {b2:.3f}s: {b64 / b2:.2f}x {alt(b, 64, b, 2)}"))
    b32, d32 = get(b, 32, "compile"), get(d, 32, "compile")
    if b32 and d32:
        out.append(("(b) compile at L=32 below (d)'s", b32 < d32,
                    f"median {b32:.3f}s vs {d32:.3f}s: {b32 / d32:.2f}x {alt(b, 32, d, 32)}"))
    rb, rc = get(b, 32, "run"), get(c, 32, "run")
    if rb and rc:
        mb, mc = get(b, 32, "run_min"), get(c, 32, "run_min")
        out.append(("(b) steady-state run within 10% of (c) at L=32", rb <= 1.10 * rc,
                    f"median {rb * 1e3:.1f}ms vs {rc * 1e3:.1f}ms: {rb / rc:.3f}x (min: {mb / mc:.3f}x; CPU seconds: "
                    f"{get(b, 32, 'run_cpu') / get(c, 32, 'run_cpu'):.3f}x; calls interleaved)"))
    bb = get(b, 32, "build")
    m32 = next((r for r in mx.get("results", []) if r["L"] == 32), None) if mx.get("installed") else None
    if bb is not None and b32:
        bc = bb + get(b, 32, "trace") + get(b, 32, "lower") + b32
        if m32:
            cold, hit = m32["cold_load_s"], m32["hit_load_s"]
            out.append(("build+compile of (b) at L=32 >= 50x faster than MAX cold compile", cold >= 50 * bc,
                        f"{bc:.3f}s (build+trace+lower+compile) vs MAX cold {cold:.1f}s: {cold / bc:.0f}x"))
            out.append(("build+compile of (b) at L=32 faster than MAX cache hit", bc < hit,
                        f"{bc:.3f}s vs MAX cache-hit load {hit:.2f}s: {hit / bc:.1f}x"))
            e2e = get(b, 32, "e2e")
            out.append(("(info) (b) e2e build+load+first execute at L=32 vs MAX cache hit + first execute", None,
                        f"{e2e:.3f}s vs {hit + m32['hit_first_execute_s']:.2f}s"))
        else:
            why = mx.get("reason") or "MAX has no L=32 result"
            out.append(("build+compile of (b) at L=32 vs MAX (cold 50x, cache hit)", None, f"not measured: {why}"))
    return out


def plot(res: dict, layers: list[int], mx: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5))
    styles = {"a_maxjax_inlined": "o-", "b_maxjax_subgraph": "s-", "c_flax_unrolled": "^--", "d_flax_scan": "v--"}
    for v in VARIANTS:
        ns = [n for n in layers if str(n) in res[v]]
        ax.plot(ns, [res[v][str(n)]["compile"] for n in ns], styles[v], label=LABELS[v] + " (XLA compile)")
    bs = [n for n in layers if str(n) in res["b_maxjax_subgraph"]]
    ax.plot(bs, [sum(res["b_maxjax_subgraph"][str(n)][k] for k in ("build", "trace", "lower", "compile")) for n in bs],
            "s:", color="C1", alpha=0.6, label="(b) build+trace+lower+compile")
    if mx.get("installed") and not mx.get("failed"):
        ns = [r["L"] for r in mx["results"]]
        ax.plot(ns, [r["cold_load_s"] for r in mx["results"]], "D-", color="k",
                label="MAX 26.7 cold compile (session.load)")
        ax.plot(ns, [r["hit_load_s"] for r in mx["results"]], "D:", color="grey",
                label="MAX 26.7 cache hit (session.load)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("layers L")
    ax.set_ylabel("seconds")
    ax.set_title(f"Compile time vs depth (8x128x512 f32, {platform.machine()} CPU, jax {jax.__version__})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--max-layers", type=int, nargs="+", default=[2, 8, 32])
    p.add_argument("--reps", type=int, default=7, help="steady-state calls at small L (fewer at large L)")
    p.add_argument("--cycles", type=int, default=5, help="fresh build/trace/lower/compile cycles per point (median)")
    p.add_argument("--no-max", action="store_true", help="skip MAX 26.7 even when it is installed")
    p.add_argument("--no-steady-inlined-above", type=int, default=1000,
                   help="skip the steady-state run of (a)/(c) above this L (compile still measured)")
    p.add_argument("--tag", default="", help="suffix for the result files (compile_depth{tag}.json/png)")
    p.add_argument("--replot", action="store_true", help="redraw the PNG from the saved JSON, measure nothing")
    args = p.parse_args()
    if args.replot:
        saved = json.loads((RESULTS / f"compile_depth{args.tag}.json").read_text())
        layers = sorted(int(n) for n in saved["jax"]["b_maxjax_subgraph"])
        plot(saved["jax"], layers, saved["max"], RESULTS / f"compile_depth{args.tag}.png")
        print(saved["table"])
        return
    RESULTS.mkdir(exist_ok=True)
    t_start = time.perf_counter()
    loadavg_start = os.getloadavg()

    x = jax.device_put(input_array())
    # warm up JAX/XLA once (first-compile costs of the process would otherwise land on L=1)
    for sub in (False, True):
        m, reg = maxjax_module(2, sub)
        InferenceSession().load(maxjax_build(m), weights_registry=reg).execute(x)
    for scan in (False, True):
        fwd, st = flax_jit(flax_model(2, scan))
        fwd(st, x).block_until_ready()

    res: dict = {v: {} for v in VARIANTS}
    for n in args.layers:
        steady_for = [v for v in VARIANTS
                      if not (v in ("a_maxjax_inlined", "c_flax_unrolled") and n > args.no_steady_inlined_above)]
        got, outs = measure_depth(n, x, args.cycles, reps_for(n, args.reps), steady_for)
        for v in VARIANTS:
            r = res[v][str(n)] = got[v]
            log(f"{LABELS[v]:<26} L={n:<3} build {fmt(r.get('build'))} load {fmt(r.get('load'))} "
                f"trace {fmt(r['trace'])} lower {fmt(r['lower'])} compile {fmt(r['compile'])} "
                f"(cpu {fmt(r['compile_cpu'])}) e2e {fmt(r['e2e'])} "
                f"run {fmt(r.get('run'), 'ms')}ms")
        log(f"  [{time.perf_counter() - t_start:.0f}s]")
        gc.collect()
        ref = outs["c_flax_unrolled"]
        for v in VARIANTS:
            res[v][str(n)]["max_abs_diff_vs_c"] = float(np.abs(outs[v] - ref).max())
        res.setdefault("_out_sample", {})[str(n)] = [float(v) for v in ref.reshape(-1)[:8]]
    jax_s = time.perf_counter() - t_start
    loadavg_jax = os.getloadavg()

    if args.no_max:
        mx = {"installed": False, "reason": "skipped (--no-max)"}
    else:
        mx = run_max(args.max_layers, args.reps, args.tag)
    if mx.get("installed") and not mx.get("failed"):
        for r in mx["results"]:
            ref = res.get("_out_sample", {}).get(str(r["L"]))
            if ref:
                r["max_abs_diff_vs_c_sample"] = float(np.abs(np.array(r["out_sample"]) - np.array(ref)).max())

    text = table(res, args.layers, mx)
    text += (f"\n\nload average (1/5/15 min) at start {loadavg_start}, after the JAX part {loadavg_jax}, at the end "
             f"{os.getloadavg()} on {os.cpu_count()} CPUs; "
             "(cpu) = CPU seconds of the compile (robust to a busy machine)")
    print(text)
    print("\nmax |out - (c)| per variant and L:")
    for v in VARIANTS:
        print(f"  {LABELS[v]:<26}", " ".join(f"L={n}:{res[v][str(n)]['max_abs_diff_vs_c']:.1e}" for n in args.layers))
    if mx.get("installed") and not mx.get("failed"):
        print(f"  {LABELS['max_subgraph']:<26}", " ".join(
            f"L={r['L']}:{r.get('max_abs_diff_vs_c_sample', float('nan')):.1e}(8 values)" for r in mx["results"]))
    print("\nTargets (issue 4):")
    tg = targets(res, mx)
    for name, ok, detail in tg:
        verdict = "PASS" if ok else "FAIL" if ok is False else "INFO" if name.startswith("(info)") else "N/A "
        print(f"  {verdict}  {name}: {detail}")

    meta = {
        "jax": jax.__version__,
        "flax": flax.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "devices": [str(d) for d in jax.devices()],
        "shape": [BATCH, SEQ, D],
        "hidden": H,
        "jax_wall_s": jax_s,
        "loadavg_start": loadavg_start,
        "loadavg_after_jax": loadavg_jax,
        "loadavg_end": os.getloadavg(),
        "total_wall_s": time.perf_counter() - t_start,
    }
    out = {"meta": meta, "jax": res, "max": mx, "targets": [{"target": a, "pass": b, "detail": c} for a, b, c in tg],
           "table": text}
    (RESULTS / f"compile_depth{args.tag}.json").write_text(json.dumps(out, indent=1))
    plot(res, args.layers, mx, RESULTS / f"compile_depth{args.tag}.png")
    print(f"\nsaved {RESULTS / f'compile_depth{args.tag}.json'} and .png ({meta['total_wall_s']:.0f}s in all)")


if __name__ == "__main__":
    main()
