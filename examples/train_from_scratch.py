"""Train a small Llama-shaped byte-level model from scratch on the Python documentation; plot its loss curve.

    python examples/train_from_scratch.py                       # about 5 minutes on 2 CPU cores
    python examples/train_from_scratch.py --steps 2000 --layers 8 --hidden 384 --out runs/bytes

The model is ``maxjax.models.llama.build_llama`` of a small config (vocab 257: the 256 bytes and a
document separator), so its layers are MAX's ``build_subgraph`` + ``ops.call`` chain, run as one
``lax.scan``; its weights come from ``maxjax.nn.init`` (PyTorch's defaults). ``maxjax.train.Trainer``
runs AdamW with warm-up and cosine decay. Every ``--eval-every`` steps it measures held-out bits per
byte (files the training never sees); at the end it saves ``loss.png`` (training loss and
held-out bits per byte against steps) and ``history.json`` in ``--out``, prints a greedy
continuation of a prompt, and its last line is ``held-out bits per byte: BEFORE -> AFTER (loss curve: PATH)``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--seq", type=int, default=256, help="bytes per sequence (default 256)")
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    p.add_argument("--hidden", type=int, default=256, help="model width (default 256; heads of 32 channels)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (default 3e-3)")
    p.add_argument("--corpus", default=None, help="a folder of text files (default: the Python docs from python3-doc)")
    p.add_argument("--max-files", type=int, default=None, help="use only the first N corpus files")
    p.add_argument("--eval-every", type=int, default=50, help="steps between held-out evaluations (default 50)")
    p.add_argument("--eval-batches", type=int, default=4, help="held-out batches per evaluation (default 4)")
    p.add_argument("--prompt", default="The :mod:`itertools` module", help="prompt of the sample printed at the end")
    p.add_argument("--out", default="runs/train_from_scratch", help="folder for loss.png and history.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "seq", "layers", "hidden", "eval_every", "eval_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.hidden % 32:
        p.error("--hidden must be a multiple of 32 (heads of 32 channels)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from tqdm.auto import tqdm

    from maxjax import nn, train
    from maxjax.models.llama import LlamaConfig, build_llama
    from maxjax.train.data import ByteTokenizer, TokenStream, load_corpus, python_docs_path

    try:
        corpus = load_corpus(args.corpus if args.corpus else python_docs_path(), max_files=args.max_files)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    byte = ByteTokenizer()
    stream = TokenStream.from_texts(corpus.texts("train"), byte.encode_batch, byte.separator)
    held = TokenStream.from_texts(corpus.texts("held_out"), byte.encode_batch, byte.separator)
    eval_batches = held.eval_batches(args.batch, args.seq, args.eval_batches)
    heads = args.hidden // 32
    config = LlamaConfig(
        vocab_size=byte.vocab_size, hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=32, rope_theta=10000.0,
        rms_norm_eps=1e-5, max_position_embeddings=max(1024, args.seq), tie_word_embeddings=False,
    )  # fmt: skip
    model = build_llama(config)
    nn.init.initialize(model, jax.random.key(args.seed))
    n_params = sum(int(np.prod(w.shape)) for w in model.raw_state_dict().values())
    print(f"corpus: {corpus}: {len(stream):,} training bytes, {len(held):,} held out")
    print(f"model: {args.layers} layers x {args.hidden}, {n_params:,} parameters")
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, max(1, args.steps // 20), args.steps, args.lr / 20)
    trainer = train.Trainer(model, optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01)))
    state = trainer.init(seed=args.seed)

    def bits_per_byte(st) -> float:
        return math.log2(trainer.perplexity(st, eval_batches))

    history = {"step": [], "loss": [], "eval_step": [0], "eval_bits_per_byte": [bits_per_byte(state)]}
    print(f"held-out bits per byte at step 0: {history['eval_bits_per_byte'][0]:.3f}")
    print(f"train step compiled in {trainer.compile(state, stream.batch(0, args.batch, args.seq, args.seed)):.1f} s")
    bar = tqdm(total=args.steps, desc="training", unit="step", disable=args.no_progress, file=sys.stdout)
    t0, done = time.perf_counter(), 0
    for position, batch in stream.batches(args.batch, args.seq, seed=args.seed):
        if position >= args.steps:
            break
        state, m = trainer.step(state, batch)
        loss = float(m["loss"])
        done += int(m["tokens"])
        history["step"].append(position + 1)
        history["loss"].append(loss)
        bar.set_postfix(loss=f"{loss:.3f}", bytes_s=f"{done / (time.perf_counter() - t0):.0f}")
        bar.update(1)
        if (position + 1) % args.eval_every == 0 or position + 1 == args.steps:
            history["eval_step"].append(position + 1)
            history["eval_bits_per_byte"].append(bits_per_byte(state))
    bar.close()
    print(f"{args.steps} steps in {time.perf_counter() - t0:.0f} s ({done / (time.perf_counter() - t0):.0f} bytes/s)")

    # a greedy continuation: one compiled forward over a fixed window, the prompt right-aligned
    weights = trainer.state_dict(state)
    forward = jax.jit(lambda s, t: nn.functional_call(model, s, t))
    ids = byte.encode(args.prompt)
    for _ in range(160):
        window = ids[-args.seq :]
        x = np.zeros((1, args.seq), np.int32)
        x[0, : len(window)] = window
        logits = forward(weights, jnp.asarray(x))
        ids.append(int(jnp.argmax(logits[0, len(window) - 1, :256])))
    print(f"\nsample: {byte.decode(ids)!r}\n")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "history.json").write_text(json.dumps(history))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(history["step"], np.asarray(history["loss"]) / math.log(2), label="training loss (bits per byte)", alpha=0.7)
    ax.plot(history["eval_step"], history["eval_bits_per_byte"], "o-", label="held-out bits per byte")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.set_title(f"byte-level Llama ({args.layers} x {args.hidden}) on the Python documentation")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=110)
    plt.close(fig)
    first, last = history["eval_bits_per_byte"][0], history["eval_bits_per_byte"][-1]
    print(f"held-out bits per byte: {first:.3f} -> {last:.3f} (loss curve: {out / 'loss.png'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
