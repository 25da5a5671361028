"""Benchmark of SmolLM2 on device meshes (issue 14, "Measure"), every configuration in its own process.

1. Per-device resident bytes of the prepared weights at tp = 1, 2, 3, 4, 8 (the sum of each
   device's addressable shards, in the runtime layout), against the goal: the one-device bytes
   of the split weights / tp + the replicated bytes, within 5%. Heads that do not divide the
   devices are padded (zero KV groups), which costs bytes on the attention weights; the table
   shows it.
2. Decode tokens/s (batch 2: one row per data-parallel replica at dp = 2) and time to first token
   on 8 host CPU devices per (dp, tp), next to one device. CPU is not the point: on 2 cores, 8
   "devices" share them, and the figures report what the partitioned program costs, untuned.
3. The bytes each process reads from the GGUF in a 2-process run (2 x 4 CPU devices,
   ``jax.distributed`` on localhost) for both axis orders: ``tp=4,dp=2`` (tp across processes)
   and ``dp=2,tp=4`` (one replica per process).

Prints a table, saves ``benchmarks/results/sharding.json`` and ``sharding.png`` (``sharding_quick.*``
with ``--quick``), with the CPU's vector features.

    python benchmarks/sharding.py [--quick] [--steps 32]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
PROMPTS = ["The quick brown fox", "Once upon a time"]
MESHES = [(1, 1), (1, 2), (1, 3), (1, 4), (1, 8), (2, 4), (8, 1)]


def worker(spec: dict) -> dict:
    import jax

    jax.config.update("jax_num_cpu_devices", spec["devices"])
    if spec.get("coordinator"):
        from maxjax.engine.mesh import initialize_distributed

        initialize_distributed(spec["coordinator"], spec["processes"], spec["process_id"])
    import numpy as np

    from maxjax.engine.mesh import make_mesh
    from maxjax.graph.weights.lazy import bytes_read
    from maxjax.models import load_model

    dp, tp = spec.get("dp", 1), spec.get("tp", 1)
    mesh = make_mesh(spec["mesh"]) if spec.get("mesh") else (None if dp * tp == 1 else make_mesh({"dp": dp, "tp": tp}))
    t = time.perf_counter()
    lm = load_model(mesh=mesh)
    out = {"load_s": time.perf_counter() - t, "bytes_read": bytes_read()}
    per_device: dict[str, int] = {}
    for leaf in jax.tree.leaves(lm.state):
        for shard in leaf.addressable_shards:
            per_device[str(shard.device)] = per_device.get(str(shard.device), 0) + shard.data.nbytes
    out["bytes_per_device"] = per_device
    out["replicated_bytes"] = sum(leaf.nbytes for leaf in jax.tree.leaves(lm.state) if leaf.sharding.is_fully_replicated)
    lm.generate(PROMPTS, 4)  # compile every shape
    ttft, speeds = [], []
    for _ in range(spec["reps"]):
        outs = lm.generate(PROMPTS, spec["steps"], stop_at_eos=False)
        ttft.append(outs[0].time_to_first_token)
        speeds.append(sum(g.tokens_per_second for g in outs))  # aggregate over the rows
    out["tokens"] = outs[0].token_ids
    out["ttft_s"] = sorted(ttft)[len(ttft) // 2]
    out["decode_tok_s"] = sorted(speeds)[len(speeds) // 2]
    return out


def run(spec: dict, timeout: float = 900) -> dict:
    p = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})  # fmt: skip
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (p.stderr or p.stdout)[-1500:]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_processes(mesh: str, steps: int) -> list[dict]:
    port = free_port()
    base = {"devices": 4, "coordinator": f"127.0.0.1:{port}", "processes": 2, "mesh": mesh, "steps": steps, "reps": 1}
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", json.dumps({**base, "process_id": i})], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
             for i in range(2)]  # fmt: skip
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=900)
        line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
        out.append(json.loads(line[7:]) if line else {"error": stderr[-1500:]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and one repetition")
    ap.add_argument("--steps", type=int, help="decode steps per run (default 32, quick 8)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print("RESULT " + json.dumps(worker(json.loads(a.worker))), flush=True)
        return
    from maxjax.backend import cpu_vector_features

    steps = a.steps or (8 if a.quick else 32)
    reps = 1 if a.quick else 3
    res: dict = {"cpu": cpu_vector_features(), "cores": os.cpu_count(), "steps": steps, "meshes": {}, "processes": {}}
    for dp, tp in MESHES:
        key = f"dp={dp},tp={tp}"
        print(f"== {key}", flush=True)
        res["meshes"][key] = run({"devices": 1 if dp * tp == 1 else 8, "dp": dp, "tp": tp, "steps": steps, "reps": reps})
    for mesh in ("tp=4,dp=2", "dp=2,tp=4"):
        print(f"== 2 processes, {mesh}", flush=True)
        res["processes"][mesh] = two_processes(mesh, steps)

    ref = res["meshes"]["dp=1,tp=1"]
    whole = max(ref["bytes_per_device"].values()) if "bytes_per_device" in ref else float("nan")

    def goal(key: str, r: dict) -> float:
        """MB a device would hold with the one-device weights split over tp exactly (no padding),
        plus the replicated ones."""
        tp = int(key.split("tp=")[1])
        return ((whole - r["replicated_bytes"]) / tp + r["replicated_bytes"]) / 1e6

    lines = [f"SmolLM2-135M Q4_1 on meshes of host CPU devices ({res['cores']} cores; vector features "
             f"{' '.join(res['cpu']['vector_features'])}); decode {steps} steps, batch {len(PROMPTS)}", ""]  # fmt: skip
    head = f"{'mesh':12}{'bytes/device (MB)':>19}{'goal (MB)':>11}{'over goal':>10}{'decode tok/s':>14}{'TTFT (ms)':>11}{'tokens = 1 device':>19}"
    lines += [head, "-" * len(head)]
    for key, r in res["meshes"].items():
        if "error" in r:
            lines.append(f"{key:12} failed: {r['error'].splitlines()[-1] if r['error'] else ''}")
            continue
        biggest = max(r["bytes_per_device"].values()) / 1e6
        g = goal(key, r)
        same = r["tokens"] == ref.get("tokens")
        lines.append(f"{key:12}{biggest:19.1f}{g:11.1f}{100 * (biggest / g - 1):9.1f}%{r['decode_tok_s']:14.1f}"
                     f"{1e3 * r['ttft_s']:11.0f}{str(same):>19}")  # fmt: skip
    lines.append("")
    lines.append("bytes read from the GGUF per process, 2 processes x 4 CPU devices:")
    for mesh, procs in res["processes"].items():
        cells = [f"process {i}: " + (f"{p['bytes_read'] / 1e6:.1f} MB, tokens = 1 device: {p['tokens'] == ref.get('tokens')}"
                                     if "error" not in p else "failed") for i, p in enumerate(procs)]  # fmt: skip
        lines.append(f"  {mesh:10} " + "; ".join(cells))
    text = "\n".join(lines)
    print(text)
    res["report"] = text
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "sharding_quick" if a.quick else "sharding"
    (RESULTS / f"{stem}.json").write_text(json.dumps(res, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ok = {k: r for k, r in res["meshes"].items() if "error" not in r}
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        names = list(ok)
        ax1.bar(names, [max(r["bytes_per_device"].values()) / 1e6 for r in ok.values()], label="measured")
        ax1.plot(names, [goal(k, r) for k, r in ok.items()], "ko-", label="goal (no padding)")
        ax1.set_ylabel("MB of weights per device")
        ax1.legend()
        ax1.tick_params(axis="x", rotation=45)
        ax2.bar(names, [r["decode_tok_s"] for r in ok.values()])
        ax2.set_ylabel("decode tokens/s (8 host devices on %d cores)" % res["cores"])
        ax2.tick_params(axis="x", rotation=45)
        fig.tight_layout()
        fig.savefig(RESULTS / f"{stem}.png", dpi=110)
        print(f"saved {RESULTS / (stem + '.json')} and .png")
    except Exception as e:  # the numbers matter more than the picture
        print(f"plot failed: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
