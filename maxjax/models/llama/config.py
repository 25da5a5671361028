"""``LlamaConfig``: Llama hyperparameters (Hugging Face's names) from a GGUF or a ``config.json``.

Hyperparameters come from the checkpoint (GGUF metadata keys ``{arch}.block_count``, ...; or a
Hugging Face ``config.json``), never hard-coded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

__all__ = ["LlamaConfig", "SUPPORTED_GGUF_ARCHITECTURES"]

#: GGUF ``general.architecture`` values that load into this module.
SUPPORTED_GGUF_ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class LlamaConfig:
    """Llama hyperparameters (Hugging Face's names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], has_output_weight: bool, source: str = "the GGUF file") -> "LlamaConfig":
        """From GGUF key/values (``general.architecture`` must be a supported one).

        Raises:
            ValueError: an unsupported architecture (naming it and the supported ones), or a
                required key is missing (naming it).
        """
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_GGUF_ARCHITECTURES:
            raise ValueError(
                f"{source}: unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)})"
            )

        def get(key: str, default: Any = None) -> Any:
            full = f"{arch}.{key}"
            if full in meta:
                return meta[full]
            if default is None:
                raise ValueError(f"{source}: GGUF metadata has no {full!r}")
            return default

        scaling = meta.get(f"{arch}.rope.scaling.type")
        if scaling not in (None, "none") or f"{arch}.rope.scaling.factor" in meta and float(meta[f"{arch}.rope.scaling.factor"]) != 1.0:
            raise ValueError(f"{source}: rope scaling {scaling!r} is not supported (plain Llama rope only)")
        hidden = int(get("embedding_length"))
        heads = int(get("attention.head_count"))
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = int(get("vocab_size", len(tokens) if tokens is not None else None))
        head_dim = int(get("attention.key_length", hidden // heads))
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_hidden_layers=int(get("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(get("attention.head_count_kv", heads)),
            head_dim=head_dim,
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=int(get("context_length")),
            tie_word_embeddings=not has_output_weight,
        )

    @classmethod
    def from_gguf(cls, weights: Any, source: str) -> "LlamaConfig":
        """From an open ``GGUFWeights``: its metadata, and whether it has an output head of its own.

        Raises:
            ValueError: see :meth:`from_gguf_metadata`; Llama 3 rope frequency scaling
                (``rope_freqs.weight``), which is not supported.
        """
        config = cls.from_gguf_metadata(weights.metadata, weights.output.weight.exists(), source=source)
        if weights["rope_freqs"]["weight"].exists():
            raise ValueError(f"{source}: Llama 3 rope frequency scaling (rope_freqs.weight) is not supported")
        return config

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], source: str = "config.json") -> "LlamaConfig":
        """From a Hugging Face ``config.json`` of a ``LlamaForCausalLM``.

        Raises:
            ValueError: another architecture, or a required key missing.
        """
        archs = cfg.get("architectures") or [cfg.get("model_type")]
        if not any(a in ("LlamaForCausalLM", "llama") for a in archs):
            raise ValueError(f"{source}: unsupported architecture {archs} (supported: LlamaForCausalLM)")
        if cfg.get("rope_scaling"):
            raise ValueError(f"{source}: rope_scaling {cfg['rope_scaling']!r} is not supported (plain Llama rope only)")
        try:
            heads = int(cfg["num_attention_heads"])
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=int(cfg["hidden_size"]),
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads", heads)),
                head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
                rope_theta=float(cfg.get("rope_theta", 10000.0)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            )
        except KeyError as e:
            raise ValueError(f"{source}: missing key {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_hf_config(self, **extra: Any) -> dict[str, Any]:
        """A Hugging Face ``config.json`` of a ``LlamaForCausalLM`` with these hyperparameters
        (what :meth:`from_hf_config` reads back); ``extra`` keys (``bos_token_id``,
        ``eos_token_id``, ``torch_dtype``, ...) are added."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **asdict(self),
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "rope_scaling": None,
            **extra,
        }
