"""Benchmark of text generation with SmolLM2-135M-Instruct (issue 5, "Speed"), all engines in one run.

Three engines on the same GGUF (``SmolLM2-135M-Instruct.Q4_1.gguf``), each in its own subprocess
(so peak RSS is per engine), fed identical prompt token ids (made by maxjax's tokenizer here, in
the parent, and passed to every worker); maxjax runs with each of its CPU weight layouts
(``maxjax``: the default ``quantized_layout="nibbles"``, 4-bit weights kept at 4 bits, float32
arithmetic; ``maxjax_unpacked``: ``"unpacked"``, one byte per value; ``maxjax_int8``:
``load_model(..., arithmetic="int8")``, the ``int8`` layout whose products of at least the policy's
``int8_min_rows`` (16 on the CPU) rows run as int8 dots, so batch >= 16 decode and prefill do;
``maxjax_tiles``: ``load_model(..., arithmetic="q8_0")``, the ``tiles`` layout, Q8_0 activations
and integer dots at every batch size):

1. maxjax (``maxjax.models.load_model``): the low-level serving calls, timed separately after
   warm-up: ``prefill`` of a 128-token prompt at batch 1 (tokens/s); decode at batch 1 and at
   batch 16 (aggregate tokens/s): ``generate_tokens`` of N+1 tokens after a 16-token prompt (the
   loop ``generate`` runs: each step is dispatched before the previous step's tokens reach the
   host, which streams them), timed from the first new token to the last, as for HF; at batch 32
   as well (issue 24), and the batched prefill rate (rows x 16 tokens over the time from the call
   to the first tokens on the host, cache allocation included); time to
   first token for the 128-token prompt (wall clock from host ids, cache allocation included,
   to the sampled token on the host); the compile time of every shape (first call minus a warm
   call, and ``lm.num_compiles`` to check each first call compiled exactly once and nothing
   recompiled while timing); the resident bytes of the weights it reads per decode step
   (``lm.state``). JAX's persistent compilation cache is turned off in this worker.
2. Hugging Face ``transformers`` on torch, float32 (the GGUF dequantized at load, ``gguf_file=``),
   run with ``/work/refenv/bin/python`` (``--hf-python``): prefill = one forward of the 128 tokens
   with the KV cache (``logits_to_keep=1`` where supported, as ``generate`` does); time to first
   token = ``generate(max_new_tokens=1)``; decode = greedy ``generate`` of N+1 tokens
   (``eos_token_id=-1``, so EOS neither stops it nor is masked), timed by a streamer from the
   first new token to the last.
3. ``llama-cpp-python`` (``--llama-python``, default ``/work/tokref/bin/python``), loaded with
   ``use_extra_bufts=False`` (set on ``llama_model_default_params()``: the ``Llama`` constructor does
   not expose it; the default build crashed on prompts longer than one token on AMX CPUs, upstream
   issue #20824; ``--llama-extra-bufts`` keeps llama.cpp's default): prefill = ``llm.eval`` of the
   128 tokens (one batch, ``n_batch=512``); time to first token = that plus the argmax of the
   last logits; decode = N greedy steps of ``llm.eval([token])`` + argmax. Batched (issue 24), at
   batch 16 and 32, with the low-level API on a second context of the same model
   (``llama_init_from_model``, ``n_seq_max`` = rows, llama.cpp's default split KV cache, ``n_ctx`` =
   rows x 256): one sequence id per row; prefill = one ``llama_decode`` of every row's 16-token
   prompt (logits of each row's last token), then per step one ``llama_decode`` of one token per
   row and the argmax of each row's ``llama_get_logits_ith``; the KV cache cleared
   (``llama_memory_clear``) before each repetition. Twice: flash attention off, as in the batch-1
   context (the ``Llama`` object's ``flash_attn=False``; same greedy tokens), and ``auto``, llama.cpp's
   own default (on for the CPU: F16 attention, which changes greedy tokens after a few steps).

Threads: torch gets ``torch.set_num_threads(T)`` and llama.cpp ``n_threads=n_threads_batch=T``
(``--threads``, default 2); XLA uses every core it is given. When the machine has more cores than
T, every worker is pinned to the same T cores with ``sched_setaffinity``, so all three use T cores.

Also measured, in the parent: single-thread memory read bandwidth (numpy ``sum`` over a large
float64 array, best of several passes) and the all-core figure (one thread per core), giving the
batch-1 decode bound = bandwidth / (bytes of weights read per token), printed beside the
measured figure.

Contention: for each worker the parent records the CPU time the rest of the machine used while
it ran (``/proc/stat`` busy time minus the worker's own, as a share of all CPUs) and the load
average; the table shows it and flags engines above 10%, whose figures are not clean.

Prints a table and PASS/FAIL against the issue's targets (maxjax decode at batch 1 >= 2x HF's;
maxjax aggregate decode at batch 16 >= 4x llama.cpp's batch-1 decode; issue 24: maxjax aggregate
decode at batch 16 >= 1.5x llama.cpp's batched decode at batch 16, the faster of its two attention
settings; maxjax prefill >= llama.cpp's; maxjax time to first token < 1 s after compilation), the
maxjax / llama.cpp batched ratios at 16 and 32, and saves
``benchmarks/results/generate.json`` and ``generate.png`` (``generate_quick.*`` with ``--quick``).
Medians over repetitions are reported; the JSON keeps every repetition.

    python benchmarks/generate.py [--quick] [--steps 64] [--reps 3] [--engines maxjax,hf,llama]

``--replot results/generate.json`` prints the table of a saved run and redraws its PNG.
A worker can be run alone (``--worker maxjax|hf|llama --request REQ.json --out OUT.json``); the
hf and llama workers import neither maxjax nor jax.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
ENGINES = ("maxjax", "maxjax_unpacked", "maxjax_int8", "maxjax_tiles", "base", "base_unpacked", "hf", "llama")
LABELS = {"maxjax": "maxjax 4-bit (JAX)", "maxjax_unpacked": "maxjax unpacked (JAX)", "maxjax_int8": "maxjax int8 dots (JAX)",
          "maxjax_tiles": "maxjax tiles, Q8_0 acts",
          "base": "baseline 4-bit", "base_unpacked": "baseline unpacked", "hf": "HF transformers (torch f32)",
          "llama": "llama.cpp"}  # fmt: skip
#: the quantized_layout each maxjax engine loads with (see maxjax.models.load_model); "base*" are the
#: same workers run on another source tree (--baseline DIR, e.g. a worktree of the previous commit)
LAYOUTS = {"maxjax": "nibbles", "maxjax_unpacked": "unpacked", "maxjax_int8": "int8", "maxjax_tiles": "tiles", "base": "nibbles",
           "base_unpacked": "unpacked"}  # fmt: skip
#: the maxjax engines (the same worker), and the ones whose figures the batched goal is checked on
MAXJAX = ("maxjax", "maxjax_unpacked", "maxjax_int8", "maxjax_tiles")
LONG_PROMPT = 128  # prefill / time-to-first-token prompt length
SHORT_PROMPT = 16  # decode prompts' length
BATCH = 16
BATCHES = (16, 32)  # batched decode: aggregate tokens/s at each (issue 24); BATCH is the first
BATCHED_GOAL = 1.5  # issue 24: maxjax decode at batch 16 >= 1.5x llama.cpp batched decode at batch 16
NOISY = 0.10  # share of the CPUs used by other processes during a worker above which it is flagged

# An original passage; prompts are windows of its token ids (repeated if it were too short).
PASSAGE = (
    "The lighthouse keeper on the northern island kept a careful log of every ship that passed. "
    "Each morning he climbed the spiral stairs, cleaned the great lens, and wrote down the wind, "
    "the colour of the sea, and the shapes of the clouds that gathered over the distant mountains. "
    "In winter the storms came from the west, and the waves broke over the rocks so hard that the "
    "whole tower seemed to tremble. In summer the fishing boats returned at dusk, their lanterns "
    "swinging, and the children of the village ran down to the harbour to count them. Over forty "
    "years the keeper filled more than two hundred notebooks. When the lamp was finally automated, "
    "a young historian from the mainland asked to read them. She found tide tables and recipes, "
    "sketches of seabirds, the names of sailors who had been rescued, and long reflections on "
    "patience and solitude. She noticed that the handwriting grew smaller in the hardest winters, "
    "as if the keeper were saving paper, and larger in the spring, when supply boats arrived with "
    "news, letters and fresh bread. The notebooks also recorded small scientific observations: the "
    "date the first swallows appeared, the temperature of the water at noon, the number of seals "
    "resting on the southern beach. Read together, they formed one of the longest continuous "
    "records of coastal weather in the region. The historian copied the measurements into a "
    "spreadsheet and sent them to a team of climate researchers, who compared them with modern "
    "satellite data. To their surprise, the old records were remarkably accurate, and they showed "
    "how the arrival of spring had moved almost two weeks earlier over four decades. The story "
    "spread quickly. Schools invited the historian to talk about the notebooks, a museum built an "
    "exhibition around the lens and the logbooks, and visitors began to take the ferry to the "
    "island to see the tower for themselves. The keeper, by then very old, lived in a small house "
    "near the harbour. When people asked him why he had written so much, he said that the sea "
    "changes every day, and that a person who watches it closely owes it at least a few lines."
)


# -- small helpers (stdlib only: the hf/llama workers run in other Pythons) -----------------------
def peak_rss_mb() -> float:
    """Peak resident set size of this process, in MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rss_now_mb() -> float:
    """Current resident set size of this process, in MB (Linux)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def memory_after_load() -> dict:
    return {"rss_after_load_mb": rss_now_mb(), "peak_rss_after_load_mb": peak_rss_mb()}


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "best": min(xs), "all": xs}


def decode_result(batch: int, prompt_tokens: int, steps: int, runs: list[float], tokens: list, **extra) -> dict:
    """One engine's decode figures: ``runs`` are seconds for ``steps`` tokens of each of ``batch`` rows."""
    med = statistics.median(runs)
    return {"batch": batch, "prompt_tokens": prompt_tokens, "steps": steps, **extra, "seconds": stats(runs),
            "tokens_per_s": batch * steps / med, "per_row_tokens_per_s": steps / med, "token_ids": tokens}  # fmt: skip


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token over the common length, or None if they agree there."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


