"""``LlamaConfig``: Llama hyperparameters (Hugging Face's names) from a GGUF or a ``config.json``.

Hyperparameters come from the checkpoint (GGUF metadata keys ``{arch}.block_count``, ...; or a
Hugging Face ``config.json``), never hard-coded. Every field is checked (type and range) as it is
read, and a GGUF's tensors against the config before anything is built
(:mod:`maxjax.models.llama.checks`); errors are one line naming the file and the key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from maxjax.models.llama.checks import boolean, check_gguf_tensors, describe, nonnegative_int, positive_float, positive_int

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
        """From GGUF key/values (``general.architecture`` must be a supported one), every field
        checked: sizes are integers in ``[1, 2**31 - 1]``, ``rope.freq_base`` and
        ``attention.layer_norm_rms_epsilon`` finite numbers > 0, ``head_count`` a multiple of
        ``head_count_kv``, the head size (``attention.key_length``, or ``embedding_length /
        head_count``) whole and even (rotary embeddings rotate pairs), ``value_length`` and
        ``rope.dimension_count`` equal to it when given, no rope scaling, no experts, and no more
        ``tokenizer.ggml.tokens`` than ``vocab_size``.

        Raises:
            ValueError: an unsupported architecture (naming it and the supported ones), a required
                key missing, or a value of the wrong type or out of range; one line naming
                ``source`` and the key (``x.gguf: llama.attention.head_count must be a positive
                integer, got 0``).
        """
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_GGUF_ARCHITECTURES:
            shown = repr(arch) if isinstance(arch, str) and len(arch) <= 40 else describe(arch)
            raise ValueError(
                f"{source}: general.architecture: unsupported architecture {shown} "
                f"(supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)})"
            )

        def key(k: str) -> str:
            return f"{arch}.{k}"

        def where(k: str) -> str:
            return f"{source}: {key(k)}"

        def required(k: str) -> Any:
            if key(k) not in meta:
                raise ValueError(f"{source}: GGUF metadata has no {key(k)!r} (required)")
            return meta[key(k)]

        def size(k: str, default: Any = None) -> int:
            if key(k) not in meta and default is not None:
                return default
            return positive_int(required(k), where(k))

        if key("expert_count") in meta and nonnegative_int(meta[key("expert_count")], where("expert_count")) > 0:
            raise ValueError(f"{where('expert_count')} is {meta[key('expert_count')]}: mixture-of-experts llama models are not supported")
        scaling = meta.get(key("rope.scaling.type"))
        if scaling not in (None, "none"):
            shown = repr(scaling) if isinstance(scaling, str) and len(scaling) <= 40 else describe(scaling)
            raise ValueError(f"{where('rope.scaling.type')}: rope scaling {shown} is not supported (plain Llama rope only)")
        if key("rope.scaling.factor") in meta and positive_float(meta[key("rope.scaling.factor")], where("rope.scaling.factor")) != 1.0:
            raise ValueError(f"{where('rope.scaling.factor')} is {meta[key('rope.scaling.factor')]}: rope scaling is not supported (plain Llama rope only)")
        hidden = size("embedding_length")
        heads = size("attention.head_count")
        kv = size("attention.head_count_kv", heads)
        if heads % kv:
            raise ValueError(
                f"{where('attention.head_count')} ({heads}) must be a multiple of {key('attention.head_count_kv')} ({kv})"
            )
        if key("attention.key_length") in meta:
            head_dim = size("attention.key_length")
            head_from = key("attention.key_length")
            if head_dim % 2:
                raise ValueError(f"{where('attention.key_length')} must be even (rotary embeddings rotate pairs), got {head_dim}")
        else:
            if hidden % heads:
                raise ValueError(
                    f"{where('embedding_length')} ({hidden}) must be a multiple of {key('attention.head_count')} ({heads}): "
                    f"the head size is their quotient when {key('attention.key_length')} is not given"
                )
            head_dim = hidden // heads
            head_from = f"{key('embedding_length')} / {key('attention.head_count')} = {hidden} / {heads}"
            if head_dim % 2:
                raise ValueError(
                    f"{where('embedding_length')} / {key('attention.head_count')} = {hidden} / {heads} = {head_dim}: "
                    f"the head size must be even (rotary embeddings rotate pairs)"
                )
        for k, what in (("attention.value_length", "value heads of another size"), ("rope.dimension_count", "partial rotary embeddings")):
            if key(k) in meta and size(k) != head_dim:
                raise ValueError(f"{where(k)} is {meta[key(k)]}, but the head size ({head_from}) is {head_dim}: {what} are not supported")
        tokens = meta.get("tokenizer.ggml.tokens")
        if tokens is not None and not isinstance(tokens, list):
            raise ValueError(f"{source}: tokenizer.ggml.tokens must be a list of strings, got {describe(tokens)}")
        if key("vocab_size") in meta:
            vocab = size("vocab_size")
        elif tokens:
            vocab = len(tokens)
        else:
            raise ValueError(f"{source}: GGUF metadata has neither {key('vocab_size')!r} nor tokenizer.ggml.tokens (the vocabulary size)")
        if tokens is not None and len(tokens) > vocab:
            raise ValueError(f"{source}: tokenizer.ggml.tokens has {len(tokens)} tokens, more than {key('vocab_size')} ({vocab})")
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=size("feed_forward_length"),
            num_hidden_layers=size("block_count"),
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=head_dim,
            rope_theta=positive_float(meta.get(key("rope.freq_base"), 10000.0), where("rope.freq_base")),
            rms_norm_eps=positive_float(required("attention.layer_norm_rms_epsilon"), where("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=size("context_length"),
            tie_word_embeddings=not has_output_weight,
        )

    @classmethod
    def from_gguf(cls, weights: Any, source: str) -> "LlamaConfig":
        """From an open ``GGUFWeights``: its metadata, checked against its tensors before anything
        is built (see :func:`~maxjax.models.llama.checks.check_gguf_tensors`: names, block count,
        shapes, types, data layout, memory, finite norms).

        Raises:
            ValueError: see :meth:`from_gguf_metadata` and
                :func:`~maxjax.models.llama.checks.check_gguf_tensors` (the message names the file
                and the key or GGUF tensor at fault); Llama 3 rope frequency scaling
                (``rope_freqs.weight``), which is not supported.
        """
        config = cls.from_gguf_metadata(weights.metadata, "output.weight" in weights, source=source)
        check_gguf_tensors(weights, config, source, arch=weights.metadata["general.architecture"])
        return config

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], source: str = "config.json") -> "LlamaConfig":
        """From a Hugging Face ``config.json`` of a ``LlamaForCausalLM``, every field checked
        (sizes integers in ``[1, 2**31 - 1]``, ``rope_theta``/``rms_norm_eps`` finite numbers > 0,
        ``tie_word_embeddings`` a boolean, ``num_attention_heads`` a multiple of
        ``num_key_value_heads``, an even head size, ``hidden_act`` silu, no biases, no rope
        scaling). Missing or null optional keys take Hugging Face's defaults.

        Raises:
            ValueError: not a JSON object, another architecture, a required key missing, or a
                value of the wrong type or out of range; one line naming ``source`` and the key.
        """
        if not isinstance(cfg, Mapping):
            raise ValueError(f"{source}: must be a JSON object, got {describe(cfg)}")
        archs = cfg.get("architectures") or [cfg.get("model_type")]
        if not isinstance(archs, list):
            archs = [archs]
        if not any(isinstance(a, str) and a in ("LlamaForCausalLM", "llama") for a in archs):
            raise ValueError(f"{source}: unsupported architecture {describe(archs)} (supported: LlamaForCausalLM)")
        scaling = cfg.get("rope_scaling")
        if scaling and not (isinstance(scaling, Mapping) and (scaling.get("rope_type") or scaling.get("type")) == "default"):
            raise ValueError(f"{source}: rope_scaling {describe(scaling)} is not supported (plain Llama rope only)")
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"{source}: hidden_act must be 'silu' (llama's activation), got {describe(act)}")
        for k in ("attention_bias", "mlp_bias"):
            if cfg.get(k) is not None and boolean(cfg[k], f"{source}: {k}"):
                raise ValueError(f"{source}: {k} is true: llama layers with biases are not supported")

        def size(k: str, default: Any = None) -> int:
            value = cfg.get(k)
            if value is None:
                if default is None:
                    raise ValueError(f"{source}: missing key {k!r}" if k not in cfg else f"{source}: {k} must be a positive integer, got null")
                return default
            return positive_int(value, f"{source}: {k}")

        def number(k: str, default: float) -> float:
            value = cfg.get(k)
            return default if value is None else positive_float(value, f"{source}: {k}")

        hidden = size("hidden_size")
        heads = size("num_attention_heads")
        kv = size("num_key_value_heads", heads)
        if heads % kv:
            raise ValueError(f"{source}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})")
        if cfg.get("head_dim") is not None:
            head_dim = size("head_dim")
            if head_dim % 2:
                raise ValueError(f"{source}: head_dim must be even (rotary embeddings rotate pairs), got {head_dim}")
        else:
            if hidden % heads:
                raise ValueError(
                    f"{source}: hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads}): the head size is "
                    "their quotient when head_dim is not given"
                )
            head_dim = hidden // heads
            if head_dim % 2:
                raise ValueError(
                    f"{source}: hidden_size / num_attention_heads = {hidden} / {heads} = {head_dim}: the head size must be "
                    "even (rotary embeddings rotate pairs)"
                )
        tie = cfg.get("tie_word_embeddings")
        return cls(
            vocab_size=size("vocab_size"),
            hidden_size=hidden,
            intermediate_size=size("intermediate_size"),
            num_hidden_layers=size("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=head_dim,
            rope_theta=number("rope_theta", 10000.0),
            rms_norm_eps=number("rms_norm_eps", 1e-6),
            max_position_embeddings=size("max_position_embeddings", 2048),
            tie_word_embeddings=False if tie is None else boolean(tie, f"{source}: tie_word_embeddings"),
        )

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
