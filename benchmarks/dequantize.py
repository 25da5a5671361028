"""Benchmark of maxjax's GGUF dequantizers and of quantized matmuls on the CPU.

1. Dequantization throughput of every encoding under ``jax.jit``, in GB/s of float32 output,
   against the ``gguf`` package's numpy dequantizer (``gguf.quants.dequantize``).
2. ``x @ dequantize(enc, w).T`` for SmolLM2 shapes (Q4_1, Q8_0) against the same matmul with
   float32 weights, with int8 weights converted inside the jit, and with the weights in the
   packed and unpacked layouts (``PackedArray.matmul``, ``UnpackedArray.matmul``); whether XLA
   fused the dequantizer into the dot
   (read from the optimized HLO).
3. A SmolLM2-sized decode pass (30 layers x 7 matrices, batch 1, ``lax.scan`` over stacked
   weights), where the weights no longer fit in the caches.

Output buffers above 32 MB are mmapped afresh by malloc on every call and, on this VM, first
touches of fresh pages cost about 1 µs each: a 4096x4096 float32 result is timed mostly as page
faults (numpy's ``a + 1`` on such an array also runs at under 1 GB/s here; see the size sweep).
The default tensor (2048x2048, 16 MB of float32) measures the dequantizers themselves.

Prints the tables and saves ``benchmarks/results/dequantize.png`` (and ``dequantize.json``).

    python benchmarks/dequantize.py [--rows 2048 --cols 2048] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import time

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from maxjax.backend import cpu_vector_features
from maxjax.graph.quantization import PackedArray, QuantizationEncoding, UnpackedArray, dequantize


def quantized_matmul(x, packed, enc):
    """``x @ dequantize(enc, packed).T`` with the file's blocks (the packed layout)."""
    return PackedArray(enc, packed).matmul(x)


def repack(enc, packed):
    """The unpacked layout (one byte per value) of GGUF blocks, leading axes kept."""
    return UnpackedArray.from_packed(enc, packed)


def repacked_matmul(x, weight):
    return weight.matmul(x)

E = QuantizationEncoding
ENCODINGS = [E.Q4_0, E.Q4_1, E.Q5_0, E.Q5_1, E.Q8_0, E.Q4_K, E.Q5_K, E.Q6_K]
F16_FIELDS = {E.Q4_0: [0], E.Q4_1: [0, 2], E.Q5_0: [0], E.Q5_1: [0, 2], E.Q8_0: [0],
              E.Q4_K: [0, 2], E.Q5_K: [0, 2], E.Q6_K: [208]}  # fmt: skip
RESULTS = pathlib.Path(__file__).parent / "results"


