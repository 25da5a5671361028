"""BERT checkpoints' tensor names (Hugging Face's ``BertModel``, as in sentence-transformers'
``model.safetensors``): maxjax's BERT names are the checkpoint's, also accepting ``BertForXxx``'s
``bert.`` prefix."""

from __future__ import annotations

from typing import Any

from maxjax.graph.weights import WeightData
from maxjax.graph.weights.adapters import NameTable, adapt

__all__ = ["BERT_HF_NAMES", "bert_from_hf"]

#: Hugging Face BERT names -> maxjax BERT names: the identity, without a ``bert.`` prefix.
BERT_HF_NAMES: NameTable = ((r"(?:bert\.)?(.+)", r"\1"),)


def bert_from_hf(weights: Any) -> dict[str, WeightData]:
    """A Hugging Face BERT checkpoint as maxjax BERT names (the file's names; a ``bert.`` prefix
    is dropped): every tensor, as stored."""
    return adapt(weights, BERT_HF_NAMES)
