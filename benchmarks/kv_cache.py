"""Paged ragged KV cache (MAX's form) against maxjax's dense cache, one decode step of SmolLM2.

Issue 21 asks which KV-cache form the engine uses on CPU, and why. Both engines run the bundled
SmolLM2-135M-Instruct GGUF (Q4_1) in the same process, with the same weights: float32 (dequantized
at load) by default, so that the two differ only in the cache and attention (``--weights packed``
keeps the paged graph's weights in GGUF blocks and the engine's in its default layout):

- ``paged``: the MAX-style graph of ``examples/max_llama3.py`` (a ``Transformer`` of
  ``TransformerBlock``/``AttentionWithRope`` over ``MHAKVCacheParams`` with 16-token pages),
  compiled by ``InferenceSession``; one step = ``execute`` of one new token per sequence on a
  ragged batch whose sequences already hold ``context`` tokens (``PagedKVCache.inputs``: page table,
  cache lengths), logits of the last token.
- ``dense``: ``maxjax generate``'s decode step (``CausalLM.decode_step``: ``[layers, batch, heads,
  positions, head_dim]`` caches sized to the request, greedy sampling in the same program).

Each step is timed after warm-up calls of the same shape, the two engines interleaved round by
round (so a busy machine slows both alike), and the median of the rounds is reported, with the
ratio paged / dense (above 1: the dense cache is faster). The CPU's vector features and the load
average are printed beside the figures.

Run: ``python benchmarks/kv_cache.py [--rounds 5] [--steps 10] [--quick]``; writes
``benchmarks/results/kv_cache.json`` and ``kv_cache.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from max_llama3 import graph_of, load  # noqa: E402

from maxjax._bundled import smollm2_gguf_path  # noqa: E402
from maxjax.backend import cpu_vector_features  # noqa: E402
from maxjax.engine import InferenceSession  # noqa: E402
from maxjax.models import load_model  # noqa: E402
from maxjax.nn.kv_cache import PagedKVCache  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


class Paged:
    """One decode step of the MAX-style ragged graph for ``batch`` sequences of ``context`` tokens."""

    def __init__(self, compiled, kv_params, batch: int, context: int) -> None:
        page = kv_params.page_size
        self.cache = PagedKVCache(kv_params, batch * (-(-(context + 1) // page)))
        self.ids = list(range(batch))
        for i in self.ids:
            self.cache.claim(i)
        self.cache.inputs(self.ids, [context] * batch)  # reserve the pages the context fills
        self.cache.commit(self.ids, [context] * batch)
        self.compiled = compiled
        self.tokens = np.full(batch, 504, np.int64)
        self.offsets = np.arange(batch + 1, dtype=np.uint32)

    def __call__(self) -> None:
        kv = self.cache.inputs(self.ids, [1] * len(self.ids))  # no commit: every step has the same shape
        logits = self.compiled.execute(self.tokens, self.offsets, np.ones(1, np.int64), *kv)[0]
        logits.to_numpy()


class Dense:
    """One decode step of ``maxjax generate`` for ``batch`` rows at position ``context``."""

    def __init__(self, lm, batch: int, context: int) -> None:
        from maxjax.models.generation import CACHE_ROUND

        self.lm = lm
        self.k, self.v = lm.new_cache(batch, -(-(context + 1) // CACHE_ROUND) * CACHE_ROUND)
        self.tokens = np.full(batch, 504, np.int32)
        self.positions = np.full(batch, context, np.int32)

    def __call__(self) -> None:
        nxt, _, self.k, self.v = self.lm.decode_step(self.tokens, self.positions, self.k, self.v)
        np.asarray(nxt)


def time_steps(step, n: int) -> float:
    """Seconds per call of ``step``, over ``n`` calls."""
    t = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="decode steps per round and engine")
    p.add_argument("--weights", choices=("float32", "packed"), default="float32")
    p.add_argument("--quick", action="store_true", help="batch 1 and 4 at context 128 only, 3 rounds")
    a = p.parse_args()
    cases = [(1, 128), (4, 128)] if a.quick else [(1, 128), (1, 512), (4, 128), (4, 512), (16, 256)]
    rounds = 3 if a.quick else a.rounds
    cpu = cpu_vector_features()
    info = (f"jax {jax.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"vector features {' '.join(cpu['vector_features']) or 'unknown'}, "
            f"load average at start {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"# {info}")
    dequantize = a.weights == "float32"
    print(f"# weights: {a.weights}")
    model, kv_params, _ = load(smollm2_gguf_path(), dequantize=dequantize)
    compiled = InferenceSession().load(graph_of(model, kv_params), weights_registry=model.state_dict())
    lm = load_model(quantized_layout="dequantized" if dequantize else None)
    rows = []
    print(f"\n{'batch':>5} {'context':>7} {'paged ms':>9} {'dense ms':>9} {'paged/dense':>11}")
    for batch, context in cases:
        engines = {"paged": Paged(compiled, kv_params, batch, context), "dense": Dense(lm, batch, context)}
        for step in engines.values():  # compile and warm up
            for _ in range(3):
                step()
        times: dict[str, list[float]] = {k: [] for k in engines}
        for _ in range(rounds):
            for name, step in engines.items():
                times[name].append(time_steps(step, a.steps))
        med = {k: float(np.median(v)) for k, v in times.items()}
        row = dict(batch=batch, context=context, paged_ms=med["paged"] * 1e3, dense_ms=med["dense"] * 1e3,
                   ratio=med["paged"] / med["dense"], rounds={k: [t * 1e3 for t in v] for k, v in times.items()})  # fmt: skip
        rows.append(row)
        print(f"{batch:>5} {context:>7} {row['paged_ms']:>9.2f} {row['dense_ms']:>9.2f} {row['ratio']:>11.2f}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = ("kv_cache_quick" if a.quick else "kv_cache") + ("" if dequantize else "_packed")
    (RESULTS / f"{name}.json").write_text(json.dumps(dict(machine=info, cpu=cpu, weights=a.weights, rows=rows), indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = [f"b{r['batch']}/c{r['context']}" for r in rows]
        x = np.arange(len(rows))
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.bar(x - 0.2, [r["paged_ms"] for r in rows], 0.4, label="paged ragged (MAX's form)")
        ax.bar(x + 0.2, [r["dense_ms"] for r in rows], 0.4, label="dense (maxjax engine)")
        ax.set_xticks(x, labels)
        ax.set_ylabel("ms per decode step")
        ax.set_title("SmolLM2-135M Q4_1 decode step, " + " ".join(cpu["vector_features"][:3]))
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / f"{name}.png", dpi=100)
    except ImportError:
        print("matplotlib not installed: no plot")


if __name__ == "__main__":
    main()
