"""Text corpora for training: files split into training and held-out sets, tokenized into streams of batches.

    corpus = load_corpus(python_docs_path())                  # the Python documentation (reST sources)
    train = TokenStream.from_texts(corpus.texts("train"), tokenizer.encode_batch, separator=eos_id)
    for position, tokens in train.batches(batch=4, seq=128, seed=0, start=0):   # tokens int32 [4, 129]
        ...

Files are split by a hash of their path relative to the corpus root (``crc32 % 1000 <
held_out * 1000``): the split is the same on every machine and does not move when files are added.
A stream is one token array (documents joined by a separator token) cut into windows of ``seq +
1`` tokens, ``seq`` apart (each token is a target once per epoch); :meth:`TokenStream.batches`
visits the windows in an order shuffled per epoch from ``seed``, and batch ``position`` is a pure
function of ``(seed, position)``, so a run resumed at a checkpoint's data position sees the same
batches as one that never stopped.

The default corpus is the Python documentation's reStructuredText sources, installed by Debian's
``python3-doc`` package (``/usr/share/doc/python3-doc/html/_sources``, about 500 files, 12 MB);
``scripts/setup.sh`` installs it where it can (root with ``apt-get``).
"""

from __future__ import annotations

import glob
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

__all__ = ["Corpus", "TokenStream", "ByteTokenizer", "load_corpus", "python_docs_path", "PYTHON_DOCS_CANDIDATES"]

#: where Debian's python3-doc puts the documentation sources (first match wins)
PYTHON_DOCS_CANDIDATES = (
    "/usr/share/doc/python3-doc/html/_sources",
    "/usr/share/doc/python3/html/_sources",
    "/usr/share/doc/python3.*/html/_sources",
)


def python_docs_path() -> Path:
    """The folder of the Python documentation's sources (``*.rst.txt``) from Debian's ``python3-doc``.

    Raises:
        FileNotFoundError: the package is not installed (the message says how to install it).
    """
    for pattern in PYTHON_DOCS_CANDIDATES:
        for p in sorted(glob.glob(pattern)):
            if os.path.isdir(p):
                return Path(p)
    raise FileNotFoundError(
        "the Python documentation corpus is not installed (looked in "
        + ", ".join(PYTHON_DOCS_CANDIDATES)
        + "): install it with `apt-get install python3-doc` (Debian/Ubuntu), or pass a folder of text files"
    )


