"""Llama (and Llama-architecture models such as SmolLM2): config, weight names, model.

Registered in :mod:`maxjax.models.registry` as ``"llama"`` (GGUF ``general.architecture`` "llama";
Hugging Face ``LlamaForCausalLM``).
"""

from maxjax.dtype import DType
from maxjax.models.llama.checks import cast_float_weight, check_hf_tensors
from maxjax.models.llama.config import SUPPORTED_GGUF_ARCHITECTURES, LlamaConfig
from maxjax.models.llama.model import LlamaForCausalLM, build_llama
from maxjax.models.llama.weights import LLAMA_GGUF_NAMES, LLAMA_HF_NAMES, llama_from_gguf, llama_from_hf, llama_to_hf
from maxjax.models.registry import Architecture, register


def _weights_from_hf(weights, config: LlamaConfig, dtype: DType = DType.float32) -> dict:
    """The checkpoint's tensors checked against ``config`` (before anything is built), as maxjax
    names, in ``dtype`` (the module's weights: converted on read for lazy tensors, one copy out of
    the map, none where the file holds ``dtype``; else now); with tied embeddings an
    ``lm_head.weight`` is dropped, as Hugging Face ignores it."""
    check_hf_tensors(weights, config, dtype)
    state = {name: cast_float_weight(wd, dtype) for name, wd in llama_from_hf(weights).items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


register(
    Architecture(
        name="llama",
        gguf_architectures=SUPPORTED_GGUF_ARCHITECTURES,
        hf_architectures=("LlamaForCausalLM", "llama"),
        config_from_gguf=LlamaConfig.from_gguf,
        config_from_hf=LlamaConfig.from_hf_config,
        weights_from_gguf=lambda weights, c: llama_from_gguf(weights, n_head=c.num_attention_heads, n_kv_head=c.num_key_value_heads),
        weights_from_hf=_weights_from_hf,
        build=build_llama,
        module_class=LlamaForCausalLM,
        config_to_hf=LlamaConfig.to_hf_config,
        weights_to_hf=llama_to_hf,
    )
)

__all__ = ["LLAMA_GGUF_NAMES", "LLAMA_HF_NAMES", "LlamaConfig", "LlamaForCausalLM", "build_llama", "llama_from_gguf", "llama_from_hf", "llama_to_hf"]
