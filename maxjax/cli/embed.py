"""``maxjax embed SENTENCE ...``: sentence embeddings, one JSON object a line, or a cosine table.

    maxjax embed "A man is playing a guitar." "Someone plays an instrument."
    maxjax embed --input sentences.txt > embeddings.jsonl       # one sentence a line, with a progress bar
    maxjax embed --similarity "cat" "dog" "car"                  # cosine similarity table

Each output line is ``{"text": ..., "embedding": [384 floats]}`` (float32 values printed as the
shortest decimal that reads back to the same float32). The default model is the bundled
all-MiniLM-L6-v2 (``--model DIR``: another sentence-transformers directory). An input file is read
as UTF-8 and streamed in chunks (blank lines are skipped).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

from maxjax.cli.errors import CLIError

__all__ = ["configure", "run"]

#: sentences read from an input file and embedded together (sorted by length within the chunk)
CHUNK = 1024


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("sentences", nargs="*", metavar="SENTENCE", help="sentences to embed")
    p.add_argument("--input", metavar="FILE", help="a UTF-8 text file with one sentence a line ('-': standard input)")
    p.add_argument("--model", metavar="DIR", help="a sentence-transformers directory (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="sentences per forward pass (default 32)")
    p.add_argument("--similarity", action="store_true", help="print the cosine similarity table instead of the embeddings")
    p.add_argument("--no-progress", action="store_true", help="no progress bar for --input")


def _read_lines(path: str) -> list[str]:
    """The non-blank lines of a UTF-8 file (without their line ends).

    Raises:
        CLIError: the file cannot be read or is not UTF-8 (naming it and the first bad byte).
    """
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise CLIError(f"--input {path}: cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CLIError(f"--input {path}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})") from None
    return [line for line in text.splitlines() if line.strip()]


def _floats(e: np.ndarray) -> list[float]:
    """float32 values as Python floats printed with float32's shortest decimals."""
    return [float(np.format_float_positional(v)) for v in e]


def _chunks(items: list[str], n: int) -> Iterator[list[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _similarity_table(texts: list[str], emb: np.ndarray) -> str:
    """Rows and columns numbered as the sentences; each cell the cosine of the two embeddings."""
    unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    cos = unit @ unit.T  # [n, n]
    width = min(40, max(len(t) for t in texts))
    label = [(t if len(t) <= width else t[: width - 1] + "…").ljust(width) for t in texts]
    head = " " * (width + 5) + " ".join(f"{j:>6}" for j in range(len(texts)))
    rows = [f"{i:>3}  {label[i]}" + "".join(f" {c:6.3f}" for c in cos[i]) for i in range(len(texts))]
    return "\n".join([head, *rows])


def run(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be a positive integer, got {args.batch_size}")
    if args.input is not None and args.sentences:
        raise CLIError("give sentences or --input FILE, not both")
    texts = _read_lines(args.input) if args.input is not None else list(args.sentences)
    if not texts:
        raise CLIError(f"--input {args.input}: no sentences (the file has no non-blank line)" if args.input else "no sentences: give SENTENCE ... or --input FILE")

    from maxjax.models import load_encoder

    encoder = load_encoder(args.model)
    if args.similarity:
        emb = encoder.embed(texts, batch_size=args.batch_size)
        print(_similarity_table(texts, emb))
        return 0
    bar = None
    if args.input is not None and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(texts), unit="sentence", desc="embedding", file=sys.stderr)
    try:
        out = sys.stdout
        for chunk in _chunks(texts, CHUNK):
            emb = encoder.embed(chunk, batch_size=args.batch_size, progress=bar.update if bar is not None else None)
            for text, e in zip(chunk, emb):
                out.write(json.dumps({"text": text, "embedding": _floats(e)}, ensure_ascii=False))
                out.write("\n")
            out.flush()
    finally:
        if bar is not None:
            bar.close()
    return 0
