"""The ``int8`` quantized layout (issue 24): accuracy and decode speed against the float32 path.

SmolLM2-135M-Instruct (the bundled Q4_1 GGUF) in three configurations, in one process:

- ``float32``: the backend policy's layout (``unpacked`` on AVX2, ``nibbles`` on AVX-512), the
  file's values bit for bit, float32 arithmetic;
- ``int8 weights``: the ``int8`` layout (weights requantized per output channel, Hadamard-rotated
  in 64-column blocks) with float32 arithmetic everywhere (``int8_min_rows=0``);
- ``int8 dots``: the ``int8`` layout with the CPU policy's ``int8_min_rows`` (16): products of 16
  rows and more are int8 x int8 -> int32 dots, activations quantized per row.

Measured:

1. held-out perplexity on the Python documentation (``maxjax.train.data``'s held-out split; the
   training corpus of the tests): ``--eval-batches`` batches of 4 x 256 tokens, through
   ``Trainer.perplexity`` (a full-sequence forward: every product has 1024 rows, so ``int8 dots``
   uses int8 dots throughout);
2. the share of identical greedy tokens against ``float32``, for 16 prompts generated together
   (decode at batch 16: int8 dots in ``int8 dots``);
3. one decode step (greedy, cache of 256 positions) at batch 1, 16 and 32: median of
   ``--rounds`` rounds of ``--steps`` steps, the configurations interleaved round by round.

The CPU's vector features and the load average are recorded beside the figures. Writes
``benchmarks/results/int8.json``, ``int8.txt`` and ``int8.png``.

    python benchmarks/int8.py [--eval-batches 4] [--rounds 5] [--steps 8]
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

PROMPTS = [
    "The quick brown fox", "def fibonacci(n):", "Once upon a time", "The capital of France is",
    "import numpy as np", "In mathematics, a prime number", "The weather today", "To install the package, run",
    "Python is a programming language that", "The first step is to", "class Stack:", "My favourite book is",
    "The meeting is scheduled for", "Water boils at", "SELECT name FROM", "The history of the Roman Empire",
]  # fmt: skip
BATCHES = (1, 16, 32)


def _cpu() -> dict:
    from maxjax.backend.cpu import cpu_features

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = sorted(f for f in cpu_features() if f.startswith(("avx", "amx", "fma")))
    return {"model": model, "flags": flags, "cores": len(os.sched_getaffinity(0))}


def step_header(batches: tuple[int, ...]) -> str:
    """The decode-step columns' header: per batch size, ms per step, tokens/s and the ratio to float32's."""
    return " ".join(f"{f'b{b} ms':>8} {f'b{b} tok/s':>10} {'vs f32':>7}" for b in batches)


def step_cells(step_ms: dict, name: str, batches: tuple[int, ...], digits: int = 1) -> str:
    """Those columns for configuration ``name`` (``step_ms[name][b]``: ms per step at batch ``b``;
    ``step_ms["float32"]`` the reference)."""
    return "".join(
        f" {step_ms[name][b]:>8.{digits}f} {b * 1e3 / step_ms[name][b]:>10.0f} {step_ms['float32'][b] / step_ms[name][b]:>6.2f}x"
        for b in batches
    )


def time_decode_steps(lms: dict, batches: tuple[int, ...], rounds: int, steps: int) -> tuple[dict, float]:
    """The median milliseconds of one greedy decode step (cache of 256 positions) of each model
    at each batch size: every shape compiled first, then ``rounds`` rounds of ``steps`` steps,
    the models interleaved round by round. Returns ``({name: {batch: ms}}, load average when
    the timed rounds began)``."""
    import jax
    import numpy as np

    times: dict[str, dict[int, list[float]]] = {n: {b: [] for b in batches} for n in lms}
    caches = {}
    for name, lm in lms.items():
        for b in batches:
            k, v = lm.new_cache(b, 256)
            toks, pos = np.ones((b,), np.int32), np.full((b,), 10, np.int32)
            out = lm.decode_step(toks, pos, k, v)  # compile
            jax.block_until_ready(out[0])
            caches[name, b] = (toks, pos, out[2], out[3])
    load0 = os.getloadavg()[0]
    for _ in range(rounds):
        for b in batches:
            for name, lm in lms.items():
                toks, pos, k, v = caches[name, b]
                t0 = time.perf_counter()
                for _ in range(steps):
                    out = lm.decode_step(toks, pos, k, v)
                    k, v = out[2], out[3]
                jax.block_until_ready(out[0])
                times[name][b].append((time.perf_counter() - t0) / steps)
                caches[name, b] = (toks, pos, k, v)
    return {n: {b: 1e3 * statistics.median(t) for b, t in d.items()} for n, d in times.items()}, load0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    a = ap.parse_args()

    import glob

    import jax
    import numpy as np
    import optax

    from maxjax import train
    from maxjax.backend import policy_for
    from maxjax.models import load_model
    from maxjax.train.data import TokenStream, load_corpus, python_docs_path

    base = policy_for("cpu")
    configs = {
        "float32": (base.quantized_layout, base),
        "int8 weights": ("int8", dataclasses.replace(base, int8_min_rows=0)),
        "int8 dots": ("int8", base),
    }
    lms = {name: load_model(quantized_layout=layout, policy=policy) for name, (layout, policy) in configs.items()}

    # 1. perplexity
    try:
        root = python_docs_path()
    except FileNotFoundError:
        root = Path(sorted(glob.glob("/usr/share/doc/python3*/html/_sources"))[0])
    corpus = load_corpus(root, max_files=60)
    tok = lms["float32"].tokenizer
    held = TokenStream.from_texts(corpus.texts("held_out"), tok.encode_batch, tok.eos_token_id)
    batches = held.eval_batches(4, 256, a.eval_batches)
    ppl = {}
    for name, (layout, policy) in configs.items():
        trainer = train.Trainer(lms[name].module, optax.sgd(0.0), trainable="norm.weight", quantized_layout=layout, policy=policy)
        ppl[name] = trainer.perplexity(trainer.init(), batches)
        print(f"perplexity {name}: {ppl[name]:.4f}", flush=True)

    # 2. greedy tokens of 16 prompts generated together
    tokens = {name: [g.token_ids for g in lm.generate(PROMPTS, a.new_tokens)] for name, lm in lms.items()}
    ref = tokens["float32"]
    same = {
        name: sum(x == y for r, t in zip(ref, toks) for x, y in zip(r, t)) / max(1, sum(len(r) for r in ref))
        for name, toks in tokens.items()
    }

    # 3. decode steps, interleaved
    step_ms, load0 = time_decode_steps(lms, BATCHES, a.rounds, a.steps)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": _cpu(), "loadavg": [load0, os.getloadavg()[0]],
        "perplexity": ppl, "same_greedy_tokens": same, "step_ms": step_ms, "eval_tokens": len(batches) * 4 * 256,
        "policy_layout": base.quantized_layout, "int8_min_rows": base.int8_min_rows, "jax": jax.__version__,
    }  # fmt: skip
    lines = [
        f"SmolLM2-135M Q4_1, int8 layout vs float32 ({base.quantized_layout}); CPU {result['cpu']['model']}, "
        f"{result['cpu']['cores']} cores, flags {' '.join(result['cpu']['flags'])}; load {load0:.1f}->{os.getloadavg()[0]:.1f}",
        f"{'config':<14} {'perplexity':>10} {'vs f32':>8} {'same greedy':>12} "
        + step_header(BATCHES),
    ]
    for name in lms:
        row = f"{name:<14} {ppl[name]:>10.4f} {ppl[name] / ppl['float32']:>7.4f}x {same[name]:>11.1%} "
        lines.append(row + step_cells(step_ms, name, BATCHES))
    lines.append(f"perplexity over {result['eval_tokens']} held-out tokens; greedy tokens: 16 prompts x {a.new_tokens} "
                 "generated together; decode step: cache of 256 positions, medians of interleaved rounds")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "int8.json").write_text(json.dumps(result, indent=1))
    (RESULTS / "int8.txt").write_text(text + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(BATCHES))
    for i, name in enumerate(lms):
        ax.bar(x + (i - 1) * 0.27, [b * 1e3 / step_ms[name][b] for b in BATCHES], 0.27,
               label=f"{name} (ppl {ppl[name]:.2f})")  # fmt: skip
    ax.set_xticks(x, [f"batch {b}" for b in BATCHES])
    ax.set_ylabel("decode tokens / s")
    ax.set_title("SmolLM2-135M decode: int8 layout vs float32 (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "int8.png", dpi=100)


if __name__ == "__main__":
    main()