# -- maxjax worker ----------------------------------------------------------------------------------
def worker_maxjax(req: dict) -> dict:
    import jax

    jax.config.update("jax_enable_compilation_cache", False)  # compile times are real compiles
    import numpy as np

    from maxjax.models import load_model

    try:
        from maxjax.models import generation as causal_lm  # where the generation loop's buckets live
    except ImportError:  # a baseline tree from before the models package was split
        from maxjax.models import causal_lm

    steps, reps, prefill_reps = req["steps"], req["reps"], req["prefill_reps"]
    layout = req.get("layout", "nibbles")
    arithmetic = req.get("arithmetic")  # None: load_model's default (a baseline tree may not know the argument)
    out: dict = {"engine": "maxjax", "layout": layout, "arithmetic": arithmetic or "default", "jax": jax.__version__, "backend": jax.default_backend(),
                 "devices": [str(d) for d in jax.devices()], "xla_flags": os.environ.get("XLA_FLAGS", ""),
                 "cpu_affinity": sorted(os.sched_getaffinity(0))}  # fmt: skip
    t = time.perf_counter()
    lm = load_model(req["gguf"], quantized_layout=layout, **({"arithmetic": arithmetic} if arithmetic else {}))
    pol = getattr(lm, "policy", None)
    out["int8_min_rows"] = getattr(pol, "int8_min_rows", None)
    out["load_s"] = time.perf_counter() - t
    out.update(memory_after_load())
    log(f"[maxjax] loaded in {out['load_s']:.1f} s")

    # Bytes of weights one decode step reads: every array of the prepared state (the tied
    # embedding counts once: the output head reads all of it, the lookup one row).
    leaves = jax.tree_util.tree_leaves_with_path(lm.state)
    breakdown = {jax.tree_util.keystr(p): int(x.nbytes) for p, x in leaves}
    out["weight_bytes"] = sum(breakdown.values())
    out["weight_breakdown"] = breakdown
    out["weight_dtypes"] = sorted({str(x.dtype) for _, x in leaves})

    bucket_of = getattr(causal_lm, "_bucket", None)
    context = lm.config.max_position_embeddings
    round_to = getattr(causal_lm, "CACHE_ROUND", 128)

    def shape_for(n_prompt: int, n_new: int) -> tuple[int, int]:
        """(bucket, cache_len) as ``generate`` picks them."""
        bucket = bucket_of(n_prompt, context) if bucket_of else n_prompt
        return bucket, min(context, -(-(bucket + n_new) // round_to) * round_to)

    def ready_cache(b: int, cache_len: int):
        k, v = lm.new_cache(b, cache_len)
        return jax.block_until_ready(k), jax.block_until_ready(v)

    compiles: dict = {}
    recompiles_while_timing = 0
    decode_recompiles = [0]  # recompilations seen inside decode()

    def pad(rows: list[list[int]], bucket: int):
        toks = np.zeros((len(rows), bucket), np.int32)
        for r, row in enumerate(rows):
            toks[r, : len(row)] = row
        return toks, np.array([len(r) for r in rows], np.int32)

    # 1. Prefill of the long prompt at batch 1, and time to first token.
    long_ids = req["long_ids"]
    bucket, cache_len = shape_for(len(long_ids), 1)
    toks, lengths = pad([long_ids], bucket)
    k, v = ready_cache(1, cache_len)
    n0 = lm.num_compiles
    t0 = time.perf_counter()
    nxt, _, k, v = lm.prefill(toks, lengths, k, v)
    nxt.block_until_ready()
    first_call = time.perf_counter() - t0
    prefill_compiles = lm.num_compiles - n0
    prefill_s, ttft_s, first_tokens = [], [], []
    for _ in range(prefill_reps):
        del k, v
        n0 = lm.num_compiles
        t0 = time.perf_counter()
        k, v = ready_cache(1, cache_len)  # part of serving a new prompt: counted in TTFT
        t1 = time.perf_counter()
        nxt, _, k, v = lm.prefill(toks, lengths, k, v)
        nxt.block_until_ready()
        t2 = time.perf_counter()
        tok = int(np.asarray(nxt)[0])
        t3 = time.perf_counter()
        recompiles_while_timing += lm.num_compiles - n0
        prefill_s.append(t2 - t1)
        ttft_s.append(t3 - t0)
        first_tokens.append(tok)
    del k, v
    compiles[f"prefill b=1 seq={bucket} cache={cache_len}"] = {
        "first_call_s": first_call, "compile_s": first_call - statistics.median(prefill_s), "compiles": prefill_compiles}
    out["prefill"] = {"tokens": len(long_ids), "bucket": bucket, "cache_len": cache_len, "seconds": stats(prefill_s),
                      "tokens_per_s": len(long_ids) / statistics.median(prefill_s)}  # fmt: skip
    out["ttft"] = {"seconds": stats(ttft_s), "first_token": first_tokens[0]}
    log(f"[maxjax] prefill {len(long_ids)} tokens: {len(long_ids) / statistics.median(prefill_s):.0f} tok/s, "
        f"TTFT {statistics.median(ttft_s) * 1e3:.0f} ms, compile {first_call:.1f} s")  # fmt: skip

    # 2. Decode at batch 1, 16 and 32 after a short prompt: ``generate_tokens`` (the loop
    # ``generate`` runs), timed from the first new token to the last, as for HF. The time from the
    # call to the first token (cache allocation, the batch's prefill, first token on the host) gives
    # the batched prefill rate, rows x prompt tokens / that time.
    def decode(rows: list[list[int]]) -> dict:
        b = len(rows)
        bucket, cache_len = shape_for(max(len(r) for r in rows), steps + 1)
        runs, tokens, firsts = [], None, []
        for rep in range(reps + 1):  # rep 0: compiles prefill and decode, warms up
            stamps: list[float] = []
            n0 = lm.num_compiles
            t0 = time.perf_counter()
            res = lm.generate_tokens(rows, steps + 1, stop_at_eos=False,
                                     on_token=lambda r, t, s=stamps: s.append(time.perf_counter()) if r == b - 1 else None)  # fmt: skip
            if len(stamps) != steps + 1:
                raise RuntimeError(f"generate_tokens made {len(stamps)} tokens, not {steps + 1}")
            if rep == 0:
                compiles[f"generate b={b} seq={bucket} cache={cache_len}"] = {
                    "first_call_s": stamps[-1] - t0, "compiles": lm.num_compiles - n0}
                continue
            decode_recompiles[0] += lm.num_compiles - n0
            runs.append(stamps[steps] - stamps[0])
            firsts.append(stamps[0] - t0)
            tokens = [r.token_ids for r in res]  # [b, steps + 1]
        c = compiles[f"generate b={b} seq={bucket} cache={cache_len}"]
        c["compile_s"] = c["first_call_s"] - (statistics.median(firsts) + statistics.median(runs))
        n_prompt = sum(len(r) for r in rows)
        prefill = {"batch": b, "tokens": n_prompt, "seconds": stats(firsts), "tokens_per_s": n_prompt / statistics.median(firsts),
                   "includes": "cache allocation, prefill, first token to host"}  # fmt: skip
        return decode_result(b, len(rows[0]), steps, runs, tokens, cache_len=cache_len, prefill=prefill)

    short = req["short_ids"]
    out["decode_b1"] = decode(short[:1])
    log(f"[maxjax] decode b=1: {out['decode_b1']['tokens_per_s']:.1f} tok/s")
    for b in BATCHES:
        if len(short) < b:
            raise RuntimeError(f"{len(short)} short prompts given, batch {b} needs {b}")
        d = out[f"decode_b{b}"] = decode(short[:b])
        log(f"[maxjax] decode b={b}: {d['tokens_per_s']:.1f} tok/s aggregate, batched prefill "
            f"{d['prefill']['tokens_per_s']:.0f} tok/s")  # fmt: skip
    recompiles_while_timing += decode_recompiles[0]
    out["compiles"] = compiles
    out["recompiles_while_timing"] = recompiles_while_timing
    out["num_compiles_total"] = lm.num_compiles
    out["peak_rss_mb"] = peak_rss_mb()
    return out


# -- Hugging Face worker --------------------------------------------------------------------------
def worker_hf(req: dict) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(req["threads"])
    torch.set_grad_enabled(False)
    transformers.logging.set_verbosity_error()
    steps, reps, prefill_reps = req["steps"], req["reps"], req["prefill_reps"]
    out: dict = {"engine": "hf", "torch": torch.__version__, "transformers": transformers.__version__,
                 "torch_threads": torch.get_num_threads(), "dtype": "float32",
                 "cpu_affinity": sorted(os.sched_getaffinity(0))}  # fmt: skip
    path = pathlib.Path(req["gguf"])
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    out["load_s"] = time.perf_counter() - t
    out.update(memory_after_load())
    out["weight_bytes"] = int(sum(p.numel() * p.element_size() for p in model.parameters()))
    log(f"[hf] loaded in {out['load_s']:.1f} s ({out['weight_bytes'] / 1e6:.0f} MB of float32 parameters)")
    eos = model.config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos

    # Prefill: one forward over the 128 tokens, filling a KV cache, last position's logits only.
    ids = torch.tensor([req["long_ids"]])
    try:
        model(input_ids=ids, use_cache=True, logits_to_keep=1)
        kw = {"logits_to_keep": 1}
    except TypeError:
        kw = {}
    out["prefill_logits_to_keep"] = bool(kw)
    prefill_s = []
    for _ in range(prefill_reps):
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=True, **kw)
        prefill_s.append(time.perf_counter() - t0)
    out["prefill"] = {"tokens": ids.shape[1], "seconds": stats(prefill_s),
                      "tokens_per_s": ids.shape[1] / statistics.median(prefill_s)}  # fmt: skip

    def gen(inp: torch.Tensor, n: int, streamer=None) -> torch.Tensor:
        # eos_token_id=-1: never stop early, and never mask EOS either (min_new_tokens would set its
        # logit to -inf and change the greedy tokens where EOS wins); transformers accepts it with
        # a warning ("will not stop until the maximum length is reached").
        o = model.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False, max_new_tokens=n,
                           eos_token_id=-1, pad_token_id=eos, streamer=streamer)  # fmt: skip
        if o.shape[1] != inp.shape[1] + n:
            raise RuntimeError(f"generate made {o.shape[1] - inp.shape[1]} tokens, not {n}")
        return o

    # Time to first token: generate(max_new_tokens=1), host ids to host token.
    gen(ids, 1)
    ttft_s, first = [], None
    for _ in range(prefill_reps):
        t0 = time.perf_counter()
        o = gen(ids, 1)
        first = int(o[0, -1])
        ttft_s.append(time.perf_counter() - t0)
    out["ttft"] = {"seconds": stats(ttft_s), "first_token": first}
    log(f"[hf] prefill {ids.shape[1]} tokens: {out['prefill']['tokens_per_s']:.0f} tok/s, "
        f"TTFT {statistics.median(ttft_s) * 1e3:.0f} ms")  # fmt: skip

    class Stamps(BaseStreamer):
        """Records when generate hands over each batch of tokens (first put: the prompt)."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            self.times.append(time.perf_counter())

    def decode(rows: list[list[int]]) -> dict:
        inp = torch.tensor(rows)
        gen(inp, 2)  # warm-up
        runs, tokens = [], None
        for _ in range(reps):
            st = Stamps()
            o = gen(inp, steps + 1, st)
            # times[0]: prompt, times[1]: first new token, ..., times[steps + 1]: last, then end()
            runs.append(st.times[steps + 1] - st.times[1])
            tokens = o[:, inp.shape[1]:].tolist()
        return decode_result(inp.shape[0], inp.shape[1], steps, runs, tokens)

    short = req["short_ids"]
    out["decode_b1"] = decode(short[:1])
    log(f"[hf] decode b=1: {out['decode_b1']['tokens_per_s']:.1f} tok/s")
    out["decode_b16"] = decode(short[:BATCH])
    log(f"[hf] decode b={BATCH}: {out['decode_b16']['tokens_per_s']:.1f} tok/s aggregate")
    out["peak_rss_mb"] = peak_rss_mb()
    return out


# -- llama.cpp worker ------------------------------------------------------------------------------
def llama_without_extra_bufts(C) -> bool:
    """Makes ``llama_cpp.Llama`` load with ``use_extra_bufts=False`` (``C``: ``llama_cpp.llama_cpp``;
    the constructor has no such argument, so ``llama_model_default_params`` is wrapped): no weight
    repacking into llama.cpp's extra buffer types (its AMX and repacked CPU kernels; see the module
    docstring). False where this llama.cpp has no such field."""
    if "use_extra_bufts" not in [f[0] for f in C.llama_model_params._fields_]:
        return False
    default_params = C.llama_model_default_params

    def params_without_extra_bufts():
        p = default_params()
        p.use_extra_bufts = False
        return p

    C.llama_model_default_params = params_without_extra_bufts
    return True


def worker_llama(req: dict) -> dict:
    import numpy as np
    import llama_cpp
    import llama_cpp.llama_cpp as C

    steps, reps, prefill_reps, threads = req["steps"], req["reps"], req["prefill_reps"], req["threads"]
    out: dict = {"engine": "llama", "llama_cpp_python": llama_cpp.__version__, "n_threads": threads,
                 "system_info": C.llama_print_system_info().decode(errors="replace").strip(),
                 "cpu_affinity": sorted(os.sched_getaffinity(0))}  # fmt: skip
    out["use_extra_bufts_supported"] = "use_extra_bufts" in [f[0] for f in C.llama_model_params._fields_]
    if not req["llama_extra_bufts"]:
        llama_without_extra_bufts(C)
    n_ctx = max(512, len(req["long_ids"]) + 8, SHORT_PROMPT + steps + 8)
    t = time.perf_counter()
    llm = llama_cpp.Llama(model_path=req["gguf"], n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                          n_batch=512, verbose=False)  # fmt: skip
    out["load_s"] = time.perf_counter() - t
    out.update(memory_after_load())
    out["use_extra_bufts"] = bool(getattr(llm.model_params, "use_extra_bufts", True))
    out["n_ctx"] = n_ctx
    try:
        out["weight_bytes"] = int(C.llama_model_size(llm.model))  # the tensors as llama.cpp holds them
    except (AttributeError, TypeError):
        pass
    n_vocab = llm.n_vocab()
    log(f"[llama] loaded in {out['load_s']:.1f} s (use_extra_bufts={out['use_extra_bufts']})")

    def argmax_last() -> int:
        ptr = C.llama_get_logits_ith(llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    ids = req["long_ids"]
    llm.reset()
    llm.eval(ids)  # warm-up
    prefill_s, ttft_s, first = [], [], None
    for _ in range(prefill_reps):
        t0 = time.perf_counter()
        llm.reset()
        llm.eval(ids)
        t1 = time.perf_counter()
        first = argmax_last()
        t2 = time.perf_counter()
        prefill_s.append(t1 - t0)
        ttft_s.append(t2 - t0)
    out["prefill"] = {"tokens": len(ids), "seconds": stats(prefill_s),
                      "tokens_per_s": len(ids) / statistics.median(prefill_s)}  # fmt: skip
    out["ttft"] = {"seconds": stats(ttft_s), "first_token": first}
    log(f"[llama] prefill {len(ids)} tokens: {out['prefill']['tokens_per_s']:.0f} tok/s, "
        f"TTFT {statistics.median(ttft_s) * 1e3:.0f} ms")  # fmt: skip

    row = req["short_ids"][0]
    runs, tokens = [], None
    for rep in range(reps + 1):  # rep 0 warms up
        llm.reset()
        llm.eval(row)
        tok = argmax_last()
        gen = [tok]
        t0 = time.perf_counter()
        for _ in range(steps):
            llm.eval([tok])
            tok = argmax_last()
            gen.append(tok)
        dt = time.perf_counter() - t0
        if rep:
            runs.append(dt)
            tokens = [gen]
    out["decode_b1"] = decode_result(1, len(row), steps, runs, tokens)
    log(f"[llama] decode b=1: {out['decode_b1']['tokens_per_s']:.1f} tok/s")

    # Batched decode with the low-level API, as llama.cpp's own batched examples serve several
    # prompts: a second context on the same model (so the same weights, use_extra_bufts included)
    # with one sequence id per row (n_seq_max = rows; llama.cpp's default split KV cache,
    # kv_unified=False, gives each sequence n_ctx / rows cells); prefill = one llama_decode of every
    # row's prompt (logits of each row's last token only), then each step one llama_decode of one
    # token per row, greedy (argmax of each row's logits on the host). ``flash_attn_type``: the main
    # figures use the batch-1 context's (the Llama object's flash_attn=False: disabled), so the
    # tokens are comparable; the figures with llama.cpp's own default (auto: on for the CPU, F16
    # attention, other greedy tokens) are kept beside them (``decode_b{b}_fa_auto``).
    def batched(rows: list[list[int]], flash_attn_type: int) -> tuple[dict, dict]:
        b, plen = len(rows), len(rows[0])
        per_seq = -(-(plen + steps + 8) // 256) * 256
        cp = C.llama_context_default_params()
        cp.n_ctx = b * per_seq
        cp.n_batch = cp.n_ubatch = max(512, b * plen)  # the whole prefill in one ubatch
        cp.n_seq_max = b
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = True
        cp.flash_attn_type = flash_attn_type
        info = {"n_ctx": cp.n_ctx, "n_batch": cp.n_batch, "n_ubatch": cp.n_ubatch, "n_seq_max": cp.n_seq_max,
                "kv_unified": bool(cp.kv_unified), "flash_attn_type": int(cp.flash_attn_type)}  # fmt: skip
        ctx = C.llama_init_from_model(llm.model, cp)
        if not ctx:
            raise RuntimeError(f"llama_init_from_model failed for batch {b} ({info})")
        info["n_ctx_actual"] = int(C.llama_n_ctx(ctx))
        mem = C.llama_get_memory(ctx)
        batch = C.llama_batch_init(b * plen, 0, 1)
        try:

            def fill(entries: list[tuple[int, int, int, bool]]) -> None:
                """entries: (token, position, sequence id, wants logits) per batch slot."""
                batch.n_tokens = len(entries)
                for i, (t, p, sq, lg) in enumerate(entries):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, p, 1, int(lg)
                    batch.seq_id[i][0] = sq

            def decode_or_raise() -> None:
                rc = C.llama_decode(ctx, batch)
                if rc != 0:
                    raise RuntimeError(f"llama_decode returned {rc} (batch {b}, {batch.n_tokens} tokens, {info})")

            def argmax(i: int) -> int:
                return int(np.argmax(np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, i), shape=(n_vocab,))))

            prefill_entries = [(t, p, r, p == len(row) - 1) for r, row in enumerate(rows) for p, t in enumerate(row)]
            last = [sum(len(x) for x in rows[: r + 1]) - 1 for r in range(b)]  # batch slot of each row's last token
            pre_s, runs, tokens = [], [], None
            for rep in range(reps + 1):  # rep 0 warms up
                t0 = time.perf_counter()
                C.llama_memory_clear(mem, True)
                fill(prefill_entries)
                decode_or_raise()
                toks = [argmax(i) for i in last]
                t1 = time.perf_counter()
                gen = [[t] for t in toks]
                for s in range(steps):
                    fill([(toks[r], plen + s, r, True) for r in range(b)])
                    decode_or_raise()
                    toks = [argmax(r) for r in range(b)]
                    for r in range(b):
                        gen[r].append(toks[r])
                t2 = time.perf_counter()
                if rep:
                    pre_s.append(t1 - t0)
                    runs.append(t2 - t1)
                    tokens = gen
        finally:
            C.llama_batch_free(batch)
            C.llama_free(ctx)
        n_prompt = sum(len(r) for r in rows)
        prefill = {"batch": b, "tokens": n_prompt, "seconds": stats(pre_s), "tokens_per_s": n_prompt / statistics.median(pre_s),
                   "includes": "KV clear, one llama_decode of every prompt, first tokens' argmax"}  # fmt: skip
        return decode_result(b, plen, steps, runs, tokens, context=info, prefill=prefill), info

    short = req["short_ids"]
    fa_b1 = int(llm.context_params.flash_attn_type)
    out["flash_attn_type_b1"] = fa_b1
    auto = int(getattr(C, "LLAMA_FLASH_ATTN_TYPE_AUTO", -1))
    for b in BATCHES:
        if len(short) < b:
            raise RuntimeError(f"{len(short)} short prompts given, batch {b} needs {b}")
        for key, fa in ((f"decode_b{b}", fa_b1), (f"decode_b{b}_fa_auto", auto)):
            d, _ = batched(short[:b], fa)
            out[key] = d
            log(f"[llama] batched decode b={b} flash_attn_type={fa}: {d['tokens_per_s']:.1f} tok/s aggregate, batched "
                f"prefill {d['prefill']['tokens_per_s']:.0f} tok/s (n_ctx {d['context']['n_ctx_actual']})")  # fmt: skip
    out["peak_rss_mb"] = peak_rss_mb()
    return out


WORKERS = {"maxjax": worker_maxjax, "maxjax_unpacked": lambda req: worker_maxjax({**req, "layout": "unpacked"}),
           "maxjax_int8": lambda req: worker_maxjax({**req, "layout": "int8", "arithmetic": "int8"}),
           "maxjax_tiles": lambda req: worker_maxjax({**req, "layout": "tiles", "arithmetic": "q8_0"}),
           "base": worker_maxjax, "base_unpacked": lambda req: worker_maxjax({**req, "layout": "unpacked"}),
           "hf": worker_hf, "llama": worker_llama}  # fmt: skip


# -- parent -------------------------------------------------------------------------------------------
def memory_bandwidth(mb: int, passes: int) -> dict:
    """Read bandwidth in GB/s: numpy ``sum`` of a float64 array, one thread and one per core."""
    import numpy as np

    a = np.ones(mb * (1 << 20) // 8)
    a.sum()  # touch every page
    single = []
    for _ in range(passes):
        t = time.perf_counter()
        a.sum()
        single.append(a.nbytes / (time.perf_counter() - t) / 1e9)
    n = len(os.sched_getaffinity(0))
    parts = np.array_split(a, n)
    multi = []
    for _ in range(passes):
        threads = [threading.Thread(target=p.sum) for p in parts]  # numpy releases the GIL in sum
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        multi.append(a.nbytes / (time.perf_counter() - t) / 1e9)
    return {"array_mb": mb, "single_thread_gbps": max(single), "single_thread_all": single,
            "all_cores_gbps": max(multi), "all_cores_all": multi, "cores": n}  # fmt: skip


def prompt_ids(gguf: str) -> tuple[list[int], list[list[int]]]:
    """The 128-token prompt and max(BATCHES) prompts of 16 tokens, from maxjax's tokenizer (the first
    16 are the same whatever BATCHES is)."""
    from maxjax.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(gguf)
    ids = tok.encode(PASSAGE, add_special_tokens=False)
    n = max(BATCHES)
    need = LONG_PROMPT + n * SHORT_PROMPT
    while len(ids) < need:
        ids = ids + ids
    long_ids = ids[:LONG_PROMPT]
    short = [ids[LONG_PROMPT + i * SHORT_PROMPT : LONG_PROMPT + (i + 1) * SHORT_PROMPT] for i in range(n)]
    return long_ids, short


def cpu_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all CPUs; steal counts as busy)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_worker(engine: str, python: str, req: dict, cores: list[int] | None, timeout: float, extra_env: dict | None = None) -> dict:
    """Runs one engine's worker in a fresh process (with ``extra_env``); returns its JSON, or {"error": ...}."""
    with tempfile.TemporaryDirectory() as tmp:
        rq, rs = pathlib.Path(tmp, "req.json"), pathlib.Path(tmp, "res.json")
        rq.write_text(json.dumps(req))
        cmd = [python, str(pathlib.Path(__file__).resolve()), "--worker", engine, "--request", str(rq), "--out", str(rs)]
        env = {**os.environ, **(extra_env or {})}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        pre = (lambda: os.sched_setaffinity(0, cores)) if cores else None
        log(f"== {engine}: {python}")
        t = time.perf_counter()
        busy0, child0, load0 = cpu_busy_s(), children_cpu_s(), os.getloadavg()
        try:
            proc = subprocess.Popen(cmd, env=env, preexec_fn=pre, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace")  # fmt: skip
        except OSError as e:
            return {"engine": engine, "error": f"cannot start {python}: {e}"}
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(timeout, kill)
        watchdog.start()
        tail: collections.deque[str] = collections.deque(maxlen=20)
        try:
            for line in proc.stdout:  # the worker's progress, shown as it comes
                line = line.rstrip("\n")
                tail.append(line)
                if line.startswith((f"[{engine}]", "[maxjax]")):  # every maxjax engine's worker says [maxjax]
                    log("  " + line)
            proc.wait()
        finally:
            watchdog.cancel()
        if timed_out.is_set():
            return {"engine": engine, "error": f"timed out after {timeout:g} s"}
        if proc.returncode != 0 or not rs.exists():
            how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
            return {"engine": engine, "error": f"{how}:\n" + "\n".join(tail)}
        res = json.loads(rs.read_text())
        wall = time.perf_counter() - t
        # CPU time the rest of the machine used while this worker ran, as a share of all CPUs:
        # anything well above 0 means the figures were taken on a contended machine.
        others = (cpu_busy_s() - busy0) - (children_cpu_s() - child0)
        res["wall_s"] = wall
        res["worker_cpu_s"] = children_cpu_s() - child0
        res["others_cpu_share"] = max(0.0, others) / (wall * (os.cpu_count() or 1))
        res["loadavg"] = {"start": load0, "end": os.getloadavg()}
        return res


def get(res: dict, *keys, default=None):
    for k in keys:
        if not isinstance(res, dict) or k not in res:
            return default
        res = res[k]
    return res


def verdicts(r: dict) -> list[dict]:
    hf, ll = r.get("hf", {}), r.get("llama", {})
    out = []

    def check(name: str, value, target, ok) -> None:
        status = "n/a" if value is None or target is None else ("PASS" if ok(value, target) else "FAIL")
        out.append({"target": name, "value": value, "threshold": target, "status": status})

    hf1 = get(hf, "decode_b1", "tokens_per_s")
    ll1 = get(ll, "decode_b1", "tokens_per_s")
    llp = get(ll, "prefill", "tokens_per_s")
    llb = best_llama_batched(ll, BATCH)
    for e in MAXJAX:
        if e not in r:
            continue
        mj, who = r[e], LABELS[e].split(" (")[0]
        check(f"{who}: decode b={BATCH} >= {BATCHED_GOAL}x llama.cpp batched decode b={BATCH}, its faster attention (tok/s)",
              get(mj, f"decode_b{BATCH}", "tokens_per_s"), None if llb is None else BATCHED_GOAL * llb, lambda v, t: v >= t)  # fmt: skip
        check(f"{who}: decode b=1 >= 2x HF decode b=1 (tok/s)", get(mj, "decode_b1", "tokens_per_s"),
              None if hf1 is None else 2 * hf1, lambda v, t: v >= t)  # fmt: skip
        check(f"{who}: aggregate decode b={BATCH} >= 4x llama.cpp decode b=1 (tok/s)",
              get(mj, "decode_b16", "tokens_per_s"), None if ll1 is None else 4 * ll1, lambda v, t: v >= t)  # fmt: skip
        check(f"{who}: prefill 128 >= llama.cpp prefill (tok/s)", get(mj, "prefill", "tokens_per_s"), llp,
              lambda v, t: v >= t)  # fmt: skip
        check(f"{who}: time to first token < 1 s after compilation (s)", get(mj, "ttft", "seconds", "median"), 1.0,
              lambda v, t: v < t)  # fmt: skip
    return out


def best_llama_batched(ll: dict, b: int) -> float | None:
    """llama.cpp's batched decode at batch ``b`` (tok/s), the faster of flash attention off / auto."""
    vals = [v for v in (get(ll, f"decode_b{b}", "tokens_per_s"), get(ll, f"decode_b{b}_fa_auto", "tokens_per_s")) if v is not None]
    return max(vals) if vals else None


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def report(r: dict) -> str:
    engines = [e for e in ENGINES if e in r["engines"]]
    res = {e: r["engines"][e] for e in engines}
    lines = []
    meta = r["machine"]
    lines.append(f"SmolLM2-135M-Instruct Q4_1 GGUF; {meta['cpus']} CPUs ({meta['cpu_model']}), threads per engine: "
                 f"XLA all {meta['worker_cores']} cores given, torch {r['settings']['threads']}, llama.cpp "
                 f"{r['settings']['threads']}; load average {meta['loadavg_start'][0]:.2f} at start, "
                 f"{meta['loadavg_end'][0]:.2f} at end")  # fmt: skip
    for who, g in (("maxjax", r.get("git", {})), ("baseline", r.get("baseline", {}))):
        if g.get("commit"):
            dirty = g.get("maxjax_uncommitted") or []
            lines.append(f"{who} at {g['commit'][:10]}" + (f" with uncommitted changes to {len(dirty)} file(s) under maxjax/" if dirty else ""))
    cpu = meta.get("cpu")
    if cpu:
        lines.append(f"CPU vector features: {' '.join(cpu['vector_features'])}")
    s = r["settings"]
    lines.append(f"prompts: {LONG_PROMPT} tokens (prefill, TTFT); decode: {s['steps']} steps after {SHORT_PROMPT}-token "
                 f"prompts; medians of {s['reps']} runs ({s['prefill_reps']} for prefill/TTFT)")  # fmt: skip
    for e in engines:
        if "error" in res[e]:
            lines.append(f"!! {LABELS[e]} failed: {res[e]['error']}")
    w = 28
    head = f"{'':34}" + "".join(f"{LABELS[e]:>{w}}" for e in engines)
    lines += ["", head, "-" * len(head)]
    rows = [
        ("prefill 128 tok (tok/s)", lambda x: fmt(get(x, "prefill", "tokens_per_s"), ".0f")),
        ("time to first token (ms)", lambda x: fmt(None if get(x, "ttft", "seconds", "median") is None else 1e3 * get(x, "ttft", "seconds", "median"), ".0f")),
        ("decode b=1 (tok/s)", lambda x: fmt(get(x, "decode_b1", "tokens_per_s"))),
        (f"decode b={BATCH} aggregate (tok/s)", lambda x: fmt(get(x, "decode_b16", "tokens_per_s"))),
        (f"decode b={BATCH} per row (tok/s)", lambda x: fmt(get(x, "decode_b16", "per_row_tokens_per_s"))),
        *[row for b in BATCHES[1:] for row in (
            (f"decode b={b} aggregate (tok/s)", lambda x, b=b: fmt(get(x, f"decode_b{b}", "tokens_per_s"))),
            (f"decode b={b} per row (tok/s)", lambda x, b=b: fmt(get(x, f"decode_b{b}", "per_row_tokens_per_s"))))],
        *[(f"  llama.cpp flash-attn auto b={b}", lambda x, b=b: fmt(get(x, f"decode_b{b}_fa_auto", "tokens_per_s"))) for b in BATCHES],
        *[(f"batched prefill b={b}x{SHORT_PROMPT} (tok/s)", lambda x, b=b: fmt(get(x, f"decode_b{b}", "prefill", "tokens_per_s"), ".0f"))
          for b in BATCHES],
        *[(f"  llama.cpp flash-attn auto b={b}", lambda x, b=b: fmt(get(x, f"decode_b{b}_fa_auto", "prefill", "tokens_per_s"), ".0f"))
          for b in BATCHES],
        ("load (s)", lambda x: fmt(get(x, "load_s"))),
        ("weights resident (MB)", lambda x: fmt(None if get(x, "weight_bytes") is None else get(x, "weight_bytes") / 1e6, ".0f")),
        ("RSS after load (MB)", lambda x: fmt(get(x, "rss_after_load_mb"), ".0f")),
        ("peak RSS (MB)", lambda x: fmt(get(x, "peak_rss_mb"), ".0f")),
        ("CPU used by other processes (%)", lambda x: fmt(None if get(x, "others_cpu_share") is None else 100 * get(x, "others_cpu_share"), ".0f")),
        ("load average at start / end", lambda x: "-" if get(x, "loadavg") is None else
         f"{x['loadavg']['start'][0]:.2f} / {x['loadavg']['end'][0]:.2f}"),
    ]  # fmt: skip
    for name, f in rows:
        lines.append(f"{name:34}" + "".join(f"{f(res[e]):>{w}}" for e in engines))

    ll = res.get("llama", {})
    if any(get(ll, f"decode_b{b}") for b in BATCHES):
        lines += ["", f"batched decode, maxjax / llama.cpp batched (aggregate tok/s; llama.cpp: low-level batch API, one "
                      f"sequence id per row; flash attention off as in its batch-1 context / auto, llama.cpp's default):"]  # fmt: skip
        for e in MAXJAX:
            if e not in res:
                continue
            for b in BATCHES:
                v = get(res[e], f"decode_b{b}", "tokens_per_s")
                off, auto = get(ll, f"decode_b{b}", "tokens_per_s"), get(ll, f"decode_b{b}_fa_auto", "tokens_per_s")
                if v is None:
                    continue
                ratio = lambda d: "-" if d is None else f"{v / d:.2f}x"
                lines.append(f"  {LABELS[e].split(' (')[0]:22} b={b}: {v:8.1f} tok/s = {ratio(off)} (FA off), {ratio(auto)} (FA auto)")
        lines.append(f"  goal: decode b={BATCH} >= {BATCHED_GOAL}x llama.cpp batched b={BATCH} (the faster of the two), see targets")
        if ll.get("system_info"):
            lines.append(f"  llama.cpp {ll.get('llama_cpp_python', '')} system info: {ll['system_info']}")

    mj = res.get("maxjax", {})
    if "compiles" in mj:
        lines += ["", "maxjax compile time per shape (first call minus a warm call; compiles counted):"]
        for shape, c in mj["compiles"].items():
            comp = c.get("compile_s")
            lines.append(f"  {shape:40} first call {c['first_call_s']:6.2f} s" + (f", compile ~{comp:6.2f} s" if comp is not None else "")
                         + f", compiles: {c['compiles']}")  # fmt: skip
        lines.append(f"  recompilations while timing: {mj['recompiles_while_timing']}")

    bw = r.get("bandwidth")
    if bw and mj.get("weight_bytes"):
        lines += ["", f"memory read bandwidth: {bw['single_thread_gbps']:.1f} GB/s single thread, "
                      f"{bw['all_cores_gbps']:.1f} GB/s with {bw['cores']} threads (numpy sum over {bw['array_mb']} MB)"]  # fmt: skip
        for e in ("maxjax", "maxjax_unpacked"):
            wb = get(res.get(e, {}), "weight_bytes")
            if wb:
                lines.append(f"batch-1 decode bound for {LABELS[e].split(' (')[0]}: {wb / 1e6:.0f} MB of weights read per "
                             f"token -> {bw['single_thread_gbps'] * 1e9 / wb:.0f} tok/s (single thread), "
                             f"{bw['all_cores_gbps'] * 1e9 / wb:.0f} tok/s (all cores); measured "
                             f"{fmt(get(res[e], 'decode_b1', 'tokens_per_s'))} tok/s")  # fmt: skip
        llw = get(res.get("llama", {}), "weight_bytes")
        if llw:
            lines.append(f"  (llama.cpp: {llw / 1e6:.0f} MB per token -> {bw['single_thread_gbps'] * 1e9 / llw:.0f} tok/s "
                         f"single-thread bound; measured {fmt(get(res['llama'], 'decode_b1', 'tokens_per_s'))})")  # fmt: skip
        hfw = get(res.get("hf", {}), "weight_bytes")
        if hfw:
            lines.append(f"  (HF float32: {hfw / 1e6:.0f} MB per token -> {bw['single_thread_gbps'] * 1e9 / hfw:.0f} tok/s "
                         f"single-thread bound; measured {fmt(get(res['hf'], 'decode_b1', 'tokens_per_s'))})")  # fmt: skip

    agree = r.get("agreement")
    if agree:
        lines += ["", "greedy token agreement (first mismatch index over the common length; None = identical):"]
        for k, v in agree.items():
            lines.append(f"  {k}: {v}")

    noisy = [f"{LABELS[e]} {100 * res[e]['others_cpu_share']:.0f}%" for e in engines
             if get(res[e], "others_cpu_share", default=0) > NOISY]  # fmt: skip
    if noisy:
        lines += ["", f"!! other processes took CPU time while these engines ran ({', '.join(noisy)} of the "
                      f"{meta['cpus']} CPUs): their figures are not clean; rerun on an idle machine"]  # fmt: skip
    lines += ["", "targets (maxjax):"]
    for v in r["verdicts"]:
        lines.append(f"  {v['status']:4}  {v['target']}: {fmt(v['value'], '.3g')} vs {fmt(v['threshold'], '.3g')}")
    return "\n".join(lines)


def agreement(res: dict) -> dict:
    out = {}
    mj = get(res, "maxjax", "decode_b1", "token_ids")
    hf = get(res, "hf", "decode_b1", "token_ids")
    ll = get(res, "llama", "decode_b1", "token_ids")
    mj16 = get(res, "maxjax", "decode_b16", "token_ids")
    hf16 = get(res, "hf", "decode_b16", "token_ids")
    if mj and hf:
        out["maxjax vs HF, b=1"] = first_mismatch(mj[0], hf[0])
    if mj and ll:
        out["maxjax vs llama.cpp, b=1"] = first_mismatch(mj[0], ll[0])
    if hf and ll:
        out["HF vs llama.cpp, b=1"] = first_mismatch(hf[0], ll[0])
    mju = get(res, "maxjax_unpacked", "decode_b1", "token_ids")
    if mj and mju:
        out["maxjax 4-bit vs unpacked, b=1"] = first_mismatch(mj[0], mju[0])
    for e in ("base", "base_unpacked"):
        be = get(res, e, "decode_b1", "token_ids")
        be16 = get(res, e, "decode_b16", "token_ids")
        if mj and be:
            out[f"maxjax vs {LABELS[e]}, b=1"] = first_mismatch(mj[0], be[0])
        if mj16 and be16:
            out[f"maxjax vs {LABELS[e]}, b={BATCH}: rows identical"] = sum(a == b for a, b in zip(mj16, be16))
    if mj and mj16:
        out[f"maxjax b={BATCH} row 0 vs maxjax b=1"] = first_mismatch(mj16[0], mj[0])
    if mj16 and hf16:
        rows = [first_mismatch(a, b) for a, b in zip(mj16, hf16)]
        diff = {i: x for i, x in enumerate(rows) if x is not None}
        out[f"maxjax vs HF, b={BATCH}: rows identical"] = f"{len(rows) - len(diff)}/{len(rows)}" + (
            f" (row: first mismatch {diff})" if diff else "")
    def rows_agree(a: list, b: list) -> str:
        rows = [first_mismatch(x, y) for x, y in zip(a, b)]
        diff = {i: x for i, x in enumerate(rows) if x is not None}
        return f"{len(rows) - len(diff)}/{len(rows)}" + (f" (row: first mismatch {diff})" if diff else "")

    for b in BATCHES:
        for key, what in ((f"decode_b{b}", "llama.cpp batched"), (f"decode_b{b}_fa_auto", "llama.cpp batched flash-attn auto")):
            lb = get(res, "llama", key, "token_ids")
            if lb and ll:
                out[f"{what} b={b} row 0 vs llama.cpp b=1"] = first_mismatch(lb[0], ll[0])
        for e in MAXJAX:
            mb, lb = get(res, e, f"decode_b{b}", "token_ids"), get(res, "llama", f"decode_b{b}", "token_ids")
            if mb and lb:
                out[f"{LABELS[e].split(' (')[0]} vs llama.cpp batched, b={b}: rows identical"] = rows_agree(mb, lb)
        m8, mb = get(res, "maxjax_int8", f"decode_b{b}", "token_ids"), get(res, "maxjax", f"decode_b{b}", "token_ids")
        if m8 and mb:
            out[f"maxjax int8 dots vs maxjax 4-bit, b={b}: rows identical"] = rows_agree(m8, mb)
    for e in ("maxjax", "llama"):
        a, c = get(res, e, f"decode_b{BATCHES[0]}", "token_ids"), get(res, e, f"decode_b{BATCHES[-1]}", "token_ids")
        if a and c and len(BATCHES) > 1:
            out[f"{e} b={BATCHES[-1]} rows vs b={BATCHES[0]} rows: identical"] = rows_agree(c, a)
    ttft = {e: get(res, e, "ttft", "first_token") for e in ENGINES if get(res, e, "ttft", "first_token") is not None}
    if len(ttft) > 1:
        out["first token after the 128-token prompt"] = ttft
    return out


def plot(r: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = r["engines"]
    engines = [e for e in ENGINES if e in res and "error" not in res[e]]
    colors = {"maxjax": "tab:blue", "maxjax_unpacked": "tab:cyan", "maxjax_int8": "tab:purple", "maxjax_tiles": "tab:green", "base": "tab:gray",
              "base_unpacked": "silver", "hf": "tab:orange", "llama": "tab:green"}  # fmt: skip
    fig, axes = plt.subplots(2, 4, figsize=(20, 8.5))

    def bars(ax, key, title, ylabel, scale=1.0, fa_auto=None):
        """One bar per engine; ``fa_auto``: the key of llama.cpp's flash-attention-auto figure, drawn beside it."""
        names, vals = [], []
        items = [(e, key, LABELS[e].split(" (")[0], colors[e]) for e in engines]
        if fa_auto and "llama" in engines:
            items.append(("llama", fa_auto, "llama.cpp FA auto", "yellowgreen"))
        for e, k, name, color in items:
            v = get(res[e], *k)
            if v is not None:
                names.append(name)
                vals.append(v * scale)
                ax.bar(names[-1], vals[-1], color=color)
                ax.text(len(names) - 1, vals[-1], f"{vals[-1]:,.0f}" if vals[-1] >= 100 else f"{vals[-1]:.3g}", ha="center", va="bottom", fontsize=9)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.tick_params(axis="x", labelsize=8, labelrotation=20)

    def hline(ax, y, label, color="k"):
        if y is not None:
            ax.axhline(y, ls="--", color=color, lw=1)
            ax.text(ax.get_xlim()[0], y, " " + label, va="bottom", fontsize=8, color=color)

    ax = axes[0, 0]
    bars(ax, ("prefill", "tokens_per_s"), f"prefill, {LONG_PROMPT}-token prompt, batch 1", "tokens/s")
    hline(ax, get(res.get("llama", {}), "prefill", "tokens_per_s"), "target: llama.cpp")
    ax = axes[0, 1]
    bars(ax, ("decode_b1", "tokens_per_s"), "decode, batch 1", "tokens/s")
    hf1 = get(res.get("hf", {}), "decode_b1", "tokens_per_s")
    hline(ax, None if hf1 is None else 2 * hf1, "target: 2x HF")
    bw, wb = r.get("bandwidth"), get(res.get("maxjax", {}), "weight_bytes")
    if bw and wb:
        hline(ax, bw["single_thread_gbps"] * 1e9 / wb, "maxjax bound (1-thread bandwidth)", "tab:red")
    ax = axes[0, 2]
    bars(ax, ("decode_b16", "tokens_per_s"), f"decode, batch {BATCH}, aggregate", "tokens/s", fa_auto=("decode_b16_fa_auto", "tokens_per_s"))
    ll1 = get(res.get("llama", {}), "decode_b1", "tokens_per_s")
    hline(ax, None if ll1 is None else 4 * ll1, "target: 4x llama.cpp b=1")
    llb = best_llama_batched(res.get("llama", {}), BATCH)
    hline(ax, None if llb is None else BATCHED_GOAL * llb, f"goal: {BATCHED_GOAL}x llama.cpp batched b={BATCH}", "tab:green")
    b2 = BATCHES[-1]
    ax = axes[0, 3]
    bars(ax, (f"decode_b{b2}", "tokens_per_s"), f"decode, batch {b2}, aggregate", "tokens/s", fa_auto=(f"decode_b{b2}_fa_auto", "tokens_per_s"))
    ax = axes[1, 3]
    for i, b in enumerate(BATCHES):  # grouped bars: one group per batch size
        xs = [e for e in engines if get(res[e], f"decode_b{b}", "prefill", "tokens_per_s") is not None]
        for j, e in enumerate(xs):
            v = get(res[e], f"decode_b{b}", "prefill", "tokens_per_s")
            ax.bar(i + (j - (len(xs) - 1) / 2) * 0.8 / max(1, len(xs)), v, width=0.8 / max(1, len(xs)), color=colors[e],
                   label=LABELS[e].split(" (")[0] if i == 0 else None)  # fmt: skip
    ax.set_xticks(range(len(BATCHES)), [f"{b} x {SHORT_PROMPT} tokens" for b in BATCHES])
    ax.set_title("batched prefill (to the first tokens on the host)", fontsize=10)
    ax.set_ylabel("tokens/s")
    ax.legend(fontsize=8)
    ax = axes[1, 0]
    bars(ax, ("ttft", "seconds", "median"), f"time to first token, {LONG_PROMPT}-token prompt", "ms", 1e3)
    hline(ax, 1000.0, "target: 1 s")
    ax = axes[1, 1]
    bars(ax, ("peak_rss_mb",), "peak RSS of the engine's process", "MB")
    ax = axes[1, 2]
    comp = get(res.get("maxjax", {}), "compiles") or {}
    if comp:
        names = list(comp)
        ax.barh(range(len(names)), [comp[n]["first_call_s"] for n in names], color="tab:blue")
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
    ax.set_title("maxjax first call per shape (compile + run)", fontsize=10)
    ax.set_xlabel("s")
    s = r["settings"]
    fig.suptitle(f"SmolLM2-135M Q4_1 on {r['machine']['cpus']} CPUs ({r['machine']['cpu_model']}); threads: "
                 f"torch/llama.cpp {s['threads']}, XLA {r['machine']['worker_cores']}; decode {s['steps']} steps; "
                 f"load avg {r['machine']['loadavg_start'][0]:.1f}" + ("; QUICK" if s["quick"] else "")
                 + "\nCPU used by other processes while each engine ran: "
                 + ", ".join(f"{LABELS[e].split(' (')[0]} {100 * res[e].get('others_cpu_share', float('nan')):.0f}%" for e in engines),
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def git_state(root: pathlib.Path | None = None) -> dict:
    """The commit measured and any uncommitted changes to maxjax/ (the working tree is what runs)."""
    root = root or HERE.parent

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "maxjax_uncommitted": git("status", "--porcelain", "--", "maxjax").splitlines()}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few steps and repetitions (a smoke run); writes generate_quick.*")
    ap.add_argument("--steps", type=int, help="decode steps per run (default 64, quick 16)")
    ap.add_argument("--reps", type=int, help="timed decode runs per engine and batch (default 3, quick 1)")
    ap.add_argument("--prefill-reps", type=int, help="timed prefill/TTFT runs (default 5, quick 2)")
    ap.add_argument("--threads", type=int, default=2, help="torch and llama.cpp threads; every worker is pinned to this many cores")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES))
    ap.add_argument("--gguf", help="the model file (default: the bundled SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("--hf-python", default="/work/refenv/bin/python", help="a Python with torch + transformers")
    ap.add_argument("--llama-python", default="/work/tokref/bin/python", help="a Python with llama_cpp")
    ap.add_argument("--llama-extra-bufts", action="store_true", help="keep llama.cpp's use_extra_bufts default (weight repacking)")
    ap.add_argument("--bandwidth-mb", type=int, help="array size of the bandwidth measurement (default 1024, quick 512)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per engine")
    ap.add_argument("--out", type=pathlib.Path, help="JSON path (default benchmarks/results/generate[_quick].json)")
    ap.add_argument("--replot", type=pathlib.Path, help="print the table and redraw the PNG of a saved JSON; run nothing")
    ap.add_argument("--baseline", type=pathlib.Path, help="a source tree (e.g. a git worktree of the previous commit) whose "
                    "maxjax the base/base_unpacked engines run, for an A/B in one run")
    ap.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--request", type=pathlib.Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        req = json.loads(args.request.read_text())
        res = WORKERS[args.worker](req)
        args.out.write_text(json.dumps(res))
        return 0

    if args.replot:
        r = json.loads(args.replot.read_text())
        print(report(r))
        plot(r, args.replot.with_suffix(".png"))
        return 0

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        ap.error(f"unknown engine(s) {bad}; choose from {list(ENGINES)}")
    q = args.quick
    steps = args.steps or (16 if q else 64)
    reps = args.reps or (1 if q else 3)
    prefill_reps = args.prefill_reps or (2 if q else 5)
    if args.gguf:
        gguf = str(pathlib.Path(args.gguf).resolve())
    else:
        from maxjax._bundled import smollm2_gguf_path

        gguf = str(smollm2_gguf_path())
    long_ids, short = prompt_ids(gguf)

    from maxjax.backend.cpu import cpu_vector_features

    all_cores = sorted(os.sched_getaffinity(0))
    cores = all_cores[: args.threads] if len(all_cores) > args.threads else None
    worker_cores = len(cores) if cores else len(all_cores)
    load0 = os.getloadavg()
    if load0[0] > 1.5:
        log(f"warning: load average {load0[0]:.2f}: other work is running, the figures will be noisy")
    r: dict = {
        "settings": {"quick": q, "steps": steps, "reps": reps, "prefill_reps": prefill_reps, "threads": args.threads,
                     "llama_extra_bufts": args.llama_extra_bufts, "gguf": gguf, "long_prompt_tokens": LONG_PROMPT,
                     "short_prompt_tokens": SHORT_PROMPT, "batch": BATCH},
        "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "cpu": cpu_vector_features(), "worker_cores": worker_cores,
                    "pinned_to": cores, "platform": platform.platform(), "python": platform.python_version(),
                    "loadavg_start": load0},
        "git": git_state(),
        "prompts": {"long_ids": long_ids, "short_ids": short},
        "engines": {},
    }  # fmt: skip
    req = {"gguf": gguf, "long_ids": long_ids, "short_ids": short, "steps": steps, "reps": reps,
           "prefill_reps": prefill_reps, "threads": args.threads, "llama_extra_bufts": args.llama_extra_bufts}  # fmt: skip
    python = {"maxjax": sys.executable, "maxjax_unpacked": sys.executable, "maxjax_int8": sys.executable, "maxjax_tiles": sys.executable, "base": sys.executable,
              "base_unpacked": sys.executable, "hf": args.hf_python, "llama": args.llama_python}  # fmt: skip
    if any(e.startswith("base") for e in engines) and not args.baseline:
        ap.error("the base engines need --baseline DIR")
    if args.baseline:
        r["baseline"] = {"tree": str(args.baseline.resolve()), **git_state(args.baseline.resolve())}
    for e in engines:
        env = {"PYTHONPATH": str(args.baseline.resolve())} if e.startswith("base") else {}
        r["engines"][e] = run_worker(e, python[e], req, cores, args.timeout, env)
    log("== memory bandwidth")
    r["bandwidth"] = memory_bandwidth(args.bandwidth_mb or (512 if q else 1024), 3 if q else 5)
    r["machine"]["loadavg_end"] = os.getloadavg()
    r["verdicts"] = verdicts(r["engines"])
    r["agreement"] = agreement(r["engines"])
    text = report(r)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "generate_quick" if q else "generate"
    out = args.out or RESULTS / f"{stem}.json"
    r["report"] = text
    out.write_text(json.dumps(r, indent=1))
    png = out.with_suffix(".png")
    try:
        plot(r, png)
        print(f"\nsaved {out} and {png}")
    except Exception as e:  # the numbers matter more than the picture
        print(f"\nsaved {out}; plot failed: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