@dataclass
class Corpus:
    """Text files under ``root`` split into ``train`` and ``held_out`` (see the module docstring)."""

    root: Path
    train: list[Path] = field(default_factory=list)
    held_out: list[Path] = field(default_factory=list)

    def files(self, split: str) -> list[Path]:
        """The files of ``split`` (``"train"`` or ``"held_out"``).

        Raises:
            ValueError: another split name.
        """
        if split not in ("train", "held_out"):
            raise ValueError(f"split must be 'train' or 'held_out', got {split!r}")
        return self.train if split == "train" else self.held_out

    def texts(self, split: str) -> Iterator[str]:
        """The text of each file of ``split``, in path order (UTF-8; undecodable bytes replaced)."""
        for p in self.files(split):
            yield p.read_text(encoding="utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"Corpus({str(self.root)!r}, {len(self.train)} training files, {len(self.held_out)} held out)"


def load_corpus(
    path: str | os.PathLike[str],
    *,
    held_out: float = 0.05,
    suffixes: Sequence[str] = (".txt", ".rst", ".md"),
    max_files: int | None = None,
) -> Corpus:
    """The non-empty text files (by ``suffixes``) under ``path`` (a folder, searched recursively,
    or one file), split into training and held-out files.

    Args:
        held_out: the share of files held out (0 to 1; at least one file each way when there are two).
        max_files: keep only the first ``max_files`` files (in path order) before splitting.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: no non-empty text file under ``path``; ``held_out`` outside ``[0, 1)``.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"corpus {str(root)!r}: no such file or directory")
    if not 0.0 <= held_out < 1.0:
        raise ValueError(f"held_out must be in [0, 1), got {held_out}")
    if root.is_file():
        files = [root]
        base = root.parent
    else:
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(tuple(suffixes)))
        base = root
    files = [p for p in files if p.stat().st_size > 0 and p.read_bytes().strip()]
    if max_files is not None:
        files = files[:max_files]
    if not files:
        raise ValueError(f"corpus {str(root)!r} is empty: no non-empty {'/'.join(suffixes)} files")
    threshold = int(round(held_out * 1000))
    train, held = [], []
    for p in files:
        h = zlib.crc32(str(p.relative_to(base)).encode()) % 1000
        (held if h < threshold else train).append(p)
    if held_out > 0 and len(files) >= 2:
        if not held:
            held.append(train.pop())
        if not train:
            train.append(held.pop(0))
    return Corpus(root, train, held)


class ByteTokenizer:
    """Bytes as tokens: ids 0-255 are the UTF-8 bytes, 256 separates documents (``vocab_size`` 257)."""

    vocab_size = 257
    separator = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class TokenStream:
    """One split's tokens as a flat int32 array, cut into windows for batches (see the module docstring)."""

    def __init__(self, tokens: np.ndarray):
        self.tokens = np.asarray(tokens, np.int32)

    @classmethod
    def from_texts(cls, texts: Iterable[str], encode_batch: Callable[[list[str]], list[list[int]]], separator: int | None) -> "TokenStream":
        """Encodes ``texts`` with ``encode_batch`` and joins them, ``separator`` (a token id, or
        None for nothing) after each.

        Raises:
            ValueError: no tokens at all.
        """
        texts = list(texts)
        pieces: list[np.ndarray] = []
        for ids in encode_batch(texts):
            pieces.append(np.asarray(ids, np.int32))
            if separator is not None:
                pieces.append(np.asarray([separator], np.int32))
        tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
        if not tokens.size:
            raise ValueError("the texts gave no tokens")
        return cls(tokens)

    def __len__(self) -> int:
        return int(self.tokens.size)

    def num_windows(self, seq: int) -> int:
        """How many windows of ``seq + 1`` tokens, ``seq`` apart, the stream holds."""
        return max(0, (self.tokens.size - 1) // seq)

    def window(self, i: int, seq: int) -> np.ndarray:
        """Window ``i``: tokens ``[i * seq, i * seq + seq + 1)``."""
        return self.tokens[i * seq : i * seq + seq + 1]

    def _order(self, seq: int, seed: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(self.num_windows(seq))

    def batch(self, position: int, batch: int, seq: int, seed: int = 0) -> np.ndarray:
        """Batch number ``position`` (0, 1, ...): int32 ``[batch, seq + 1]``, windows in an order
        shuffled per epoch from ``seed``.

        Raises:
            ValueError: the stream holds fewer than ``batch`` windows.
        """
        n = self.num_windows(seq)
        if n < batch:
            raise ValueError(f"the stream ({self.tokens.size} tokens) holds {n} windows of {seq + 1}, fewer than a batch of {batch}")
        per_epoch = n // batch
        epoch, k = divmod(position, per_epoch)
        order = self._order(seq, seed, epoch)[k * batch : (k + 1) * batch]
        return np.stack([self.window(int(i), seq) for i in order])

    def batches(self, batch: int, seq: int, seed: int = 0, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        """``(position, tokens [batch, seq + 1])`` from batch ``start`` on, endlessly (epochs reshuffled)."""
        position = start
        while True:
            yield position, self.batch(position, batch, seq, seed)
            position += 1

    def eval_batches(self, batch: int, seq: int, max_batches: int | None = None) -> list[np.ndarray]:
        """The windows in order (no shuffle), ``[batch, seq + 1]`` each, for a held-out evaluation
        (at most ``max_batches``; a last partial batch is dropped).

        Raises:
            ValueError: fewer than ``batch`` windows.
        """
        n = self.num_windows(seq)
        if n < batch:
            raise ValueError(f"the stream ({self.tokens.size} tokens) holds {n} windows of {seq + 1}, fewer than a batch of {batch}")
        count = n // batch if max_batches is None else min(n // batch, max_batches)
        return [np.stack([self.window(b * batch + j, seq) for j in range(batch)]) for b in range(count)]

