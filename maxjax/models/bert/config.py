"""``BertConfig``: BERT hyperparameters from a Hugging Face ``config.json``, and the
sentence-transformers head (pooling, normalisation, max length) from the model's own files.

A sentence-transformers directory (e.g. all-MiniLM-L6-v2) holds ``config.json`` (the BERT
encoder), ``modules.json`` (the pipeline: ``Transformer`` -> ``Pooling`` -> optional
``Normalize``), ``<pooling path>/config.json`` (which pooling) and ``sentence_bert_config.json``
(``max_seq_length``). Nothing here is hard-coded for one model: every value is read from those
files and checked as it is read (one-line errors naming the file and the key).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from maxjax.models.llama.checks import positive_float, positive_int
from maxjax.models.registry import read_hf_config

__all__ = ["BertConfig", "SentenceHead", "POOLING_MODES", "SUPPORTED_HF_ARCHITECTURES"]

#: Hugging Face ``architectures`` / ``model_type`` values this encoder loads.
SUPPORTED_HF_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining", "bert")
#: sentence-transformers' pooling config keys -> maxjax pooling names (the supported ones).
POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
_UNSUPPORTED_POOLING = (
    "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)  # fmt: skip
_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu", "tanh", "sigmoid")


@dataclass(frozen=True)
class BertConfig:
    """BERT encoder hyperparameters (Hugging Face's names)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], source: str = "config.json") -> "BertConfig":
        """From a ``config.json`` dict of a BERT model.

        Raises:
            ValueError: another architecture (naming it and the supported ones), a missing key, a
                value of the wrong type or out of range, ``hidden_size`` not divisible by
                ``num_attention_heads``, an unsupported ``hidden_act`` or
                ``position_embedding_type`` (one line naming ``source`` and the key).
        """
        names = cfg.get("architectures") or [cfg.get("model_type")]
        names = names if isinstance(names, list) else [names]
        if not any(n in SUPPORTED_HF_ARCHITECTURES for n in names):
            raise ValueError(
                f"{source}: architectures {names} is not a BERT encoder (supported: {', '.join(SUPPORTED_HF_ARCHITECTURES)})"
            )

        def req(key: str) -> Any:
            if key not in cfg:
                raise ValueError(f"{source}: no {key!r} (required)")
            return cfg[key]

        def size(key: str) -> int:
            return positive_int(req(key), f"{source}: {key}")

        act = cfg.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"{source}: hidden_act {act!r} is not supported (supported: {', '.join(_ACTIVATIONS)})")
        pos = cfg.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise ValueError(f"{source}: position_embedding_type {pos!r} is not supported (supported: 'absolute')")
        c = cls(
            vocab_size=size("vocab_size"),
            hidden_size=size("hidden_size"),
            num_hidden_layers=size("num_hidden_layers"),
            num_attention_heads=size("num_attention_heads"),
            intermediate_size=size("intermediate_size"),
            hidden_act=act,
            max_position_embeddings=size("max_position_embeddings"),
            type_vocab_size=positive_int(cfg.get("type_vocab_size", 2), f"{source}: type_vocab_size"),
            layer_norm_eps=positive_float(cfg.get("layer_norm_eps", 1e-12), f"{source}: layer_norm_eps"),
            pad_token_id=int(cfg.get("pad_token_id", 0) or 0),
        )
        if c.hidden_size % c.num_attention_heads:
            raise ValueError(
                f"{source}: hidden_size ({c.hidden_size}) is not divisible by num_attention_heads ({c.num_attention_heads})"
            )
        return c


@dataclass(frozen=True)
class SentenceHead:
    """What sentence-transformers does after the encoder: ``pooling`` (``"mean"`` over the
    attention mask, or ``"cls"``: the first token), ``normalize`` (L2, from a ``Normalize``
    module in ``modules.json``) and ``max_seq_length`` (tokens, ``[CLS]`` and ``[SEP]`` included)."""

    pooling: str
    normalize: bool
    max_seq_length: int

    @classmethod
    def from_dir(cls, directory: str | Path, config: BertConfig) -> "SentenceHead":
        """From a sentence-transformers directory's ``modules.json``, its pooling module's
        ``config.json`` and ``sentence_bert_config.json``. A directory without ``modules.json``
        (a plain Hugging Face BERT) gets mean pooling, no normalisation and
        ``max_position_embeddings`` tokens.

        Raises:
            ValueError: unreadable JSON, a module type other than Transformer / Pooling /
                Normalize, no or several pooling modes, an unsupported pooling mode,
                ``max_seq_length`` above ``max_position_embeddings`` (naming the file and key).
        """
        d = Path(directory)
        max_len = config.max_position_embeddings
        st = d / "sentence_bert_config.json"
        if st.exists():
            stc = read_hf_config(st)
            if "max_seq_length" in stc:
                max_len = positive_int(stc["max_seq_length"], f"{st}: max_seq_length")
                if max_len > config.max_position_embeddings:
                    raise ValueError(
                        f"{st}: max_seq_length {max_len} exceeds the model's max_position_embeddings ({config.max_position_embeddings})"
                    )
        modules_path = d / "modules.json"
        if not modules_path.exists():
            return cls("mean", False, max_len)
        try:
            modules = json.loads(modules_path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"{modules_path}: not valid UTF-8 JSON: {e}") from None
        if not isinstance(modules, list):
            raise ValueError(f"{modules_path}: must be a JSON list of modules")
        pooling, normalize = None, False
        for m in modules:
            kind = str(m.get("type", "")).rsplit(".", 1)[-1] if isinstance(m, dict) else ""
            if kind == "Transformer":
                continue
            if kind == "Normalize":
                normalize = True
            elif kind == "Pooling":
                pc_path = d / str(m.get("path", "")) / "config.json"
                pc = read_hf_config(pc_path)
                bad = [k for k in _UNSUPPORTED_POOLING if pc.get(k)]
                if bad:
                    raise ValueError(f"{pc_path}: {bad[0]} is not supported (supported: {', '.join(POOLING_MODES)})")
                modes = [v for k, v in POOLING_MODES.items() if pc.get(k)]
                if len(modes) != 1:
                    raise ValueError(f"{pc_path}: exactly one of {', '.join(POOLING_MODES)} must be true, got {len(modes)}")
                dim = pc.get("word_embedding_dimension", config.hidden_size)
                if dim != config.hidden_size:
                    raise ValueError(f"{pc_path}: word_embedding_dimension {dim} is not the model's hidden_size {config.hidden_size}")
                pooling = modes[0]
            else:
                raise ValueError(
                    f"{modules_path}: module type {m.get('type') if isinstance(m, dict) else m!r} is not supported "
                    "(supported: Transformer, Pooling, Normalize)"
                )
        if pooling is None:
            raise ValueError(f"{modules_path}: no sentence_transformers.models.Pooling module")
        return cls(pooling, normalize, max_len)
