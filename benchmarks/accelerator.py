"""Decode on an accelerator (issue 23's GPU check): load, compile, time to first token and decode
at batch 1, 16 and 64, beside the device's memory-bandwidth bound.

For each model given (a GGUF file or a Hugging Face directory; ``--synthetic 8b:q4_0,8b:bf16``
makes ``scripts/make_synthetic_gguf.py``'s files in its cache), in this process, on JAX's default
device:

- ``load_s``: ``load_model`` to a model ready to run, and the bytes its state holds on the device
  (the run-time layout: on GPU, Q4_0 unpacked to a byte per value plus scales, bfloat16 widened
  to float32 unless ``--dtype bfloat16`` keeps it, as the GPU policy and the load dtype choose);
- ``compile_s``: a first 4-token generation (prefill of the 128-token prompt and decode);
- ``ttft_s``: time to first token of the same prompt, warm;
- ``generate tok/s``: batch-1 ``generate`` of ``--steps`` tokens, as a user sees it;
- decode steps: the median milliseconds of one ``decode_step`` (greedy, a cache of 256
  positions) at each batch of ``--batches``, ``--steps`` steps a round, 3 rounds
  (``int8.py``'s ``time_decode_steps``);
- the bound: the file's weight bytes read per token (scale.py's ``bytes_per_token``: the token
  embedding counts only when it is also the output head) over the device's read bandwidth,
  measured here as a ``jnp.sum`` over 4 GiB of float32 (bytes read per second).

Prints a table and writes ``benchmarks/results/accelerator_<platform>.json`` (``--out``).

    python benchmarks/accelerator.py --synthetic 8b:q4_0,8b:bf16 [--batches 1,16,64] [--steps 64]
    python benchmarks/accelerator.py MODEL [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "scripts"))

from int8 import time_decode_steps  # noqa: E402
from scale import PROMPT, SHAPE, bytes_per_token  # noqa: E402


def read_bandwidth(gib: float = 4.0, reps: int = 10) -> float:
    """Bytes read per second by a ``jnp.sum`` over ``gib`` GiB of float32 on the default device
    (the best of ``reps``)."""
    import jax
    import jax.numpy as jnp

    n = int(gib * 2**30) // 4
    x = jnp.ones((n,), jnp.float32)
    f = jax.jit(jnp.sum)
    f(x).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    del x
    return n * 4 / best


def state_bytes(lm) -> int:
    import jax

    return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(lm.state))


def measure(path: str, label: str, batches: tuple[int, ...], steps: int, dtype: str) -> dict:
    import gc

    import jax

    from maxjax.dtype import DType
    from maxjax.models import load_model

    def phase(what: str, seconds: float) -> None:  # each phase as it ends: a run cut short still says where
        print(f"  {label}: {what} {seconds:.1f} s", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    lm = load_model(path, dtype=getattr(DType, dtype), progress=True)
    jax.block_until_ready(jax.tree.leaves(lm.state))
    phase("loaded in", time.perf_counter() - t0)
    out: dict = {"model": label, "path": path, "dtype": dtype, "load_s": time.perf_counter() - t0,
                 "state_bytes": state_bytes(lm), "file_bytes_per_token": bytes_per_token(path)}  # fmt: skip
    ids = lm.tokenizer.encode(PROMPT)[:128]
    text = lm.tokenizer.decode(ids)
    t1 = time.perf_counter()
    (g,) = lm.generate([text], max_new_tokens=4, stop_at_eos=False)
    out["compile_s"] = g.compile_seconds
    phase(f"first generation (compiles {g.compile_seconds:.1f} s) in", time.perf_counter() - t1)
    (g,) = lm.generate([text], max_new_tokens=steps, stop_at_eos=False)
    out["ttft_s"] = g.time_to_first_token
    out["generate_tok_s"] = (len(g.token_ids) - 1) / g.decode_seconds
    out["tokens"] = [int(t) for t in g.token_ids[:8]]
    out["step_ms"] = {}
    for b in batches:
        out["step_ms"][b] = time_decode_steps({label: lm}, (b,), rounds=3, steps=steps)[0][label][b]
        print(f"  {label}: batch {b}: {out['step_ms'][b]:.2f} ms/step", file=sys.stderr, flush=True)
    del lm, g
    gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="GGUF files or Hugging Face directories")
    ap.add_argument("--synthetic", default="", help="SIZE:TYPE,... with SIZE in 1b,3b,8b and TYPE q4_0, q8_0 or bf16")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--dtype", default="float32", help="load_model's dtype (float32: MAX's default; bfloat16)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import jax

    import make_synthetic_gguf as synth

    models = [(p, os.path.basename(p.rstrip("/"))) for p in a.models]
    for item in [s for s in a.synthetic.split(",") if s]:
        size, kind = item.split(":")
        fmt = "safetensors" if kind == "bf16" else "gguf"
        path = synth.ensure(SHAPE[size], "q4_0" if fmt == "safetensors" else kind, fmt=fmt)
        models.append((str(path), f"synthetic {SHAPE[size]} {kind}"))
    batches = tuple(int(b) for b in a.batches.split(","))
    dev = jax.devices()[0]
    bw = read_bandwidth()
    print(f"device: {dev.device_kind} ({dev.platform}), jax {jax.__version__}; read bandwidth {bw / 1e9:.0f} GB/s",
          file=sys.stderr, flush=True)  # fmt: skip
    head = (f"{'model':<34} {'load s':>7} {'GB dev':>7} {'compile s':>9} {'TTFT ms':>8} {'gen tok/s':>9} "
            + " ".join(f"{f'b{b} ms':>8} {f'b{b} tok/s':>10}" for b in batches) + f" {'bound tok/s':>11} {'b1 share':>8}")  # fmt: skip
    out = pathlib.Path(a.out or HERE / "results" / f"accelerator_{dev.platform}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    lines, rows = [], []
    for path, label in models:  # each row printed and saved as it is measured
        print(f"{label} ...", file=sys.stderr, flush=True)
        r = measure(path, label, batches, a.steps, a.dtype)
        r["bound_tok_s"] = bound = bw / r["file_bytes_per_token"]
        rows.append(r)
        cells = " ".join(f"{r['step_ms'][b]:>8.2f} {1e3 * b / r['step_ms'][b]:>10.0f}" for b in batches)
        lines.append(f"{r['model']:<34} {r['load_s']:>7.1f} {r['state_bytes'] / 1e9:>7.2f} {r['compile_s']:>9.2f} "
                     f"{1e3 * r['ttft_s']:>8.1f} {r['generate_tok_s']:>9.1f} {cells} {bound:>11.0f} "
                     f"{1e3 / r['step_ms'][batches[0]] / bound:>8.0%}")  # fmt: skip
        print(f"\n{dev.device_kind}, jax {jax.__version__}, read bandwidth {bw / 1e9:.0f} GB/s, dtype {a.dtype}")
        print("\n".join([head, *lines]), flush=True)
        out.write_text(json.dumps({"device": dev.device_kind, "platform": dev.platform, "jax": jax.__version__,
                                   "read_bandwidth": bw, "dtype": a.dtype, "rows": rows}, indent=1))  # fmt: skip
    print(f"wrote {out}", file=sys.stderr)

if __name__ == "__main__":
    main()
