"""Benchmark of loading weights (issue 3, "Speed and memory"), all measured side by side in one run.

1. safetensors -> device arrays, on MiniLM's ``model.safetensors`` (91 MB) and on a synthetic
   512 MB file: maxjax's ``SafetensorWeights`` (default copy mode, and ``zero_copy=True``) against
   ``safetensors.numpy.load_file`` + ``jax.device_put`` (the synthetic file's data is 64-byte
   aligned, so zero-copy can alias it; MiniLM's is not, so zero-copy copies there). Each
   measurement runs in a fresh process
   with the file already in the page cache; time to ready device arrays, time until every page
   of every array has been read once ("used"), and peak RSS growth over the bytes
   of the tensors (the process's peak is reset with ``/proc/self/clear_refs`` before loading).
2. SmolLM2's GGUF (98 MB, Q4_1/Q8_0/F32): every weight loaded packed; resident bytes of the
   loaded weights against the file size.
3. Dequantization throughput of each encoding under ``jax.jit``, in GB/s of float32 output,
   against the ``gguf`` package's numpy ``dequantize``, on real blocks: SmolLM2's own Q4_1 and
   Q8_0 tensors, its weights re-quantized with ``gguf.quants.quantize`` for Q4_0/Q5_0/Q5_1, and
   random blocks with finite scales for the k-quants (the gguf package cannot quantize those);
   about 10 MB of output per call.

0. Stacking layers (issue 23), each in a fresh process: a 64-block float32 registry in memory
   (537 MB), and every block tensor of a GGUF (``--gguf``, e.g. the synthetic Llama-3.2-1B Q4_0
   from ``scripts/make_synthetic_gguf.py``) from the file, packed: the old way (each tensor
   copied at load, ``np.stack``, ``device_put``/``jnp.asarray``, which copies NumPy's 16-byte
   aligned buffer again) against ``maxjax.engine.placement.place_layers`` (one preallocated,
   64-byte aligned stack filled layer by layer straight from the map, adopted by ``device_put``).
   Wall and CPU time (on a shared machine wall time is mostly waiting) and peak RSS growth.

Prints the tables; saves ``benchmarks/results/load_weights.png`` and ``load_weights.json``
(``load_stack.json`` with ``--stack-only``).

    python benchmarks/load_weights.py [--quick] [--gguf FILE] [--stack-only]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

RESULTS = pathlib.Path(__file__).parent / "results"
METHODS = ["safetensors+device_put", "maxjax", "maxjax zero_copy"]


# -- process-level measurements ------------------------------------------------------------------


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def _warm_page_cache(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def _touch_all(arrays: list) -> int:
    """Reads one byte of every memory page of every (CPU) array, so that every page is resident.

    ``np.asarray`` of a CPU ``jax.Array`` is a view of its buffer (no copy); nothing is compiled.
    """
    import numpy as np

    total = 0
    for a in arrays:
        flat = np.asarray(a).reshape(-1).view(np.uint8)
        total += int(flat[::4096].sum())
    return total


def worker_safetensors(method: str, path: str) -> dict:
    import jax
    import numpy as np

    jax.block_until_ready(jax.device_put(np.ones(4)))
    _touch_all([jax.device_put(np.ones(4, np.float32))])
    from safetensors.numpy import load_file

    from maxjax.graph.weights import SafetensorWeights

    _warm_page_cache(path)
    rss0 = _status("VmRSS")
    peak_ok = _reset_peak()
    t0 = time.perf_counter()
    if method == "safetensors+device_put":
        arrays = {k: jax.device_put(v) for k, v in load_file(path).items()}
    else:
        w = SafetensorWeights([path], zero_copy=(method == "maxjax zero_copy"))
        arrays = {n: v.data().to_jax() for n, v in w.items()}
    jax.block_until_ready(list(arrays.values()))
    t_ready = time.perf_counter() - t0
    _touch_all(list(arrays.values()))
    t_used = time.perf_counter() - t0
    nbytes = sum(a.nbytes for a in arrays.values())
    return dict(
        method=method, seconds=t_ready, seconds_used=t_used, tensor_bytes=nbytes,
        peak_rss_growth=_status("VmHWM") - rss0 if peak_ok else None, rss_growth=_status("VmRSS") - rss0,
    )  # fmt: skip


def worker_gguf(path: str) -> dict:
    import jax
    import numpy as np

    from maxjax.graph.weights import GGUFWeights

    jax.block_until_ready(jax.device_put(np.ones(4)))
    _warm_page_cache(path)
    rss0 = _status("VmRSS")
    t0 = time.perf_counter()
    weights = GGUFWeights(path)
    t_open = time.perf_counter() - t0
    rss_reader = _status("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    data = {n: v.data() for n, v in weights.items()}
    arrays = [wd.to_jax() for wd in data.values()]
    jax.block_until_ready(arrays)
    t_load = time.perf_counter() - t0
    _touch_all(arrays)
    encodings: dict[str, int] = {}
    for wd in data.values():
        key = wd.quantization_encoding.value if wd.quantization_encoding else wd.dtype.name
        encodings[key] = encodings.get(key, 0) + wd.nbytes
    return dict(
        file_bytes=os.path.getsize(path), open_seconds=t_open, load_seconds=t_load,
        reader_rss=rss_reader - rss0, weights_rss=_status("VmRSS") - rss_reader,
        weights_peak_rss=_status("VmHWM") - rss_reader, weight_bytes=sum(a.nbytes for a in arrays),
        float32_bytes=sum(4 * int(np.prod([int(d) for d in (wd.original_shape or wd.shape)])) for wd in data.values()),
        bytes_by_encoding=encodings,
    )  # fmt: skip


def run_worker(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", *args], capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the three benchmarks -------------------------------------------------------------------------


def make_synthetic(directory: str, total_mb: int) -> str:
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors = {}
    per = 32 << 20
    for i in range(total_mb // 32):
        if i % 4 == 3:  # a quarter bfloat16, the rest float32
            tensors[f"layers.{i}.w"] = rng.standard_normal(per // 2, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(4096, -1)
        else:
            tensors[f"layers.{i}.w"] = rng.standard_normal(per // 4, dtype=np.float32).reshape(4096, -1)
    tensors["small.bias"] = np.ones(4096, np.float32)
    path = os.path.join(directory, f"synthetic_{total_mb}mb.safetensors")
    for pad in range(0, 64, 8):  # metadata padding that puts the tensor data 64-byte aligned
        save_file(tensors, path, metadata={"pad": "x" * pad})
        with open(path, "rb") as f:
            if (8 + int.from_bytes(f.read(8), "little")) % 64 == 0:
                break
    return path


def bench_safetensors(files: dict[str, str], reps: int) -> list[dict]:
    rows = []
    for label, path in files.items():
        for method in METHODS:
            runs = [run_worker("safetensors", method, path) for _ in range(reps)]
            r = dict(file=label, method=method, tensor_bytes=runs[0]["tensor_bytes"])
            # the machine is shared: the fastest of several fresh processes is the stable number
            r["seconds"] = min(x["seconds"] for x in runs)
            r["seconds_used"] = min(x["seconds_used"] for x in runs)
            peaks = [x["peak_rss_growth"] for x in runs if x["peak_rss_growth"] is not None]
            r["peak_rss_ratio"] = max(peaks) / r["tensor_bytes"] if peaks else None
            rows.append(r)
        base = next(r for r in rows if r["file"] == label and r["method"] == METHODS[0])
        for r in rows:
            if r["file"] == label:
                r["time_vs_baseline"] = r["seconds"] / base["seconds"]
                r["used_vs_baseline"] = r["seconds_used"] / base["seconds_used"]
    print("\n1. safetensors -> device arrays (best of %d fresh processes; page cache warm)" % reps)
    print(f"  {'file':18s} {'method':24s} {'MB':>7s} {'ready s':>8s} {'x base':>7s} {'used s':>8s} {'x base':>7s} {'peak RSS/bytes':>15s}")
    for r in rows:
        peak = f"{r['peak_rss_ratio']:.2f}" if r["peak_rss_ratio"] is not None else "n/a"
        print(
            f"  {r['file']:18s} {r['method']:24s} {r['tensor_bytes'] / 1e6:7.1f} {r['seconds']:8.3f} "
            f"{r['time_vs_baseline']:7.2f} {r['seconds_used']:8.3f} {r['used_vs_baseline']:7.2f} {peak:>15s}"
        )
    return rows


def bench_gguf(path: str) -> dict:
    r = run_worker("gguf", path)
    print("\n2. SmolLM2 GGUF, every weight loaded packed (fresh process)")
    print(f"  file size                      {r['file_bytes'] / 1e6:8.1f} MB")
    print(f"  loaded weight bytes            {r['weight_bytes'] / 1e6:8.1f} MB  ({r['weight_bytes'] / r['file_bytes']:.3f} x file)")
    print(f"  resident growth, weights       {r['weights_rss'] / 1e6:8.1f} MB  ({r['weights_rss'] / r['file_bytes']:.3f} x file)")
    print(f"  peak growth while loading      {r['weights_peak_rss'] / 1e6:8.1f} MB  ({r['weights_peak_rss'] / r['file_bytes']:.3f} x file)")
    print(f"  (as float32 they would be      {r['float32_bytes'] / 1e6:8.1f} MB  ({r['float32_bytes'] / r['file_bytes']:.2f} x file))")
    print(f"  reader (metadata, vocabulary)  {r['reader_rss'] / 1e6:8.1f} MB resident, open {r['open_seconds']:.2f} s; load {r['load_seconds']:.3f} s")
    print("  bytes by encoding: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in r["bytes_by_encoding"].items()))
    return r


def _timeit(fn, *args, rounds: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def real_blocks(quick: bool) -> dict:
    """Packed uint8 [rows, bytes] per encoding, 2.65M elements each (1.77M with --quick).

    The outputs stay around 10 MB: far larger ones are dominated by page faults of the fresh
    output buffer that XLA allocates on every call (about 2 GB/s whatever the encoding)."""
    import gguf
    import numpy as np

    from maxjax._bundled import smollm2_gguf_path
    from maxjax.graph.quantization import QuantizationEncoding as E
    from maxjax.graph.weights import GGUFWeights

    w = GGUFWeights(smollm2_gguf_path())
    n_layers = 2 if quick else 3
    gate = np.concatenate([w.blk[i].ffn_gate.weight.data().to_numpy() for i in range(n_layers)])  # Q4_1 [1536*L, 360]
    out = {E.Q4_1: (gate, "SmolLM2 ffn_gate (real Q4_1)")}
    emb_rows = gate.shape[0]
    out[E.Q8_0] = (w.token_embd.weight.data().to_numpy()[:emb_rows], "SmolLM2 token_embd (real Q8_0)")
    floats = gguf.quants.dequantize(gate, gguf.GGMLQuantizationType.Q4_1)
    for enc in (E.Q4_0, E.Q5_0, E.Q5_1):
        out[enc] = (gguf.quants.quantize(floats, enc.to_gguf()), "SmolLM2 ffn_gate re-quantized")
    rng = np.random.default_rng(0)
    elements = floats.size
    for enc, offs in ((E.Q4_K, [0, 2]), (E.Q5_K, [0, 2]), (E.Q6_K, [208])):
        rows, cols = elements // 4096, 4096
        bpe, bsize = enc.block_parameters
        data = rng.integers(0, 256, (rows, cols // bpe, bsize), dtype=np.uint8)
        for off in offs:
            data[:, :, off : off + 2] = (rng.standard_normal((rows, cols // bpe)) * 0.01).astype("<f2").view(np.uint8).reshape(rows, -1, 2)
        out[enc] = (data.reshape(rows, -1), "random blocks, finite scales")
    return out


def bench_dequantize(quick: bool) -> list[dict]:
    import gguf
    import jax
    import numpy as np

    from maxjax.graph.quantization import dequantize

    deq = jax.jit(dequantize, static_argnums=0)
    rows_out = []
    print("\n3. dequantization throughput, GB/s of float32 output (best of rounds)")
    print(f"  {'enc':5s} {'elements':>10s} {'jax.jit GB/s':>13s} {'gguf numpy GB/s':>16s} {'speedup':>8s}  blocks")
    for enc, (packed, source) in real_blocks(quick).items():
        dev = jax.device_put(packed)
        t_jax = _timeit(deq, enc, dev, rounds=10)
        qtype = enc.to_gguf()
        t_np = _timeit(lambda p: gguf.quants.dequantize(p, qtype), packed, rounds=1 if quick else 2)
        ref = gguf.quants.dequantize(packed, qtype)
        same = bool(np.array_equal(np.asarray(deq(enc, dev)), ref, equal_nan=True))
        gb = ref.size * 4 / 1e9
        rows_out.append(dict(encoding=enc.value, elements=int(ref.size), gbps_jax=gb / t_jax, gbps_numpy=gb / t_np,
                             speedup=t_np / t_jax, bit_identical=same, blocks=source))  # fmt: skip
        print(f"  {enc.value:5s} {ref.size:10d} {gb / t_jax:13.2f} {gb / t_np:16.2f} {t_np / t_jax:8.1f}  {source}{'' if same else '  (DIFFERS)'}")
    return rows_out


def plot(st_rows: list[dict], gguf_row: dict, deq_rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.8))
    files = list(dict.fromkeys(r["file"] for r in st_rows))
    width = 0.8 / len(METHODS)
    for k, (key, title) in enumerate((("seconds", "safetensors -> device arrays: ready (s)"),
                                      ("seconds_used", "... and every page read once (s)"))):  # fmt: skip
        ax = axes[k]
        for j, m in enumerate(METHODS):
            vals = [next(r[key] for r in st_rows if r["file"] == f and r["method"] == m) for f in files]
            ax.bar(np.arange(len(files)) + j * width, vals, width, label=m)
        ax.set_xticks(np.arange(len(files)) + width, files)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    ax = axes[2]
    for j, m in enumerate(METHODS):
        vals = [next(r["peak_rss_ratio"] or 0 for r in st_rows if r["file"] == f and r["method"] == m) for f in files]
        ax.bar(np.arange(len(files)) + j * width, vals, width, label=m)
    ax.axhline(1.3, color="k", ls="--", lw=1, label="1.3x target")
    ax.set_xticks(np.arange(len(files)) + width, files)
    ax.set_title("peak RSS growth / tensor bytes", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[3]
    encs = [r["encoding"] for r in deq_rows]
    x = np.arange(len(encs))
    ax.bar(x - 0.2, [r["gbps_jax"] for r in deq_rows], 0.4, label="jax.jit (maxjax)")
    ax.bar(x + 0.2, [r["gbps_numpy"] for r in deq_rows], 0.4, label="gguf numpy")
    ax.set_xticks(x, encs)
    ax.set_yscale("log")
    ax.set_title("dequantize: GB/s of float32 output", fontsize=10)
    ax.legend(fontsize=8)
    ratio = gguf_row["weights_rss"] / gguf_row["file_bytes"]
    fig.suptitle(f"maxjax weight loading on {platform.machine()} ({os.cpu_count()} cores); "
                 f"SmolLM2 GGUF loaded packed: resident {ratio:.2f} x file size", fontsize=11)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- stacking layers (issue 23): np.stack + device_put against one preallocated stack -------------


def _old_place(values: list, encoding=None, layout=None):
    """What ``Program._place`` did for a stacked weight: ``np.stack`` of host copies, then
    ``device_put`` (a copy: NumPy's buffer is 16-byte aligned) or ``jnp.asarray`` + ``to_layout``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from maxjax.driver import to_host_array, to_jax_array
    from maxjax.graph.quantization import to_layout

    value = np.stack([to_host_array(v) for v in values])
    if encoding is not None:
        return jax.device_put(to_layout(layout, encoding, jnp.asarray(value)))
    return to_jax_array(value)


def worker_stack(kind: str, method: str, arg: str) -> dict:
    """One stacking measurement in a fresh process: ``kind`` "registry" (a 64-block float32 MLP
    registry of ``arg`` MB in memory) or "gguf" (every block tensor of the GGUF file ``arg``,
    read through LazyTensors, in the layout ``packed``)."""
    import jax
    import numpy as np

    from maxjax.engine.placement import place_layers

    jax.devices()
    rss0 = _status("VmRSS")
    if kind == "registry":
        n, per = 64, int(arg) * (1 << 20) // 64 // 4
        side = int(per**0.5)
        rng = np.random.default_rng(0)
        layers = [rng.standard_normal((side, side), dtype=np.float32) for _ in range(n)]
        rss0 = _status("VmRSS")
        _reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        out = [_old_place(layers) if method == "np.stack" else place_layers(layers, None, stacked=True)]
        nbytes = sum(a.nbytes for a in layers)
    else:  # the whole path from the file: open, read every block tensor, stack (packed)
        from maxjax.graph.weights import GGUFWeights

        _warm_page_cache(arg)
        w = GGUFWeights(arg, lazy=method != "np.stack")  # the old path copied each tensor at load
        rss0 = _status("VmRSS")  # the header (and the tokenizer's metadata) parsed: not timed
        _reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        names = [k for k in w._store.tensors if k.startswith("blk.")]
        roles = sorted({k.split(".", 2)[2].removesuffix(".weight") for k in names})
        n = 1 + max(int(k.split(".")[1]) for k in names)
        out, nbytes = [], 0
        for role in roles:
            wds = [w[f"blk.{i}.{role}.weight"].data() for i in range(n)]
            enc = wds[0].quantization_encoding
            lay = "packed" if enc is not None else None
            nbytes += sum(int(np.prod(d.shape)) * np.dtype(d.dtype.to_numpy()).itemsize for d in wds)
            if method == "np.stack":
                out.append(_old_place([d.data for d in wds], enc, lay))
            else:
                out.append(place_layers(wds, None, stacked=True, encoding=enc, quantized_layout=lay))
    jax.block_until_ready(out)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    # cpu_s: CPU time of the process (all threads); on a shared machine wall time mostly measures waiting
    return dict(kind=kind, method=method, bytes=nbytes, seconds=dt, gb_per_s=nbytes / dt / 1e9, cpu_s=cpu,
                gb_per_cpu_s=nbytes / cpu / 1e9,
                peak_rss_growth=_status("VmHWM") - rss0)  # fmt: skip


def bench_stack(gguf_path: str | None, registry_mb: int) -> list[dict]:
    rows = []
    cases = [("registry", str(registry_mb))] + ([("gguf", gguf_path)] if gguf_path else [])
    for kind, arg in cases:
        for method in ("np.stack", "host_stack"):
            r = run_worker("stack", kind, method, arg)
            rows.append(r)
            print(f"stack {kind:8s} {method:10s} {r['bytes'] / 1e6:8.0f} MB  {r['seconds']:6.3f} s  {r['gb_per_s']:5.2f} GB/s  "
                  f"CPU {r['cpu_s']:6.3f} s  {r['gb_per_cpu_s']:5.2f} GB per CPU-s  "
                  f"peak RSS growth {r['peak_rss_growth'] / 1e6:6.0f} MB")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller files and fewer repetitions")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--stack-only", action="store_true", help="only the layer-stacking comparison")
    parser.add_argument("--gguf", help="a GGUF for the stacking comparison (e.g. a synthetic 1B)")
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "stack":
            result = worker_stack(*rest)
        else:
            result = worker_safetensors(*rest) if kind == "safetensors" else worker_gguf(*rest)
        print(json.dumps(result))
        return
    from maxjax._bundled import minilm_safetensors_path, smollm2_gguf_path

    RESULTS.mkdir(parents=True, exist_ok=True)
    stack_rows = bench_stack(args.gguf, 128 if args.quick else 537)
    if args.stack_only:
        (RESULTS / "load_stack.json").write_text(json.dumps(dict(machine=platform.platform(), cpus=os.cpu_count(), stack=stack_rows), indent=1))
        return
    with tempfile.TemporaryDirectory() as d:
        files = {"MiniLM (91 MB)": str(minilm_safetensors_path())}
        size = 128 if args.quick else 512
        files[f"synthetic {size} MB"] = make_synthetic(d, size)
        st_rows = bench_safetensors(files, reps=1 if args.quick else 5)
    gguf_row = bench_gguf(str(smollm2_gguf_path()))
    deq_rows = bench_dequantize(args.quick)
    name = "load_weights_quick" if args.quick else "load_weights"
    out = dict(machine=platform.platform(), cpus=os.cpu_count(), stack=stack_rows, safetensors=st_rows, gguf=gguf_row, dequantize=deq_rows)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=1))
    plot(st_rows, gguf_row, deq_rows, RESULTS / f"{name}.png")
    print(f"\nsaved {RESULTS / (name + '.png')} and {name}.json")


if __name__ == "__main__":
    main()
