"""Benchmark of training (issue 15, "Measure"): tokens/s, CPU time, compile time and peak RSS, all engines in one run.

Two comparisons, each engine in its own subprocess (so peak RSS is per engine), fed identical
token batches made here in the parent:

(a) from scratch: a byte-level Llama (6 layers, hidden 256, 8 query / 4 KV heads, MLP 768, vocab
    257; batch 8 x 256 bytes of the Python documentation), AdamW, float32, from the same initial
    weights (``maxjax.nn.init``, copied into the Flax model with ``maxjax.train.interop``):
    1. ``maxjax_scratch``: ``maxjax.models.llama.build_llama`` + ``maxjax.train.Trainer`` (its
       layers one scanned subgraph, one compiled step, state donated);
    2. ``flax_scratch``: the same model in Flax NNX with ``nnx.vmap``-built layers run by
       ``nnx.scan`` (``tests/nnx_llama.py``), stepped the fast Flax way: ``nnx.split`` once, then a
       ``jax.jit``-ed pure step of ``(params, opt_state, batch)`` with donation (no per-step graph
       traversal) and the same optax AdamW.
(b) LoRA fine-tune of SmolLM2-135M-Instruct (rank 8, alpha 16, on q/k/v/o/gate/up/down of every
    layer; batch 4 x 128 tokens of the Python documentation; AdamW 1e-3 without weight decay;
    float32 weights dequantized from the bundled GGUF, written once as a Hugging Face directory by
    ``maxjax.train.export`` so both engines start from the same bytes):
    3. ``maxjax_lora``: ``maxjax.train.dequantized`` + ``apply_lora`` + ``Trainer(trainable="*lora_*")``
       (the policy's ``frozen_precision``: on a CPU with AMX-BF16 the frozen base weights multiply
       in the AMX kernel, four bfloat16 passes);
       ``maxjax_lora_exact``: the same with ``frozen_precision=HIGHEST`` (XLA's exact float32);
    4. ``hf_lora``: transformers ``AutoModelForCausalLM`` + PEFT ``get_peft_model(LoraConfig(...))``
       + ``torch.optim.AdamW`` on torch (``--hf-python``, default ``/work/refenv/bin/python``;
       ``torch.set_num_threads(threads)``), the loss computed as maxjax does (cross-entropy of
       the logits of ``tokens[:, :-1]`` against ``tokens[:, 1:]``);
    5. ``hf_lora_ftz``: the same with ``torch.set_flush_denormal(True)`` (XLA:CPU flushes
       denormals; torch's default does not, and its CPU kernels slow down on them);
    6. ``maxjax_lora_bf16``: ``maxjax_lora`` with ``Trainer(compute_dtype="bfloat16")`` (float32
       master weights and AdamW state, bfloat16 forward and backward: in the policy's
       ``bfloat16_autocast`` recipe on CPUs without AMX-BF16, float32 activations and bfloat16
       operands of the weight products, as torch.autocast; on a CPU without
       ``avx512_bf16``/``amx_bf16`` the policy's refusal is overridden, ``bfloat16_matmul=True``,
       so the figures show XLA's emulation there: the record says which);
    7. ``hf_lora_bf16``: ``hf_lora`` with the forward under ``torch.autocast("cpu",
       dtype=torch.bfloat16)`` (float32 weights and optimizer, PyTorch's mixed-precision recipe).

Each worker runs warm-up steps (the first compiles), then ``--steps`` timed steps; the figures are
medians: tokens/s (wall clock; "best" from the fastest step), CPU seconds per step (user + system), the compile time of the step (maxjax: ``Trainer.compile``; Flax: the
jitted step's ``lower().compile()``; torch compiles nothing: its first step's time is shown) and
the worker's peak RSS. When the machine has more cores than ``--threads``, every worker is pinned
to the same ``--threads`` cores. The parent records the CPU time the rest of the machine used
while each worker ran (as in ``benchmarks/generate.py``) and flags workers above 10%. Run it on a
quiet machine: torch's OpenMP threads slow down far more than XLA's thread pool when another
process takes a core (steps of 20-40 CPU seconds instead of 5 were seen here under load), so a
contended run flatters maxjax against transformers; "best tok/s" shows each engine's fastest step.

Goals (PASS/FAIL in the table): (a) maxjax tokens/s >= Flax NNX's (ratio >= 1.0); (b) maxjax
tokens/s >= 2x transformers + PEFT's (default torch settings); issue 24's: (d) float32 LoRA >= 1.0x
transformers + PEFT float32, (e) bfloat16 LoRA >= 1.5x transformers + PEFT under autocast; (f) shows
the policy's frozen products against exact float32 ones, same run.

    python benchmarks/train.py [--quick] [--steps 8] [--thp] [--engines maxjax_scratch,flax_scratch,...]

Saves ``benchmarks/results/train.json`` and ``train.png`` (``train_quick.*`` with ``--quick``);
``--replot results/train.json`` prints the table of a saved run and redraws its PNG. A worker
runs alone with ``--worker NAME --request REQ.json --out OUT.json``; the hf workers import
neither maxjax nor jax.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
from generate import children_cpu_s, cpu_busy_s, cpu_model, git_state, log, peak_rss_mb  # noqa: E402

ENGINES = ("maxjax_scratch", "flax_scratch", "maxjax_lora", "maxjax_lora_exact", "hf_lora", "hf_lora_ftz", "maxjax_lora_bf16", "hf_lora_bf16")
LORA_ENGINES = ("maxjax_lora", "maxjax_lora_exact", "hf_lora", "hf_lora_ftz", "maxjax_lora_bf16", "hf_lora_bf16")
LABELS = {"maxjax_scratch": "maxjax (scratch)", "flax_scratch": "Flax NNX nnx.scan (scratch)",
          "maxjax_lora": "maxjax LoRA", "maxjax_lora_exact": "maxjax LoRA, exact frozen products",
          "hf_lora": "HF transformers + PEFT (torch)",
          "hf_lora_ftz": "HF + PEFT, flush denormals", "maxjax_lora_bf16": "maxjax LoRA bfloat16",
          "hf_lora_bf16": "HF + PEFT, autocast bfloat16"}  # fmt: skip
SCRATCH = dict(vocab_size=257, hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8,
               num_key_value_heads=4, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=1024,
               tie_word_embeddings=False)  # fmt: skip
SCRATCH_BATCH, SCRATCH_SEQ = 8, 256
LORA_BATCH, LORA_SEQ, LORA_RANK, LORA_ALPHA = 4, 128, 8, 16.0
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
NOISY = 0.10


# -- helpers shared by the workers (stdlib only: the hf workers run in another Python) -----------
def cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def timed_steps(step, batches: list, warmup: int) -> dict:
    """Runs ``step(batch) -> loss`` over ``batches``: the first ``warmup`` untimed, then each timed
    (wall and CPU). Returns the figures and every loss."""
    losses, walls, cpus = [], [], []
    for i, b in enumerate(batches):
        w0, c0 = time.perf_counter(), cpu_s()
        loss = step(b)
        w, c = time.perf_counter() - w0, cpu_s() - c0
        losses.append(loss)
        if i == 0:
            first = w
        if i >= warmup:
            walls.append(w)
            cpus.append(c)
        print(f"[{os.environ.get('BENCH_ENGINE', '?')}] step {i}: loss {loss:.4f}, {w:.2f} s, cpu {c:.2f} s", flush=True)
    tokens = len(batches[0]) * (len(batches[0][0]) - 1)
    med = statistics.median(walls)
    return {"losses": losses, "step_s": walls, "cpu_s": cpus, "first_step_s": first, "median_step_s": med,
            "median_cpu_s": statistics.median(cpus), "tokens_per_step": tokens, "tokens_per_s": tokens / med,
            "best_tokens_per_s": tokens / min(walls)}  # fmt: skip


# -- maxjax workers ------------------------------------------------------------------------------
def run_trainer(trainer, batches: list, warmup: int) -> tuple[dict, object]:
    """A maxjax Trainer from ``init`` through its compile and :func:`timed_steps` over ``batches``:
    (the figures with compile time, compile count and peak RSS, the last state)."""
    import numpy as np

    state = trainer.init()
    batches = [np.asarray(b, np.int32) for b in batches]
    compile_s = trainer.compile(state, batches[0])
    box = [state]

    def step(b):
        box[0], m = trainer.step(box[0], b)
        return float(m["loss"])

    out = timed_steps(step, batches, warmup)
    return {**out, "compile_s": compile_s, "num_compiles": trainer.num_compiles, "peak_rss_mb": peak_rss_mb()}, box[0]


def worker_maxjax_scratch(req: dict) -> dict:
    import jax
    import numpy as np
    import optax

    from maxjax import nn, train
    from maxjax.models.llama import LlamaConfig, build_llama

    model = build_llama(LlamaConfig(**SCRATCH))
    nn.init.initialize(model, jax.random.key(0))
    trainer = train.Trainer(model, optax.adamw(req["lr"]))
    out, _ = run_trainer(trainer, req["scratch_batches"], req["warmup"])
    return out


def worker_flax_scratch(req: dict) -> dict:
    import jax
    import numpy as np
    import optax
    from flax import nnx

    sys.path.insert(0, str(HERE.parent / "tests"))
    from nnx_llama import Llama

    from maxjax import nn
    from maxjax.models.llama import LlamaConfig, build_llama
    from maxjax.train.interop import from_maxjax

    config = LlamaConfig(**SCRATCH)
    same = build_llama(config)  # the same initial weights as the maxjax worker
    init = nn.init.init_state(same, jax.random.key(0))
    model = Llama(config, nnx.Rngs(0), scan=True)
    params = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(params, from_maxjax(init, same, stacked=("layers",)))
    nnx.update(model, params)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt = optax.adamw(req["lr"])
    opt_state = opt.init(params)

    def loss_fn(p, tokens):
        m = nnx.merge(graphdef, p, rest)
        logits = m(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def _step(p, o, tokens):
        loss, g = jax.value_and_grad(loss_fn)(p, tokens)
        u, o = opt.update(g, o, p)
        return optax.apply_updates(p, u), o, loss

    jstep = jax.jit(_step, donate_argnums=(0, 1))
    batches = [np.asarray(b, np.int32) for b in req["scratch_batches"]]
    t = time.perf_counter()
    compiled = jstep.lower(params, opt_state, batches[0]).compile()
    compile_s = time.perf_counter() - t
    box = [params, opt_state]

    def step(b):
        box[0], box[1], loss = compiled(box[0], box[1], b)
        return float(loss)

    out = timed_steps(step, batches, req["warmup"])
    return {**out, "compile_s": compile_s, "peak_rss_mb": peak_rss_mb()}


def worker_maxjax_lora(req: dict, compute_dtype: str = "float32", exact: bool = False) -> dict:
    import dataclasses

    import jax
    import numpy as np
    import optax

    from maxjax import train
    from maxjax.graph.weights import load_weights
    from maxjax.models.registry import for_hf_config

    # the float32 export: the same weights as the torch side (a module only: no serving program)
    cfg = json.loads(pathlib.Path(req["hf_dir"], "config.json").read_text())
    arch = for_hf_config(cfg, req["hf_dir"])
    config = arch.config_from_hf(cfg, req["hf_dir"])
    model = arch.build(config)
    model.load_state_dict(arch.weights_from_hf(load_weights(sorted(pathlib.Path(req["hf_dir"]).glob("*.safetensors"))), config), weight_alignment=1)
    train.apply_lora(model, LORA_TARGETS, rank=LORA_RANK, alpha=LORA_ALPHA, key=jax.random.key(0))
    from maxjax.backend.policy import policy_for

    policy = policy_for("cpu")
    native = policy.bfloat16_matmul
    if compute_dtype == "bfloat16" and not native:  # measure the emulation rather than refuse
        policy = dataclasses.replace(policy, bfloat16_matmul=True)
    if exact:  # XLA's exact float32 products for the frozen weights too (the policy's choice elsewhere)
        policy = dataclasses.replace(policy, frozen_precision=jax.lax.Precision.HIGHEST)
    trainer = train.Trainer(model, optax.adamw(req["lr"], weight_decay=0.0), trainable="*lora_*", policy=policy,
                            compute_dtype=compute_dtype)  # fmt: skip
    out, state = run_trainer(trainer, req["lora_batches"], req["warmup"])
    return {**out, "trainable_params": sum(int(v.size) for v in state.params.values()), "compute_dtype": compute_dtype,
            "bfloat16_native": native, "frozen_precision": str(policy.frozen_precision), "laid_out": trainer.laid_out}  # fmt: skip


def worker_maxjax_lora_exact(req: dict) -> dict:
    return worker_maxjax_lora(req, "float32", exact=True)


def worker_maxjax_lora_bf16(req: dict) -> dict:
    return worker_maxjax_lora(req, "bfloat16")


# -- torch workers (no maxjax, no jax) -----------------------------------------------------------
def _worker_hf(req: dict, flush_denormal: bool, autocast_bf16: bool = False) -> dict:
    import contextlib

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(req["threads"])
    torch.set_flush_denormal(flush_denormal)
    model = AutoModelForCausalLM.from_pretrained(req["hf_dir"], dtype=torch.float32)
    config = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules=LORA_TARGETS, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=req["lr"], weight_decay=0.0)

    def step(b):
        tokens = torch.tensor(b, dtype=torch.long)
        with torch.autocast("cpu", dtype=torch.bfloat16) if autocast_bf16 else contextlib.nullcontext():
            logits = model(input_ids=tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    out = timed_steps(step, req["lora_batches"], req["warmup"])
    import peft
    import transformers

    return {**out, "compile_s": None, "trainable_params": sum(p.numel() for p in params), "peak_rss_mb": peak_rss_mb(),
            "compute_dtype": "bfloat16 (autocast)" if autocast_bf16 else "float32", "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}}  # fmt: skip


def worker_hf_lora(req: dict) -> dict:
    return _worker_hf(req, False)


def worker_hf_lora_ftz(req: dict) -> dict:
    return _worker_hf(req, True)


def worker_hf_lora_bf16(req: dict) -> dict:
    return _worker_hf(req, False, autocast_bf16=True)


WORKERS = {"maxjax_scratch": worker_maxjax_scratch, "flax_scratch": worker_flax_scratch, "maxjax_lora": worker_maxjax_lora,
           "maxjax_lora_exact": worker_maxjax_lora_exact, "hf_lora": worker_hf_lora, "hf_lora_ftz": worker_hf_lora_ftz, "maxjax_lora_bf16": worker_maxjax_lora_bf16,
           "hf_lora_bf16": worker_hf_lora_bf16}  # fmt: skip


# -- the parent ------------------------------------------------------------------------------------
def run_worker(engine: str, python: str, req_path: pathlib.Path, cores: list[int] | None, timeout: float, extra_env: dict | None = None) -> dict:
    """Runs one worker in a fresh process; returns its JSON (with the machine's contention), or {"error": ...}."""
    if not os.path.exists(python):
        return {"engine": engine, "error": f"{python} does not exist (pass --hf-python a Python with torch, transformers and peft)"}
    with tempfile.TemporaryDirectory() as tmp:
        rs = pathlib.Path(tmp, "res.json")
        cmd = [python, str(pathlib.Path(__file__).resolve()), "--worker", engine, "--request", str(req_path), "--out", str(rs)]
        env = {**os.environ, **(extra_env or {}), "BENCH_ENGINE": engine, "TOKENIZERS_PARALLELISM": "false"}
        pre = (lambda: os.sched_setaffinity(0, cores)) if cores else None
        log(f"== {engine}: {python}")
        t, busy0, child0, load0 = time.perf_counter(), cpu_busy_s(), children_cpu_s(), os.getloadavg()
        proc = subprocess.Popen(cmd, env=env, preexec_fn=pre, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        tail: list[str] = []
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                tail = (tail + [line])[-20:]
                if line.startswith(f"[{engine}]"):
                    log("  " + line)
            proc.wait()
        finally:
            timer.cancel()
        if proc.returncode != 0 or not rs.exists():
            return {"engine": engine, "error": f"exit status {proc.returncode}:\n" + "\n".join(tail)}
        res = json.loads(rs.read_text())
        wall = time.perf_counter() - t
        others = (cpu_busy_s() - busy0) - (children_cpu_s() - child0)
        res.update(engine=engine, wall_s=wall, others_cpu_share=max(0.0, others) / (wall * (os.cpu_count() or 1)),
                   loadavg={"start": load0, "end": os.getloadavg()})  # fmt: skip
        return res


def make_batches(n_scratch: int, n_lora: int) -> tuple[list, list, str]:
    """Token batches from the Python documentation's training files (random ids when it is missing)."""
    import numpy as np

    from maxjax._bundled import smollm2_gguf_path
    from maxjax.tokenizer import Tokenizer
    from maxjax.train.data import ByteTokenizer, TokenStream, load_corpus, python_docs_path

    try:
        corpus = load_corpus(python_docs_path(), max_files=60)
        texts = list(corpus.texts("train"))
        source = f"Python documentation ({len(texts)} files)"
    except FileNotFoundError:
        texts, source = None, "random token ids (python3-doc is not installed)"
    rng = np.random.default_rng(0)
    if texts is None:
        scratch = [rng.integers(0, 256, (SCRATCH_BATCH, SCRATCH_SEQ + 1)).tolist() for _ in range(n_scratch)]
        lora = [rng.integers(0, 49152, (LORA_BATCH, LORA_SEQ + 1)).tolist() for _ in range(n_lora)]
        return scratch, lora, source
    byte = TokenStream.from_texts(texts, ByteTokenizer().encode_batch, ByteTokenizer.separator)
    tok = Tokenizer.from_gguf(smollm2_gguf_path())
    bpe = TokenStream.from_texts(texts, tok.encode_batch, tok.eos_token_id)
    scratch = [byte.batch(i, SCRATCH_BATCH, SCRATCH_SEQ, seed=0).tolist() for i in range(n_scratch)]
    lora = [bpe.batch(i, LORA_BATCH, LORA_SEQ, seed=0).tolist() for i in range(n_lora)]
    return scratch, lora, source


def export_smollm2(directory: str) -> str:
    from maxjax import train
    from maxjax.models import load_model
    from maxjax.train.export import save_pretrained

    lm = load_model()
    model = train.dequantized(lm.module)
    return save_pretrained(directory, model, model.state_dict(), lm.config, lm.tokenizer)


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def verdicts(e: dict) -> list[dict]:
    out = []

    def ratio(a: str, b: str, goal: float, name: str) -> None:
        x, y = e.get(a, {}).get("tokens_per_s"), e.get(b, {}).get("tokens_per_s")
        value = x / y if x and y else None
        status = "n/a" if value is None else ("PASS" if value >= goal else "FAIL")
        out.append({"target": name, "value": value, "threshold": goal, "status": status})

    ratio("maxjax_scratch", "flax_scratch", 1.0, "(a) maxjax / Flax NNX (nnx.scan) training tokens/s")
    ratio("maxjax_lora", "hf_lora", 2.0, "(b) maxjax / transformers+PEFT LoRA training tokens/s")
    ratio("maxjax_lora", "hf_lora_ftz", 2.0, "(b') maxjax / transformers+PEFT with flushed denormals")
    ratio("maxjax_lora_bf16", "hf_lora_bf16", 2.0, "(c) maxjax bfloat16 / transformers+PEFT autocast bfloat16 tokens/s")
    ratio("maxjax_lora", "hf_lora", 1.0, "(d) issue 24: maxjax float32 / transformers+PEFT float32 tokens/s")
    ratio("maxjax_lora_bf16", "hf_lora_bf16", 1.5, "(e) issue 24: maxjax bfloat16 / transformers+PEFT autocast bfloat16 tokens/s")
    ratio("maxjax_lora", "maxjax_lora_exact", 1.0, "(f) maxjax float32, the policy's frozen products (AMX on AMX-BF16 CPUs) / exact")
    return out


def report(r: dict) -> str:
    e = r["engines"]
    rows = [("engine", "tok/s", "best tok/s", "step s", "CPU s/step", "compile s", "first step s", "peak RSS MB", "others' CPU",
             "loss first->last")]  # fmt: skip
    for name in ENGINES:
        x = e.get(name)
        if x is None:
            continue
        if "error" in x:
            rows.append((LABELS[name], "error: " + x["error"].splitlines()[0][:80], "", "", "", "", "", "", "", ""))
            continue
        share = x.get("others_cpu_share")
        flag = "" if share is None or share <= NOISY else " (!)"
        rows.append((LABELS[name], fmt(x["tokens_per_s"], ".0f"), fmt(x.get("best_tokens_per_s"), ".0f"), fmt(x["median_step_s"], ".2f"),
                     fmt(x["median_cpu_s"], ".2f"),
                     fmt(x.get("compile_s"), ".1f"), fmt(x.get("first_step_s"), ".1f"), fmt(x["peak_rss_mb"], ".0f"),
                     f"{100 * share:.0f}%{flag}" if share is not None else "-",
                     f"{x['losses'][0]:.3f} -> {x['losses'][-1]:.3f}"))  # fmt: skip
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    s = r["settings"]
    head = (f"training benchmark ({'quick' if s['quick'] else 'full'}{', huge pages' if s.get('thp') else ''}; {s['steps']} timed steps after {s['warmup']} warm-up; "
            f"data: {s['data']}; {r['machine']['cpu_model']}, {r['machine']['worker_cores']} cores per worker, "
            f"vector features {r['machine']['cpu']})\n"
            f"(a) scratch: {SCRATCH['num_hidden_layers']} layers x {SCRATCH['hidden_size']}, batch {SCRATCH_BATCH} x {SCRATCH_SEQ} bytes; "
            f"(b) LoRA rank {LORA_RANK} on SmolLM2-135M, batch {LORA_BATCH} x {LORA_SEQ} tokens; float32 except the bfloat16 rows\n")  # fmt: skip
    v = ["", "goals:"] + [f"  {x['status']:4}  {x['target']}: {fmt(x['value'], '.2f')} (goal >= {x['threshold']:g})" for x in r["verdicts"]]
    noisy = [LABELS[k] for k, x in e.items() if x.get("others_cpu_share", 0) > NOISY]
    if noisy:
        v.append(f"  (!) other processes used more than {100 * NOISY:.0f}% of the CPUs during: {', '.join(noisy)}: those figures are not clean")
    return head + "\n".join(lines) + "\n".join(v)


def plot(r: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    e = r["engines"]
    groups = [("(a) from scratch", ["maxjax_scratch", "flax_scratch"]), ("(b) LoRA, SmolLM2-135M", list(LORA_ENGINES))]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    for col, (title, names) in enumerate(groups):
        names = [n for n in names if n in e and "error" not in e[n]]
        for row, (key, label) in enumerate((("tokens_per_s", "training tokens/s"), ("peak_rss_mb", "peak RSS (MB)"))):
            ax = axes[row][col]
            vals = [e[n][key] for n in names]
            ax.bar([LABELS[n] for n in names], vals, color=["tab:blue", "tab:orange", "tab:red", "tab:cyan", "tab:olive"][: len(names)])
            for i, v in enumerate(vals):
                ax.text(i, v, f"{v:.0f}", ha="center", va="bottom")
            ax.set_title(f"{title}: {label}")
            ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"maxjax training benchmark ({r['machine']['cpu_model']}, {r['machine']['worker_cores']} cores per worker)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 timed steps per engine (a smoke run); writes train_quick.*")
    ap.add_argument("--steps", type=int, help="timed steps per engine (default 8, quick 3)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2; the first compiles)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads; every worker is pinned to this many cores")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES))
    ap.add_argument("--hf-python", default="/work/refenv/bin/python", help="a Python with torch, transformers and peft")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per engine")
    ap.add_argument("--thp", action="store_true", help="run every worker with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (transparent "
                    "huge pages for large allocations: XLA:CPU's per-step temporary buffers stop page-faulting)")
    ap.add_argument("--out", type=pathlib.Path, help="JSON path (default benchmarks/results/train[_quick].json)")
    ap.add_argument("--replot", type=pathlib.Path, help="print the table and redraw the PNG of a saved JSON; run nothing")
    ap.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--request", type=pathlib.Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        res = WORKERS[args.worker](json.loads(args.request.read_text()))
        args.out.write_text(json.dumps(res))
        return 0
    if args.replot:
        r = json.loads(args.replot.read_text())
        print(report(r))
        plot(r, args.replot.with_suffix(".png"))
        return 0

    engines = [x.strip() for x in args.engines.split(",") if x.strip()]
    bad = [x for x in engines if x not in ENGINES]
    if bad:
        ap.error(f"unknown engine(s) {bad}; choose from {list(ENGINES)}")
    if any(x.startswith("hf") for x in engines) and not os.path.exists(args.hf_python):
        log(f"warning: {args.hf_python} does not exist: the transformers + PEFT engines will be reported as errors "
            "(pass --hf-python a Python with torch==2.13.0, transformers and peft)")  # fmt: skip
    steps = args.steps or (3 if args.quick else 8)
    n = args.warmup + steps
    from maxjax.backend.cpu import cpu_vector_features

    scratch, lora, source = make_batches(n, n)
    all_cores = sorted(os.sched_getaffinity(0))
    cores = all_cores[: args.threads] if len(all_cores) > args.threads else None
    load0 = os.getloadavg()
    if load0[0] > 1.5:
        log(f"warning: load average {load0[0]:.2f}: other work is running, the figures will be noisy")
    r: dict = {
        "settings": {"quick": args.quick, "steps": steps, "warmup": args.warmup, "threads": args.threads, "data": source, "thp": args.thp,
                     "scratch": {**SCRATCH, "batch": SCRATCH_BATCH, "seq": SCRATCH_SEQ},
                     "lora": {"batch": LORA_BATCH, "seq": LORA_SEQ, "rank": LORA_RANK, "alpha": LORA_ALPHA, "targets": LORA_TARGETS}},
        "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "cpu": cpu_vector_features(),
                    "worker_cores": len(cores) if cores else len(all_cores), "pinned_to": cores,
                    "platform": platform.platform(), "python": platform.python_version(), "loadavg_start": load0},
        "git": git_state(),
        "engines": {},
    }  # fmt: skip
    python = {"maxjax_scratch": sys.executable, "flax_scratch": sys.executable, "maxjax_lora": sys.executable,
              "maxjax_lora_exact": sys.executable,
              "hf_lora": args.hf_python, "hf_lora_ftz": args.hf_python, "maxjax_lora_bf16": sys.executable,
              "hf_lora_bf16": args.hf_python}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = os.path.join(tmp, "smollm2-f32")
        if any(x in engines for x in LORA_ENGINES):
            log("== exporting SmolLM2 (float32) for the LoRA engines")
            export_smollm2(hf_dir)
        req_path = pathlib.Path(tmp, "req.json")
        req_path.write_text(json.dumps({"scratch_batches": scratch, "lora_batches": lora, "warmup": args.warmup, "lr": 1e-3,
                                        "threads": args.threads, "hf_dir": hf_dir}))  # fmt: skip
        for x in engines:
            r["engines"][x] = run_worker(x, python[x], req_path, cores, args.timeout,
                                         {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"} if args.thp else None)
    r["machine"]["loadavg_end"] = os.getloadavg()
    r["verdicts"] = verdicts(r["engines"])
    text = report(r)
    print(text)
    r["report"] = text
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / ("train_quick.json" if args.quick else "train.json")
    out.write_text(json.dumps(r, indent=1))
    try:
        plot(r, out.with_suffix(".png"))
        print(f"\nsaved {out} and {out.with_suffix('.png')}")
    except Exception as exc:  # the numbers matter more than the picture
        print(f"\nsaved {out}; plot failed: {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
