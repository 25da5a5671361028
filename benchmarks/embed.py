"""Benchmark of sentence embeddings with all-MiniLM-L6-v2 (issue 25, "Measure"), maxjax vs
sentence-transformers on torch, in one run.

The parent makes a deterministic set of sentences of 10-60 tokens (seeded words from the model's
own vocabulary, lengths checked with maxjax's tokenizer) and runs each engine in its own subprocess
(so peak RSS is per engine), both pinned to the same cores, on the same texts:

1. maxjax: ``maxjax.models.load_encoder().embed(texts, batch_size=b)`` (graph mode: one
   ``Program`` under ``jax.jit``, batches padded to length buckets and power-of-two row counts).
   Where the backend policy's ``encoder_precision`` is not ``HIGHEST`` (a CPU with AMX-BF16:
   ``HIGH``, the AMX kernel), the same again at ``HIGHEST`` (XLA's exact float32 products), as
   the baseline of that choice.
2. sentence-transformers on torch (``--st-python``, default ``/work/torchvenv/bin/python``; it
   imports neither maxjax nor jax): ``SentenceTransformer(dir).encode(texts, batch_size=b)``
   with ``torch.set_num_threads(T)``.

For each batch size (1, 32, 256) every engine first embeds all texts once (warm-up: compiles
every shape maxjax will use, and torch's first-call costs), then ``--reps`` timed passes; the
table gives the median sentences/s, the ratio maxjax / sentence-transformers, and each worker's
peak RSS (``ru_maxrss``). Also recorded: the CPU model, its vector flags (avx2, avx512*, amx*),
the cores used and the load average before/after (the machine may be shared: figures taken
under load are noisy; the ratio is the figure to read).

Saves ``benchmarks/results/embed.json``, ``embed.txt`` (the table) and ``embed.png``.

    python benchmarks/embed.py [--reps 3] [--threads 2] [--n1 32] [--n 512]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BATCHES = (1, 32, 256)


def _cpu_info() -> dict:
    info = {"model": "", "flags": []}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not info["model"]:
                info["model"] = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not info["flags"]:
                flags = line.split(":", 1)[1].split()
                info["flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "sse4", "f16c")))
    except OSError:
        pass
    info["cores"] = sorted(os.sched_getaffinity(0))
    return info


def make_sentences(n: int, model_dir: Path, seed: int = 0) -> list[str]:
    """``n`` sentences of 10-60 tokens (with [CLS]/[SEP]) made of whole words of the model's
    vocabulary, deterministic for ``seed``."""
    import numpy as np

    from maxjax.models.bert import EncoderTokenizer

    d = model_dir
    vocab = [w for w in (d / "vocab.txt").read_text(encoding="utf-8").split("\n") if w.isalpha() and w.islower() and len(w) > 2]
    tok = EncoderTokenizer(d / "tokenizer.json", 256)
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        target = int(rng.integers(10, 61))
        words = list(rng.choice(vocab, size=target))
        while len(words) > 1 and len(tok.encode_batch([" ".join(words)])[0]) > target:
            words.pop()
        s = " ".join(words).capitalize() + "."
        if 10 <= len(tok.encode_batch([s])[0]) <= 60:
            out.append(s)
    return out


def _useful_gflop(texts: list[str], model_dir: Path):
    """A function of a list of texts -> the mean GFLOP one sentence costs in the encoder, counting
    only its own tokens (no padding): per layer, per sentence of L tokens, 8 L H^2 (q, k, v, o
    projections) + 4 L H F (feed-forward) + 4 L^2 H (scores and weighted values)."""
    from maxjax.models.bert import BertConfig, EncoderTokenizer

    cfg = BertConfig.from_hf_config(json.loads((model_dir / "config.json").read_text()))
    h, f, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    lengths = {t: len(ids) for t, ids in zip(texts, EncoderTokenizer(model_dir / "tokenizer.json", 256).encode_batch(texts))}

    def gflop(subset: list[str]) -> float:
        return sum(n * (8 * L * h * h + 4 * L * h * f + 4 * L * L * h) for L in map(lengths.get, subset)) / len(subset) / 1e9

    return gflop


# -- workers -------------------------------------------------------------------------------------
def _time_passes(fn, texts: list[str], batch: int, reps: int) -> dict[str, list[float]]:
    """Sentences per wall-clock second and per CPU second (the process's user + system time, all
    its threads: the work done, less sensitive to other processes on a shared machine)."""
    fn(texts, batch)  # warm-up: every shape of this batch size
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(texts, batch)
        wall.append(len(texts) / (time.perf_counter() - t0))
        cpu.append(len(texts) / max(time.process_time() - c0, 1e-9))
    return {"wall": wall, "cpu": cpu}


def _gemm_peak(matmul, make) -> float:
    """GFLOP/s of one float32 GEMM at the encoder's FFN shape ([1024, 384] x [384, 1536]), the
    median of 20 calls: this engine's arithmetic bound on the machine."""
    a, b = make((1024, 384)), make((384, 1536))
    matmul(a, b)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        matmul(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * 1024 * 384 * 1536 / statistics.median(times) / 1e9


def worker_maxjax(req: dict) -> dict:
    sys.path.insert(0, str(ROOT))
    import jax
    import jax.numpy as jnp
    import numpy as np

    from maxjax.models import load_encoder

    dot = jax.jit(jnp.dot)
    peak = _gemm_peak(lambda a, b: dot(a, b).block_until_ready(),
                      lambda shape: jnp.asarray(np.random.default_rng(0).standard_normal(shape), jnp.float32))  # fmt: skip

    from maxjax.backend import policy_for

    policy = policy_for()
    if req.get("exact"):  # XLA's exact float32 products, whatever the policy's encoder_precision
        import dataclasses

        policy = dataclasses.replace(policy, encoder_precision=jax.lax.Precision.HIGHEST)
    t0 = time.perf_counter()
    enc = load_encoder(req["model"], policy=policy)
    load_s = time.perf_counter() - t0
    out = {"load_s": load_s, "rates": {}}
    for b in BATCHES:
        texts = req["texts"][: req["n1"]] if b == 1 else req["texts"]
        out["rates"][str(b)] = _time_passes(lambda t, bs: enc.embed(t, batch_size=bs), texts, b, req["reps"])
    out["compiles"] = enc.num_compiles
    out["gemm_gflops"] = peak
    out["version"] = f"jax {jax.__version__}"
    return out


def worker_st(req: dict) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(req["threads"])
    peak = _gemm_peak(torch.mm, lambda shape: torch.randn(shape, dtype=torch.float32))
    t0 = time.perf_counter()
    model = SentenceTransformer(req["model"], device="cpu")
    load_s = time.perf_counter() - t0
    out = {"load_s": load_s, "rates": {}}
    with torch.inference_mode():
        for b in BATCHES:
            texts = req["texts"][: req["n1"]] if b == 1 else req["texts"]
            enc = lambda t, bs: model.encode(t, batch_size=bs, convert_to_numpy=True, show_progress_bar=False)  # noqa: E731
            out["rates"][str(b)] = _time_passes(enc, texts, b, req["reps"])
    import sentence_transformers

    out["gemm_gflops"] = peak
    out["version"] = f"torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}"
    return out


def _worker_main(kind: str, req_path: str, out_path: str) -> None:
    req = json.loads(Path(req_path).read_text())
    if req.get("cores"):
        os.sched_setaffinity(0, req["cores"])
    result = worker_maxjax({**req, "exact": kind == "maxjax_exact"}) if kind.startswith("maxjax") else worker_st(req)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(out_path).write_text(json.dumps(result))


# -- parent --------------------------------------------------------------------------------------
def _run_worker(kind: str, python: str, req: dict, tmp: Path) -> dict:
    rp, op = tmp / f"{kind}_req.json", tmp / f"{kind}_out.json"
    rp.write_text(json.dumps(req))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    subprocess.run([python, __file__, "--worker", kind, "--request", str(rp), "--out", str(op)], check=True, env=env)
    res = json.loads(op.read_text())
    res["wall_s"], res["loadavg_before"], res["loadavg_after"] = time.perf_counter() - t0, load0, os.getloadavg()[0]
    return res


def _policy_precision() -> str:
    """The default backend policy's ``encoder_precision``, by name."""
    from maxjax.backend import policy_for

    p = policy_for().encoder_precision
    return getattr(p, "name", str(p))


def table(result: dict) -> str:
    m, s = result["engines"]["maxjax"], result["engines"]["sentence_transformers"]
    med = lambda e, b, k: statistics.median(e["rates"][str(b)][k])  # noqa: E731
    lines = [
        f"all-MiniLM-L6-v2 sentence embeddings, {result['n']} sentences of 10-60 tokens ({result['n1']} at batch 1), "
        f"median of {result['reps']} passes",
        f"CPU: {result['cpu']['model']}, cores {result['cpu']['cores']}, flags {' '.join(result['cpu']['flags'])}",
        f"{'batch':>6} {'maxjax sent/s':>14} {'ST sent/s':>10} {'ratio':>7} {'goal':>6}   "
        f"{'maxjax sent/cpu-s':>18} {'ST sent/cpu-s':>14} {'ratio':>7}",
    ]
    for b in BATCHES:
        mm, ss, mc, sc = med(m, b, "wall"), med(s, b, "wall"), med(m, b, "cpu"), med(s, b, "cpu")
        goal = 1.0 if b == 1 else 1.5
        lines.append(f"{b:>6} {mm:>14.1f} {ss:>10.1f} {mm / ss:>6.2f}x {'PASS' if mm / ss >= goal else 'FAIL':>6}   "
                     f"{mc:>18.1f} {sc:>14.1f} {mc / sc:>6.2f}x   (goal >= {goal}x)")  # fmt: skip
    if "gflop_per_sentence" in result:
        lines.append(f"arithmetic (useful FLOPs of the unpadded tokens; bound = each engine's float32 GEMM at the FFN's "
                     f"shape: maxjax/XLA {m['gemm_gflops']:.0f}, torch {s['gemm_gflops']:.0f} GFLOP/s):")  # fmt: skip
        for b in BATCHES:
            g = result["gflop_per_sentence"][str(b)]
            mg, sg = med(m, b, "wall") * g, med(s, b, "wall") * g
            lines.append(f"{b:>6} maxjax {mg:>6.1f} GFLOP/s ({mg / m['gemm_gflops']:>4.0%} of its bound)   "
                         f"ST {sg:>6.1f} GFLOP/s ({sg / s['gemm_gflops']:>4.0%} of its bound)")  # fmt: skip
    lines.append(f"peak RSS: maxjax {m['peak_rss_mib']:.0f} MiB, sentence-transformers {s['peak_rss_mib']:.0f} MiB "
                 f"(ratio {m['peak_rss_mib'] / s['peak_rss_mib']:.2f}x)")  # fmt: skip
    lines.append(f"load: maxjax {m['load_s']:.1f} s, sentence-transformers {s['load_s']:.1f} s; maxjax compiled "
                 f"{m['compiles']} shapes (warm-up, untimed)")  # fmt: skip
    lines.append(f"load average during the runs: maxjax {m['loadavg_before']:.1f}->{m['loadavg_after']:.1f}, "
                 f"sentence-transformers {s['loadavg_before']:.1f}->{s['loadavg_after']:.1f} (machine has {os.cpu_count()} CPUs)")  # fmt: skip
    x = result["engines"].get("maxjax_exact")
    if x is not None:
        lines.append(f"maxjax's float32 products at encoder_precision={result.get('encoder_precision')} (the policy's; the AMX kernel "
                     f"where the CPU has AMX-BF16) against XLA's exact float32 (HIGHEST), same run:")  # fmt: skip
        for b in BATCHES:
            mm, xx = med(m, b, "wall"), med(x, b, "wall")
            lines.append(f"{b:>6} {mm:>8.1f} against {xx:>8.1f} sent/s: {mm / xx:.2f}x")
    lines.append(f"versions: maxjax on {m['version']}; {s['version']}")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    m, s = result["engines"]["maxjax"], result["engines"]["sentence_transformers"]
    x = np.arange(len(BATCHES))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 1]})
    for off, (label, e) in zip((-0.2, 0.2), (("maxjax", m), ("sentence-transformers (torch)", s))):
        ax.bar(x + off, [statistics.median(e["rates"][str(b)]["wall"]) for b in BATCHES], 0.4, label=label)
    ax.set_xticks(x, [f"batch {b}" for b in BATCHES])
    ax.set_ylabel("sentences / s")
    ax.set_title("all-MiniLM-L6-v2 throughput (CPU)")
    ax.legend()
    ax2.bar([0, 1], [m["peak_rss_mib"], s["peak_rss_mib"]], color=["C0", "C1"])
    ax2.set_xticks([0, 1], ["maxjax", "ST"])
    ax2.set_ylabel("peak RSS (MiB)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads and cores both engines are pinned to")
    ap.add_argument("--n", type=int, default=512, help="sentences at batch 32 and 256")
    ap.add_argument("--n1", type=int, default=32, help="sentences at batch 1")
    ap.add_argument("--st-python", default="/work/torchvenv/bin/python")
    ap.add_argument("--model", help="sentence-transformers directory (default: the bundled all-MiniLM-L6-v2)")
    ap.add_argument("--worker", choices=("maxjax", "maxjax_exact", "st"))
    ap.add_argument("--request")
    ap.add_argument("--out")
    ap.add_argument("--name", default="embed", help="results file stem")
    a = ap.parse_args()
    if a.worker:
        _worker_main(a.worker, a.request, a.out)
        return
    sys.path.insert(0, str(ROOT))
    from maxjax.models.encoders import default_encoder_dir

    cpu = _cpu_info()
    cores = cpu["cores"][: a.threads]
    model_dir = Path(a.model) if a.model else default_encoder_dir()
    texts = make_sentences(a.n, model_dir)
    req = {"model": str(model_dir), "texts": texts, "n1": a.n1, "reps": a.reps, "threads": a.threads, "cores": cores}
    with tempfile.TemporaryDirectory() as tmp:
        engines = {"maxjax": _run_worker("maxjax", sys.executable, req, Path(tmp))}
        if _policy_precision() != "HIGHEST":  # the policy's products are not XLA's exact ones: those too, as a baseline
            engines["maxjax_exact"] = _run_worker("maxjax_exact", sys.executable, req, Path(tmp))
        engines["sentence_transformers"] = _run_worker("st", a.st_python, req, Path(tmp))
    cpu["cores"] = cores
    gflop = _useful_gflop(texts, model_dir)
    result = {"n": a.n, "n1": a.n1, "reps": a.reps, "cpu": cpu, "engines": engines, "encoder_precision": _policy_precision(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "gflop_per_sentence": {str(b): gflop(texts[: a.n1] if b == 1 else texts) for b in BATCHES}}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = table(result)
    print(text)
    (RESULTS / f"{a.name}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{a.name}.txt").write_text(text + "\n")
    plot(result, RESULTS / f"{a.name}.png")


if __name__ == "__main__":
    main()
