"""Q8_0 activations for Q4_0 weights read in place (issues 23 and 24): accuracy and decode speed
against float32 activations, with llama.cpp's perplexity on the same text beside them.

Two files of SmolLM2-135M-Instruct: the bundled Q4_1 (``nibbles`` in maxjax, its Q8_0 token
embedding read in place), and the same requantized to Q4_0 by llama.cpp itself
(``llama_model_quantize`` through ``llama-cpp-python``; read in place), cached in
``~/.cache/maxjax``. Two maxjax configurations of each, in one process:

- ``float32``: ``load_model(arithmetic="float32")``: the kernel multiplies the file's values by
  the float32 activations;
- ``Q8_0 acts``: ``load_model(arithmetic="q8_0")`` (the policy's ``q8_activations``): decode
  products quantize each activation row per 32-value block to Q8_0 and run integer dots
  (llama.cpp's ``ggml_vec_dot_q4_0_q8_0``, ``_q4_1_q8_1``, ``_q8_0_q8_0``).

Measured:

1. held-out perplexity on the Python documentation (``maxjax.train.data``'s held-out split),
   teacher-forced through batch-1 decode steps (``--windows`` windows of 128 tokens, one at a
   time, so that the Q8_0 configuration quantizes every product's activations), and llama.cpp's
   on the same windows (``logits_all``, one window at a time);
2. the share of identical greedy tokens against ``float32``, 16 prompts x ``--new-tokens``,
   each generated alone (batch 1);
3. one decode step (greedy, cache of 256 positions) at batch 1 and 16 (Q8_0 activations are
   for one row only: 16 rows take float32 in both): median of ``--rounds``
   rounds of ``--steps`` steps, the configurations interleaved round by round.

The CPU's vector features are recorded beside the figures. Writes
``benchmarks/results/q8_activations.json``, ``.txt`` and ``.png``.

    python benchmarks/q8_activations.py [--windows 32] [--llama-python /work/llamavenv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from int8 import PROMPTS, _cpu, step_cells, step_header, time_decode_steps  # noqa: E402  (one list of prompts, one CPU record, one timing loop and table)

CACHE = Path.home() / ".cache" / "maxjax" / "smollm2-135m-instruct-q4_0.gguf"
BATCHES = (1, 16)
WINDOW = 128

QUANTIZE = """
import ctypes, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.allow_requantize, p.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, True, os.cpu_count()
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
"""

LLAMA_PPL = """
import json, math, sys, numpy as np
from llama_cpp import Llama
model, windows = sys.argv[1], json.load(open(sys.argv[2]))
size = len(windows[0])
llm = Llama(model_path=model, n_ctx=size, n_batch=size, logits_all=True, verbose=False, n_threads=os.cpu_count())
nll, n = 0.0, 0
for w in windows:
    llm.reset()
    llm.eval(w)
    logits = np.asarray(llm.scores[: len(w) - 1], np.float64)  # [t, vocab]: position t predicts token t + 1
    logits -= logits.max(-1, keepdims=True)
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll -= lp[np.arange(len(w) - 1), w[1:]].sum()
    n += len(w) - 1
print(json.dumps({"perplexity": math.exp(nll / n), "tokens": n}))
"""


def _q4_0_model(llama_python: str) -> Path:
    """SmolLM2-135M-Instruct as Q4_0, requantized by llama.cpp (cached)."""
    if CACHE.exists():
        return CACHE
    from maxjax.models.loading import resolve_model_path

    CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE.with_suffix(".tmp")
    subprocess.run([llama_python, "-c", "import os\n" + QUANTIZE, str(resolve_model_path(None)), str(tmp)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    tmp.rename(CACHE)
    return CACHE


def _decode_perplexity(lm, batches) -> float:
    """exp(mean NLL) of each window's tokens 1.. given the ones before, one decode step at a time."""
    import jax
    import numpy as np

    nll, n = 0.0, 0
    for tokens in batches:  # [rows, WINDOW]
        rows, length = tokens.shape
        k, v = lm.new_cache(rows, length)
        for t in range(length - 1):
            _, logits, k, v = lm.decode_step(tokens[:, t], np.full((rows,), t, np.int32), k, v)
            lp = jax.nn.log_softmax(np.asarray(logits, np.float64), axis=-1)
            nll -= float(np.asarray(lp)[np.arange(rows), tokens[:, t + 1]].sum())
            n += rows
    return float(np.exp(nll / n))


