"""LoRA fine-tuning of SmolLM2-135M-Instruct on the Python documentation, with a held-out split.

    python examples/finetune_smollm2.py                        # the default run: about 10 minutes on 2 CPU cores
    python examples/finetune_smollm2.py --steps 300 --out runs/smollm2-docs --checkpoints runs/ckpt
    maxjax generate --model runs/smollm2-docs ".. function:: shuffle(x)"

What it does:

1. loads the bundled GGUF (Q4_1) and makes a float32 copy of it (``maxjax.train.dequantized``);
2. reads the corpus (default: Debian's ``python3-doc``, the documentation's reStructuredText
   sources) split by file into training and held-out text (``maxjax.train.data``);
3. adds LoRA adapters (rank, alpha; default on every projection of every layer) and trains only
   them with AdamW (``maxjax.train.Trainer``: one compiled step, the scanned layers, the base
   weights frozen arguments), showing loss and tokens/s;
4. measures held-out perplexity before and after, generates from a prompt of the domain with the
   model before and after, merges the adapters into the weights and exports a Hugging Face
   directory (``model.safetensors``, ``config.json``, tokenizer files) that ``maxjax generate
   --model DIR`` and transformers load.

With ``--checkpoints DIR`` the run saves an Orbax checkpoint every ``--checkpoint-every`` steps and
resumes from the latest one when started again. The last line printed is
``held-out perplexity: BEFORE -> AFTER (exported to DIR)``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_PROMPT = ".. function:: shuffle(x)\n\n   Shuffle the sequence"
DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="The defaults fit in about 10 minutes on a 2-core CPU.")  # fmt: skip
    p.add_argument("--steps", type=int, default=80, help="optimizer steps (default 80)")
    p.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--alpha", type=float, default=16.0, help="LoRA alpha: the update is scaled by alpha/rank (default 16)")
    p.add_argument("--targets", default=DEFAULT_TARGETS, help=f"comma-separated Linear names or path patterns (default {DEFAULT_TARGETS})")
    p.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate (default 1e-3)")
    p.add_argument("--corpus", default=None, help="a folder of text files (default: the Python docs from python3-doc)")
    p.add_argument("--max-files", type=int, default=None, help="use only the first N corpus files")
    p.add_argument("--eval-batches", type=int, default=4, help="held-out batches for perplexity (default 4)")
    p.add_argument("--out", default="runs/finetune_smollm2", help="where to export the merged model (default runs/finetune_smollm2)")
    p.add_argument("--checkpoints", default=None, help="Orbax checkpoint folder: save and resume the run there")
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints (default 20)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the before/after generation prompt")
    p.add_argument("--max-new-tokens", type=int, default=40, help="tokens generated before and after (default 40)")
    p.add_argument("--seed", type=int, default=0, help="seed of the adapters and the batch order")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "seq", "rank", "eval_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import jax
    import optax
    from tqdm.auto import tqdm

    from maxjax import train
    from maxjax.models import load_model
    from maxjax.train.checkpoint import RunCheckpointer
    from maxjax.train.data import TokenStream, load_corpus, python_docs_path
    from maxjax.train.export import save_pretrained

    t0 = time.perf_counter()
    try:
        corpus = load_corpus(args.corpus if args.corpus else python_docs_path(), max_files=args.max_files)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lm = load_model()
    tok = lm.tokenizer
    print(f"model: {lm.source}; corpus: {corpus}")
    train_stream = TokenStream.from_texts(corpus.texts("train"), tok.encode_batch, tok.eos_token_id)
    held = TokenStream.from_texts(corpus.texts("held_out"), tok.encode_batch, tok.eos_token_id)
    eval_batches = held.eval_batches(args.batch, args.seq, args.eval_batches)
    print(f"tokens: {len(train_stream):,} training, {len(held):,} held out ({len(eval_batches) * args.batch * args.seq:,} scored)")

    model = train.dequantized(lm.module)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    paths = train.apply_lora(model, targets, rank=args.rank, alpha=args.alpha, key=jax.random.key(args.seed))
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, max(1, args.steps // 10), args.steps, args.lr / 10)
    trainer = train.Trainer(model, optax.adamw(schedule, weight_decay=0.0), trainable="*lora_*")
    n_train = sum(int(v.size) for v in trainer.init().params.values())
    print(f"LoRA rank {args.rank}, alpha {args.alpha:g} on {len(paths)} Linear layers: {n_train:,} trainable parameters")

    state = trainer.init(seed=args.seed)
    before_ppl = trainer.perplexity(state, eval_batches)
    print(f"held-out perplexity before: {before_ppl:.3f}")
    before_text = lm.generate([args.prompt], max_new_tokens=args.max_new_tokens)[0].text

    ckpt = RunCheckpointer(args.checkpoints, trainer) if args.checkpoints else None
    position = 0
    if ckpt is not None:
        state, position = ckpt.restore_or(state)
        if int(state.step):
            print(f"resumed from {args.checkpoints} at step {int(state.step)}")
    start_step = int(state.step)
    compile_s = trainer.compile(state, train_stream.batch(position, args.batch, args.seq, args.seed))
    print(f"train step compiled in {compile_s:.1f} s")
    bar = tqdm(total=args.steps, initial=start_step, desc="LoRA", unit="step", disable=args.no_progress, file=sys.stdout)
    losses, tokens_done, t_train = [], 0, time.perf_counter()
    for position, batch in train_stream.batches(args.batch, args.seq, seed=args.seed, start=position):
        if int(state.step) >= args.steps:
            break
        state, metrics = trainer.step(state, batch)
        loss = float(metrics["loss"])
        losses.append(loss)
        tokens_done += int(metrics["tokens"])
        rate = tokens_done / (time.perf_counter() - t_train)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:.0f}")
        bar.update(1)
        if ckpt is not None and int(state.step) % args.checkpoint_every == 0:
            ckpt.save(state, data_position=position + 1)
    bar.close()
    if ckpt is not None:
        ckpt.save(state, data_position=position)
        ckpt.close()
    if losses:
        print(f"trained {len(losses)} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}, {tokens_done / (time.perf_counter() - t_train):.0f} tokens/s")

    after_ppl = trainer.perplexity(state, eval_batches)
    merged = train.merge_lora(model, trainer.state_dict(state))
    out = save_pretrained(args.out, model, merged, lm.config, tok)
    tuned = load_model(out)
    after_text = tuned.generate([args.prompt], max_new_tokens=args.max_new_tokens)[0].text
    print(f"\nprompt: {args.prompt!r}")
    print(f"before: {before_text!r}")
    print(f"after:  {after_text!r}")
    print(f"({time.perf_counter() - t0:.0f} s in all)")
    print(f"held-out perplexity: {before_ppl:.3f} -> {after_ppl:.3f} (exported to {Path(out)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
