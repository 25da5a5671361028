"""Scale benchmark (issue 23): maxjax against llama.cpp on SmolLM2 and synthetic Llama-3 files.

For each model (the bundled SmolLM2-135M Q4_1, and the synthetic Llama-3.2-1B, and with
``--sizes`` the 3B/8B, in Q4_0 and Q8_0, made on demand by ``scripts/make_synthetic_gguf.py`` in
its cache) and each engine, in a fresh process with the file in the page cache:

- load time (to a model ready to run; maxjax: ``load_model``, llama.cpp: ``Llama(...)``, mmap on,
  ``use_extra_bufts=False`` as in ``benchmarks/generate.py`` unless ``--llama-extra-bufts``);
- resident memory after load and peak after a 128-token prompt and 64 (``--steps``) greedy
  decode steps;
- maxjax's compile time (a first 4-token generation: prefill and decode) and warm time to first token;
  llama.cpp's time to first token (warm);
- batch-1 decode tokens/s, beside the bound: bytes of weights read per token (the file's tensor
  bytes; the token embedding counts only when it is also the output head) over the single-thread
  read bandwidth measured here (a NumPy sum over 1 GiB).

Both engines use every core of the process's affinity mask. The CPU's vector features are
recorded beside the figures. Prints a table, writes ``benchmarks/results/scale.json`` and
``scale.png``.

    python benchmarks/scale.py [--sizes 1b,3b,8b] [--types q4_0,q8_0] [--llama-python /work/llamavenv/bin/python]
                               [--also-arithmetic q8_0] [--also-layout nibbles] [--llama-extra-bufts]
                               [--safetensors 1b [--also-widen-bfloat16]]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
ROOT = HERE.parent
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
          "combined movable metal type, oil-based ink and a wooden press adapted from wine making. ") * 6  # fmt: skip
STEPS = 64
SHAPE = {"1b": "llama-3.2-1b", "3b": "llama-3.2-3b", "8b": "llama-3.1-8b"}


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


# -- workers (fresh processes) ---------------------------------------------------------------------


def worker_maxjax(req: dict) -> dict:
    import numpy as np

    from maxjax.models import load_model

    t0 = time.perf_counter()
    policy = None
    if "keep_16bit_weights" in req:  # a float32 model of a bfloat16 directory: keep or widen its weights
        import dataclasses

        from maxjax.backend import policy_for

        policy = dataclasses.replace(policy_for("cpu"), keep_16bit_weights=req["keep_16bit_weights"])
    lm = load_model(req["model"], quantized_layout=req.get("quantized_layout"), arithmetic=req.get("arithmetic", "auto"), policy=policy)
    out = {"engine": "maxjax", "load_s": time.perf_counter() - t0, "rss_after_load": _status("VmRSS")}
    ids = lm.tokenizer.encode(PROMPT)[:128]
    text = lm.tokenizer.decode(ids)
    steps = req.get("steps", STEPS)
    (g,) = lm.generate([text], max_new_tokens=4, stop_at_eos=False)  # compiles prefill and decode
    out["compile_s"] = g.compile_seconds
    (g,) = lm.generate([text], max_new_tokens=steps, stop_at_eos=False)  # warm
    out["prompt_ids"] = [int(i) for i in g.prompt_ids]
    out["ttft_s"] = g.time_to_first_token
    out["decode_tok_s"] = (len(g.token_ids) - 1) / g.decode_seconds
    out["peak_rss"] = _status("VmHWM")
    out["tokens"] = [int(t) for t in g.token_ids[:8]]
    import jax

    from maxjax.graph.quantization import QuantizedArray

    leaves = jax.tree.leaves(lm.state, is_leaf=lambda x: isinstance(x, QuantizedArray))
    out["quantized_layout"] = "+".join(sorted({x.layout for x in leaves if isinstance(x, QuantizedArray)})) or lm.program.quantized_layout
    out["layer_weights"] = lm.program.layer_weights
    assert np.isfinite(out["decode_tok_s"])
    return out


def worker_llama(req: dict) -> dict:
    import numpy as np
    import llama_cpp
    import llama_cpp.llama_cpp as C

    threads = len(os.sched_getaffinity(0))
    ids = req["prompt_ids"]
    if not req.get("llama_extra_bufts"):  # as benchmarks/generate.py: no repacking / AMX buffers
        sys.path.insert(0, str(HERE))
        from generate import llama_without_extra_bufts

        llama_without_extra_bufts(C)
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=req["model"], n_threads=threads, n_threads_batch=threads, n_ctx=512,
                          n_batch=512, use_mmap=True, verbose=False)  # fmt: skip
    out = {"engine": "llama.cpp", "load_s": time.perf_counter() - t0, "rss_after_load": _status("VmRSS"),
           "system_info": C.llama_print_system_info().decode(errors="replace").strip(), "version": llama_cpp.__version__,
           "use_extra_bufts": bool(getattr(llm.model_params, "use_extra_bufts", True))}  # fmt: skip
    n_vocab = llm.n_vocab()

    def argmax_last() -> int:
        return int(np.argmax(np.ctypeslib.as_array(C.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))))

    llm.reset()
    llm.eval(ids)  # warm-up
    t0 = time.perf_counter()
    llm.reset()
    llm.eval(ids)
    tok = argmax_last()
    out["ttft_s"] = time.perf_counter() - t0
    gen = [tok]
    t0 = time.perf_counter()
    steps = req.get("steps", STEPS)
    for _ in range(steps - 1):
        llm.eval([tok])
        tok = argmax_last()
        gen.append(tok)
    out["decode_tok_s"] = (steps - 1) / (time.perf_counter() - t0)
    out["peak_rss"] = _status("VmHWM")
    out["tokens"] = gen[:8]
    return out


def read_bandwidth(threads: int = 1) -> float:
    """Read bandwidth (GB/s) with ``threads`` threads: the best of 3 NumPy sums over 1 GiB, split
    in ``threads`` parts summed at once (NumPy releases the GIL while it sums)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    a = np.ones(1 << 27, np.float64)
    parts = np.array_split(a, threads)
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(3):
            t0 = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = max(best, a.nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def bytes_per_token(path: str) -> int:
    """Bytes of weights read per decoded token: every tensor's, the token embedding's only when it
    is also the output head (a GGUF file, or a Hugging Face directory's ``model.safetensors``)."""
    if os.path.isdir(path):
        from safetensors import safe_open

        with safe_open(os.path.join(path, "model.safetensors"), "np") as f:
            names = set(f.keys())
            total = 0
            for n in names:
                if n == "model.embed_tokens.weight" and "lm_head.weight" in names:
                    continue
                sl = f.get_slice(n)
                total += int(np.prod(sl.get_shape())) * {"BF16": 2, "F16": 2, "F32": 4}[sl.get_dtype()]
        return total
    import gguf

    r = gguf.GGUFReader(path)
    names = {t.name for t in r.tensors}
    return sum(int(t.n_bytes) for t in r.tensors if t.name != "token_embd.weight" or "output.weight" not in names)


# -- parent ----------------------------------------------------------------------------------------


def run(cmd: list[str], req: dict, timeout: int) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*cmd, str(HERE / "scale.py"), "--worker", json.dumps(req)], capture_output=True, text=True,
                          timeout=timeout, env=env)  # fmt: skip
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def _is_maxjax(key: str) -> bool:
    """Whether a row's key names a maxjax engine: ``maxjax`` or ``maxjax[LAYOUT]`` (``--also-layout``,
    ``--also-arithmetic``)."""
    return key == "maxjax" or key.startswith("maxjax[")