def _measure(model: Path, a: argparse.Namespace, batches: list) -> dict:
    """Perplexity (both configurations and llama.cpp), greedy agreement and decode steps of one file."""
    from maxjax.models import load_model

    lms = {"float32": load_model(model, arithmetic="float32"), "Q8_0 acts": load_model(model, arithmetic="q8_0")}
    ppl = {}
    for name, lm in lms.items():  # 1. perplexity, teacher-forced through decode steps
        ppl[name] = _decode_perplexity(lm, batches)
        print(f"{model.name}: perplexity {name}: {ppl[name]:.4f}", flush=True)
    windows = RESULTS / "q8_activations_windows.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    windows.write_text(json.dumps([[int(t) for t in row] for b in batches for row in b]))
    try:  # llama.cpp on the same windows
        out = subprocess.run([a.llama_python, "-c", "import os\n" + LLAMA_PPL, str(model), str(windows)], check=True,
                             capture_output=True, text=True, timeout=1800)  # fmt: skip
        ppl["llama.cpp"] = json.loads(out.stdout.strip().splitlines()[-1])["perplexity"]
        print(f"{model.name}: perplexity llama.cpp: {ppl['llama.cpp']:.4f}", flush=True)
    finally:
        windows.unlink()

    # 2. greedy tokens of 16 prompts, each alone
    tokens = {name: [lm.generate([p], a.new_tokens)[0].token_ids for p in PROMPTS] for name, lm in lms.items()}
    ref = tokens["float32"]
    same = {
        name: sum(x == y for r, t in zip(ref, toks) for x, y in zip(r, t)) / max(1, sum(len(r) for r in ref))
        for name, toks in tokens.items()
    }

    # 3. decode steps, interleaved
    step_ms, _ = time_decode_steps(lms, BATCHES, a.rounds, a.steps)
    return {"model": str(model), "perplexity": ppl, "same_greedy_tokens": same, "step_ms": step_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--llama-python", default="/work/llamavenv/bin/python", help="a Python with llama_cpp")
    a = ap.parse_args()

    import glob

    import jax
    import numpy as np

    from maxjax._bundled import smollm2_gguf_path
    from maxjax.tokenizer import Tokenizer
    from maxjax.train.data import TokenStream, load_corpus, python_docs_path

    models = {"Q4_1 (bundled)": Path(smollm2_gguf_path()), "Q4_0 (requantized by llama.cpp)": _q4_0_model(a.llama_python)}
    try:
        root = python_docs_path()
    except FileNotFoundError:
        root = Path(sorted(glob.glob("/usr/share/doc/python3*/html/_sources"))[0])
    corpus = load_corpus(root, max_files=60)
    tok = Tokenizer.from_gguf(str(models["Q4_1 (bundled)"]))
    held = TokenStream.from_texts(corpus.texts("held_out"), tok.encode_batch, tok.eos_token_id)
    batches = [b.astype(np.int32) for b in held.eval_batches(1, WINDOW, a.windows)]
    load0 = os.getloadavg()[0]
    runs = {label: _measure(path, a, batches) for label, path in models.items()}
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": _cpu(), "loadavg": [load0, os.getloadavg()[0]],
        "models": runs, "eval_tokens": len(batches) * (WINDOW - 1), "jax": jax.__version__,
    }  # fmt: skip
    lines = [
        f"SmolLM2-135M-Instruct, Q8_0 activations vs float32 at batch 1; CPU {result['cpu']['model']}, "
        f"{result['cpu']['cores']} cores, flags {' '.join(result['cpu']['flags'])}; load {load0:.1f}->{os.getloadavg()[0]:.1f}",
        f"{'file':<32} {'config':<10} {'perplexity':>10} {'vs f32':>8} {'same greedy':>12} "
        + step_header(BATCHES),
    ]
    for label, r in runs.items():
        ppl, same, step_ms = r["perplexity"], r["same_greedy_tokens"], r["step_ms"]
        for name in step_ms:
            row = f"{label:<32} {name:<10} {ppl[name]:>10.4f} {ppl[name] / ppl['float32']:>7.4f}x {same[name]:>11.1%} "
            lines.append(row + step_cells(step_ms, name, BATCHES, digits=2))
        if "llama.cpp" in ppl:
            ratio = ppl["llama.cpp"] / ppl["float32"]
            lines.append(f"{label:<32} {'llama.cpp':<10} {ppl['llama.cpp']:>10.4f} {ratio:>7.4f}x  (same windows, prompt evaluation)")
    lines.append(f"perplexity over {result['eval_tokens']} held-out tokens, teacher-forced batch-1 decode steps; greedy "
                 f"tokens: 16 prompts x {a.new_tokens}, each alone; decode step: cache of 256 positions, medians of "
                 "interleaved rounds")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    (RESULTS / "q8_activations.json").write_text(json.dumps(result, indent=1))
    (RESULTS / "q8_activations.txt").write_text(text + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), squeeze=False)
    for ax, (label, r) in zip(axes[0], runs.items()):
        x = np.arange(len(BATCHES))
        for i, name in enumerate(r["step_ms"]):
            ax.bar(x + (i - 0.5) * 0.4, [b * 1e3 / r["step_ms"][name][b] for b in BATCHES], 0.4,
                   label=f"{name} (ppl {r['perplexity'][name]:.3f})")  # fmt: skip
        ax.set_xticks(x, [f"batch {b}" for b in BATCHES])
        ax.set_ylabel("decode tokens / s")
        ax.set_title(f"SmolLM2-135M {label}")
        ax.legend()
    fig.suptitle("Q8_0 vs float32 activations (CPU)")
    fig.tight_layout()
    fig.savefig(RESULTS / "q8_activations.png", dpi=100)


if __name__ == "__main__":
    main()
