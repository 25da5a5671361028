"""Real architectures assembled from ``maxjax.nn`` (Llama) and the serving API for them."""

from maxjax.models.causal_lm import CausalLM, Generation, load_model
from maxjax.models.llama import LlamaConfig, build_llama

__all__ = ["CausalLM", "Generation", "LlamaConfig", "build_llama", "load_model"]