def random_packed(enc: QuantizationEncoding, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random GGUF blocks with finite float16 scales, shaped [rows, bytes_per_row]."""
    rng = np.random.default_rng(seed)
    bpe, bsize = enc.block_parameters
    nb = cols // bpe
    data = rng.integers(0, 256, (rows, nb, bsize), dtype=np.uint8)
    for off in F16_FIELDS[enc]:
        scale = (rng.standard_normal((rows, nb)) * 0.01).astype("<f2")
        data[:, :, off : off + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
    return data.reshape(rows, nb * bsize)


def timeit(fn, *args, min_time: float = 0.3, rounds: int = 5) -> float:
    """Best-of-rounds seconds per call (the machine is shared: the minimum is the stable number)."""
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = max(time.perf_counter() - t0, 1e-6)
    reps = max(1, int(min_time / rounds / once))
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def dot_fused_with_packed(compiled_text: str) -> bool:
    """True when some fused computation holds both a dot and a uint8 (packed-weight) operand."""
    for comp in re.split(r"\n(?=%|ENTRY)", compiled_text):
        if comp.startswith("ENTRY"):
            continue
        if " dot(" in comp and re.search(r"u8\[\d", comp):
            return True
    return False


# ------------------------------------------------------------------------------------------------


def bench_dequantize(rows: int, cols: int, numpy_rounds: int) -> list[dict]:
    out = []
    deq = jax.jit(dequantize, static_argnums=0)
    for enc in ENCODINGS:
        packed_np = random_packed(enc, rows, cols)
        packed = jax.device_put(packed_np)
        t_jax = timeit(deq, enc, packed)
        qtype = enc.to_gguf()
        t_np = timeit(lambda p: gguf.quants.dequantize(p, qtype), packed_np, min_time=0.0, rounds=numpy_rounds)
        gb = rows * cols * 4 / 1e9
        out.append(dict(encoding=enc.value, ms_jax=t_jax * 1e3, ms_numpy=t_np * 1e3,
                        gbps_jax=gb / t_jax, gbps_numpy=gb / t_np, speedup=t_np / t_jax))  # fmt: skip
        print(f"  {enc.value:5s} jax {t_jax * 1e3:8.2f} ms {gb / t_jax:6.2f} GB/s   "
              f"numpy {t_np * 1e3:8.2f} ms {gb / t_np:6.2f} GB/s   x{t_np / t_jax:5.1f}", flush=True)  # fmt: skip
    return out


def bench_matmul() -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    shapes = [(1, 1536, 576), (1, 576, 576), (1, 576, 1536), (16, 1536, 576)]
    f_float = jax.jit(lambda x, w: x @ w.T)
    f_int8 = jax.jit(lambda x, w: x @ w.astype(jnp.float32).T)
    f_deq = jax.jit(lambda x, w, enc: x @ dequantize(enc, w).T, static_argnums=2)
    f_qmm = jax.jit(quantized_matmul, static_argnums=2)
    f_rep = jax.jit(repacked_matmul)
    for n, o, i in shapes:
        x = jnp.asarray(rng.standard_normal((n, i)), jnp.float32)
        row = dict(shape=f"[{n},{i}]x[{o},{i}]")
        row["float32"] = timeit(f_float, x, jnp.asarray(rng.standard_normal((o, i)), jnp.float32)) * 1e6
        row["int8"] = timeit(f_int8, x, jnp.asarray(rng.integers(-127, 128, (o, i)), jnp.int8)) * 1e6
        for enc in (E.Q4_1, E.Q8_0):
            w = jnp.asarray(random_packed(enc, o, i))
            row[enc.value] = timeit(f_deq, x, w, enc) * 1e6
            row[f"{enc.value} quantized_matmul"] = timeit(f_qmm, x, w, enc) * 1e6
            row[f"{enc.value} repacked"] = timeit(f_rep, x, repack(enc, w)) * 1e6
            text = f_deq.lower(x, w, enc).compile().as_text()
            row[f"{enc.value} fused"] = dot_fused_with_packed(text)
        out.append(row)
        print("  " + "  ".join(f"{k} {v:.0f}us" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
              flush=True)  # fmt: skip
    return out


SMOLLM2_LAYER = {"q": (576, 576), "k": (192, 576), "v": (192, 576), "o": (576, 576),
                 "gate": (1536, 576), "up": (1536, 576), "down": (576, 1536)}  # fmt: skip


def bench_decode_pass(layers: int = 30) -> dict:
    """Batch-1 matmuls over SmolLM2-sized weights, scanned over stacked layers (weights from RAM)."""
    rng = np.random.default_rng(0)
    x0 = jnp.asarray(rng.standard_normal((1, 576)), jnp.float32)
    results = {}

    def make(kind: str):
        if kind == "float32":
            mk = lambda o, i: rng.standard_normal((layers, o, i)).astype(np.float32) * 0.05  # noqa: E731
            mm = lambda h, w: h @ w.T  # noqa: E731
        elif kind == "int8":
            mk = lambda o, i: rng.integers(-127, 128, (layers, o, i), dtype=np.int8)  # noqa: E731
            mm = lambda h, w: (h @ w.astype(jnp.float32).T) * 1e-3  # noqa: E731
        else:
            enc = E[kind.split()[0]]
            mk = lambda o, i: np.stack([random_packed(enc, o, i, s) for s in range(layers)])  # noqa: E731
            mm = lambda h, w: quantized_matmul(h, w, enc)  # noqa: E731
            if kind.endswith("repacked"):
                pack = mk
                mk = lambda o, i: repack(enc, jnp.asarray(pack(o, i)))  # noqa: E731
                mm = repacked_matmul
        weights = {k: mk(o, i) for k, (o, i) in SMOLLM2_LAYER.items()}
        weights = jax.tree.map(jnp.asarray, weights)

        def layer(h, w):
            # the matmuls of a Llama block, batch 1, without attention over a cache
            q, k, v = mm(h, w["q"]), mm(h, w["k"]), mm(h, w["v"])
            att = q * (1 + 1e-3 * jnp.tanh(jnp.sum(k * v)))
            h = h + 1e-3 * mm(att, w["o"])
            g = jax.nn.silu(mm(h, w["gate"])) * mm(h, w["up"])
            h = h + 1e-3 * mm(g, w["down"])
            return h / (1 + jnp.max(jnp.abs(h))), None

        f = jax.jit(lambda h, w: jax.lax.scan(layer, h, w)[0])
        nbytes = sum(v.nbytes for v in jax.tree.leaves(weights))
        return f, weights, nbytes

    kinds = ("float32", "int8", "Q4_1", "Q4_1 repacked", "Q8_0", "Q8_0 repacked")
    built = {kind: make(kind) for kind in kinds}
    best = {kind: float("inf") for kind in kinds}
    for _ in range(3):  # interleaved, best of all rounds: the machine is shared
        for kind, (f, w, _) in built.items():
            best[kind] = min(best[kind], timeit(f, x0, w, min_time=0.5, rounds=3))
    for kind, (f, w, nbytes) in built.items():
        t = best[kind]
        results[kind] = dict(ms=t * 1e3, weight_mb=nbytes / 1e6, gbps=nbytes / t / 1e9)
        print(f"  {kind:14s} {t * 1e3:7.2f} ms per pass  ({nbytes / 1e6:6.1f} MB of weights, "
              f"{nbytes / t / 1e9:5.1f} GB/s)", flush=True)  # fmt: skip
    return results


def plot(deq: list[dict], mm: list[dict], decode: dict, path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    names = [r["encoding"] for r in deq]
    xs = np.arange(len(names))
    ax.bar(xs - 0.2, [r["gbps_jax"] for r in deq], 0.4, label="maxjax (jax.jit)")
    ax.bar(xs + 0.2, [r["gbps_numpy"] for r in deq], 0.4, label="gguf (numpy)")
    ax.set_xticks(xs, names)
    ax.set_ylabel("GB/s of float32 output")
    ax.set_title(f"Dequantization, {title}")
    ax.legend()

    ax = axes[1]
    kinds = ["float32", "int8", "Q4_1", "Q4_1 repacked", "Q8_0", "Q8_0 repacked"]
    xs = np.arange(len(mm))
    for j, k in enumerate(kinds):
        ax.bar(xs + (j - 2.5) * 0.14, [r[k] for r in mm], 0.14, label=k)
    ax.set_xticks(xs, [r["shape"] for r in mm], fontsize=8)
    ax.set_ylabel("µs per call (weights in cache)")
    ax.set_title("x @ W.T under jax.jit")
    ax.legend()

    ax = axes[2]
    ks = list(decode)
    ax.bar(ks, [decode[k]["ms"] for k in ks], color=[f"C{j}" for j in range(len(ks))])
    ax.tick_params(axis="x", labelsize=7)
    for j, k in enumerate(ks):
        ax.text(j, decode[k]["ms"], f"{decode[k]['weight_mb']:.0f} MB", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per pass")
    ax.set_title("SmolLM2-sized matmul pass, batch 1")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--cols", type=int, default=2048, help="a multiple of 256")
    p.add_argument("--numpy-rounds", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="a 1024x1024 tensor and no decode pass")
    a = p.parse_args()
    if a.quick:
        a.rows = a.cols = 1024
    if a.cols % 256:
        p.error("--cols must be a multiple of 256 (the k-quant block)")
    cpu = cpu_vector_features()
    info = (f"jax {jax.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"vector features {' '.join(cpu['vector_features']) or 'unknown'}, "
            f"load average at start {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"# {info}")
    print(f"\n## Dequantization of a {a.rows}x{a.cols} tensor ({a.rows * a.cols * 4 / 1e6:.0f} MB of float32)")
    deq = bench_dequantize(a.rows, a.cols, a.numpy_rounds)
    sweep = {}
    if not a.quick:
        print("\n## Q4_1 dequantization against the tensor size (jax.jit)")
        f = jax.jit(dequantize, static_argnums=0)
        for n in (1024, 2048, 4096):
            w = jax.device_put(random_packed(E.Q4_1, n, n))
            t = timeit(f, E.Q4_1, w)
            sweep[f"{n}x{n}"] = dict(ms=t * 1e3, gbps=n * n * 4 / t / 1e9)
            print(f"  {n}x{n}: {t * 1e3:7.2f} ms  {n * n * 4 / t / 1e9:6.2f} GB/s of float32 output", flush=True)
    print("\n## x @ W.T (µs; weights in cache; 'fused' = XLA fused the dequantizer into the dot)")
    mm = bench_matmul()
    decode = {}
    if not a.quick:
        print("\n## SmolLM2-sized matmul pass: 30 layers x (q, k, v, o, gate, up, down), batch 1")
        decode = bench_decode_pass()

    print("\n| encoding | jax.jit ms | jax.jit GB/s | gguf numpy ms | gguf numpy GB/s | speedup |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in deq:
        print(f"| {r['encoding']} | {r['ms_jax']:.2f} | {r['gbps_jax']:.2f} | {r['ms_numpy']:.1f} | "
              f"{r['gbps_numpy']:.2f} | {r['speedup']:.1f}x |")  # fmt: skip
    cols = ["float32", "int8", "Q4_1", "Q4_1 quantized_matmul", "Q4_1 repacked", "Q4_1 fused", "Q8_0",
            "Q8_0 quantized_matmul", "Q8_0 repacked", "Q8_0 fused"]  # fmt: skip
    print("\n| shape | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for r in mm:
        cells = [f"{r[c]:.0f} µs" if isinstance(r[c], float) else ("yes" if r[c] else "no") for c in cols]
        print(f"| {r['shape']} | " + " | ".join(cells) + " |")
    if decode:
        print("\n| weights | ms per pass | MB of weights | GB/s of weights |")
        print("|---|---:|---:|---:|")
        for k, v in decode.items():
            print(f"| {k} | {v['ms']:.1f} | {v['weight_mb']:.0f} | {v['gbps']:.1f} |")

    info += f", at end {os.getloadavg()[0]:.1f}"
    print(f"\n# {info}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "dequantize_quick" if a.quick else "dequantize"
    (RESULTS / f"{stem}.json").write_text(
        json.dumps(dict(info=info, cpu=cpu, rows=a.rows, cols=a.cols, dequantize=deq, size_sweep=sweep, matmul=mm,
                        decode=decode), indent=1)  # fmt: skip
    )
    plot(deq, mm, decode or {"(skipped)": dict(ms=0.0, weight_mb=0.0)}, RESULTS / f"{stem}.png",
         f"{a.rows}x{a.cols}")  # fmt: skip
    print(f"\nsaved {RESULTS / f'{stem}.png'} and {stem}.json")


if __name__ == "__main__":
    main()