def _ratios(m: dict, l: dict) -> dict[str, float]:
    """maxjax engine ``m``'s figures over llama.cpp's ``l``: load time, peak RSS, decode, TTFT."""
    return {"load_time": m["load_s"] / l["load_s"], "peak_rss": m["peak_rss"] / l["peak_rss"],
            "decode": m["decode_tok_s"] / l["decode_tok_s"], "ttft": m["ttft_s"] / l["ttft_s"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1b", help="synthetic sizes: 1b,3b,8b")
    ap.add_argument("--types", default="q4_0,q8_0")
    ap.add_argument("--llama-python", default="/work/llamavenv/bin/python", help="a Python with llama_cpp")
    ap.add_argument("--llama-extra-bufts", action="store_true",
                    help="keep llama.cpp's use_extra_bufts default (weight repacking, AMX buffers; SIGILL where the VM forbids AMX)")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--steps", type=int, default=STEPS, help="decode steps timed (default 64)")
    ap.add_argument("--smollm2", action=argparse.BooleanOptionalAction, default=True, help="include SmolLM2-135M")
    ap.add_argument("--safetensors", default="", help="sizes to add as bfloat16 Hugging Face directories (maxjax only: "
                    "llama.cpp reads GGUF), e.g. 1b")
    ap.add_argument("--also-layout", default="", help="also run maxjax with this quantized layout (e.g. nibbles: the "
                    "layout GGUF Q4_0 took before the policy mapped it), reported as engine 'maxjax[LAYOUT]'")
    ap.add_argument("--also-arithmetic", default="", help="also run maxjax with this arithmetic (e.g. float32: no Q8_0 "
                    "activations), reported as engine 'maxjax[ARITHMETIC]'")
    ap.add_argument("--also-widen-bfloat16", action="store_true", help="for the --safetensors directories, also run maxjax "
                    "with the bfloat16 weights widened to float32 at load (keep_16bit_weights off), as 'maxjax[widened]'")
    ap.add_argument("--out", default="scale", help="stem of the results' .json and .png (default scale)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        req = json.loads(a.worker)
        print(json.dumps(worker_maxjax(req) if req["engine"] == "maxjax" else worker_llama(req)))
        return
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_synthetic_gguf as synth

    from maxjax._bundled import smollm2_gguf_path
    from maxjax.backend.cpu import cpu_vector_features

    models = [("SmolLM2-135M", "q4_1", str(smollm2_gguf_path()))] if a.smollm2 else []
    for size in [s for s in a.sizes.split(",") if s]:
        for qtype in a.types.split(","):
            models.append((f"synthetic {SHAPE[size]}", qtype, str(synth.ensure(SHAPE[size], qtype))))
    for size in [s for s in a.safetensors.split(",") if s]:
        models.append((f"synthetic {SHAPE[size]}", "bf16", str(synth.ensure(SHAPE[size], fmt="safetensors"))))
    features = cpu_vector_features()
    cores = len(os.sched_getaffinity(0))
    bw, bw_all = read_bandwidth(1), read_bandwidth(cores)
    print(f"CPU vector features: {features}; read bandwidth {bw:.1f} GB/s (1 thread), {bw_all:.1f} GB/s ({cores} threads)")
    rows = []
    have_llama = os.path.exists(a.llama_python)
    for name, qtype, path in models:
        file = os.path.join(path, "model.safetensors") if os.path.isdir(path) else path
        warm(file)
        size = os.path.getsize(file)
        bpt = bytes_per_token(path)
        row = {"model": name, "type": qtype, "file_bytes": size, "bytes_per_token": bpt,
               "bound_tok_s_1thread": bw * 1e9 / bpt, "bound_tok_s_all_threads": bw_all * 1e9 / bpt}  # fmt: skip
        row["maxjax"] = mj = run([sys.executable], {"engine": "maxjax", "model": path, "steps": a.steps}, a.timeout)
        if "decode_tok_s" in mj:
            row["maxjax_share_of_bound_all_threads"] = mj["decode_tok_s"] / row["bound_tok_s_all_threads"]
        if have_llama and "prompt_ids" in mj and not os.path.isdir(path):
            row["llama.cpp"] = run([a.llama_python], {"engine": "llama", "model": path, "prompt_ids": mj["prompt_ids"], "steps": a.steps,
                                                         "llama_extra_bufts": a.llama_extra_bufts}, a.timeout)
        also, also_req = None, {}
        if a.also_layout or a.also_arithmetic:
            also = f"maxjax[{a.also_layout or a.also_arithmetic}]"
            also_req = {"quantized_layout": a.also_layout or None, "arithmetic": a.also_arithmetic or "auto"}
        if also and not os.path.isdir(path):
            row[also] = run([sys.executable], {"engine": "maxjax", "model": path, "steps": a.steps, **also_req}, a.timeout)
        if a.also_widen_bfloat16 and os.path.isdir(path):
            also = "maxjax[widened]"
            row[also] = run([sys.executable], {"engine": "maxjax", "model": path, "steps": a.steps, "keep_16bit_weights": False}, a.timeout)
        rows.append(row)
        engines = [k for k in row if _is_maxjax(k) or k == "llama.cpp"]
        print(json.dumps({k: v for k, v in row.items() if k not in engines}), flush=True)
        for eng in engines:
            r = row.get(eng)
            if r is None:
                continue
            if "error" in r:
                print(f"  {eng:9s} ERROR {r['error']}")
                continue
            print(f"  {eng:16s} load {r['load_s']:6.2f} s  RSS load {r['rss_after_load'] / 1e6:7.0f} MB  peak {r['peak_rss'] / 1e6:7.0f} MB"
                  f"  TTFT {r['ttft_s'] * 1e3:7.0f} ms  decode {r['decode_tok_s']:6.2f} tok/s"
                  + (f"  compile {r['compile_s']:.1f} s ({r['quantized_layout']})" if eng.startswith("maxjax") else ""))  # fmt: skip
        wide = row.get("maxjax[widened]")
        if wide and "error" not in wide and "error" not in mj:
            row["ratios_widened"] = _ratios(mj, wide)
            print("  maxjax/maxjax[widened]: " + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratios_widened"].items()))
        if "llama.cpp" in row and "error" not in row["llama.cpp"] and "error" not in mj:
            l = row["llama.cpp"]
            row["ratios"] = _ratios(mj, l)
            print("  maxjax/llama.cpp: " + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratios"].items()))
            o = row.get(also) if also else None
            if o and "error" not in o:
                row["ratios_" + also] = _ratios(o, l)
                print(f"  {also}/llama.cpp: " + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratios_" + also].items()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"machine": platform.platform(), "cpu_vector_features": features, "cores": cores,
           "read_bandwidth_1thread_gb_s": bw, "read_bandwidth_all_threads_gb_s": bw_all, "steps": a.steps, "rows": rows,
           "load_average": os.getloadavg()}  # fmt: skip
    (RESULTS / f"{a.out}.json").write_text(json.dumps(out, indent=1, default=str))
    plot(rows, features, RESULTS / f"{a.out}.png")
    print(f"saved {RESULTS / a.out}.json and .png")


def plot(rows: list[dict], features: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (key, label, scale) in zip(axes, [("load_s", "load time (s)", 1), ("peak_rss", "peak RSS (MB)", 1e-6),
                                              ("decode_tok_s", "batch-1 decode (tok/s)", 1)]):  # fmt: skip
        engines = sorted({k for r in rows for k in r if _is_maxjax(k)}) + ["llama.cpp"]
        for eng, marker in zip(engines, ("o", "^", "v", "s") if len(engines) > 2 else ("o", "s")):
            marker = "s" if eng == "llama.cpp" else marker
            for qtype in sorted({r["type"] for r in rows}):
                pts = [(r["file_bytes"] / 1e6, r[eng][key] * scale) for r in rows
                       if r["type"] == qtype and eng in r and "error" not in r[eng]]  # fmt: skip
                if pts:
                    xs, ys = zip(*sorted(pts))
                    ax.plot(xs, ys, marker=marker, label=f"{eng} {qtype}")
        if key == "decode_tok_s":
            xs = [r["file_bytes"] / 1e6 for r in rows]
            ax.scatter(xs, [r["bound_tok_s_1thread"] for r in rows], marker="x", color="k", label="1-thread bandwidth bound")
            ax.scatter(xs, [r["bound_tok_s_all_threads"] for r in rows], marker="+", color="k", label="all-thread bandwidth bound")
        if key == "peak_rss":
            xs = sorted(r["file_bytes"] / 1e6 for r in rows)
            ax.plot(xs, xs, "k:", label="file size")
        ax.set_xscale("log")
        ax.set_xlabel("file size (MB)")
        ax.set_title(label)
        ax.legend(fontsize=7)
    flags = ", ".join(f for f in features.get("vector_features", []) if f.startswith(("avx", "fma", "f16c")))
    fig.suptitle(f"maxjax vs llama.cpp by model size ({flags})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
