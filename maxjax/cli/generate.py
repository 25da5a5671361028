"""``maxjax generate PROMPT``: stream a model's continuation, then a one-line summary.

    maxjax generate "The quick brown fox"                    # bundled SmolLM2, greedy
    maxjax generate --chat "What is the capital of France?"
    maxjax generate --temperature 0.8 --top-p 0.9 --seed 1 --max-new-tokens 100 "Once upon a time"
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from maxjax.dtype import DType

from maxjax.cli.devices import add_mesh_arguments, mesh_from_arguments
from maxjax.cli.errors import CLIError

__all__ = ["configure", "run"]

#: how the CLI spells the sampling parameters in messages
_FLAG_NAMES = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}

_DTYPES = {"float32": DType.float32, "bfloat16": DType.bfloat16}
_LAYOUTS = ("auto", "nibbles", "unpacked", "packed", "dequantized", "int8", "mapped", "tiles")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", metavar="PROMPT", help="the text to continue (with --chat: the user's message)")
    p.add_argument(
        "--model",
        metavar="PATH",
        help="a .gguf file, a Hugging Face model directory (config.json + safetensors), or a repo id in "
        "the local Hugging Face cache (default: the bundled SmolLM2-135M-Instruct Q4_1 GGUF)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="most tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature; 0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="sample among the K most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="activation and KV-cache dtype, and a Hugging Face checkpoint's weights' dtype (default float32)")
    p.add_argument(
        "--quantized-layout",
        choices=_LAYOUTS,
        default="auto",
        help="how quantized weights sit in memory: auto (default: the backend policy's choice for this platform and "
        "CPU), nibbles (4-bit stays 4-bit), unpacked (one byte per value, about 2x the memory of Q4_1), packed (the "
        "file's blocks; slow on CPU), dequantized (float32), int8 (requantized per channel, not bit-identical: batches "
        "of 16+ rows run int8 dots), mapped (Q4_0 and Q8_0 read in place from the mapped file: nothing copied at load), tiles (Q4_0 copied at load into "
        "tiles of 16 rows for integer dots with Q8_0 activations: arithmetic q8_0)",
    )
    p.add_argument(
        "--arithmetic", choices=("auto", "float32", "int8", "q8_0"), default="auto",
        help="int8: a quantized model's batched products (16+ rows) as int8 dots, in the int8 layout (not "
        "bit-identical to the file); q8_0: activations rounded to Q8_0 blocks, llama.cpp's arithmetic (integer dots in "
        "maxjax's CPU kernel: faster decode); float32: the file's values exactly; auto (default): the backend policy's choice",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar while weights load")
    p.add_argument(
        "--verbose", action="store_true",
        help="also print where the process's memory went (weights in their run-time layout, KV cache, the rest)",
    )  # fmt: skip
    add_mesh_arguments(p)
    _one_line_usage_errors(p)


def _one_line_usage_errors(p: argparse.ArgumentParser) -> None:
    """A bad or unknown argument is reported in one line (exit status 2), not the usage text and a
    line (unknown ones are caught here: argparse leaves them to the top-level parser)."""
    parse_known_args = p.parse_known_args

    def error(message: str) -> None:
        p.exit(2, f"{p.prog}: error: {' '.join(message.split())} (see {p.prog} --help)\n")

    def parse_known(args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = parse_known_args(args, namespace)
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    p.error = error  # type: ignore[method-assign]
    p.parse_known_args = parse_known  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> int:
    from maxjax.models.sampling import check_sampling

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if not args.prompt:
        raise ValueError("the prompt is empty")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # argv bytes that are not UTF-8 arrive as surrogate escapes
        bad = args.prompt[e.start]
        byte = f"0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else repr(bad)
        raise CLIError(f"PROMPT is not valid UTF-8 text: byte {byte} at character {e.start}") from None
    check_sampling(args.temperature, args.top_k, args.top_p, args.seed, names=_FLAG_NAMES)
    out = sys.stdout
    if args.coordinator:  # a multi-process run: the collectives' C++ library prints to fd 1, keep the text apart
        sys.stdout.flush()
        out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    mesh = mesh_from_arguments(args)
    from maxjax.models import load_model

    rss_before_load = _rss_bytes()
    t0 = time.perf_counter()
    lm = load_model(
        args.model,
        dtype=_DTYPES[args.dtype],
        progress=not args.no_progress and sys.stderr.isatty(),
        quantized_layout=None if args.quantized_layout == "auto" else args.quantized_layout,
        arithmetic=args.arithmetic,
        mesh=mesh,
    )
    load_s = time.perf_counter() - t0
    context = lm.config.max_position_embeddings
    n_prompt = len(lm.encode_prompt(args.prompt, args.chat))
    if n_prompt + args.max_new_tokens > context:
        raise CLIError(
            f"--max-new-tokens {args.max_new_tokens}: the prompt ({n_prompt} tokens) plus the new tokens exceed "
            f"the model's context of {context} tokens ({lm.source})"
        )
    for piece in lm.stream(
        args.prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        chat=args.chat,
    ):
        out.write(piece)
        out.flush()
    g = lm.last_generation
    out.write("\n")
    read = ""
    if mesh is not None:  # what this process read of the model file: only its devices' shards
        from maxjax.graph.weights.lazy import bytes_read

        read = f", this process read {bytes_read() / 1e6:.1f} MB of weights"
    print(
        f"[{len(g.prompt_ids)} prompt tokens, {len(g.token_ids)} new tokens ({g.finish_reason}), "
        f"time to first token {g.time_to_first_token:.2f} s, {g.tokens_per_second:.1f} tokens/s, "
        + (f"compile {g.compile_seconds:.1f} s, " if g.compile_seconds else "")
        + f"load {load_s:.1f} s{read}]",
        file=sys.stderr,
    )
    if args.verbose:
        print(memory_report(lm, g, rss_before_load), file=sys.stderr)
    return 0


def _rss_bytes() -> int:
    """This process's resident set now (Linux ``/proc/self/statm``; elsewhere its peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_report(lm: Any, generation: Any, rss_before_load: int) -> str:
    """One line: the process's peak resident set and its parts in MB, from what is measured
    (``ru_maxrss``, the weights' and the KV cache's array bytes, each buffer once: a file whose
    weights are read in place counts whole, resident once read; the resident set before loading);
    the rest is JAX's runtime, XLA's compiled programs and their temporary buffers, and host copies."""
    import resource

    import jax

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    leaves = {id(x): x for x in jax.tree_util.tree_leaves(lm.state)}  # a mapped file is one leaf of many weights
    weights = sum(int(getattr(x, "nbytes", 0)) for x in leaves.values())
    kv = generation.kv_cache_bytes
    rest = peak - weights - kv - rss_before_load
    from maxjax.graph.quantization import QuantizedArray

    # the layouts the quantized weights took (the policy maps or tiles some encodings)
    layouts = sorted({x.layout for x in jax.tree.leaves(lm.state, is_leaf=lambda x: isinstance(x, QuantizedArray)) if isinstance(x, QuantizedArray)})
    mb = lambda n: f"{n / 1e6:,.0f} MB"  # noqa: E731
    return (
        f"[memory: peak RSS {mb(peak)} = weights {mb(weights)}"
        + (f" (quantized layout{'s' if len(layouts) > 1 else ''} {'+'.join(layouts)})" if layouts else "")
        + f" + KV cache {mb(kv)} + before loading {mb(rss_before_load)} (Python, maxjax, JAX) + rest {mb(rest)} "
        "(JAX runtime, compiled programs and their buffers, host copies)]"
    )
