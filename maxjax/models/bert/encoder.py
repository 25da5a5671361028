"""``load_bert_encoder``: a sentence-transformers BERT directory -> a ready :class:`SentenceEncoder`.

The tokenizer is the model's ``tokenizer.json`` run by Hugging Face ``tokenizers`` (WordPiece,
lower-casing as its normalizer says), truncated at the model's ``max_seq_length`` with padding
turned off: :class:`SentenceEncoder` pads each batch itself, to a few length buckets (16, 24, 32,
48, 64, ... up to the max length) and a few batch sizes (powers of two up to ``batch_size``), so a new
batch rarely compiles. The model runs in graph mode (MAX's way): one :class:`~maxjax.graph.Graph`
with symbolic ``batch`` and ``seq`` dims made a pure function by :class:`~maxjax.engine.Program`
(its six layers one ``lax.scan``) under ``jax.jit``.
"""

from __future__ import annotations

import dataclasses

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from maxjax.backend import BackendPolicy, policy_for
from maxjax.dtype import DType
from maxjax.engine import Program
from maxjax.graph import Graph, TensorType
from maxjax.graph.weights import SafetensorWeights
from maxjax.models.bert.config import BertConfig, SentenceHead
from maxjax.models.bert.model import BertModel, build_bert
from maxjax.models.bert.weights import bert_module_from_hf
from maxjax.models.registry import read_hf_config

__all__ = ["SentenceEncoder", "EncoderTokenizer", "load_bert_encoder", "load_module", "length_buckets"]


#: padded lengths are multiples of this up to :data:`FINE_UNTIL` (where most sentences are)
FINE_STEP, FINE_UNTIL = 8, 64


def length_buckets(max_len: int, smallest: int = 16, between: bool = True) -> tuple[int, ...]:
    """Padded sizes up to ``max_len``: with ``between``, every multiple of :data:`FINE_STEP` from
    ``smallest`` to :data:`FINE_UNTIL` (16, 24, 32, 40, ..., 64: sentences of 10-60 tokens pad by
    under 8; on all-MiniLM-L6-v2 at batch 32 that is 1.19x the sentences/s of 1.5x-spaced
    buckets, for 3 more compiled lengths), then powers of two and the sizes halfway to the next
    (96, 128, 192, ...; at most 1.5x padding); without it, powers of two from ``smallest``. Then
    ``max_len``."""
    out, n = [], smallest
    while n < max_len:
        out.append(n)
        if between and n < FINE_UNTIL:
            n += FINE_STEP
            continue
        if between and n >= 4 and n + n // 2 < max_len:
            out.append(n + n // 2)
        n *= 2
    return (*out, max_len)


def _bucket(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    return buckets[-1]


class EncoderTokenizer:
    """A BERT ``tokenizer.json`` (Hugging Face ``tokenizers``) that truncates at ``max_length``
    tokens (``[CLS]`` and ``[SEP]`` included) and does not pad.

    ``encode_batch(texts) -> list[list[int]]``; ``cls_id``/``sep_id``/``pad_id``: the special tokens.

    Raises:
        ValueError: (constructing) the file is missing or not a tokenizer (naming it).
    """

    def __init__(self, path: str | os.PathLike[str], max_length: int):
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: no tokenizer.json in the model directory (required)")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on a bad file
            raise ValueError(f"{path}: not a tokenizers tokenizer.json: {' '.join(str(e).split())}") from None
        padding = tok.padding or {}  # the file's own padding settings name its pad id
        self.pad_id = int(padding.get("pad_id", tok.token_to_id("[PAD]") or 0))
        tok.no_padding()
        tok.enable_truncation(max_length)
        self.tokenizer, self.max_length, self.path = tok, max_length, path
        special = tok.encode("", add_special_tokens=True).ids  # the post-processor's template: [CLS] [SEP]
        if len(special) != 2:
            raise ValueError(f"{path}: its post-processor does not wrap a text in two special tokens ([CLS] ... [SEP])")
        self.cls_id, self.sep_id = special

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=True)]


