"""BERT encoders (sentence-transformers all-MiniLM-L6-v2 and other BERT checkpoints): config,
weight names, the model built from ``maxjax.nn`` layers, and :func:`load_bert_encoder` (what :func:`maxjax.models.load_encoder` runs).

Registered in :mod:`maxjax.models.registry` as the encoder architecture ``"bert"`` (Hugging Face
``BertModel``).
"""

from maxjax.models.bert.config import SUPPORTED_HF_ARCHITECTURES, BertConfig, SentenceHead
from maxjax.models.bert.encoder import EncoderTokenizer, SentenceEncoder, length_buckets, load_bert_encoder, load_module
from maxjax.models.bert.model import BertEmbeddings, BertLayer, BertModel, build_bert
from maxjax.models.bert.weights import BERT_HF_NAMES, BERT_MODULE_NAMES, bert_from_hf, bert_module_from_hf
from maxjax.models.registry import EncoderArchitecture, register_encoder

register_encoder(EncoderArchitecture(name="bert", hf_architectures=SUPPORTED_HF_ARCHITECTURES, load=load_bert_encoder))

__all__ = [
    "BERT_HF_NAMES", "BERT_MODULE_NAMES", "BertConfig", "BertEmbeddings", "BertLayer", "BertModel", "EncoderTokenizer",
    "SentenceEncoder", "SentenceHead", "bert_from_hf", "bert_module_from_hf", "build_bert", "length_buckets",
    "load_bert_encoder", "load_module",
]  # fmt: skip
