"""BERT (encoder) checkpoints: the weight-name adapter (``bert_from_hf``). No model is built here yet."""

from maxjax.models.bert.weights import BERT_HF_NAMES, bert_from_hf

__all__ = ["BERT_HF_NAMES", "bert_from_hf"]