class SentenceEncoder:
    """A BERT sentence encoder: ``embed(texts) -> float32 [n, hidden]``.

    ``policy``: the :class:`~maxjax.backend.BackendPolicy` it runs under (default: the default
    backend's); its program runs at the policy's ``encoder_precision`` (on a CPU with AMX-BF16,
    ``HIGH``: the AMX kernel's four bfloat16 passes; pass a policy with
    ``encoder_precision=lax.Precision.HIGHEST`` for XLA's exact float32 products).

    Attributes:
        module: the :class:`~maxjax.models.bert.BertModel` (weights loaded).
        config, head: its :class:`BertConfig` and :class:`SentenceHead`.
        tokenizer: the :class:`EncoderTokenizer`.
        program, state: the graph as a pure function and its prepared weights; ``functions``
            ``apply(state, input_ids, attention_mask) -> [batch, hidden]`` (jitted).
        num_compiles: how many shapes have compiled so far.
    """

    def __init__(self, module: BertModel, tokenizer: EncoderTokenizer, source: str = "", policy: BackendPolicy | None = None):
        self.module, self.config, self.head, self.tokenizer, self.source = module, module.config, module.head, tokenizer, source
        types = [TensorType(DType.int32, ["batch", "seq"]), TensorType(DType.int32, ["batch", "seq"])]
        self.graph = Graph("bert_encoder", forward=module, input_types=types)
        policy = policy or policy_for()
        # the policy's precision for encoders (HIGH: the CPU's AMX kernel, see BackendPolicy)
        self.program = Program(self.graph, policy=dataclasses.replace(policy, precision=policy.encoder_precision))
        self.state = self.program.prepare(module.state_dict())
        self.buckets = length_buckets(self.head.max_seq_length)
        #: most rows in one compiled pass (the backend policy's ``encoder_rows``)
        self.rows_per_pass = policy.encoder_rows
        self.num_compiles = 0
        program = self.program

        def apply(state: Any, input_ids: Any, attention_mask: Any) -> Any:
            self.num_compiles += 1  # once per trace, i.e. per compiled shape
            return program.apply(state, input_ids, attention_mask)[0]

        self.apply = jax.jit(apply)

    @property
    def dimension(self) -> int:
        """Embedding size (``hidden_size``)."""
        return self.config.hidden_size

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (``[CLS] ... [SEP]``, truncated at ``head.max_seq_length``).

        Raises:
            ValueError: not a list of strings, an empty list, or an empty string (naming its index).
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise ValueError(f"texts must be a list of strings, got {type(texts).__name__}")
        if len(texts) == 0:
            raise ValueError("texts is an empty list (give at least one sentence)")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"texts[{i}] must be a string, got {type(t).__name__}")
            if t == "":
                raise ValueError(f"texts[{i}] is an empty string")
        return self.tokenizer.encode_batch(texts)

    def pad(self, ids: Sequence[Sequence[int]], rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)`` int32 ``[rows, bucket]``: ``ids`` right-padded to the
        smallest length bucket that holds the longest, plus empty rows up to ``rows``."""
        rows = max(rows or len(ids), len(ids))
        seq = _bucket(max(len(i) for i in ids), self.buckets)
        input_ids = np.full((rows, seq), self.tokenizer.pad_id, np.int32)
        mask = np.zeros((rows, seq), np.int32)
        for r, i in enumerate(ids):
            if len(i) > seq:
                raise ValueError(f"row {r} has {len(i)} tokens, more than the max length {seq}")
            input_ids[r, : len(i)] = i
            mask[r, : len(i)] = 1
        return input_ids, mask

    def embed_ids(self, ids: Sequence[Sequence[int]], batch_size: int = 32, progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Embeddings of token-id rows (each with its ``[CLS]``/``[SEP]``): float32 ``[n, hidden]``.

        Rows are sorted by length and taken ``batch_size`` at a time; a batch runs as passes of at
        most :attr:`rows_per_pass` rows (the backend policy's ``encoder_rows``), each padded to a
        length bucket and a power-of-two row count; rows come back in the input order.
        ``progress(k)`` is called after each batch with its number of rows.

        Raises:
            ValueError: ``batch_size`` < 1, an empty list, an empty row, a row longer than the max
                length or with an id outside the vocabulary (naming the row).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if len(ids) == 0:
            raise ValueError("no rows to embed (an empty list)")
        v = self.config.vocab_size
        for r, row in enumerate(ids):
            if len(row) == 0:
                raise ValueError(f"row {r} has no tokens")
            if len(row) > self.head.max_seq_length:
                raise ValueError(f"row {r} has {len(row)} tokens, more than the model's max_seq_length {self.head.max_seq_length}")
            if min(row) < 0 or max(row) >= v:
                raise ValueError(f"row {r} has a token id outside [0, {v})")
        order = np.argsort([-len(r) for r in ids], kind="stable")
        out = np.empty((len(ids), self.dimension), np.float32)
        rows = min(batch_size, self.rows_per_pass)
        row_buckets = length_buckets(rows, 1, between=False)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            passes = []  # dispatched together, read back after
            for p in range(0, len(batch), rows):
                idx = batch[p : p + rows]
                input_ids, mask = self.pad([ids[i] for i in idx], _bucket(len(idx), row_buckets))
                passes.append((idx, self.apply(self.state, input_ids, mask)))
            for idx, emb in passes:
                out[idx] = np.asarray(emb)[: len(idx)]
            if progress is not None:
                progress(len(batch))
        return out

    def embed(self, texts: Sequence[str], batch_size: int = 32, progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Sentence embeddings: float32 ``[len(texts), hidden]`` (L2-normalised when the model's
        ``modules.json`` has a ``Normalize`` module, as all-MiniLM-L6-v2's does).

        Raises:
            ValueError: an empty list, an empty string, a non-string (naming its index), or
                ``batch_size`` < 1.
        """
        return self.embed_ids(self.tokenize(texts), batch_size=batch_size, progress=progress)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"SentenceEncoder({self.source!r}: BERT {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
            f"{self.head.pooling} pooling{', normalized' if self.head.normalize else ''}, max {self.head.max_seq_length} tokens)"
        )


