"""BERT checkpoints' tensor names (Hugging Face's ``BertModel``, as in sentence-transformers'
``model.safetensors``): maxjax's BERT names are the checkpoint's, also accepting ``BertForXxx``'s
``bert.`` prefix; :data:`BERT_MODULE_NAMES` then maps those names to :class:`~maxjax.models.bert.BertModel`'s
(its attention is :class:`~maxjax.nn.MultiheadAttention`, whose children are MAX's ``q_proj``, ...)."""

from __future__ import annotations

from typing import Any

from maxjax.graph.weights import WeightData
from maxjax.graph.weights.adapters import NameTable, adapt

__all__ = ["BERT_HF_NAMES", "BERT_MODULE_NAMES", "bert_from_hf", "bert_module_from_hf"]

#: Hugging Face BERT names -> maxjax BERT names: the identity, without a ``bert.`` prefix.
BERT_HF_NAMES: NameTable = ((r"(?:bert\.)?(.+)", r"\1"),)


def bert_from_hf(weights: Any) -> dict[str, WeightData]:
    """A Hugging Face BERT checkpoint as maxjax BERT names (the file's names; a ``bert.`` prefix
    is dropped): every tensor, as stored."""
    return adapt(weights, BERT_HF_NAMES)


_L = r"encoder\.layer\.(\d+)\."
#: maxjax BERT names (the checkpoint's, see :data:`BERT_HF_NAMES`) -> :class:`BertModel` weight
#: names. ``embeddings.position_ids`` (a buffer), the ``pooler`` and ``cls.*`` heads (not used
#: by sentence embeddings) are dropped.
BERT_MODULE_NAMES: NameTable = (
    (r"embeddings\.position_ids", None),
    (r"pooler\..+", None),
    (r"cls\..+", None),  # BertForMaskedLM / BertForPreTraining heads
    (r"embeddings\.(word|position|token_type)_embeddings\.weight", r"embeddings.\1_embeddings.weight"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"embeddings.layer_norm.\1"),
    (_L + r"attention\.self\.query\.(weight|bias)", r"encoder.layer.\1.attention.q_proj.\2"),
    (_L + r"attention\.self\.key\.(weight|bias)", r"encoder.layer.\1.attention.k_proj.\2"),
    (_L + r"attention\.self\.value\.(weight|bias)", r"encoder.layer.\1.attention.v_proj.\2"),
    (_L + r"attention\.output\.dense\.(weight|bias)", r"encoder.layer.\1.attention.o_proj.\2"),
    (_L + r"attention\.output\.LayerNorm\.(weight|bias)", r"encoder.layer.\1.attention_norm.\2"),
    (_L + r"intermediate\.dense\.(weight|bias)", r"encoder.layer.\1.mlp.up_proj.\2"),
    (_L + r"output\.dense\.(weight|bias)", r"encoder.layer.\1.mlp.down_proj.\2"),
    (_L + r"output\.LayerNorm\.(weight|bias)", r"encoder.layer.\1.mlp_norm.\2"),
)


def bert_module_from_hf(weights: Any) -> dict[str, WeightData]:
    """A Hugging Face BERT checkpoint (``BertModel`` names, or ``BertForXxx``'s ``bert.``-prefixed
    ones) as :class:`~maxjax.models.bert.BertModel` weight names (:data:`BERT_MODULE_NAMES`).

    Raises:
        ValueError: a tensor name no row matches (another architecture), listing them.
    """
    return adapt(bert_from_hf(weights), BERT_MODULE_NAMES)