def load_module(path: str | os.PathLike[str], dtype: DType = DType.float32) -> tuple[BertModel, Path]:
    """The :class:`BertModel` of a sentence-transformers (or Hugging Face BERT) directory, weights
    loaded from its ``model.safetensors`` by their Hugging Face names.

    Raises:
        ValueError: not a directory, no ``config.json`` / ``model.safetensors``, another
            architecture, or a weight of the wrong shape or dtype (naming it).
    """
    d = Path(path)
    if not d.is_dir():
        raise ValueError(f"{d}: not a model directory")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{d}: no config.json in the model directory (required)")
    config = BertConfig.from_hf_config(read_hf_config(cfg_path), str(cfg_path))
    head = SentenceHead.from_dir(d, config)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{d}: no model.safetensors in the model directory (required)")
    module = build_bert(config, head, dtype)
    state = bert_module_from_hf(SafetensorWeights(files))
    module.load_state_dict(state)
    return module, d


def load_bert_encoder(path: str | os.PathLike[str], policy: BackendPolicy | None = None) -> SentenceEncoder:
    """A :class:`SentenceEncoder` for a sentence-transformers BERT directory (what
    :func:`maxjax.models.load_encoder` calls for a BERT ``config.json``); ``policy``: see
    :class:`SentenceEncoder`.

    Raises:
        ValueError: see :func:`load_module`; no ``tokenizer.json`` (naming the file).
    """
    module, d = load_module(path)
    tokenizer = EncoderTokenizer(d / "tokenizer.json", module.head.max_seq_length)
    return SentenceEncoder(module, tokenizer, source=str(d), policy=policy)
